"""Where a trace may stop: an upstream module is a verified stable interface when the definitions
the path uses from it did not change between base and target (seeds: "follow dependencies until
reaching a verified stable interface or an installed component boundary").

Used definitions are the names the walk's importers take from the module (all of it for `import m`,
`*`, or a module the path only runs), closed over the module's own names they use and the classes
they derive from (in the module or imported); changed means a different body hash
(core/code/scanner.py) in the base and target records, or a definition only one side has. The
`changes` view keeps the plugin's nodes and the upstream nodes whose used definitions changed (or
cannot be verified), reached through plugin modules and through what changed definitions import,
and leaves everything behind a stable interface or a component to the boundaries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..code.codebase import Codebase, Outcome
from ..code.module_index import Definition, IndexedModule, ModuleIndex
from ..foundation.evidence import Evidence
from ..sources.subjects import RevisionSubject, Subject
from .walk import Boundary, BoundaryKind, Edge, Row, RowSide, Stability, Walk

EVIDENCE_SHOWN = 3
NAMES_SHOWN = 8
BASE_HOPS = 6
"""Class bases followed across modules from a used class (deeper hierarchies are rare)."""
SUMMARISED: tuple[BoundaryKind, ...] = ("component", "stable_interface")
"""Boundary kinds the `changes` view gives as one entry per kind and side; the others, and modules
missing at the target (blocked paths), stay listed."""
SUMMARY_NAMES = 4
STABLE = "stable interface: the definitions the path uses are unchanged between base and target"
UNVERIFIED = ("undefined", "dynamic", "absent at target", "absent at target and in the upstream base")
"""Evidence kinds that leave a used name unverifiable (not a change)."""


@dataclass
class _Verdict:
    status: Stability = "stable"
    evidence: list[str] = field(default_factory=list)
    lines: tuple[int, int] | None = None
    """(base line, target line) of the first used definition, for boundary evidence."""

    def add(self, other: _Verdict) -> None:
        """Fold in another name's verdict; a name already in the evidence keeps its first entry."""
        if other.status == "changed" or (other.status == "unknown" and self.status == "stable"):
            self.status = other.status
        known = {_subject(e) for e in self.evidence}
        self.evidence += [e for e in other.evidence if _subject(e) not in known]
        self.lines = self.lines or other.lines


def _subject(evidence: str) -> str:
    """The name an evidence entry is about (`changed:Foo 3->4 via Bar` -> `Foo`)."""
    return evidence.split(" ")[0].partition(":")[2] or evidence


@dataclass(frozen=True)
class _Use:
    names: frozenset[str]
    whole: bool
    """Imported as a module (`import m`, `from p import m`, `from m import *`): every definition counts."""


def attach_importers(walk: Walk, edges: Iterable[Edge]) -> None:
    """Every importer of each node (module rows and `module:Name` rows), sorted."""
    found: dict[str, set[str]] = {}
    for edge in edges:
        found.setdefault(edge.module, set()).add(edge.importer)
        if edge.symbol:
            found.setdefault(f"{edge.module}:{edge.symbol}", set()).add(edge.importer)
    for row in walk.rows:
        row.importers = sorted(found.get(row.name, ()))


class _Judge:
    """Compares the used definitions of upstream modules in the base and target records (memoised)."""

    def __init__(self, code: Codebase, base: ModuleIndex) -> None:
        self.code, self.base = code, base
        self.memo: dict[tuple[str, str], _Verdict] = {}
        self.closures: dict[tuple[str, str], set[str]] = {}
        """The module's own names each judged name depends on (itself included)."""
        self.by_name: dict[int, dict[str, list[Definition]]] = {}

    def defs(self, indexed: IndexedModule, name: str) -> list[Definition]:
        """Every definition of `name` in the module (a name defined twice keeps both, in order)."""
        table = self.by_name.get(id(indexed.record))
        if table is None:
            table = self.by_name[id(indexed.record)] = {}
            for definition in indexed.record.definitions:
                table.setdefault(definition.name, []).append(definition)
        return table.get(name, [])

    def module(self, module: str, use: _Use) -> _Verdict:
        target, base = self.code.get(module), self.base.get(module)
        if target is None:
            return _Verdict("unknown", ["absent at target"])
        if base is None:
            return _Verdict("changed", ["added: absent at base"])
        names = use.names
        if use.whole:
            names = frozenset(d.name for d in target.record.definitions) | {d.name for d in base.record.definitions}
        verdict = _Verdict() if names else _Verdict("stable", ["unchanged:(no definitions: only its imports run)"])
        for name in sorted(names):
            verdict.add(self.name(module, name))
        return verdict

    def name(self, module: str, name: str, hops: int = BASE_HOPS) -> _Verdict:
        """One used name with what it depends on in its module, and its classes' bases."""
        key = (module, name)
        if key not in self.memo:
            self.memo[key] = _Verdict()  # a cycle through bases or names reads as unchanged
            self.memo[key] = self._closure(module, name, hops)
        return self.memo[key]

    def _closure(self, module: str, name: str, hops: int) -> _Verdict:
        target, base = self.code.module(module), self.base.get(module)
        if base is None:
            return _Verdict("changed", [f"added:{name} (module absent at base)"])
        verdict, queue, seen = _Verdict(), [(name, "")], {name}
        defined = {d.name for d in target.record.definitions} | {d.name for d in base.record.definitions}
        while queue:
            current, via = queue.pop()
            verdict.add(self._compare(target, base, current, via, hops))
            for definition in [*self.defs(target, current), *self.defs(base, current)]:
                for used in definition.names_used:
                    if used in defined and used not in seen:
                        seen.add(used)
                        queue.append((used, via or current))
        self.closures[(module, name)] = seen
        return verdict

    def followed(self, module: str, use: _Use) -> set[str] | None:
        """The nodes a module's used definitions import (through the names they load), None for all
        of them (the module is used whole, or has no base to judge it by)."""
        indexed = self.code.get(module)
        if use.whole or indexed is None or self.base.get(module) is None:
            return None
        loaded: set[str] = set()
        for name in use.names:
            self.name(module, name)
            for own in self.closures.get((module, name), ()):
                for definition in self.defs(indexed, own):
                    loaded.update(definition.names_used)
        return _bound(self.code.index, indexed, loaded)

    def _compare(self, target: IndexedModule, base: IndexedModule, name: str, via: str, hops: int) -> _Verdict:
        after, before = self.defs(target, name), self.defs(base, name)
        suffix = f" via {via}" if via else ""
        if not after and not before:
            return self._elsewhere(target.name, name, suffix, hops)
        if not before:
            return _Verdict("changed", [f"added:{name} {after[0].line}{suffix}"])
        if not after:
            return _Verdict("changed", [f"removed:{name} {before[0].line}{suffix}"])
        lines = (before[0].line, after[0].line)
        if [d.body_hash for d in after] != [d.body_hash for d in before]:
            return _Verdict("changed", [f"changed:{name} {lines[0]}->{lines[1]}{suffix}"], lines)
        verdict = _Verdict("stable", [f"unchanged:{name} {lines[0]}->{lines[1]}{suffix}"], lines)
        if hops and after[0].kind == "class":
            for text in after[0].bases:
                ref = self.code.bind(target.name, text)
                found = self.code.get(ref.module) if ref else None
                inherited_here = ref is not None and ref.module == target.name  # judged with the names it uses
                if ref and found is not None and found.side == "upstream" and len(ref.path) == 1 and not inherited_here:
                    inherited = self.name(ref.module, ref.path[0], hops - 1)
                    if inherited.status != "stable":
                        verdict.add(_Verdict(inherited.status, [f"base {ref.symbol} of {name}: {inherited.status}"]))
        return verdict

    def _elsewhere(self, module: str, name: str, suffix: str, hops: int) -> _Verdict:
        """A used name the module does not define: a star re-export (judged where it is defined),
        a submodule, or a name bound under a condition or at run time (not verifiable)."""
        found = self.code.resolve(module, name)
        if found.outcome is Outcome.DEFINED and found.module != module and hops:
            return self.name(found.module, found.name or name, hops - 1)
        if found.outcome is Outcome.MODULE:
            return _Verdict()
        how = "dynamic" if found.outcome is Outcome.DYNAMIC else "undefined"  # a module `__getattr__` answers it
        return _Verdict("unknown", [f"{how}:{name}{suffix}"])


def _bound(index: ModuleIndex, indexed: IndexedModule, names: set[str]) -> set[str]:
    """The nodes (as the walk names them) the module's imports bind to the given local names."""
    nodes: set[str] = set()
    for record in indexed.record.imports:
        target = indexed.absolute(record.module)
        if not record.names:
            if (record.alias or record.module.split(".")[0]) in names:
                nodes.add(target)
            continue
        for original, alias in record.names:
            if alias in names or original == "*":
                defining, symbol = index.resolve_symbol(target, original) if original != "*" else (target, None)
                nodes.update([defining, f"{defining}:{symbol}"] if symbol else [defining])
    return nodes


@dataclass
class Assessment:
    """Per upstream node whether its used definitions changed; the stable ones as boundaries; the
    rows of the `changes` view."""

    changes: list[Row] = field(default_factory=list)
    stable: list[Boundary] = field(default_factory=list)


def _uses(walk: Walk, edges: Iterable[Edge]) -> dict[str, _Use]:
    """What the path takes from each module: imported names (the starts' classes too), or all of it
    (imported as a module, or only run: a package `__init__`, a re-export passed through)."""
    names: dict[str, set[str]] = {}
    whole: set[str] = set()
    for edge in edges:
        if edge.branch == "not_taken" or edge.kind == "package_init" or edge.reexport:
            continue
        if edge.symbol:
            names.setdefault(edge.module, set()).add(edge.symbol)
        else:
            whole.add(edge.module)
    for row in walk.rows:
        module, _, symbol = row.name.partition(":")
        if row.depth == 0 and symbol:
            names.setdefault(module, set()).add(symbol)
    return {m: _Use(frozenset(names.get(m, ())), m in whole or m not in names) for m in names.keys() | whole}


def assess(
    code: Codebase, base: ModuleIndex | None, walk: Walk, edges: list[Edge], base_subject: Subject | None
) -> Assessment:
    """Judge every upstream and missing row (unknown without a base), mark the stable upstream
    modules as boundaries, and select the `changes` view."""
    attach_importers(walk, edges)
    uses, judge = _uses(walk, edges), _Judge(code, base) if base is not None else None
    assessment = Assessment()
    followed: dict[str, set[str] | None] = {}
    for row in walk.rows:
        if row.side not in ("upstream", "missing"):
            continue
        module, _, symbol = row.name.partition(":")
        use = uses.get(module, _Use(frozenset(), True))
        verdict = _judge_row(judge, base, row.side, module, symbol, use)
        row.stability = verdict.status
        if judge is not None:
            row.upstream_delta, row.stability_evidence = _grounds(verdict)
        if symbol or row.side != "upstream" or row.branch == "not_taken":
            continue
        if verdict.status == "stable":
            row.boundary = STABLE
            assessment.stable.append(_stable_boundary(code, base_subject, row, use, verdict))
        elif judge is not None:
            followed[module] = judge.followed(module, use)
    assessment.changes = changes_view(walk, edges, followed if judge is not None else None)
    return assessment


def _grounds(verdict: _Verdict) -> tuple[list[str], list[str]]:
    """(the relevant upstream delta: the used definitions that changed, what leaves the verdict
    unknown or, for a stable node, the unchanged names), each capped."""
    delta: list[str] = []
    unverified: list[str] = []
    unchanged: list[str] = []
    for entry in verdict.evidence:
        kind = entry.partition(":")[0]
        unknown = kind in UNVERIFIED or entry.endswith(": unknown")  # a base class that cannot be judged
        (unchanged if kind == "unchanged" else unverified if unknown else delta).append(entry)
    return _capped(delta), _capped(unchanged if verdict.status == "stable" else unverified)


def _capped(entries: list[str]) -> list[str]:
    more = len(entries) - EVIDENCE_SHOWN
    return entries[:EVIDENCE_SHOWN] + ([f"… {more} more"] if more > 0 else [])


def _judge_row(
    judge: _Judge | None, base: ModuleIndex | None, side: RowSide, module: str, symbol: str, use: _Use
) -> _Verdict:
    if judge is None or base is None:
        return _Verdict("unknown", [])
    if side == "missing":
        before = base.get(module)
        if before is None:
            return _Verdict("unknown", ["absent at target and in the upstream base"])
        return _Verdict("changed", [f"removed: {before.path} at base, absent at target"])
    return judge.name(module, symbol) if symbol else judge.module(module, use)


def _stable_boundary(code: Codebase, base: Subject | None, row: Row, use: _Use, verdict: _Verdict) -> Boundary:
    """The boundary a stable module makes: which used names, and where the first is at base and target."""
    names = sorted(use.names)
    more = f", … {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    shown = ", ".join(names[:NAMES_SHOWN]) + more
    used = "every definition (imported as a module)" if use.whole else shown
    evidence: list[Evidence] = []
    if verdict.lines and base is not None and row.file:
        rev = base.commit if isinstance(base, RevisionSubject) else base.sha(row.file)
        evidence = [
            code.evidence(row.name, verdict.lines[1]),
            code.evidence(row.name, verdict.lines[0]).model_copy(update={"rev": rev}),
        ]
    return Boundary(row.name, "upstream", f"{STABLE}: {used}", "stable_interface", row.file, evidence)


def changes_view(walk: Walk, edges: Iterable[Edge], followed: dict[str, set[str] | None] | None) -> list[Row]:
    """Plugin modules (and the plugin names the walk starts from), and the upstream or missing
    modules whose used definitions changed or cannot be verified, reached from the plugin through
    plugin modules and changed upstream ones (through
    what a changed module's used definitions import: `followed`, None for all of it); of their
    `module:Name` rows, those the plugin imports (deeper ones are named in their module's
    evidence). With no base (`followed` None) only what the plugin imports directly: nothing
    upstream can be verified. Branches not taken are left out unless the plugin owns them."""
    rows = {row.name: row for row in walk.rows}
    children: dict[str, list[str]] = {}
    for edge in edges:
        targets = [edge.module, f"{edge.module}:{edge.symbol}"] if edge.symbol else [edge.module]
        children.setdefault(edge.importer, []).extend(targets)
    queue = [r.name for r in walk.rows if r.depth == 0 or (r.side == "plugin" and ":" not in r.name)]
    seen: set[str] = set()
    kept: set[str] = set()
    while queue:
        name = queue.pop()
        row = rows.get(name)
        if row is None or name in seen:
            continue
        seen.add(name)
        judged = row.side in ("upstream", "missing") and row.stability != "stable" and row.branch != "not_taken"
        if row.side == "plugin" or (judged and (":" not in name or _plugin_imports(row, rows))):
            kept.add(name)
        if ":" in name or not (row.side == "plugin" or (judged and followed is not None and row.side == "upstream")):
            continue
        only = followed.get(name) if followed is not None else None
        queue.extend(child for child in children.get(name, ()) if only is None or child in only)
    modules = {row.name for row in walk.rows if ":" not in row.name}
    return [row for row in walk.rows if (row.side != "plugin" and row.name in kept) or _owned_shown(row, modules)]


def _owned_shown(row: Row, modules: set[str]) -> bool:
    """A plugin module, or a plugin `module:Name` the walk starts from or whose module it has no row
    for: the names the plugin imports from its own modules fold into those modules' rows."""
    if row.side != "plugin":
        return False
    return ":" not in row.name or row.depth == 0 or row.name.partition(":")[0] not in modules


def grouped(names: list[str]) -> list[str]:
    """Sorted dotted names with siblings folded into one entry (`a.b.{c,d}` for `a.b.c` and `a.b.d`),
    so a node imported from dozens of modules stays short."""
    siblings: dict[str, list[str]] = {}
    for name in names:
        parent, _, leaf = name.rpartition(".")
        siblings.setdefault(parent, []).append(leaf)
    return [
        (f"{parent}.{{{','.join(leaves)}}}" if len(leaves) > 1 else f"{parent}.{leaves[0]}") if parent else leaves[0]
        for parent, leaves in siblings.items()
    ]


def _plugin_imports(row: Row, rows: dict[str, Row]) -> bool:
    return any((importer := rows.get(name)) is not None and importer.side == "plugin" for name in row.importers)


def summarise(boundaries: list[Boundary], every_kind: bool = False) -> list[Boundary]:
    """The boundaries of the `changes` view: components and stable interfaces as one entry per kind
    and side (a count and the first names), the others each on its own; `every_kind` groups them all
    (a trace's summary)."""
    groups: dict[tuple[BoundaryKind, RowSide], list[Boundary]] = {}
    listed: list[Boundary] = []
    for boundary in boundaries:
        if every_kind or (boundary.kind in SUMMARISED and boundary.side != "missing"):
            groups.setdefault((boundary.kind, boundary.side), []).append(boundary)
        else:
            listed.append(boundary)
    summary = []
    for (kind, side), group in groups.items():
        if len(group) == 1:
            summary.append(group[0])
            continue
        names = [b.package for b in group]
        package = ", ".join(names[:SUMMARY_NAMES]) + (", …" if len(names) > SUMMARY_NAMES else "")
        reasons = {b.reason for b in group}
        if len(reasons) > 1:
            reasons = {b.reason.split(":")[0] for b in group}
        common = reasons.pop() if len(reasons) == 1 else "reasons differ"
        reason = f"{len(group)} boundaries; {common} (view=full lists each)"
        summary.append(Boundary(package, side, reason, kind, count=len(group)))
    return summary + listed
