"""The dependency walk: from a registered architecture through imports (statements, lazy ones,
literal module-loader calls), the package `__init__`s they run and re-export chains to the
boundaries (stdlib, third-party, compiled), and the reverse walk to consumers."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ..code.import_scan import Branch
from ..code.module_index import ImportRecord, IndexedModule, ModuleIndex
from ..foundation.evidence import Evidence

STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
BRANCH_STRENGTH: dict[Branch, int] = {"not_taken": 0, "conditional": 1, "lazy": 2, "taken": 3}

STDLIB_SHOWN = 8
RESOLVE_HOPS = 8
"""Re-exports followed from an imported name to its definition (as `ModuleIndex.resolve_symbol`)."""

RowSide = Literal["plugin", "upstream", "third_party", "binary", "stdlib", "missing"]
NodeKind = Literal["import", "package_init", "lazy", "dynamic", "typing_only"]
"""How the walk reached a module: an import statement; the run of a package's `__init__` that
importing one of its submodules (or a name from it) implies; an import inside a function (run when
called); a module-loader call whose name the literals decide; an import under `if TYPE_CHECKING:`
(recorded, never run)."""
BoundaryKind = Literal["component", "pending_upgrade", "owned", "stable_interface", "precompiled"]
Stability = Literal["stable", "changed", "unknown"]


@dataclass
class Row:
    name: str
    file: str | None
    side: RowSide
    reached_from: str | None
    guard: str | None = None
    branch: Branch = "taken"
    boundary: str | None = None
    depth: int = 0
    upstream_counterpart: str | None = None
    upstream_delta: list[str] | None = None
    metax_difference: str | None = None
    annotation: str | None = None
    importers: list[str] = field(default_factory=list)
    """Every module on the path that imports it (`reached_from` is the first)."""
    stability: Stability | None = None
    """Upstream and missing rows: whether the definitions the path uses changed between base and target."""
    stability_evidence: list[str] = field(default_factory=list)
    """Why stable (`unchanged:name base_line->target_line` per used definition) or unknown, capped; a
    changed row's grounds are its `upstream_delta`."""
    kind: NodeKind = "import"


@dataclass
class Walk:
    rows: list[Row] = field(default_factory=list)
    truncated: bool = False

    def names(self) -> set[str]:
        return {r.name for r in self.rows}


@dataclass(frozen=True)
class Boundary:
    """Where the walk stopped: a component (stdlib, third-party, compiled, missing), a plugin
    module it does not follow (a pending upgrade, or owned by another workflow), or an upstream
    module whose used definitions did not change between base and target (a stable interface)."""

    package: str
    side: RowSide
    reason: str
    kind: BoundaryKind = "component"
    file: str | None = None
    evidence: list[Evidence] = field(default_factory=list)
    count: int = 1
    """How many boundaries the entry stands for: more than one in a summary."""


@dataclass(frozen=True)
class Edge:
    """One import on the path: `importer` imports `module`, or the name `symbol` of it."""

    importer: str
    module: str
    symbol: str | None
    branch: Branch
    kind: NodeKind = "import"
    reexport: bool = False
    """The import only passes through `module` to a name it re-exports from elsewhere."""


@dataclass(frozen=True)
class Start:
    """Where a walk begins: a registered module and (usually) its class."""

    module: str
    symbol: str | None


@dataclass(frozen=True)
class _Step:
    """A module (or `module:symbol`) waiting to be visited, and how the walk got there."""

    module: str
    symbol: str | None
    depth: int
    reached_from: str | None
    guard: str | None
    branch: Branch
    kind: NodeKind = "import"


def _through(step: _Step, indexed: IndexedModule | None, name: str) -> _Step:
    """`step` continued through the import that re-exports `name` in `indexed` (the one
    `ModuleIndex.resolve_symbol` follows): both guards hold, and the weaker branch."""
    candidates = [i for i in indexed.record.imports if i.branch != "not_taken"] if indexed else []
    for record in sorted(candidates, key=lambda i: i.branch != "taken"):
        bound = [alias for _, alias in record.names] or [record.alias or record.module.split(".")[0]]
        if name in bound:
            guard = " and ".join(g for g in (step.guard, record.guard) if g) or None
            branch = min(step.branch, record.branch, key=BRANCH_STRENGTH.__getitem__)
            return replace(step, guard=guard, branch=branch)
    return step


def classify(index: ModuleIndex, module: str, first_party: frozenset[str]) -> tuple[RowSide, str | None]:
    """(side, boundary reason) of a module name."""
    indexed = index.get(module)
    if indexed is not None:
        return indexed.side, None
    top = module.split(".")[0]
    if top in STDLIB:
        return "stdlib", "standard library: a stable interface, not traced"
    if top in first_party:
        if module.split(".")[-1].startswith("_"):
            return "binary", "no Python source in the tree: a compiled extension (verify the installed API)"
        return "missing", "imported but absent from the tree: removed, renamed, generated or compiled"
    return "third_party", "third-party package: an installed component boundary"


class _Walker:
    """One breadth-first walk: rows by name, symbol rows and not-taken branches kept for the end."""

    def __init__(
        self, index: ModuleIndex, first_party: frozenset[str], max_depth: int, max_rows: int, stop: Mapping[str, str]
    ) -> None:
        self.index, self.first_party, self.stop = index, first_party, stop
        self.max_depth, self.max_rows = max_depth, max_rows
        self.walk = Walk()
        self.rows: dict[str, Row] = {}
        self.skipped: dict[str, Row] = {}
        self.symbols: list[Row] = []
        self.queue: deque[_Step] = deque()

    def add(self, row: Row) -> bool:
        """Record a row once; a later, stronger path (taken over conditional) replaces how it is
        reached (importer, guard, branch and kind)."""
        existing = self.rows.get(row.name)
        if existing is not None:
            if BRANCH_STRENGTH[row.branch] > BRANCH_STRENGTH[existing.branch]:
                existing.reached_from, existing.guard = row.reached_from, row.guard
                existing.branch, existing.kind = row.branch, row.kind
            return False
        if len(self.rows) >= self.max_rows:
            self.walk.truncated = True
            return False
        self.rows[row.name] = row
        return True

    def visit(self, step: _Step) -> None:
        side, boundary = classify(self.index, step.module, self.first_party)
        indexed = self.index.get(step.module)
        path = indexed.path if indexed else None
        if step.symbol:
            name = f"{step.module}:{step.symbol}"
            self.symbols.append(self.row(step, name, path, side, None))
        stopped = bool(step.depth) and step.module in self.stop
        if stopped:
            boundary = self.stop[step.module]
        row = self.row(step, step.module, path, side, boundary)
        if self.add(row) and indexed is not None and step.depth < self.max_depth and not stopped:
            self.follow(indexed, step.depth + 1)

    @staticmethod
    def row(step: _Step, name: str, path: str | None, side: RowSide, boundary: str | None) -> Row:
        return Row(name, path, side, step.reached_from, step.guard, step.branch, boundary, step.depth, kind=step.kind)

    def push(self, step: _Step) -> None:
        """Queue a step after the packages whose `__init__` importing it runs first (`a` and `a.b`
        before `a.b.c`, outermost first), each a `package_init` step of the same import; those
        `__init__`s are then followed like any module, so their dispatch takes its branch. The
        importer's own packages are left out: they ran before the importer did."""
        parts = step.module.split(".")
        importer = f"{step.reached_from}." if step.reached_from else ""
        for end in range(1, len(parts)):
            package = self.index.get(".".join(parts[:end]))
            if package is None or not package.is_package or importer.startswith(f"{package.name}."):
                continue
            known = self.rows.get(package.name)
            if known is None or BRANCH_STRENGTH[known.branch] < BRANCH_STRENGTH[step.branch]:
                self.queue.append(replace(step, module=package.name, symbol=None, kind="package_init"))
        self.queue.append(step)

    def reexports(self, step: _Step, name: str) -> list[_Step]:
        """`from <step.module> import name`: a step per module the name is re-exported through (each
        runs, and each is reached from the one before), then the defining module with the symbol, or
        the submodule the name is (whose packages `push` runs)."""
        steps: list[_Step] = []
        module, symbol, via = step.module, name, step.reached_from
        for _ in range(RESOLVE_HOPS):
            defining, found = self.index.resolve_symbol(module, symbol, 1)
            if (defining, found) == (module, symbol):
                break
            if defining != f"{module}.{symbol}":
                steps.append(replace(step, module=module, symbol=None, reached_from=via))
                via = module
                step = _through(step, self.index.get(module), symbol)
            module, symbol = defining, found or ""
            if not symbol:
                break
        return [*steps, replace(step, module=module, symbol=symbol or None, reached_from=via)]

    def read_ahead(self, indexed: IndexedModule, records: list[ImportRecord]) -> None:
        """Read the records of the modules a followed module imports (and of the names it imports
        that are submodules) in one batch, not one at a time as the re-exports are resolved."""
        names = []
        for record in records:
            if record.branch != "not_taken":
                target = indexed.absolute(record.module)
                names += [target, *(f"{target}.{original}" for original, _ in record.names)]
        self.index.load(found for name in names if (found := self.index.get(name)) is not None)

    def follow(self, indexed: IndexedModule, depth: int) -> None:
        """Queue the imports of a module (statements and literal module-loader calls); a not-taken
        one is recorded, not followed."""
        module = indexed.name
        records = [*indexed.record.imports, *indexed.record.dynamic_imports]
        self.read_ahead(indexed, records)
        for record in records:
            target = indexed.absolute(record.module)
            if record.branch == "not_taken":
                side_of_target = classify(self.index, target, self.first_party)[0]
                found = self.index.get(target)
                path = found.path if found else None
                skipped = Row(
                    target, path, side_of_target, module, record.guard, "not_taken", None, depth, kind=record.kind
                )
                self.skipped.setdefault(target, skipped)
                continue
            step = _Step(target, None, depth, module, record.guard, record.branch, record.kind)
            for original, _alias in record.names or [["*", "*"]]:
                for hop in [step] if original == "*" else self.reexports(step, original):
                    self.push(hop)

    def finish(self) -> Walk:
        """Symbol rows after the module rows, then the branches not taken that nothing else reached."""
        for row in self.symbols:
            module, _, symbol = row.name.partition(":")
            indexed = self.index.get(module)
            if indexed is not None and indexed.record.definition(symbol) is None:
                row.boundary = "name not defined in the module (dynamic or star import)"
            self.add(row)
        for name, row in self.skipped.items():
            if name not in self.rows:
                self.add(row)
        self.walk.rows = list(self.rows.values())
        return self.walk


def walk_dependencies(
    index: ModuleIndex,
    starts: list[Start],
    first_party: frozenset[str],
    max_depth: int,
    max_rows: int,
    stop: Mapping[str, str] | None = None,
) -> Walk:
    """Breadth-first over modules; imported symbols get their own `module:Name` rows, in the module
    that defines them, after a row for every module they are re-exported through (a registered
    class re-exported by its start module is defined one hop below it, as that module's import says).

    Branches an out-of-tree platform does not take are recorded (branch `not_taken`) but not
    followed; conditional ones are followed and keep their guard. Modules in `stop` (owned by
    another workflow) are recorded with that reason as their boundary and not followed.
    """
    walker = _Walker(index, first_party, max_depth, max_rows, stop or {})
    steps: list[_Step] = []
    for start in starts:
        step = _Step(start.module, None, 0, None, None, "taken")
        hops = walker.reexports(step, start.symbol) if start.symbol else []
        steps += [step] + [hop if hop.module == start.module else replace(hop, depth=1) for hop in hops]
    for step in sorted(steps, key=lambda s: s.depth):  # breadth first: every start before what its re-exports reach
        walker.push(step)
    while walker.queue:
        walker.visit(walker.queue.popleft())
    return walker.finish()


def consumers(index: ModuleIndex, module: str, symbol: str | None, max_depth: int, max_rows: int) -> Walk:
    """Every module that imports `module` (or `module:symbol`, through re-exports), transitively."""
    walk = Walk()
    targets = {(module, symbol)}
    seen: set[str] = set()
    for depth in range(1, max_depth + 1):
        next_frontier: list[tuple[str, str | None]] = []
        for indexed in index.side():
            name = indexed.name
            if name in seen:
                continue
            for record in [*indexed.record.imports, *indexed.record.dynamic_imports]:
                target = indexed.absolute(record.module)
                hit = None
                if not record.names and (target, None) in targets:
                    hit = target
                for original, _ in record.names:
                    resolved = index.resolve_symbol(target, original)
                    if (resolved[0], resolved[1]) in targets or (resolved[0], None) in targets:
                        hit = f"{resolved[0]}:{resolved[1]}" if resolved[1] else resolved[0]
                if hit:
                    seen.add(name)
                    if len(walk.rows) >= max_rows:
                        walk.truncated = True
                        return walk
                    walk.rows.append(
                        Row(name, indexed.path, indexed.side, hit, record.guard, record.branch, None, depth)
                    )
                    next_frontier.append((name, None))
                    break
        targets = set(next_frontier)
        if not next_frontier:
            break
    return walk


def inactive_files(index: ModuleIndex, plugin_module: str | None, reached: set[str]) -> list[str]:
    """Plugin modules inside the registered model's own package that the walk never reached."""
    if not plugin_module:
        return []
    indexed = index.get(plugin_module)
    if indexed is None or not indexed.is_package:
        return []
    return sorted(
        m.path for name, m in index.modules.items() if name.startswith(plugin_module + ".") and name not in reached
    )


def component_boundaries(walk: Walk) -> list[Boundary]:
    """One boundary per third-party, compiled or missing package the walk met, and one for the
    standard library as a whole."""
    boundaries: dict[str, Boundary] = {}
    stdlib: set[str] = set()
    for row in walk.rows:
        if row.boundary and row.side == "stdlib":
            stdlib.add(row.name.split(".")[0])
        elif row.boundary and row.side in ("third_party", "binary", "missing"):
            package = row.name.split(":")[0] if row.side in ("binary", "missing") else row.name.split(".")[0]
            boundaries.setdefault(package, Boundary(package, row.side, row.boundary))
    if stdlib:
        shown = ", ".join(sorted(stdlib)[:STDLIB_SHOWN]) + (", …" if len(stdlib) > STDLIB_SHOWN else "")
        boundaries["stdlib"] = Boundary(
            "stdlib", "stdlib", f"standard library, {len(stdlib)} modules ({shown}): stable, not traced"
        )
    return sorted(boundaries.values(), key=lambda b: (b.side, b.package))


def walk_edges(index: ModuleIndex, walk: Walk, first_party: frozenset[str], max_depth: int) -> list[Edge]:
    """Every import of the modules the walk followed, replayed through the walker's own `follow`
    (so both read imports alike), for the importers of each node, not only the first one.

    Reads the rows as the walk left them: a followed module is indexed, not a boundary, not on a
    branch not taken, and above `max_depth`.
    """
    edges: list[Edge] = []
    for row in walk.rows:
        indexed = index.get(row.name)
        if indexed is None or row.boundary or row.branch == "not_taken" or row.depth >= max_depth:
            continue
        walker = _Walker(index, first_party, max_depth, 0, {})
        walker.follow(indexed, row.depth + 1)
        steps = list(walker.queue)
        passed = {step.reached_from for step in steps}
        for step in steps:
            through = step.symbol is None and step.kind != "package_init" and step.module in passed
            importer = step.reached_from or row.name
            edges.append(Edge(importer, step.module, step.symbol, step.branch, step.kind, through))
        edges += [Edge(row.name, name, None, "not_taken", skipped.kind) for name, skipped in walker.skipped.items()]
    return edges
