"""`skipped_base_init` defects: a subclass whose `__init__` does not run its base's `__init__`
(it calls another class's, `super(<the base or higher>, self)`'s, or none), while methods it
inherits read attributes only that `__init__` sets (they would fail with AttributeError at run time).

The base is the first one listed, resolved through re-exports; its `__init__` may be inherited from
a class further up, and the inherited methods are those of every class up the base's chain that
the subclass does not override. Attributes the subclass sets anywhere, class-level names, what the
`__init__` it does call sets, and attributes other methods up the chain set are not counted.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..code.codebase import Codebase, Outcome
from ..code.dispatch import dotted
from .defects import Defect
from .inherited import linearization

MAX_CHAIN = 8

Method = ast.FunctionDef | ast.AsyncFunctionDef


def _self_attributes(node: ast.AST, ctx: type) -> dict[str, int]:
    found: dict[str, int] = {}
    for child in ast.walk(node):
        if (
            isinstance(child, ast.Attribute)
            and isinstance(child.ctx, ctx)
            and isinstance(child.value, ast.Name)
            and child.value.id == "self"
        ):
            found.setdefault(child.attr, child.lineno)
    return found


def _methods(node: ast.ClassDef) -> dict[str, Method]:
    return {item.name: item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _class_level(node: ast.ClassDef) -> set[str]:
    names = set(_methods(node))
    for item in node.body:
        targets = (
            item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@dataclass(frozen=True)
class _Base:
    """A class up the chain: where it is defined and its syntax tree."""

    module: str
    node: ast.ClassDef

    @property
    def symbol(self) -> str:
        return f"{self.module}:{self.node.name}"


def _class(code: Codebase, module: str, name: str) -> _Base | None:
    tree = code.tree(module)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None
    return _Base(module, node) if node else None


def _resolve(code: Codebase, module: str, expression: str | None) -> _Base | None:
    """The class `expression` written in `module` names, at its defining module (through re-exports)."""
    ref = code.bind(module, expression.split("[")[0]) if expression else None
    if ref is None or len(ref.path) != 1:
        return None
    found = code.resolve(ref.module, ref.path[0])
    return _class(code, found.module, found.name or ref.path[0]) if found.outcome is Outcome.DEFINED else None


def _chain(code: Codebase, base: _Base) -> list[_Base]:
    """`base` and the classes above it through their first bases (the `__init__` path)."""
    chain = [base]
    while len(chain) < MAX_CHAIN and chain[-1].node.bases:
        above = _resolve(code, chain[-1].module, dotted(chain[-1].node.bases[0]))
        if above is None or any(c.symbol == above.symbol for c in chain):
            break
        chain.append(above)
    return chain


Reads = dict[str, tuple[_Base, str, int]]
"""Attribute -> (class of the method that reads it, the method, line of the first read)."""


def _init_calls(code: Codebase, module: str, init: Method) -> list[tuple[ast.Call, str | None, bool]]:
    """`X.__init__(self, ...)` and `super(...).__init__(...)` calls: (call, the class named, via super).
    A bare `super()` has no class; a direct call of a class the index does not know, its text."""
    found = []
    for call in ast.walk(init):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"):
            continue
        owner = call.func.value
        if isinstance(owner, ast.Call) and dotted(owner.func) == "super":
            named = _resolve(code, module, dotted(owner.args[0])) if owner.args else None
            found.append((call, named.symbol if named else None, True))
        else:
            named = _resolve(code, module, dotted(owner))
            found.append((call, named.symbol if named else ast.unparse(owner), False))
    return found


def _skipping(code: Codebase, module: str, node: ast.ClassDef, chain: list[_Base], owner: int) -> ast.AST | None:
    """The call that runs another `__init__` than `chain[owner]`'s (or the `__init__` itself when it
    calls none); None when that `__init__` runs, or when a `super(X, self)` call cannot be decided."""
    runs = {c.symbol for c in chain[: owner + 1]}
    above = {c.symbol for c in chain[owner:]}
    calls = _init_calls(code, module, _methods(node)["__init__"])
    for _, symbol, via_super in calls:
        if (via_super and symbol not in above) or (not via_super and symbol in runs):
            return None
    return calls[0][0] if calls else _methods(node)["__init__"]


def _called(code: Codebase, module: str, skip: ast.AST, chain: list[_Base]) -> _Base | None:
    """The class whose `__init__` the skipping call runs instead, when the index knows it."""
    if not (isinstance(skip, ast.Call) and isinstance(skip.func, ast.Attribute)):
        return None
    owner = skip.func.value
    if isinstance(owner, ast.Call) and owner.args:
        named = _resolve(code, module, dotted(owner.args[0]))
        after = [i + 1 for i, c in enumerate(chain) if named and c.symbol == named.symbol]
        return chain[after[0]] if after and after[0] < len(chain) else None
    return _resolve(code, module, dotted(owner))


def _inits(code: Codebase, start: _Base | None) -> set[str]:
    """Attributes the `__init__`s of `start` and the classes above it set (what calling it sets)."""
    found: set[str] = set()
    for klass in _chain(code, start) if start else []:
        if "__init__" in _methods(klass.node):
            found |= set(_self_attributes(_methods(klass.node)["__init__"], ast.Store))
    return found


def _unset_reads(code: Codebase, me: _Base, chain: list[_Base], owner: int, called: _Base | None) -> Reads:
    """Attributes the methods the class inherits (the first definer in its MRO, when that is a class
    of the base's chain) read and only `chain[owner]`'s `__init__` sets: attribute -> (class of the
    method, method, line of the first read)."""
    set_by_base = _self_attributes(_methods(chain[owner].node)["__init__"], ast.Store)
    symbols = linearization(code, me.module, me.node.name) or [me.symbol, *(c.symbol for c in chain)]
    mro = [k for s in symbols if (k := _class(code, *s.partition(":")[::2]))]
    set_elsewhere = _inits(code, called)
    inherited: list[tuple[_Base, str, Method]] = []
    seen: set[str] = set()
    for klass in mro:
        set_elsewhere |= _class_level(klass.node)
        for name, method in _methods(klass.node).items():
            if name in seen:
                continue
            seen.add(name)
            if klass.symbol == me.symbol:
                set_elsewhere |= set(_self_attributes(method, ast.Store))
            elif name != "__init__":
                set_elsewhere |= set(_self_attributes(method, ast.Store))
                inherited += [(klass, name, method)] if any(c.symbol == klass.symbol for c in chain) else []
    reads: Reads = {}
    for klass, name, method in inherited:
        for attr, line in _self_attributes(method, ast.Load).items():
            if attr in set_by_base and attr not in set_elsewhere:
                reads.setdefault(attr, (klass, name, line))
    return reads


def skipped_base_init(code: Codebase, module: str) -> list[Defect]:
    """Classes of `module` whose `__init__` skips its base's, where inherited methods then read
    attributes only that `__init__` sets."""
    tree = code.tree(module)
    indexed = code.get(module)
    if tree is None or indexed is None:
        return []
    defects = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or "__init__" not in _methods(node) or not node.bases:
            continue
        base = _resolve(code, module, dotted(node.bases[0]))
        chain = _chain(code, base) if base else []
        owner = next((i for i, c in enumerate(chain) if "__init__" in _methods(c.node)), None)
        if owner is None:
            continue
        skip = _skipping(code, module, node, chain, owner)
        if skip is None:
            continue
        reads = _unset_reads(code, _Base(module, node), chain, owner, _called(code, module, skip, chain))
        if reads:
            defects.append(_defect(code, module, indexed.path, node, chain[owner], skip, reads))
    return defects


def _defect(
    code: Codebase, module: str, path: str, node: ast.ClassDef, base: _Base, skip: ast.AST, reads: Reads
) -> Defect:
    shown = ", ".join(f"self.{a}" for a in sorted(reads))
    methods = ", ".join(sorted({m for _, m, _ in reads.values()}))
    klass, _, first_line = min(reads.values(), key=lambda r: (r[0].symbol != base.symbol, r[2]))
    line = getattr(skip, "lineno", node.lineno)
    how = f"calls {ast.unparse(skip.func)}" if isinstance(skip, ast.Call) else "never calls an __init__"
    return Defect(
        "skipped_base_init",
        path,
        line,
        f"{node.name}.__init__ {how} instead of {base.symbol}.__init__; "
        f"inherited methods read {len(reads)} attribute(s) only that __init__ sets: {shown} (in {methods})",
        [
            code.evidence(module, line),
            code.evidence(base.module, _methods(base.node)["__init__"].lineno),
            code.evidence(klass.module, first_line),
        ],
        f"{module}:{node.name}",
    )
