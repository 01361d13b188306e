"""The dependency walk: from a registered architecture through imports, re-exports and class
bases to the boundaries (stdlib, third-party, compiled), and the reverse walk to consumers."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..code.module_index import ModuleIndex

STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
BRANCH_STRENGTH = {"not_taken": 0, "conditional": 1, "lazy": 2, "taken": 3}


@dataclass
class Row:
    name: str
    file: str | None
    side: str
    reached_from: str | None
    guard: str | None = None
    branch: str = "taken"
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


def classify(index: ModuleIndex, module: str, first_party: frozenset[str]) -> tuple[str, str | None]:
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


def walk_dependencies(
    index: ModuleIndex,
    starts: list[tuple[str, str | None]],
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
    stop = stop or {}
    walk = Walk()
    rows: dict[str, Row] = {}
    skipped: dict[str, Row] = {}
    queue: deque[tuple[str, str | None, int, str | None, str | None, str]] = deque(
        (module, symbol, 0, None, None, "taken") for module, symbol in starts
    )
    symbols: list[Row] = []

    def add(row: Row) -> bool:
        """Record a row once; a later, stronger path (taken over conditional) upgrades its branch."""
        existing = rows.get(row.name)
        if existing is not None:
            if BRANCH_STRENGTH[row.branch] > BRANCH_STRENGTH[existing.branch]:
                existing.branch, existing.guard = row.branch, row.guard
            return False
        if len(rows) >= max_rows:
            walk.truncated = True
            return False
        rows[row.name] = row
        return True

    while queue:
        module, symbol, depth, reached_from, guard, branch = queue.popleft()
        side, boundary = classify(index, module, first_party)
        indexed = index.get(module)
        if symbol:
            symbols.append(
                Row(
                    f"{module}:{symbol}",
                    indexed.path if indexed else None,
                    side,
                    reached_from,
                    guard,
                    branch,
                    None,
                    depth,
                )
            )
        if depth and module in stop:
            boundary = stop[module]
        fresh = add(Row(module, indexed.path if indexed else None, side, reached_from, guard, branch, boundary, depth))
        if not fresh or indexed is None or depth >= max_depth or (depth and module in stop):
            continue
        for record in indexed.record.imports:
            target = indexed.absolute(record.module)
            if record.branch == "not_taken":
                side_of_target = classify(index, target, first_party)[0]
                skipped.setdefault(
                    target,
                    Row(
                        target, _path(index, target), side_of_target, module, record.guard, "not_taken", None, depth + 1
                    ),
                )
                continue
            if not record.names:
                queue.append((target, None, depth + 1, module, record.guard, record.branch))
                continue
            for original, _alias in record.names:
                if original == "*":
                    queue.append((target, None, depth + 1, module, record.guard, record.branch))
                    continue
                defining, name = index.resolve_symbol(target, original)
                queue.append((defining, name or None, depth + 1, module, record.guard, record.branch))
    for row in symbols:
        module = row.name.split(":")[0]
        indexed = index.get(module)
        if indexed is not None and indexed.record.definition(row.name.split(":")[1]) is None:
            row.boundary = "name not defined in the module (dynamic or star import)"
        add(row)
    for name, row in skipped.items():
        if name not in rows:
            add(row)
    walk.rows = list(rows.values())
    return walk


def _path(index: ModuleIndex, module: str) -> str | None:
    indexed = index.get(module)
    return indexed.path if indexed else None


def consumers(index: ModuleIndex, module: str, symbol: str | None, max_depth: int, max_rows: int) -> Walk:
    """Every module that imports `module` (or `module:symbol`, through re-exports), transitively."""
    walk = Walk()
    targets = {(module, symbol)}
    seen: set[str] = set()
    frontier = [(module, symbol)]
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
        frontier = next_frontier
        if not frontier:
            break
    return walk
