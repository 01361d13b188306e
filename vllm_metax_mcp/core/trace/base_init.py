"""`skipped_base_init` defects: a subclass whose `__init__` calls another class's `__init__` instead
of its base's, while methods it inherits from that base read attributes only the base's `__init__`
sets (they would fail with AttributeError at run time).
"""

from __future__ import annotations

import ast

from ..code.codebase import Codebase, Ref
from ..code.dispatch import dotted
from .defects import Defect


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


def _methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {item.name: item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _class_level(node: ast.ClassDef) -> set[str]:
    names = set(_methods(node))
    for item in node.body:
        targets = (
            item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _class_node(code: Codebase, ref: Ref) -> ast.ClassDef | None:
    tree = code.tree(ref.module)
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ref.path[0]), None) if tree else None


def _skipping_call(code: Codebase, module: str, init: ast.AST, base: Ref) -> ast.Call | None:
    """A call in `__init__` to another class's `__init__` (or `super(Base, self)`), none to the base's."""
    skipping = None
    for call in ast.walk(init):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"):
            continue
        owner = call.func.value
        if isinstance(owner, ast.Call) and dotted(owner.func) == "super":
            first = dotted(owner.args[0]) if owner.args else None
            bound = code.bind(module, first) if first else None
            if bound is None or bound != base:
                return None
            skipping = call
            continue
        name = dotted(owner)
        bound = code.bind(module, name) if name else None
        if bound == base:
            return None
        skipping = skipping or call
    return skipping


def _unset_reads(node: ast.ClassDef, base_node: ast.ClassDef) -> dict[str, tuple[str, int]]:
    """Attributes the methods `node` inherits from `base_node` read and only the base's `__init__`
    sets: attribute -> (method, line of the first read)."""
    set_by_base = _self_attributes(_methods(base_node)["__init__"], ast.Store)
    set_here = set(_self_attributes(node, ast.Store)) | _class_level(node) | _class_level(base_node)
    reads: dict[str, tuple[str, int]] = {}
    for method, body in _methods(base_node).items():
        if method == "__init__" or method in _methods(node):
            continue
        for attr, line in _self_attributes(body, ast.Load).items():
            if attr in set_by_base and attr not in set_here:
                reads.setdefault(attr, (method, line))
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
        name = dotted(node.bases[0])
        base = code.bind(module, name) if name else None
        base_node = _class_node(code, base) if base is not None and len(base.path) == 1 else None
        if base is None or base_node is None or "__init__" not in _methods(base_node):
            continue
        call = _skipping_call(code, module, _methods(node)["__init__"], base)
        if call is None:
            continue
        reads = _unset_reads(node, base_node)
        if not reads:
            continue
        shown = ", ".join(f"self.{a}" for a in sorted(reads))
        methods = ", ".join(sorted({m for m, _ in reads.values()}))
        _, first_line = min(reads.values(), key=lambda r: r[1])
        defects.append(
            Defect(
                "skipped_base_init",
                indexed.path,
                call.lineno,
                f"{node.name}.__init__ calls {ast.unparse(call.func)} instead of {base.symbol}.__init__; "
                f"inherited methods read {len(reads)} attribute(s) only that __init__ sets: {shown} (in {methods})",
                [
                    code.evidence(module, call.lineno),
                    code.evidence(base.module, _methods(base_node)["__init__"].lineno),
                    code.evidence(base.module, first_line),
                ],
                f"{module}:{node.name}",
            )
        )
    return defects
