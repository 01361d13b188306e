"""The dependency walk: from a registered architecture through imports, re-exports and class
bases to the boundaries (stdlib, third-party, compiled), and the reverse walk to consumers."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..code.module_index import IndexedModule, ModuleIndex
from ..code.scanner import Branch
from ..foundation.evidence import Evidence

STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
BRANCH_STRENGTH: dict[Branch, int] = {"not_taken": 0, "conditional": 1, "lazy": 2, "taken": 3}

STDLIB_SHOWN = 8

RowSide = Literal["plugin", "upstream", "third_party", "binary", "stdlib", "missing"]
BoundaryKind = Literal["component", "pending_upgrade", "owned"]


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


@dataclass
class Walk:
    rows: list[Row] = field(default_factory=list)
    truncated: bool = False

    def names(self) -> set[str]:
        return {r.name for r in self.rows}


@dataclass(frozen=True)
class Boundary:
    """Where the walk stopped: a component (stdlib, third-party, compiled, missing) or a plugin
    module it does not follow (a pending upgrade, or owned by another workflow)."""

    package: str
    side: RowSide
    reason: str
    kind: BoundaryKind = "component"
    file: str | None = None
    evidence: list[Evidence] = field(default_factory=list)


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
        """Record a row once; a later, stronger path (taken over conditional) upgrades its branch."""
        existing = self.rows.get(row.name)
        if existing is not None:
            if BRANCH_STRENGTH[row.branch] > BRANCH_STRENGTH[existing.branch]:
                existing.branch, existing.guard = row.branch, row.guard
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
            self.symbols.append(Row(name, path, side, step.reached_from, step.guard, step.branch, None, step.depth))
        stopped = bool(step.depth) and step.module in self.stop
        if stopped:
            boundary = self.stop[step.module]
        row = Row(step.module, path, side, step.reached_from, step.guard, step.branch, boundary, step.depth)
        if self.add(row) and indexed is not None and step.depth < self.max_depth and not stopped:
            self.follow(indexed, step.depth + 1)

    def follow(self, indexed: IndexedModule, depth: int) -> None:
        """Queue the imports of a module; a not-taken one is recorded, not followed."""
        module = indexed.name
        for record in indexed.record.imports:
            target = indexed.absolute(record.module)
            if record.branch == "not_taken":
                side_of_target = classify(self.index, target, self.first_party)[0]
                found = self.index.get(target)
                path = found.path if found else None
                skipped = Row(target, path, side_of_target, module, record.guard, "not_taken", None, depth)
                self.skipped.setdefault(target, skipped)
                continue
            if not record.names:
                self.queue.append(_Step(target, None, depth, module, record.guard, record.branch))
                continue
            for original, _alias in record.names:
                if original == "*":
                    self.queue.append(_Step(target, None, depth, module, record.guard, record.branch))
                    continue
                defining, name = self.index.resolve_symbol(target, original)
                self.queue.append(_Step(defining, name or None, depth, module, record.guard, record.branch))

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
    """Breadth-first over modules; imported symbols get their own `module:Name` rows.

    Branches an out-of-tree platform does not take are recorded (branch `not_taken`) but not
    followed; conditional ones are followed and keep their guard. Modules in `stop` (owned by
    another workflow) are recorded with that reason as their boundary and not followed.
    """
    walker = _Walker(index, first_party, max_depth, max_rows, stop or {})
    walker.queue.extend(_Step(start.module, start.symbol, 0, None, None, "taken") for start in starts)
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
        for name, indexed in index.modules.items():
            if name in seen:
                continue
            for record in indexed.record.imports:
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
