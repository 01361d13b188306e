"""Which branch of import-time dispatch code an out-of-tree platform takes.

Upstream picks per-platform implementations with `if current_platform.is_rocm(): … elif …`.
An out-of-tree platform such as MetaX answers no to every `is_*` predicate, so it takes the
final branch. Conditions are evaluated on the AST with three-valued logic: a condition the
evaluator cannot decide (an environment flag, a capability check) stays unknown, and both of
its branches are conditional rather than guessed.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

Answer = bool | None

UNKNOWN: Answer = None
OUT_OF_TREE_FACTS = {"is_out_of_tree": True}
"""The one predicate an out-of-tree platform answers yes to; every other `is_*` is no."""


_FIELDS: dict[type, tuple[str, ...]] = {}


def walk_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node under `tree`, in `ast.walk`'s order, at a fraction of its cost (no generator per
    node; each node type's fields looked up once). For scans over a whole tree's files."""
    queue: list[object] = [tree]
    append, extend = queue.append, queue.extend
    for current in queue:
        kind = current.__class__
        fields = _FIELDS.get(kind)
        if fields is None:
            fields = _FIELDS[kind] = getattr(kind, "_fields", ()) if issubclass(kind, ast.AST) else ()
        for name in fields:
            value = getattr(current, name, None)
            if value.__class__ is list:
                extend(value)
            elif isinstance(value, ast.AST):
                append(value)
    return [node for node in queue if isinstance(node, ast.AST)]


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for Name/Attribute chains, None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def platform_predicate(node: ast.AST) -> str | None:
    """The predicate name of `<something>platform.is_x()` calls (e.g. `is_rocm`), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    receiver = dotted(node.func.value)
    if receiver is None or not receiver.split(".")[-1].endswith("platform"):
        return None
    return node.func.attr


def evaluate(test: ast.AST, answers: Mapping[str, bool] | None = None) -> Answer:
    """Evaluate an `if` test for an out-of-tree platform: `is_*` predicates are False unless
    `answers` says otherwise; TYPE_CHECKING is False at run time; everything else is unknown."""
    answers = {**OUT_OF_TREE_FACTS, **(answers or {})}
    predicate = platform_predicate(test)
    if predicate is not None:
        if predicate in answers:
            return answers[predicate]
        return False if predicate.startswith("is_") else UNKNOWN
    if isinstance(test, ast.Constant) and isinstance(test.value, bool):
        return test.value
    name = dotted(test)
    if name is not None and name.split(".")[-1] == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = evaluate(test.operand, answers)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [evaluate(v, answers) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    return UNKNOWN
