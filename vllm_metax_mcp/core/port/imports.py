"""Import statements in the merge: names merged when both sides changed one `from m import ...`, and a
removed-upstream import split per name (each kept only where the output still uses it)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import libcst as cst

from .contract import bound_names
from .units import Unit, import_module, parse_statement, render


def one_module_moved(base: cst.BaseStatement, local: Unit, target: Unit) -> bool:
    """At most one side reads the names from another module (both moving them is a conflict)."""
    b, lo, t = _from_import(base), _from_import(local.node), _from_import(target.node)
    if b is None or lo is None or t is None:
        return False
    return import_module(lo) == import_module(b) or import_module(t) in (import_module(b), import_module(lo))


def _from_import(node: cst.BaseStatement | None) -> cst.ImportFrom | None:
    if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
        small = node.body[0]
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
            return small
    return None


def _aliases(small: cst.ImportFrom) -> dict[str, cst.ImportAlias]:
    """`name` or `name as alias` -> the alias node, in order."""
    assert not isinstance(small.names, cst.ImportStar)
    return {render(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip(): a for a in small.names}


def split_import(unit: Unit, names: list[str]) -> Iterator[tuple[cst.BaseStatement, list[str]]]:
    """A removed-upstream import as one statement per name (each kept only if used); other units whole."""
    small = _from_import(unit.node)
    if small is None or unit.kind != "import" or len(_aliases(small)) < 2:
        yield unit.node, names
        return
    module = import_module(small)
    for spelled in _aliases(small):
        node = parse_statement(f"from {module} import {spelled}\n")
        if node is not None:
            yield node, bound_names(node)


def merge_import_names(
    base: cst.BaseStatement, local: cst.BaseStatement, target: cst.BaseStatement
) -> cst.BaseStatement | None:
    """Both sides changed one `from m import ...`: the target's names, plus the local additions, less the
    local removals; the module is the local one where the local file moved it."""
    b, lo, t = _from_import(base), _from_import(local), _from_import(target)
    if b is None or lo is None or t is None:
        return None
    in_base, in_local = _aliases(b), _aliases(lo)
    names = [n for n in _aliases(t) if n in in_local or n not in in_base]
    names += [n for n in in_local if n not in in_base and n not in names]
    if not names:
        return None
    module = import_module(lo) if import_module(lo) != import_module(b) else import_module(t)
    line = f"from {module} import {', '.join(names)}\n"
    if len(line) > 100:
        line = f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")\n"
    parsed = parse_statement(line)
    return parsed.with_changes(leading_lines=_leading(target)) if parsed else None


def _leading(node: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    lines: Sequence[cst.EmptyLine] = getattr(node, "leading_lines", ())
    return lines
