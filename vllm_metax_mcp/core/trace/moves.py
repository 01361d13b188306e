"""Where an upstream name the plugin uses went at the target, and the uses an import check misses.

A lost name gets candidates, never one chosen silently:

- `defined_elsewhere`: the same top-level name defined in another target module, ranked by how many
  of the names the plugin takes from the lost module it defines, the same kind of definition, the
  longest shared dotted prefix (the same package first), then the same module basename.
- `renamed`: a name the module (as imported, or where base defined it) gained since base whose
  words hold the lost name's words, a leading verb aside (`FusedMoE` -> `FusedMoEFactory`,
  `get_foo` -> `Foo` / `FooGetter`).
- `imported_from`: no upstream module defines it, but upstream modules now import it from a
  third-party package (`from transformers import X`).
- `submodule`: `from pkg import name` now lands on the module `pkg.name`, not the attribute base had.

Beside imports, a module attribute used through an imported upstream module (`layer.FusedMoE`)
is checked along its dotted chain at base and target (`chain_failure`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from ..code.codebase import Codebase, Lookup, Outcome, resolve_name
from ..code.dispatch import dotted
from ..code.module_index import Definition, IndexedModule, ModuleIndex, Side

MOVED_CANDIDATES = 3
LEADING_VERBS = frozenset({"get", "make", "create", "build", "init", "new"})
GUARD_ERRORS = frozenset({"AttributeError", "ImportError", "ModuleNotFoundError", "Exception", "BaseException"})

MoveKind = Literal["defined_elsewhere", "renamed", "imported_from", "submodule"]


@dataclass(frozen=True)
class Move:
    kind: MoveKind
    module: str
    name: str | None
    line: int
    what: str = ""
    """Kind of definition (class, function, assignment), or the importing module for `imported_from`."""


@dataclass(frozen=True)
class Moves:
    found: list[Move]
    total: int
    """Candidates of the first kind found, before the cut to MOVED_CANDIDATES."""

    @property
    def ambiguous(self) -> bool:
        return len([m for m in self.found if m.kind == self.found[0].kind]) > 1 if self.found else False


# -- where a name went -----------------------------------------------------------------------


def base_definition(base: ModuleIndex | None, module: str, name: str | None) -> tuple[IndexedModule, int] | None:
    """The module and line where base defined the name (line 1 for a module)."""
    if base is None:
        return None
    found = resolve_name(base.get, module, name)
    indexed = base.get(found.module)
    if indexed is None or found.outcome not in (Outcome.DEFINED, Outcome.MODULE):
        return None
    definition = indexed.record.definition(found.name) if found.outcome is Outcome.DEFINED and found.name else None
    return indexed, definition.line if definition else 1


def where_went(
    code: Codebase, base: ModuleIndex | None, module: str, name: str | None, siblings: Iterable[str], side: Side
) -> Moves:
    """Candidates for a lost `module:name` (or the whole module when name is None, or when base had a
    submodule by that name) at the target, among the modules of `side`; `siblings` are the other names
    the plugin takes from the same module."""
    if name is not None and base is not None and resolve_name(base.get, module, name).outcome is Outcome.MODULE:
        module, name = f"{module}.{name}", None
    before = base.get(module) if base else None
    if name is None:
        names = [d.name for d in before.record.definitions if not d.name.startswith("_")] if before else []
        return _definers(code.index, names, module, side, None, whole=True)
    at_base = base_definition(base, module, name)
    found = at_base[0].record.definition(name) if at_base else None
    names = [name, *(s for s in siblings if s != name)]
    defined = _definers(code.index, names, module, side, found.kind if found else None)
    if defined.found or side != "upstream":
        return defined
    renamed = _renamed(code, base, module, name)
    if renamed:
        return Moves(renamed[:MOVED_CANDIDATES], len(renamed))
    imported = _imported_from(code, name)
    return Moves(imported[:MOVED_CANDIDATES], len(imported))


def _definers(
    index: ModuleIndex, names: list[str], lost: str, side: Side, kind: str | None, whole: bool = False
) -> Moves:
    """Modules of `side` defining the first name (any of them, for a lost module: `whole`), best first;
    the other names rank the modules that define them too."""
    wanted = set(names)
    first = names[0] if names else None
    ranked: list[tuple[tuple[int, int, int, int], Move]] = []
    basename = lost.rsplit(".", 1)[-1]
    for indexed in index.side(side):
        if indexed.name == lost:
            continue
        hits = [d for d in indexed.record.definitions if d.name in wanted]
        lead = next((d for d in hits if d.name == first), hits[0] if whole and hits else None)
        if lead is None:
            continue
        score = (
            len({d.name for d in hits}),
            int(kind is not None and lead.kind == kind),
            _shared_prefix(indexed.name, lost),
            int(indexed.name.rsplit(".", 1)[-1] == basename),
        )
        move = (
            Move("defined_elsewhere", indexed.name, None, lead.line, f"{score[0]} of its {len(wanted)} names")
            if whole
            else Move("defined_elsewhere", indexed.name, lead.name, lead.line, lead.kind)
        )
        ranked.append((score, move))
    ranked.sort(key=lambda item: (tuple(-s for s in item[0]), item[1].module))
    return Moves([move for _, move in ranked[:MOVED_CANDIDATES]], len(ranked))


def _shared_prefix(a: str, b: str) -> int:
    count = 0
    for left, right in zip(a.split("."), b.split("."), strict=False):
        if left != right:
            break
        count += 1
    return count


def words(name: str) -> list[str]:
    """Lower-case words of a snake_case or CamelCase name."""
    return [w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", part)]


def _core(name: str) -> list[str]:
    found = words(name)
    return found[1:] if len(found) > 1 and found[0] in LEADING_VERBS else found


def _joined(name: str) -> tuple[str, set[int]]:
    """The core words run together, and the offsets where a word starts or ends."""
    text, bounds = "", {0}
    for word in _core(name):
        text += word
        bounds.add(len(text))
    return text, bounds


def similar(old: str, new: str) -> bool:
    """One name's words (a leading verb aside) run together appear in the other's, from a word start
    to a word end: `FusedMoE` / `FusedMoEFactory`, `get_foo` / `FooGetter`, `x_rmsnorm` / `XRMSNormKernel`."""
    if old == new:
        return False
    (a, a_bounds), (b, b_bounds) = _joined(old), _joined(new)
    short, (long, bounds) = (a, (b, b_bounds)) if len(a) <= len(b) else (b, (a, a_bounds))
    start = long.find(short) if short else -1
    while start != -1:
        if start in bounds and start + len(short) in bounds:
            return True
        start = long.find(short, start + 1)
    return False


def bound_names(indexed: IndexedModule) -> dict[str, int]:
    """Top-level names a module binds (definitions, guarded names, import aliases) and their lines."""
    names = {d.name: d.line for d in indexed.record.definitions}
    for record in indexed.record.imports:
        if record.branch in ("not_taken", "lazy"):
            continue
        for original, alias in record.names:
            if original != "*":
                names.setdefault(alias, record.line)
    for name in indexed.record.guarded_names:
        names.setdefault(name, 1)
    return names


def _renamed(code: Codebase, base: ModuleIndex | None, module: str, name: str) -> list[Move]:
    """Names the module gained since base that look like the lost one (only with a base)."""
    if base is None:
        return []
    at_base = base_definition(base, module, name)
    modules = [module, *([at_base[0].name] if at_base and at_base[0].name != module else [])]
    found: dict[tuple[str, str], Move] = {}
    for candidate in modules:
        now, before = code.get(candidate), base.get(candidate)
        if now is None:
            continue
        old = bound_names(before) if before else {}
        for new, line in bound_names(now).items():
            if new in old or not similar(name, new):
                continue
            resolved = code.resolve(candidate, new)
            defining = code.get(resolved.module) if resolved.outcome is Outcome.DEFINED else None
            definition = defining.record.definition(resolved.name or new) if defining else None
            if defining is not None and definition is not None:
                found.setdefault((defining.name, definition.name), _renamed_to(defining.name, definition))
            else:
                found.setdefault((candidate, new), Move("renamed", candidate, new, line, "import"))
    return sorted(found.values(), key=_rename_rank)


def _renamed_to(module: str, definition: Definition) -> Move:
    return Move("renamed", module, definition.name, definition.line, definition.kind)


def _rename_rank(move: Move) -> tuple[bool, bool, str, str]:
    """Public names first, then classes and functions, then by place."""
    name = move.name or ""
    return name.startswith("_"), move.what not in ("class", "function"), move.module, name


def _imported_from(code: Codebase, name: str) -> list[Move]:
    """Third-party packages upstream modules import the name from (first importer of each)."""
    sources: dict[str, Move] = {}
    for indexed in code.index.side("upstream"):
        for record in indexed.record.imports:
            target = indexed.absolute(record.module)
            if target.split(".")[0] in code.first_party or record.branch == "not_taken":
                continue
            if any(original == name for original, _ in record.names) and target not in sources:
                sources[target] = Move("imported_from", target, name, record.line, indexed.name)
    return sorted(sources.values(), key=lambda m: m.module)


# -- attribute chains ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainBreak:
    module: str
    """The module the chain reaches before the part that fails."""
    name: str
    outcome: Outcome
    at: int
    """Parts of the chain up to and including the one that fails."""


def chain_failure(lookup: Lookup, module: str, parts: tuple[str, ...]) -> ChainBreak | None:
    """The first part of `module.parts` that does not resolve; attributes of a defined name are not followed."""
    current = module
    for at, part in enumerate(parts, 1):
        found = resolve_name(lookup, current, part)
        if found.outcome is Outcome.MODULE:
            current = found.module
            continue
        return None if found.ok else ChainBreak(current, part, found.outcome, at)
    return None


@dataclass(frozen=True)
class AttributeUse:
    expression: str
    line: int


def attribute_uses(tree: ast.Module, roots: set[str]) -> list[AttributeUse]:
    """Dotted loads `root.a.b` of the given root names, outside hasattr / except-AttributeError guards.

    Roots rebound anywhere in the module (an argument, an assignment) are dropped: their uses may
    not be the import's.
    """
    rebound = _rebound(tree)
    live = roots - rebound
    return list(_uses(tree, live, False)) if live else []


def _rebound(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _uses(node: ast.AST, roots: set[str], guarded: bool) -> Iterator[AttributeUse]:
    if isinstance(node, ast.Attribute):
        written = dotted(node)
        if written is not None:
            if not guarded and isinstance(node.ctx, ast.Load) and written.split(".")[0] in roots:
                yield AttributeUse(written, node.lineno)
            return
    if isinstance(node, ast.Try):
        guards = any(_catches(handler.type) for handler in node.handlers)
        for statement in node.body:
            yield from _uses(statement, roots, guarded or guards)
        for other in [*node.handlers, *node.orelse, *node.finalbody]:
            yield from _uses(other, roots, guarded)
        return
    if isinstance(node, (ast.If, ast.IfExp)) and _tests_hasattr(node.test):
        body: list[ast.AST] = list(node.body) if isinstance(node.body, list) else [node.body]
        orelse: list[ast.AST] = list(node.orelse) if isinstance(node.orelse, list) else [node.orelse]
        yield from _uses(node.test, roots, guarded)
        for inner in body:
            yield from _uses(inner, roots, True)
        for inner in orelse:
            yield from _uses(inner, roots, guarded)
        return
    for child in ast.iter_child_nodes(node):
        yield from _uses(child, roots, guarded)


def _catches(kind: ast.expr | None) -> bool:
    if kind is None:
        return True
    names = [dotted(e) for e in kind.elts] if isinstance(kind, ast.Tuple) else [dotted(kind)]
    return any(n is not None and n.rsplit(".", 1)[-1] in GUARD_ERRORS for n in names)


def _tests_hasattr(test: ast.expr) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "hasattr" for n in ast.walk(test)
    )
