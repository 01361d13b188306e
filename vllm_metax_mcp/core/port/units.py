"""A module (or a class body) as keyed units: the statements the structural merge matches across the
three versions, by what they define rather than where they stand.

Keys: `class:Name`, `def:name`, `assign:a,b` (simple and annotated assignments), `from:.mod` /
`import:mod` (import statements, by the module they read), `doc` (the docstring), and `stmt:<code>`
for anything else (an `if TYPE_CHECKING:` block, a call), keyed by its first line. A key met again in
the same body gets `#2`, `#3`. The local side's keys are read through the MetaX contract
(`contract.Contract.upstream_key`), so a renamed class or a swapped import meets its upstream unit.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import libcst as cst

UnitKind = Literal["doc", "import", "class", "function", "assign", "statement"]
Statement = cst.BaseStatement | cst.BaseSmallStatement


@dataclass(frozen=True)
class Unit:
    key: str
    kind: UnitKind
    node: cst.BaseStatement
    name: str
    """What it defines as spelled on its own side (a class or function name, the assigned names)."""

    @property
    def code(self) -> str:
        return render(self.node)

    @property
    def norm(self) -> str:
        return normalized(self.code)


def render(node: cst.CSTNode) -> str:
    """A statement's source, dedented to column 0, its leading comment lines included."""
    return cst.Module(body=[]).code_for_node(node)


def normalized(code: str) -> str:
    """The comparison form: trailing whitespace and blank lines do not make a change."""
    return "\n".join(line.rstrip() for line in code.splitlines() if line.strip())


def _dotted(node: cst.BaseExpression | None) -> str:
    if node is None:
        return ""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return render_expression(node)


def render_expression(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def import_module(small: cst.BaseSmallStatement) -> str | None:
    """The module an import statement reads, with its relative dots; None for other statements."""
    if isinstance(small, cst.ImportFrom):
        return "." * len(small.relative) + _dotted(small.module)
    if isinstance(small, cst.Import):
        return _dotted(small.names[0].name)
    return None


def _assigned(small: cst.BaseSmallStatement) -> list[str]:
    targets: list[cst.BaseExpression] = []
    if isinstance(small, cst.Assign):
        targets = [t.target for t in small.targets]
    elif isinstance(small, cst.AnnAssign):
        targets = [small.target]
    names: list[str] = []
    for target in targets:
        if isinstance(target, cst.Name):
            names.append(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            names += [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
        else:
            return []
    return names


def _classify(node: cst.BaseStatement, first: bool) -> tuple[UnitKind, str, str]:
    """(kind, key, the name it defines) of one statement, keyed by its own spelling."""
    if isinstance(node, cst.ClassDef):
        return "class", f"class:{node.name.value}", node.name.value
    if isinstance(node, cst.FunctionDef):
        return "function", f"def:{node.name.value}", node.name.value
    if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1:
        small = node.body[0]
        strings = (cst.SimpleString, cst.ConcatenatedString)
        if first and isinstance(small, cst.Expr) and isinstance(small.value, strings):
            return "doc", "doc", ""
        module = import_module(small)
        if module is not None:
            return "import", f"{'from' if isinstance(small, cst.ImportFrom) else 'import'}:{module}", module
        names = _assigned(small)
        if names:
            return "assign", "assign:" + ",".join(names), ",".join(names)
    head = normalized(render(node.with_changes(leading_lines=()))).split("\n", 1)[0]
    return "statement", f"stmt:{head}", ""


def split_units(body: Sequence[cst.BaseStatement], key_of: Callable[[Unit], str] | None = None) -> list[Unit]:
    """The units of a body in order; `key_of` re-keys one side (the local side through the contract)."""
    units: list[Unit] = []
    seen: Counter[str] = Counter()
    for position, node in enumerate(body):
        kind, key, name = _classify(node, position == 0)
        unit = Unit(key, kind, node, name)
        key = key_of(unit) if key_of else key
        seen[key] += 1
        units.append(Unit(key if seen[key] == 1 else f"{key}#{seen[key]}", kind, node, name))
    return units


MATCHED = 0.5
"""Least line similarity for a repeated unit to meet a base unit of the same key."""


def _group(key: str) -> str:
    return key.split("#", 1)[0]


def _similarity(a: Unit, b: Unit) -> float:
    return difflib.SequenceMatcher(None, a.norm.splitlines(), b.norm.splitlines(), autojunk=False).ratio()


def align(base: list[Unit], side: list[Unit], tag: str) -> list[Unit]:
    """A side's units re-keyed where a key repeats in a body (two `if envs.X:` blocks, overloads): each
    meets the base unit it is most like, not the one at its position; the rest are new (`#<tag>-N`)."""
    in_base: dict[str, list[Unit]] = {}
    for unit in base:
        in_base.setdefault(_group(unit.key), []).append(unit)
    in_side: dict[str, list[Unit]] = {}
    for unit in side:
        in_side.setdefault(_group(unit.key), []).append(unit)
    keys = {id(u): u.key for u in side}
    for group, members in in_side.items():
        bases = in_base.get(group, [])
        if len(members) < 2 and len(bases) < 2:
            continue
        scored = sorted(((_similarity(m, b), i, j) for i, m in enumerate(members) for j, b in enumerate(bases)),
                        reverse=True)  # fmt: skip
        taken_m: set[int] = set()
        taken_b: set[int] = set()
        for score, i, j in scored:
            if score >= MATCHED and i not in taken_m and j not in taken_b:
                keys[id(members[i])] = bases[j].key
                taken_m.add(i)
                taken_b.add(j)
        for i, member in enumerate(members):
            if i not in taken_m:
                keys[id(member)] = f"{group}#{tag}-{i + 1}"
    return [replace(u, key=keys[id(u)]) for u in side]


def class_body(node: cst.ClassDef) -> list[cst.BaseStatement]:
    body = node.body
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def class_shell(node: cst.ClassDef) -> str:
    """A class without its members (decorators, name, bases, keywords): what is merged beside them."""
    return render(node.with_changes(body=cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])])))


def parse_statement(code: str) -> cst.BaseStatement | None:
    """One statement parsed from dedented source (its leading comments kept on it); None where it does not
    parse as exactly one statement."""
    try:
        module = cst.parse_module(code)
        compile(code, "<unit>", "exec")  # what the compiler refuses too (a keyword given twice)
    except (cst.ParserSyntaxError, SyntaxError, ValueError):
        return None
    if len(module.body) != 1:
        return None
    node = module.body[0]
    return node.with_changes(leading_lines=[*module.header, *getattr(node, "leading_lines", ())])
