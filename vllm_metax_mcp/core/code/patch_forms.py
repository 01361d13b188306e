"""What one plugin file does when it runs, beyond its imports: patch helpers recognised by their
bodies, modules bound from strings, calls that name dotted paths, and per function the calls and
class paths it executes.

A patch helper is a module-level function whose body imports a module named by one of its
parameters (`importlib.import_module`, `__import__`, `sys.modules`) and sets an attribute on it
(or on something `getattr` reaches from it); the attribute may come from another parameter, from
the tail of a dotted one, or from the decorated function's `__name__`. `helpers` records the
recipe as a small value algebra (JSON) and `expand` applies it to a call's literal arguments.
`dotted_ref` names the symbol such a string (or a library patcher's target) points at in the
codebase. `units` is what `activity` walks: per function or method, the calls it makes and the
class paths it names, each under the `if` tests that lead to it.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .codebase import Codebase, Outcome, Ref
from .dispatch import dotted
from .module_index import ModuleIndex

DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$")
"""A module or class path as a string: `a.b.C`, `a.b:C`."""
IMPORTERS = frozenset({"importlib.import_module", "import_module", "__import__", "sys.modules.get"})
SPLITS = {"rsplit": (0, -1), "rpartition": (0, 2)}
"""str method -> (index of the part before the last dot, index of the part after it)."""
BUILTIN_NAMES = frozenset(dir(builtins))
TRY_KINDS: tuple[type[ast.Try], ...] = (ast.Try, getattr(ast, "TryStar", ast.Try))

Value = dict[str, Any]
"""{"param": p, "part": whole|head|tail} | {"const": s} | {"decorated": 1} (the function a decorator
helper receives) | {"decorated_name": 1} (its `__name__`) | {"name_of": p} (`__name__` of the function
passed as p) | {"either": [a, b]} | {"module": v} | {"attr": [base, name]}."""


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


class _Body:
    """Values of the names inside one function, as far as the algebra follows them."""

    def __init__(self, node: ast.FunctionDef | ast.AsyncFunctionDef | None = None) -> None:
        self.params = set(_params(node)) if node else set()
        nested = [n for n in ast.walk(node) if n is not node and isinstance(n, ast.FunctionDef)] if node else []
        self.decorated = {_params(n)[0] for n in nested if _params(n)}
        """The first parameter of a nested function: the function a decorator helper receives."""
        self.env: dict[str, Value] = {}
        assigns = [n for n in ast.walk(node) if isinstance(n, ast.Assign)] if node else []
        for assign in sorted(assigns, key=lambda n: n.lineno):
            self._bind(assign)

    def _bind(self, assign: ast.Assign) -> None:
        target, value = assign.targets[0], assign.value
        if isinstance(target, ast.Name):
            found = self.value(value)
            if found is not None:
                self.env[target.id] = found
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            split = SPLITS.get(value.func.attr)
            source = self.value(value.func.value)
            if split is None or source is None or "param" not in source:
                return
            names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
            for index, part in zip(split, ("head", "tail"), strict=True):
                name = names[index] if -len(names) <= index < len(names) else None
                if name:
                    self.env[name] = {"param": source["param"], "part": part}

    def value(self, node: ast.expr) -> Value | None:
        """The algebra's value of an expression, or None when it is not followed."""
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in self.params:
                return {"param": node.id, "part": "whole"}
            return {"decorated": 1} if node.id in self.decorated else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {"const": node.value}
        if isinstance(node, ast.Attribute) and node.attr in ("__name__", "__qualname__"):
            inner = self.value(node.value)
            if inner == {"decorated": 1}:
                return {"decorated_name": 1}
            return {"name_of": inner["param"]} if inner and inner.get("part") == "whole" else None
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            values = [v for v in map(self.value, node.values) if v is not None]
            return values[0] if len(values) == 1 else ({"either": values} if values else None)
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _subscript(self, node: ast.Subscript) -> Value | None:
        if dotted(node.value) == "sys.modules":
            key = self.value(node.slice)
            return {"module": key} if key is not None else None
        call, index = node.value, node.slice
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            return None
        split = SPLITS.get(call.func.attr)
        source = self.value(call.func.value)
        position = _integer(index)
        if split is None or source is None or "param" not in source or position not in split:
            return None
        return {"param": source["param"], "part": "head" if position == split[0] else "tail"}

    def _call(self, node: ast.Call) -> Value | None:
        name = dotted(node.func)
        if name in IMPORTERS and node.args:
            if name == "__import__" and len(node.args) < 4 and not any(k.arg == "fromlist" for k in node.keywords):
                return None  # `__import__("a.b")` returns the top package `a`
            module = self.value(node.args[0])
            return {"module": module} if module is not None else None
        if name == "getattr" and len(node.args) >= 2:
            base, attr = self.value(node.args[0]), self.value(node.args[1])
            if base is not None and attr is not None and ("module" in base or "attr" in base):
                return {"attr": [base, attr]}
        return None


def _integer(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _integer(node.operand)
        return -inner if inner is not None else None
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _from_parameter(value: Value) -> bool:
    """Whether a module value's name comes from a parameter (what makes a function a helper)."""
    if "module" in value:
        return _from_parameter(value["module"])
    if "attr" in value:
        return _from_parameter(value["attr"][0])
    if "either" in value:
        return any(_from_parameter(v) for v in value["either"])
    return "param" in value


def _sites(node: ast.FunctionDef | ast.AsyncFunctionDef, body: _Body) -> Iterator[dict[str, Any]]:
    for item in ast.walk(node):
        owner = attr = value = None
        if isinstance(item, ast.Call) and dotted(item.func) == "setattr" and len(item.args) == 3:
            owner, attr, value = body.value(item.args[0]), body.value(item.args[1]), body.value(item.args[2])
        elif isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Attribute):
            target = item.targets[0]
            owner, attr, value = body.value(target.value), {"const": target.attr}, body.value(item.value)
        if owner is not None and attr is not None and ("module" in owner or "attr" in owner):
            yield {"owner": owner, "attr": attr, "value": value}


def helpers(tree: ast.Module) -> list[dict[str, Any]]:
    """Module-level functions that import a module named by a parameter and set an attribute on it."""
    found = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        sites = [s for s in _sites(node, _Body(node)) if _from_parameter(s["owner"])]
        if sites:
            found.append({"name": node.name, "params": _params(node), "sites": sites, "line": node.lineno})
    return found


def string_module(node: ast.expr) -> str | None:
    """The module an expression imports by a literal name (`import_module("a.b")`, `sys.modules["a.b"]`)."""
    value = _Body().value(node)
    inner = value.get("module") if value else None
    return inner.get("const") if isinstance(inner, dict) else None


def expand(
    helper: Mapping[str, Any],
    args: list[tuple[str | None, str | None]],
    kwargs: Mapping[str, tuple[str | None, str | None]],
    decorated: tuple[str, str] | None,
) -> list[tuple[str, str | None]]:
    """(dotted target, replacement) of each site of a helper, for one call's literal arguments.

    Arguments are (string constant, dotted name) pairs; `decorated` is the (name, symbol) of the
    function a decorator helper is applied to."""
    params: list[str] = helper["params"]
    bound = dict(zip(params, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}

    def text(value: Value | None) -> str | None:
        if value is None:
            return None
        if "const" in value:
            return str(value["const"])
        if "param" in value:
            given = bound.get(value["param"])
            whole = given[0] if given else None
            if whole is None or value["part"] == "whole":
                return whole
            head, _, tail = whole.rpartition(".")
            return (head or None) if value["part"] == "head" else tail
        if "decorated_name" in value:
            return decorated[0] if decorated else None
        if "name_of" in value:
            given = bound.get(value["name_of"])
            return given[1].rpartition(".")[2] if given and given[1] else None
        if "either" in value:
            return next((t for t in map(text, value["either"]) if t), None)
        if "module" in value:
            return text(value["module"])
        if "attr" in value:
            base, name = text(value["attr"][0]), text(value["attr"][1])
            return f"{base}.{name}" if base and name else None
        return None

    def replacement(value: Value | None) -> str | None:
        if value is None:
            return None
        if "decorated" in value:
            return decorated[1] if decorated else None
        given = bound.get(value["param"]) if "param" in value else None
        return given[1] if given else None

    found = []
    for site in helper["sites"]:
        owner, attr = text(site["owner"]), text(site["attr"])
        if owner and attr:
            found.append((f"{owner}.{attr}", replacement(site["value"])))
    return found


def dotted_ref(code: Codebase, base: ModuleIndex | None, text: str) -> Ref | None:
    """What a dotted path string (`a.b.C.m`, `a.b:C.m`) names: its longest module prefix at the
    target (or at base, when the module is gone at the target), the rest through re-exports."""
    module, colon, rest = text.partition(":")
    parts = module.split(".")
    if colon:
        head, path = module, rest.split(".")
    else:
        prefixes = [i for i in range(len(parts), 0, -1) if code.get(".".join(parts[:i]))]
        before = [i for i in range(len(parts), 0, -1) if base and base.get(".".join(parts[:i]))]
        split = max(prefixes[:1] + before[:1], default=0)
        if not split:
            return None
        head, path = ".".join(parts[:split]), parts[split:]
    if path and code.get(head) is not None:
        found = code.resolve(head, path[0])
        if found.outcome is Outcome.DEFINED:
            return Ref(found.module, (found.name or path[0], *path[1:]))
    return Ref(head, tuple(path))


# -- what runs, per function -----------------------------------------------------------------


UNKNOWN: dict[str, Any] = {}
"""An argument or default that is not a literal (JSON keeps `None` for the literal None)."""


def _literal(node: ast.expr | None) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    return UNKNOWN


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[list[Any]]:
    """[name, default literal] per parameter, positional ones first (UNKNOWN: none or not a literal)."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    found = [[a.arg, _literal(d) if d is not None else UNKNOWN] for a, d in zip(positional, defaults, strict=True)]
    return found + [
        [a.arg, _literal(d) if d is not None else UNKNOWN]
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]


class _Units:
    """Per unit (module-level code "", a function `f`, a method `C.m`): its line range and
    parameters, the calls it makes (with their literal arguments) and the dotted strings it
    names, each under the `if` tests leading to it."""

    def __init__(self) -> None:
        self.units: dict[str, dict[str, Any]] = {}

    def unit(self, name: str, start: int, end: int, params: list[list[Any]] | None = None) -> dict[str, Any]:
        return self.units.setdefault(
            name, {"start": start, "end": end, "params": params or [], "calls": [], "paths": []}
        )

    def module(self, tree: ast.Module) -> None:
        self._block(tree.body, self.unit("", 1, 1), [], set(), "")

    def _block(
        self, body: Iterable[ast.stmt], unit: dict[str, Any], guards: list[str], local: set[str], cls: str
    ) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and unit is self.units[""]:
                name = f"{cls}.{node.name}" if cls else node.name
                self._exprs(node.decorator_list, unit, guards, local)
                target = self.unit(name, node.lineno, node.end_lineno or node.lineno, _signature(node))
                self._block(node.body, target, [], set(_params(node)) - {"self", "cls"}, cls)
            elif isinstance(node, ast.ClassDef) and unit is self.units[""]:
                self._exprs([*node.bases, *node.decorator_list], unit, guards, local)
                self._block(node.body, unit, guards, local, f"{cls}.{node.name}" if cls else node.name)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                self._exprs([node.test], unit, guards, local)
                self._block(node.body, unit, [*guards, test], local, cls)
                self._block(node.orelse, unit, [*guards, f"not ({test})"], local, cls)
            elif isinstance(node, TRY_KINDS):
                self._block(node.body, unit, guards, local, cls)
                for handler in node.handlers:
                    caught = f"except {ast.unparse(handler.type)}" if handler.type else "except"
                    self._block(handler.body, unit, [*guards, caught], local, cls)
                self._block([*node.orelse, *node.finalbody], unit, guards, local, cls)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                heads = [getattr(node, "iter", None), getattr(node, "test", None)]
                heads += [i.context_expr for i in getattr(node, "items", [])]
                self._exprs([h for h in heads if h is not None], unit, guards, local)
                self._block([*node.body, *getattr(node, "orelse", [])], unit, guards, local, cls)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._block(node.body, unit, guards, local, cls)  # nested: runs with the function holding it
            else:
                self._exprs([node], unit, guards, local)

    def _exprs(self, nodes: Iterable[ast.AST], unit: dict[str, Any], guards: list[str], local: set[str]) -> None:
        guard = " and ".join(guards) or None
        for root in nodes:
            for node in ast.walk(root):
                if isinstance(node, ast.Call):
                    name = dotted(node.func)
                    head = name.split(".")[0] if name else None
                    if name and head not in local and head not in BUILTIN_NAMES:
                        positional = [_literal(a) for a in node.args]
                        keywords = {k.arg: _literal(k.value) for k in node.keywords if k.arg}
                        literal = any(a != UNKNOWN for a in [*positional, *keywords.values()])
                        args = [positional, keywords] if literal else None
                        unit["calls"].append([name, node.lineno, guard, args])
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value):
                    unit["paths"].append([node.value, node.lineno, guard])


@dataclass(frozen=True)
class Call:
    """A call a unit makes, under the `if` tests leading to it, with its literal arguments
    (`UNKNOWN` where an argument is not a literal)."""

    name: str
    line: int
    guard: str | None
    args: list[Any]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Unit:
    """A function or method (or "" module-level code): its lines, its parameters with their
    literal defaults, its calls and the dotted strings it names as (text, line, guard)."""

    start: int
    end: int
    params: list[tuple[str, Any]]
    calls: list[Call]
    paths: list[tuple[str, int, str | None]]


def units(tree: ast.Module) -> dict[str, dict[str, Any]]:
    scanner = _Units()
    scanner.module(tree)
    return scanner.units


def unit_record(unit: dict[str, Any]) -> Unit:
    calls = [Call(n, line, guard, *(args or [[], {}])) for n, line, guard, args in unit["calls"]]
    paths = [(text, line, guard) for text, line, guard in unit["paths"]]
    return Unit(unit["start"], unit["end"], [(n, d) for n, d in unit["params"]], calls, paths)
