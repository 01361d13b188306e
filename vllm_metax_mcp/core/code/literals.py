"""The strings a file's own literals decide: the module names `importlib.import_module` and
`__import__` load (read by `scanner`), and the paths plugin files load upstream files by (read by
`compare.target_only`, which adds the path forms).

An expression is followed through literals, f-strings, `+`, names bound once in its scope or the
module, and a function's parameters through the arguments of its calls in the same file. Anything
else is unknown (None), never guessed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

Function = ast.FunctionDef | ast.AsyncFunctionDef
MAX_DEPTH = 24
"""Evaluation steps through names and operands before an expression counts as unknown."""


@dataclass(frozen=True)
class Scope:
    """The names an expression may use: a call site's values, or the scope's single assignments.

    A name mapped to None is known to be unknown there (a parameter without a value, a name assigned
    twice), so the lookup does not fall through to an outer scope that happens to bind it.
    """

    values: Mapping[str, str]
    assigned: Mapping[str, ast.expr | None]
    parent: Scope | None = None


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function or module body, without those of nested functions, classes and lambdas."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            yield from own_nodes(child)


def assignments(node: ast.AST) -> dict[str, ast.expr | None]:
    """Names bound once by a plain assignment (their value), or otherwise (None)."""
    seen: dict[str, list[ast.expr | None]] = {}
    plain: set[ast.AST] = set()
    for child in own_nodes(node):
        if isinstance(child, ast.Assign) and len(child.targets) == 1 and isinstance(child.targets[0], ast.Name):
            seen.setdefault(child.targets[0].id, []).append(child.value)
            plain.add(child.targets[0])
        elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name) and child.value is not None:
            seen.setdefault(child.target.id, []).append(child.value)
            plain.add(child.target)
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store | ast.Del) and child not in plain:
            seen.setdefault(child.id, []).append(None)
    return {name: values[0] if len(values) == 1 else None for name, values in seen.items()}


def callee(func: ast.expr) -> str | None:
    """The last name of what a call calls (`f` of `f(...)` and of `a.b.f(...)`)."""
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def parameters(function: Function) -> list[str]:
    arguments = function.args
    return [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]


def argument(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """The expression a call passes for one parameter, by keyword or position (not through `*args`)."""
    found = next((k.value for k in call.keywords if k.arg == keyword), None)
    if found is None and len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        found = call.args[position]
    return found


class Literals:
    """Evaluates string expressions of one parsed file. Subclasses add forms through `name` (a
    name no assignment binds) and `other` (any expression the base does not read)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.top = Scope({}, assignments(tree))
        self.enclosing: dict[ast.AST, Function] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in own_nodes(node):
                    self.enclosing[inner] = node

    def values(self, expression: ast.expr, call: ast.Call) -> list[tuple[str | None, int]]:
        """What `expression`, an argument of `call`, evaluates to, with the line that decides it: the
        call's own line, or, when it depends on the enclosing function's parameters, one value per
        call of that function in the file (None where that call leaves it unknown)."""
        values = [(self.eval(expression, self.scope(call)), call.lineno)]
        function = self.enclosing.get(call)
        if values[0][0] is None and function is not None:
            values = [(self.eval(expression, self.scope(call, bound)), line) for bound, line in self.sites(function)]
        return values

    def scope(self, node: ast.AST, values: Mapping[str, str] | None = None) -> Scope:
        """The scope `node` lies in; a function's parameters take `values`, or are unknown."""
        function = self.enclosing.get(node)
        if function is None:
            return self.top
        assigned = assignments(function) | {p: None for p in parameters(function) if p not in (values or {})}
        return Scope(values or {}, assigned, self.top)

    def sites(self, function: Function) -> list[tuple[dict[str, str], int]]:
        """Per call of `function` in this file: its parameters' values (those literals decide)."""
        sites = []
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function.name):
                continue
            scope = self.scope(node)
            positional = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
            defaults = function.args.defaults
            given: dict[str, ast.expr] = dict(zip(positional[len(positional) - len(defaults) :], defaults, strict=True))
            given |= {a.arg: d for a, d in zip(function.args.kwonlyargs, function.args.kw_defaults, strict=True) if d}
            given |= dict(zip(positional, node.args, strict=False))
            given |= {k.arg: k.value for k in node.keywords if k.arg}
            values = {p: v for p, expr in given.items() if (v := self.eval(expr, scope)) is not None}
            sites.append((values, node.lineno))
        return sites

    def lookup(self, name: str, scope: Scope | None, depth: int) -> str | None:
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            if name in scope.assigned:
                value = scope.assigned[name]
                return None if value is None else self.eval(value, scope, depth + 1)
            scope = scope.parent
        return None

    def eval(self, node: ast.expr, scope: Scope, depth: int = 0) -> str | None:
        """The string an expression evaluates to, when the file's literals decide it."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.JoinedStr):
            parts = [
                part.value
                if isinstance(part, ast.Constant)
                else self.eval(part.value, scope, depth + 1)
                if isinstance(part, ast.FormattedValue) and part.format_spec is None
                else None
                for part in node.values
            ]
            return "".join(p for p in parts if isinstance(p, str)) if all(isinstance(p, str) for p in parts) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.eval(node.left, scope, depth + 1), self.eval(node.right, scope, depth + 1)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.Name):
            return self.name(node.id, scope, depth)
        return self.other(node, scope, depth)

    def name(self, name: str, scope: Scope, depth: int) -> str | None:
        return self.lookup(name, scope, depth)

    def other(self, node: ast.expr, scope: Scope, depth: int) -> str | None:
        return None
