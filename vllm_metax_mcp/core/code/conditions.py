"""Conditions under which plugin code runs, from the guards (`if` tests, `except` clauses) around it.

A guard is the `and`-joined text the scanners render (`x and not (y)`); `conditions` splits it into
(test, value) pairs, drops those the literal values of a function's parameters decide (or says the
code never runs), and drops the `not (m == 'a')` an elif chain's `m == 'b'` implies. A unit's
condition is a set of terms, the alternatives of its ways there, each a set of pairs that hold
together; `simplify` merges `X and A` with `X and not A` into `X`, so code reached from every
branch of an `if`/`elif`/`else` has no condition. Tests are opaque text: nothing is evaluated
beyond literals.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

MAX_TERMS = 6
"""Alternatives kept per unit (the shortest)."""
GUARD_CHARS = 100
TERM_CHARS = 240

Cond = tuple[str, bool]
"""One condition a guard tests (its source text) and the value it must have."""
Term = frozenset[Cond]
"""Conditions that hold together on one way to a unit; a unit's condition is a set of terms (any)."""


def conditions(guard: str | None, binding: Mapping[str, Any]) -> list[Cond] | None:
    """The conditions an edge's guard adds, without those the binding decides; None: it never runs.

    Guards are `and`-joined renderings (`x and not (y)`, with `try` markers); a part that does not
    parse is a condition as written."""
    if guard is None:
        return []
    whole = _parse(guard)
    parts: list[ast.expr | str]
    if whole is None:
        parts = [_parse(p) or p for p in guard.split(" and ")]
    else:
        parts = list(whole.values) if isinstance(whole, ast.BoolOp) and isinstance(whole.op, ast.And) else [whole]
    found: list[Cond] = []
    for part in parts:
        if isinstance(part, str):
            found.append((part, True))
            continue
        value = _truth(part, binding)
        if value is False:
            return None
        if value is None:
            holds = True
            while isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
                part, holds = part.operand, not holds
            found.append((ast.unparse(part), holds))
    return _implied(found)


def _implied(found: list[Cond]) -> list[Cond]:
    """Without the `not (x == a)` / `not (x in (...))` an `x == b` on the same way implies (elif chains)."""
    equal = {}
    for text, holds in found:
        node = _parse(text)
        right = node.comparators[0] if isinstance(node, ast.Compare) else None
        if (
            holds
            and isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.Eq)
            and isinstance(right, ast.Constant)
        ):
            equal[ast.unparse(node.left)] = right.value
    kept = []
    for text, holds in found:
        node = _parse(text) if not holds else None
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and ast.unparse(node.left) in equal:
            value, right = equal[ast.unparse(node.left)], node.comparators[0]
            if isinstance(node.ops[0], ast.Eq) and isinstance(right, ast.Constant) and right.value != value:
                continue
            if (
                isinstance(node.ops[0], ast.In)
                and isinstance(right, ast.Tuple)
                and all(isinstance(e, ast.Constant) and e.value != value for e in right.elts)
            ):
                continue
        kept.append((text, holds))
    return kept


def simplify(terms: set[Term]) -> set[Term]:
    """Drop contradictory and absorbed terms, merge `X and A` with `X and not A` into `X`, keep
    the shortest MAX_TERMS (so an if/elif/else whose every branch leads here is no condition)."""
    terms = {t for t in terms if not any((c, not v) in t for c, v in t)}
    merged = True
    while merged:
        merged = False
        for term in sorted(terms, key=len):
            twins = [(c, v) for c, v in term if (term - {(c, v)}) | {(c, not v)} in terms]
            if twins:
                c, v = twins[0]
                terms = (terms - {term, (term - {(c, v)}) | {(c, not v)}}) | {term - {(c, v)}}
                merged = True
                break
    kept = [t for t in terms if not any(o < t for o in terms)]
    return set(sorted(kept, key=lambda t: (len(t), sorted(t)))[:MAX_TERMS])


def render(term: Term) -> str:
    text = " and ".join(c[:GUARD_CHARS] if v else f"not ({c[:GUARD_CHARS]})" for c, v in sorted(term))
    return text if len(text) <= TERM_CHARS else text[: TERM_CHARS - 1] + "…"


def _parse(text: str) -> ast.expr | None:
    try:
        return ast.parse(text, mode="eval").body
    except SyntaxError:
        return None


def _truth(node: ast.expr, binding: Mapping[str, Any]) -> bool | None:
    if isinstance(node, ast.Name):
        return bool(binding[node.id]) if node.id in binding else None
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _truth(node.operand, binding)
        return None if inner is None else not inner
    if isinstance(node, ast.BoolOp):
        values = [_truth(v, binding) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in values else (True if all(v is True for v in values) else None)
        return True if True in values else (False if all(v is False for v in values) else None)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name):
        right = node.comparators[0]
        if node.left.id in binding and isinstance(right, ast.Constant):
            left, op = binding[node.left.id], node.ops[0]
            if isinstance(op, (ast.Eq, ast.Is)):
                return bool(left == right.value)
            if isinstance(op, (ast.NotEq, ast.IsNot)):
                return bool(left != right.value)
    return None
