"""Per-file facts of the mechanisms by which the plugin overrides upstream, read from one file's AST.

`scan_facts` is what the fact cache stores for a blob (JSON, salted by `FACTS_VERSION`):
assignments to and `setattr` on dotted names, decorators (and decorators applied by hand,
`Base.register_oot(Cls)`), the plugin's own patch decorators (functions that `setattr` on one of
their parameters), `sys.modules` replacements, class paths returned by platform methods, and
what `patch_forms` reads (helpers that patch a module named by a string, modules bound from
strings, calls naming dotted paths, and per function what it calls). Every patch fact carries its
scope: the function or method it runs in ("" for module-level code).
`ModuleFacts.from_json` reads it back as records; `overrides.find_overrides` resolves them
against the codebase. Nothing here looks beyond the one file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from .dispatch import dotted
from .patch_forms import DOTTED, Unit, helpers, string_module, unit_record, units

FACTS_VERSION = 3
CLASS_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
WRAPPERS = frozenset({"staticmethod", "classmethod", "property", "partial", "MethodType"})
BACKEND_PATH_METHODS = frozenset({"get_path", "get_class"})
"""Methods of upstream's backend enum that turn a member into the backend class (path)."""


def _value(node: ast.AST) -> dict[str, Any]:
    """An argument as facts: a constant, a dotted name, or opaque."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
        return {"const": node.value}
    name = dotted(node)
    return {"name": name} if name else {}


def _installed(node: ast.expr) -> str | None:
    """The dotted name a patch installs, seen through a descriptor or binding wrapper
    (`staticmethod(f)`, `property(f)`, `functools.partial(f, ...)`, `MethodType(f, obj)`)."""
    if isinstance(node, ast.Call) and node.args and (dotted(node.func) or "").split(".")[-1] in WRAPPERS:
        return dotted(node.args[0])
    return dotted(node)


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _patch_decorator(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any] | None:
    """A function that `setattr`s onto one of its own parameters (possibly in a nested wrapper)."""
    params = _params(node)
    for call in ast.walk(node):
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "setattr"
            and len(call.args) == 3
        ):
            continue
        owner = call.args[0]
        if isinstance(owner, ast.Name) and owner.id in params:
            names = [n.id for n in ast.walk(call.args[1]) if isinstance(n, ast.Name) and n.id in params]
            return {
                "name": node.name,
                "target_index": params.index(owner.id),
                "target_param": owner.id,
                "name_index": params.index(names[0]) if names else None,
                "name_param": names[0] if names else None,
            }
    return None


class _FactScanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.facts: dict[str, list[Any]] = {
            "assignments": [],
            "setattrs": [],
            "decorations": [],
            "patch_decorators": [],
            "module_replacements": [],
            "path_returns": [],
            "calls": [],
            "bindings": [],
        }
        self.scope: list[tuple[str, bool]] = []
        """Enclosing definitions: (name, is a function)."""
        self.started: set[int] = set()
        self.guards: list[str] = []
        """The `if` tests (and `except` clauses) around the current node inside its unit."""

    @property
    def unit(self) -> str:
        """The function or method the current node runs in; "" for module-level and class-body code."""
        for depth, (_, function) in enumerate(self.scope):
            if function:
                return ".".join(name for name, _ in self.scope[: depth + 1])
        return ""

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._decorations(node)
        found = _patch_decorator(node)
        if found and not self.scope:
            self.facts["patch_decorators"].append(found)
        self.scope.append((node.name, True))
        outer, self.guards = self.guards, []
        self.generic_visit(node)
        self.scope.pop()
        self.guards = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._decorations(node)
        if not self.scope:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._path_returns(node.name, item)
        self.scope.append((node.name, False))
        self.generic_visit(node)
        self.scope.pop()

    @property
    def guard(self) -> str | None:
        return " and ".join(self.guards) or None

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        test = ast.unparse(node.test)
        for guard, body in ((test, node.body), (f"not ({test})", node.orelse)):
            self.guards.append(guard)
            for statement in body:
                self.visit(statement)
            self.guards.pop()

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self.guards.append(f"except {ast.unparse(node.type)}" if node.type else "except")
        self.generic_visit(node)
        self.guards.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assignment(target, node.value, node.lineno)
        module = string_module(node.value)
        if module and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.facts["bindings"].append(
                {"name": node.targets[0].id, "module": module, "scope": self.unit, "line": node.lineno}
            )
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) == 3:
            owner, attr = dotted(node.args[0]), node.args[1]
            if owner:
                self.facts["setattrs"].append(
                    {
                        "target": owner,
                        "attr": attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else None,
                        "value": _installed(node.args[2]),
                        "line": node.lineno,
                        "scope": self.unit,
                        "guard": self.guard,
                    }
                )
        elif isinstance(node.func, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
            # decorator applied by hand: `register(...)(Cls)`
            self._decoration(node.func, node.args[0].id, node.lineno)
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_oot"
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            # `Base.register_oot(Cls, name=...)`: the class travels as the first argument
            self._decoration(node, node.args[0].id, node.lineno, skip_first=True)
        self._string_call(node)
        self.generic_visit(node)

    def _string_call(self, node: ast.Call) -> None:
        """A call naming a dotted path (a helper's or a library patcher's target), or `X.object(T, "a", v)`."""
        if isinstance(node.func, ast.Attribute) and node.func.attr == "start" and isinstance(node.func.value, ast.Call):
            self.started.add(id(node.func.value))
        func = dotted(node.func)
        strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if func and (any(DOTTED.match(t) for t in strings) or (func.endswith(".object") and strings)):
            self.facts["calls"].append(
                {
                    "func": func,
                    "args": [_value(a) for a in node.args],
                    "kwargs": {k.arg: _value(k.value) for k in node.keywords if k.arg},
                    "line": node.lineno,
                    "scope": self.unit,
                    "guard": self.guard,
                    "started": id(node) in self.started,
                }
            )

    def _assignment(self, target: ast.expr, value: ast.expr, line: int) -> None:
        if isinstance(target, ast.Attribute):
            name = dotted(target)
            if name and name.split(".")[0] not in ("self", "cls"):
                self.facts["assignments"].append(
                    {"target": name, "value": _installed(value), "line": line, "scope": self.unit, "guard": self.guard}
                )
        elif isinstance(target, ast.Subscript) and dotted(target.value) == "sys.modules":
            key = target.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                self.facts["module_replacements"].append(
                    {"module": key.value, "value": dotted(value), "line": line, "scope": self.unit, "guard": self.guard}
                )

    def _decorations(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self._decoration(decorator, node.name, decorator.lineno)

    def _decoration(self, decorator: ast.expr, target: str, line: int, skip_first: bool = False) -> None:
        """A decorator (or a decorator applied by hand) with its arguments and what it decorates."""
        call = decorator if isinstance(decorator, ast.Call) else None
        func = dotted(call.func if call else decorator)
        if not func:
            return
        args = [_value(a) for a in (call.args[1:] if skip_first else call.args)] if call else []
        kwargs = {k.arg: _value(k.value) for k in call.keywords if k.arg} if call else {}
        self.facts["decorations"].append(
            {
                "decorator": func,
                "args": args,
                "kwargs": kwargs,
                "target": target,
                "line": line,
                "scope": self.unit,
                "guard": self.guard,
            }
        )

    def _path_returns(self, cls: str, method: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        guards: list[str] = []

        def visit(statements: Iterable[ast.stmt]) -> None:
            for statement in statements:
                if isinstance(statement, ast.If):
                    guards.append(ast.unparse(statement.test))
                    visit(statement.body)
                    guards[-1] = f"not ({guards[-1]})"
                    visit(statement.orelse)
                    guards.pop()
                elif isinstance(statement, ast.Return) and statement.value is not None:
                    found = _backend_value(statement.value)
                    if found:
                        self.facts["path_returns"].append(
                            {
                                "class": cls,
                                "method": method.name,
                                **found,
                                "line": statement.lineno,
                                "guard": " and ".join(guards) or None,
                            }
                        )
                elif isinstance(statement, (ast.For, ast.While, ast.With, ast.Try)):
                    for child in ("body", "orelse", "finalbody"):
                        visit(getattr(statement, child, []) or [])
                    for handler in getattr(statement, "handlers", []) or []:
                        visit(handler.body)

        visit(method.body)


def _backend_value(node: ast.expr) -> dict[str, str] | None:
    """A returned class path: a dotted-path string, or `Enum.MEMBER.get_path()`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and CLASS_PATH.match(node.value):
        return {"value": node.value, "how": "path"}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BACKEND_PATH_METHODS:
        member = dotted(node.func.value)
        if member and "." in member:
            return {"value": member, "how": "enum"}
    return None


def scan_facts(source: bytes) -> dict[str, Any]:
    """One file's facts as JSON, the form the fact cache keeps; {} for a file that does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    scanner = _FactScanner()
    scanner.visit(tree)
    return {**scanner.facts, "helpers": helpers(tree), "units": units(tree)}


# -- the facts as records --------------------------------------------------------------------


@dataclass(frozen=True)
class Argument:
    """A call argument as scanned: a constant, a dotted name, or opaque (neither)."""

    const: str | int | float | bool | None = None
    name: str | None = None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Argument:
        return cls(value.get("const"), value.get("name"))

    @property
    def known(self) -> bool:
        return self.const is not None or self.name is not None

    @property
    def text(self) -> str | None:
        """The constant when it is a string."""
        return self.const if isinstance(self.const, str) else None


@dataclass(frozen=True)
class Assignment:
    """`a.b.c = value` at any depth (not on `self` or `cls`)."""

    target: str
    value: str | None
    line: int
    scope: str = ""
    guard: str | None = None


@dataclass(frozen=True)
class SetAttr:
    """`setattr(owner, "name", value)`; `attr` is None when the name is computed."""

    target: str
    attr: str | None
    value: str | None
    line: int
    scope: str = ""
    guard: str | None = None


@dataclass(frozen=True)
class Decoration:
    """A decorator (or one applied by hand) with its arguments, and the name it decorates."""

    decorator: str
    args: list[Argument]
    kwargs: dict[str, Argument]
    target: str
    line: int
    scope: str = ""
    guard: str | None = None

    def argument(self, index: int | None, name: str | None) -> Argument | None:
        """The argument bound to a parameter, by keyword first, then by position."""
        if name and name in self.kwargs:
            return self.kwargs[name]
        if index is not None and index < len(self.args):
            return self.args[index]
        return None

    def key(self, keyword: str, positional: bool) -> str | None:
        """A string registration key passed as `keyword` (or, if allowed, as the first argument)."""
        value = self.kwargs.get(keyword)
        if value is None or not value.known:
            value = self.args[0] if positional and self.args else None
        return value.text if value is not None else None


@dataclass(frozen=True)
class PatchDecorator:
    """A module-level function that `setattr`s onto one of its parameters: a patch decorator."""

    name: str
    target_index: int
    target_param: str
    name_index: int | None
    name_param: str | None


@dataclass(frozen=True)
class ModuleReplacement:
    """`sys.modules["a.b"] = value`."""

    module: str
    value: str | None
    line: int
    scope: str = ""
    guard: str | None = None


@dataclass(frozen=True)
class StringCall:
    """A call with a dotted-path string argument (or `X.object(T, "name", ...)`), where it runs,
    and whether `.start()` is called on its result (a library patcher started by hand)."""

    func: str
    args: list[Argument]
    kwargs: dict[str, Argument]
    line: int
    scope: str
    guard: str | None
    started: bool


@dataclass(frozen=True)
class Binding:
    """`name = importlib.import_module("a.b")` (or `sys.modules["a.b"]`, `sys.modules.get("a.b")`)."""

    name: str
    module: str
    scope: str
    line: int


@dataclass(frozen=True)
class PathReturn:
    """A class path a method of a module-level class returns, under the guards that lead to it."""

    cls: str
    method: str
    value: str
    how: Literal["path", "enum"]
    """A dotted-path string, or an enum member turned into one (`Enum.MEMBER.get_path()`)."""
    line: int
    guard: str | None


@dataclass(frozen=True)
class ModuleFacts:
    """`scan_facts` of one module, as records."""

    assignments: list[Assignment]
    setattrs: list[SetAttr]
    decorations: list[Decoration]
    patch_decorators: list[PatchDecorator]
    module_replacements: list[ModuleReplacement]
    path_returns: list[PathReturn]
    calls: list[StringCall]
    bindings: list[Binding]
    helpers: list[dict[str, Any]]
    """`patch_forms.helpers`: the recipe of each patch helper, applied by `patch_forms.expand`."""
    units: dict[str, Unit]

    @classmethod
    def from_json(cls, facts: dict[str, Any]) -> ModuleFacts:
        return cls(
            [Assignment(**item) for item in facts.get("assignments", [])],
            [SetAttr(**item) for item in facts.get("setattrs", [])],
            [
                Decoration(
                    item["decorator"],
                    [Argument.from_json(a) for a in item["args"]],
                    {k: Argument.from_json(v) for k, v in item["kwargs"].items()},
                    item["target"],
                    item["line"],
                    item.get("scope", ""),
                    item.get("guard"),
                )
                for item in facts.get("decorations", [])
            ],
            [PatchDecorator(**item) for item in facts.get("patch_decorators", [])],
            [ModuleReplacement(**item) for item in facts.get("module_replacements", [])],
            [
                PathReturn(item["class"], item["method"], item["value"], item["how"], item["line"], item["guard"])
                for item in facts.get("path_returns", [])
            ],
            [
                StringCall(
                    item["func"],
                    [Argument.from_json(a) for a in item["args"]],
                    {k: Argument.from_json(v) for k, v in item["kwargs"].items()},
                    item["line"],
                    item["scope"],
                    item["guard"],
                    item["started"],
                )
                for item in facts.get("calls", [])
            ],
            [Binding(**item) for item in facts.get("bindings", [])],
            facts.get("helpers", []),
            {name: unit_record(u) for name, u in facts.get("units", {}).items()},
        )
