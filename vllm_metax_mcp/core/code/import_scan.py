"""The statements of one file that import, for `scanner`: import statements with their guards
(`if`/`else` decided for an out-of-tree platform by `dispatch`, `try`/`except` around a possibly
failing import, `if TYPE_CHECKING:`, function bodies) and calls of `importlib.import_module` and
`__import__` whose module name the file's literals decide (`literals`); JIT-decorated functions
are noted on the way.

Only statements are walked, not expressions, and only those that are imports or hold statements,
unless the file mentions a module loader: then every statement's own expressions are searched for
the calls too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from .dispatch import dotted, evaluate
from .literals import Literals, Scope, argument, callee

JIT_DECORATOR_MARKERS = ("jit", "autotune", "compile", "custom_op", "register_fake")
IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "Exception")

Branch = Literal["taken", "conditional", "not_taken", "lazy"]
"""Whether an out-of-tree platform runs an import: always, under an undecided guard, never, or
inside a function (when called)."""
ImportKind = Literal["import", "lazy", "dynamic", "typing_only"]
"""How an import is written: a statement at module level, a statement inside a function, a call of
`importlib.import_module` / `__import__` with a name the file's literals decide, or a statement
under `if TYPE_CHECKING:` (never run)."""
GuardKind = Literal["if", "else", "try", "except"]
MODULE_LOADERS = {"import_module": "package", "__import__": None}
"""Calls that import a module by name, and the keyword (second argument) of the package a relative
name is resolved against."""

# A positional JSON list, as every row of the record (see `scanner`).
ImportRow = list[Any]
"""[module as written, [[name, alias], ...], alias, line, guard, branch, kind]"""


def _decorator_head(decorator: ast.expr) -> str:
    """What `ast.unparse(decorator)` shows before its first parenthesis."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = dotted(target)
    return name if name is not None else ast.unparse(decorator).split("(")[0]


_NESTED: dict[type, tuple[str, ...]] = {
    kind: blocks
    for kind in vars(ast).values()
    if isinstance(kind, type) and issubclass(kind, ast.stmt)
    if (blocks := tuple(f for f in ("body", "orelse", "finalbody") if f in kind._fields))
}
"""Statement blocks walked without a guard of their own (loops, `with`); `match` cases are not walked."""
_TRY_KINDS = (ast.Try, getattr(ast, "TryStar", ast.Try))
_SCANNED = frozenset({ast.Import, ast.ImportFrom, *_NESTED})
"""Statements that are imports or hold statements; the others (most of them) are skipped unvisited."""
_EXPRESSIONS: dict[type, tuple[str, ...]] = {
    kind: tuple(f for f in kind._fields if f not in ("body", "orelse", "finalbody", "handlers", "cases"))
    for kind in vars(ast).values()
    if isinstance(kind, type) and issubclass(kind, ast.stmt)
}
"""A statement's own expressions (a compound statement's blocks are walked as statements)."""


class ModuleNames(Literals):
    """Reads `__name__` and `__package__` as the empty package name, so `f"{__package__}.x"` and
    `import_module(".x", __name__)` stay relative and are resolved against the module when the
    index is assembled (the scanner does not know the module's name; in a package's `__init__`,
    where such loads work, both name the package)."""

    def name(self, name: str, scope: Scope, depth: int) -> str | None:
        return "" if name in ("__name__", "__package__") else self.lookup(name, scope, depth)


def _absolute(name: str, package: str) -> str:
    """A relative module name against a package given as a literal (what `import_module` does)."""
    level = len(name) - len(name.lstrip("."))
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)] if level > 1 else parts
    rest = name[level:]
    return ".".join([*base, rest] if rest else base)


class _Guard:
    """One enclosing `if`/`else`/`try`/`except` of a statement, rendered only when an import needs it."""

    __slots__ = ("handler", "kind", "node")

    def __init__(self, kind: GuardKind, node: ast.stmt, handler: ast.ExceptHandler | None = None) -> None:
        self.kind, self.node, self.handler = kind, node, handler


class StatementScanner:
    """Walks statements only (not expressions): imports with their guards, JIT-decorated functions."""

    def __init__(self, answers: Mapping[str, bool], literals: Literals | None = None) -> None:
        self.answers = answers
        self.literals = literals
        """Set when the file calls a module loader by name: every statement is then searched for the calls."""
        self.imports: list[ImportRow] = []
        self.dynamic: list[ImportRow] = []
        self.jit_kernels: list[str] = []
        self.guards: list[_Guard] = []
        self.function_depth = 0
        self._tests: dict[int, tuple[str, bool | None]] = {}
        self._catches: dict[int, bool] = {}

    def _test(self, node: ast.If) -> tuple[str, bool | None]:
        known = self._tests.get(id(node))
        if known is None:
            known = self._tests[id(node)] = (ast.unparse(node.test), evaluate(node.test, self.answers))
        return known

    def _catches_import(self, node: ast.Try) -> bool:
        known = self._catches.get(id(node))
        if known is None:
            known = self._catches[id(node)] = any(
                h.type is None or any(n in ast.unparse(h.type) for n in IMPORT_ERRORS) for h in node.handlers
            )
        return known

    def _render(self, guard: _Guard) -> tuple[str, bool | None] | None:
        if guard.kind == "if":
            return self._test(guard.node)  # type: ignore[arg-type]
        if guard.kind == "else":
            test, answer = self._test(guard.node)  # type: ignore[arg-type]
            return f"not ({test})", None if answer is None else not answer
        if not self._catches_import(guard.node):  # type: ignore[arg-type]
            return None
        if guard.kind == "try":
            return "try (import may fail)", None
        handler = guard.handler
        return f"except {ast.unparse(handler.type) if handler and handler.type else ''}".strip(), None

    def _typing_only(self) -> bool:
        """Under `if TYPE_CHECKING:` (or the `else` of `if not TYPE_CHECKING:`)."""
        for guard in self.guards:
            if not isinstance(guard.node, ast.If) or guard.kind not in ("if", "else"):
                continue
            test = guard.node.test
            negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            name = dotted(test.operand if isinstance(test, ast.UnaryOp) and negated else test)
            if name is not None and name.split(".")[-1] == "TYPE_CHECKING" and negated == (guard.kind == "else"):
                return True
        return False

    def _guard(self) -> tuple[str | None, Branch, ImportKind]:
        rendered = [r for r in map(self._render, self.guards) if r is not None]
        branch: Branch
        typing_only = self._typing_only()
        kind: ImportKind = "typing_only" if typing_only else "lazy" if self.function_depth else "import"
        if typing_only:
            branch = "not_taken"
        elif self.function_depth:
            branch = "lazy"
        elif any(answer is False for _, answer in rendered):
            branch = "not_taken"
        elif any(answer is None for _, answer in rendered):
            branch = "conditional"
        else:
            branch = "taken"
        return " and ".join(text for text, _ in rendered) or None, branch, kind

    def block(self, statements: Iterable[ast.stmt], guard: _Guard | None = None) -> None:
        if guard:
            self.guards.append(guard)
        for statement in statements:
            if self.literals is not None:
                self._loads(statement)
            if statement.__class__ in _SCANNED:
                self.statement(statement)
        if guard:
            self.guards.pop()

    def _loads(self, statement: ast.stmt) -> None:
        """Rows for the module-loader calls in a statement's own expressions whose name the
        file's literals decide (one per value); a name computed at run time is left out."""
        for field in _EXPRESSIONS[statement.__class__]:
            value = getattr(statement, field, None)
            for root in value if isinstance(value, list) else [value]:
                if not isinstance(root, ast.AST):
                    continue
                for node in ast.walk(root):
                    if isinstance(node, ast.Call) and (loader := callee(node.func)) in MODULE_LOADERS:
                        self._load(node, MODULE_LOADERS[loader])

    def _load(self, call: ast.Call, package_keyword: str | None) -> None:
        literals = self.literals
        name = argument(call, 0, "name")
        if literals is None or name is None:
            return
        package_node = argument(call, 1, package_keyword) if package_keyword else None
        package = literals.eval(package_node, literals.scope(call)) if package_node is not None else ""
        guard, branch, _ = self._guard()
        for value, _ in literals.values(name, call):
            if value and value.startswith(".") and package:
                value = _absolute(value, package)
            elif value and value.startswith(".") and package is None:
                continue  # relative to a package computed at run time
            if value and all(part.isidentifier() for part in value.lstrip(".").split(".")):
                row: ImportRow = [value, [], None, call.lineno, guard, branch, "dynamic"]
                if row not in self.dynamic:
                    self.dynamic.append(row)

    def statement(self, node: ast.stmt) -> None:
        kind = node.__class__
        if kind is ast.Import:
            guard, branch, how = self._guard()
            for alias in node.names:  # type: ignore[attr-defined]
                self.imports.append([alias.name, [], alias.asname, node.lineno, guard, branch, how])
        elif kind is ast.ImportFrom:
            guard, branch, how = self._guard()
            names = [[a.name, a.asname or a.name] for a in node.names]  # type: ignore[attr-defined]
            written = "." * node.level + (node.module or "")  # type: ignore[attr-defined]
            self.imports.append([written, names, None, node.lineno, guard, branch, how])
        elif kind is ast.If:
            self.block(node.body, _Guard("if", node))  # type: ignore[attr-defined]
            self.block(node.orelse, _Guard("else", node))  # type: ignore[attr-defined]
        elif kind in _TRY_KINDS:
            self._try(node)  # type: ignore[arg-type]
        elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            for decorator in node.decorator_list:  # type: ignore[attr-defined]
                head = _decorator_head(decorator)
                if any(marker in head.lower() for marker in JIT_DECORATOR_MARKERS):
                    self.jit_kernels.append(f"{node.name} @{head}")  # type: ignore[attr-defined]
            self.function_depth += 1
            self.block(node.body)  # type: ignore[attr-defined]
            self.function_depth -= 1
        elif kind is ast.ClassDef:
            self.block(node.body)  # type: ignore[attr-defined]
        else:
            for child in _NESTED[kind]:
                self.block(getattr(node, child))

    def _try(self, node: ast.Try) -> None:
        self.block(node.body, _Guard("try", node))
        for handler in node.handlers:
            self.block(handler.body, _Guard("except", node, handler))
        self.block(node.orelse)
        self.block(node.finalbody)
