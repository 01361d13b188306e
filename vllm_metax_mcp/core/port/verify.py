"""The checks a ported file passes before it is called done, each independent of the merge's own
bookkeeping: it parses; its imports resolve against the target upstream tree, the plugin and the other
ported files; against the target (contract applied) it differs only in units the merge accounts for;
and no change is lost — every line the local side added or changed (against the contracted base) and
every line upstream added or changed is in the output or in a conflict record.
"""

from __future__ import annotations

import ast
import builtins
import difflib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import libcst as cst

from .merge import FileMerge
from .units import Unit, class_body, normalized, render, split_units

MAX_LISTED = 20
ACCOUNTING = {"kept", "merged", "conflict", "added_local", "kept_removed", "removed_local", "upstream_only", "restored"}
"""Decisions under which the output may differ from the target."""
Resolve = Callable[[str, str], str | None]
"""(module, name) -> why `from module import name` does not resolve; None where it does or is not checked."""


@dataclass
class Verification:
    parses: bool
    error: str | None = None
    imports_checked: int = 0
    external: int = 0
    """Imports of modules outside upstream vLLM and the plugin (not checked)."""
    unresolved: list[str] = field(default_factory=list)
    used_before_bound: list[str] = field(default_factory=list)
    undefined: list[str] = field(default_factory=list)
    """Names read that nothing in the module binds (no builtin, no import, no assignment anywhere)."""
    """Names the module reads while it loads (bases, decorators, top-level values) above their binding."""
    unaccounted: list[str] = field(default_factory=list)
    lost_local: list[str] = field(default_factory=list)
    lost_upstream: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        problems = [self.unresolved, self.used_before_bound, self.undefined, self.unaccounted, self.lost_local]
        problems.append(self.lost_upstream)
        return self.parses and not any(problems)


def _absolute(module: str, level: int, own: str, is_package: bool) -> str:
    if not level:
        return module
    package = own.split(".") if is_package else own.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def check_imports(
    tree: ast.Module, own: str, is_package: bool, checked: Iterable[str], resolve: Resolve, result: Verification
) -> None:
    """Every import of a module under `checked` packages resolves (module and name)."""
    roots = set(checked)
    for node in ast.walk(tree):
        wanted: list[tuple[str, str]] = []
        if isinstance(node, ast.ImportFrom):
            module = _absolute(node.module or "", node.level, own, is_package)
            wanted = [(module, alias.name) for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Import):
            wanted = [(alias.name, "") for alias in node.names]
        for module, name in wanted:
            if module.split(".")[0] not in roots:
                result.external += 1
                continue
            result.imports_checked += 1
            why = resolve(module, name)
            if why and len(result.unresolved) < MAX_LISTED:
                result.unresolved.append(f"line {getattr(node, 'lineno', 0)}: {why}")


def _code(node: cst.BaseStatement) -> str:
    """A statement without the comment lines above it (where conflict markers of a neighbour land)."""
    return normalized(render(node.with_changes(leading_lines=()) if hasattr(node, "leading_lines") else node))


def _bound_by(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _read_on_load(node: ast.stmt) -> list[ast.expr]:
    """The expressions a top-level statement evaluates when the module loads (function bodies do not)."""
    if isinstance(node, ast.ClassDef):
        return [*node.bases, *(k.value for k in node.keywords), *node.decorator_list]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)):
        return [node.value]
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [node.value]
    return []


def check_order(tree: ast.Module, result: Verification) -> None:
    """A name read at load time above the statement that binds it (e.g. an import placed after the class
    that extends what it imports) fails on import."""
    later: dict[str, int] = {}
    for node in tree.body:
        for name in _bound_by(node):
            later.setdefault(name, node.lineno)
    bound: set[str] = set()
    for node in tree.body:
        for expr in _read_on_load(node):
            for name in (n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)):
                if (
                    name not in bound
                    and later.get(name, 0) > node.lineno
                    and len(result.used_before_bound) < MAX_LISTED
                ):
                    result.used_before_bound.append(f"line {node.lineno}: {name} (bound at line {later[name]})")
        bound |= _bound_by(node)


MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__path__", "__package__", "__loader__", "__builtins__"}


def _binds(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return {node.id}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.arg):
        return {node.arg}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return set(node.names)
    name = getattr(node, "name", None) if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) else None
    return {name} if isinstance(name, str) else set()


def check_undefined(tree: ast.Module, result: Verification) -> None:
    """Names read that nothing binds anywhere in the module (scopes merged, so only sure misses count);
    a star import makes every name possible, and the check is skipped."""
    nodes = list(ast.walk(tree))
    if any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in nodes):
        return
    bound = set(dir(builtins)) | MODULE_NAMES
    for node in nodes:
        bound |= _binds(node)
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
            bound.add(node.id)  # each name once
            if len(result.undefined) < MAX_LISTED:
                result.undefined.append(f"line {node.lineno}: {node.id}")


def _members(units: list[Unit]) -> dict[str, str]:
    """Unit key (and `class:X/member` keys) -> normalized code; a class by its members."""
    found: dict[str, str] = {}
    for unit in units:
        if isinstance(unit.node, cst.ClassDef):
            for member in split_units(class_body(unit.node)):
                found[f"{unit.key}/{member.key}"] = _code(member.node)
        else:
            found[unit.key] = _code(unit.node)
    return found


def check_accounted(
    output: cst.Module, target: cst.Module, key_of: Callable[[Unit], str], merge: FileMerge, result: Verification
) -> None:
    """Units where the output differs from the contracted target must carry an accounting decision."""
    accounted = {d.key for d in merge.decisions if d.action in ACCOUNTING}
    accounted |= {d.key.split("#", 1)[0] for d in merge.decisions if d.action in ACCOUNTING}
    # the contracted target spells renamed classes the local way: both sides are keyed the base's way
    ours, theirs = _members(split_units(output.body, key_of)), _members(split_units(target.body, key_of))
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) == theirs.get(key):
            continue
        owner, group = key.split("/", 1)[0], key.split("#", 1)[0]
        if not {key, owner, group} & accounted and len(result.unaccounted) < MAX_LISTED:
            result.unaccounted.append(key)


def _outside_imports(code: str) -> list[str]:
    """The stripped lines of `code`, import statements blanked (their names are checked as bindings)."""
    lines = [line.strip() for line in code.splitlines()]
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                lines[number - 1] = ""
    return lines


def _bindings(code: str) -> dict[str, str]:
    """Bound name -> `from module import name` over every import statement of `code`."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.update({a.asname or a.name: f"from {module} import {a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            found.update({a.asname or a.name.split(".")[0]: f"import {a.name}" for a in node.names})
    return found


def _changed(before: str, after: str) -> list[str]:
    """Lines of `after` not matched in `before`, and its bindings that are new or read another module."""
    a, b = _outside_imports(before), _outside_imports(after)
    found: list[str] = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("insert", "replace"):
            found += [line for line in b[j1:j2] if line]
    was = _bindings(before)
    return found + [
        f"{spelled} (as {bound})" for bound, spelled in _bindings(after).items() if was.get(bound) != spelled
    ]


def check_nothing_lost(contracted: Mapping[str, str], merge: FileMerge, result: Verification) -> None:
    """Local and upstream changes are in the output, or in a conflict record (both sides kept there)."""
    present = Counter(_outside_imports(merge.code))
    present.update(f"{spelled} (as {bound})" for bound, spelled in _bindings(merge.code).items())
    for conflict in merge.conflicts:
        recorded = conflict.local + conflict.target
        present.update([line.strip() for line in recorded.splitlines()] + _binding_lines(recorded))
    base = contracted["base"]
    left = _left_upstream(contracted["target"], merge)
    for side, lost in (("local", result.lost_local), ("target", result.lost_upstream)):
        changes = dict.fromkeys(_changed(base, contracted[side]))
        missing = [line for line in changes if not present[line] and (side == "local" or line not in left)]
        lost += missing[:MAX_LISTED]


def _left_upstream(target: str, merge: FileMerge) -> set[str]:
    """The lines of units an extension leaves upstream (their changes reach the plugin by import) or the
    local file removed (a decision: the output does not use them)."""
    keys = {d.key for d in merge.decisions if d.action in ("upstream_only", "removed_local")}
    if not keys:
        return set()
    units = split_units(cst.parse_module(target).body)
    codes = [u.code for u in units if u.key in keys]
    for unit in units:
        if isinstance(unit.node, cst.ClassDef):
            codes += [m.code for m in split_units(class_body(unit.node)) if f"{unit.key}/{m.key}" in keys]
    found = {line.strip() for code in codes for line in code.splitlines()}
    return found | {spelled for code in codes for spelled in _binding_lines(code)}


def _binding_lines(code: str) -> list[str]:
    try:
        return [f"{spelled} (as {bound})" for bound, spelled in _bindings(code).items()]
    except SyntaxError:
        return []


def verify_file(
    merge: FileMerge,
    own: str,
    is_package: bool,
    resolve: Resolve,
    checked: Iterable[str],
    key_of: Callable[[Unit], str],
) -> Verification:
    """All checks of one output, against what it is measured by (`FileMerge.measured`)."""
    contracted = merge.measured
    try:
        tree = ast.parse(merge.code)
        compile(tree, own or "<port>", "exec")  # what the compiler refuses too (a keyword given twice)
        output = cst.parse_module(merge.code)
    except (SyntaxError, cst.ParserSyntaxError) as error:
        return Verification(parses=False, error=str(error).splitlines()[0])
    result = Verification(parses=True)
    check_imports(tree, own, is_package, checked, resolve, result)
    check_order(tree, result)
    check_undefined(tree, result)
    check_accounted(output, cst.parse_module(contracted["target"]), key_of, merge, result)
    check_nothing_lost(contracted, merge, result)
    return result
