"""The environment switches of a setup.py: which variable an `if` reads, and which way it turns the build.

`build_files` asks, for each extension, whether an enclosing `if` (or an early `return` in a build_ext
command's build method) reads the environment. The test is evaluated as a function of the variable's
value, "1" for on and "0" (then unset) for off, so a name bound to a comparison (`SKIP = getenv("X",
"1") == "0"`; `if not SKIP:`), membership (`not in ("0", "")`), numeric comparisons (`int(getenv("X",
"0")) > 0`) and presence (`"X" in os.environ`) keep their meaning. Where the value does not decide the
test, the switch says so (`builds_when` None) instead of guessing.
"""

from __future__ import annotations

import ast
import operator
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ..foundation.errors import ToolFailure
from ..sources.subjects import Subject
from .dispatch import dotted

SETUP = "setup.py"
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
"""An attribute spelled like an environment variable (`envs.COMPILE_KERNELS`) reads one."""
ON = "1"
OFF: tuple[str | None, ...] = ("0", None)
"""The values that turn a switch off, tried in order (None: unset) until one changes the test's outcome."""
CONVERSIONS: dict[str, Callable[[Any], Any]] = {"bool": bool, "int": int, "float": float, "str": str}
STRING_METHODS = ("strip", "lstrip", "rstrip", "lower", "upper", "casefold")
COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a == b and type(a) is type(b),
    ast.IsNot: lambda a, b: not (a == b and type(a) is type(b)),
}


@dataclass(frozen=True)
class EnvSwitch:
    """An environment variable that decides whether the build compiles an extension."""

    name: str
    default: str | None
    """As written where it is read (`"0"`); None when the read names no default (or none was found)."""
    where: str
    """file:line where the variable is read (`os.getenv(...)`, an `envs.py` entry)."""
    gate: str
    """file:line of the test that decides (an `if`, an early `return` of a build method)."""
    builds_when: bool | None
    """True: built when the variable is on ("1", set); False: when it is off ("0", unset); None: the test
    reads it, but its value alone does not decide the outcome (so no polarity is claimed)."""
    combined_with: tuple[str, ...] = ()
    """Other variables the same test reads (`A or B`): the build depends on them as well (a tuple, so a
    switch stays hashable)."""


@dataclass(frozen=True)
class _EnvRead:
    name: str
    default: str | None
    where: str


@dataclass(frozen=True)
class _Definition:
    """`envs.X` as a repository's `envs.py` defines it: the expression (a lambda's body) and its file."""

    expression: ast.expr
    path: str


@dataclass(frozen=True)
class _Frame:
    """Where an expression is read: its file (names resolve in setup.py only), the function whose
    assignments come first, helper parameters bound to literal arguments, the names being resolved."""

    path: str
    place: ast.AST | None = None
    scope: dict[str, ast.expr] = field(default_factory=dict)
    seen: frozenset[str] = frozenset()

    def entering(self, name: str) -> _Frame:
        """The frame of a name's assignment: the same file and function, no helper parameters."""
        return _Frame(self.path, self.place, {}, self.seen | {name})


@dataclass(frozen=True)
class _Inlined:
    """A setup.py helper's return expression, with its parameters bound to the call's literals."""

    expression: ast.expr
    frame: _Frame


@dataclass(frozen=True)
class _Setting:
    """The environment one evaluation assumes."""

    variable: str
    value: str | None
    others: str | None
    """The value of every other variable."""
    free: bool
    """The truth of a condition no env read decides (a call, a platform check)."""


class _Unknown:
    """What an expression evaluates to when its value cannot be told statically."""


UNKNOWN = _Unknown()


def read_file(subject: Subject, path: str, gaps: list[str]) -> bytes | None:
    try:
        return subject.read(path)
    except (OSError, ToolFailure) as failed:
        gaps.append(f"{path}: not readable ({failed})")
        return None


def parse_file(source: bytes, path: str, gaps: list[str]) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError) as failed:
        gaps.append(f"{path}: not parseable ({failed.__class__.__name__})")
        return None


def _written(node: ast.AST | None) -> str | None:
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return None
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ast.unparse(node)


def _get_default(call: ast.Call) -> ast.expr | None:
    return call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "default"), None)


def _single_return(function: ast.FunctionDef) -> ast.expr | None:
    """The expression of a helper whose body (past its docstring) is one `return`."""
    body = [s for s in function.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None


class SetupSwitches:
    """One setup.py: its assignments by scope, its helpers, the `envs` modules it reads, and the
    switch each env-reading `if` puts on what it holds."""

    def __init__(self, subject: Subject, tree: ast.Module, gaps: list[str]) -> None:
        self.subject, self.tree, self.gaps = subject, tree, gaps
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        self.bindings: dict[ast.AST, dict[str, list[ast.expr]]] = {}
        self.helpers: dict[str, ast.FunctionDef] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = self.bindings.setdefault(self.place_of(node), {})
                for target in (t for t in targets if isinstance(t, ast.Name)):
                    names.setdefault(target.id, []).append(node.value)
            if isinstance(node, ast.FunctionDef) and _single_return(node) is not None:
                self.helpers.setdefault(node.name, node)
        self.literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        self.definitions: dict[str, _Definition | None] = {}
        self.modules = _modules(tree) - set(sys.stdlib_module_names)

    def place_of(self, node: ast.AST) -> ast.AST:
        """The function (or the module) whose names an expression at `node` sees first."""
        parent = self.parents.get(node)
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            parent = self.parents.get(parent)
        return parent or self.tree

    def bound(self, name: str, place: ast.AST | None) -> list[ast.expr]:
        """What `name` is assigned in `place`, else at module level (every assignment, in order)."""
        local = self.bindings.get(place, {}).get(name, []) if place is not None else []
        return local or self.bindings.get(self.tree, {}).get(name, [])

    # -- which variables a test reads -----------------------------------------------------------

    def _literal(self, node: ast.AST, frame: _Frame) -> str | None:
        if isinstance(node, ast.Name) and node.id in frame.scope:
            node = frame.scope[node.id]
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def _direct(self, node: ast.AST, frame: _Frame) -> _EnvRead | None:
        """`os.getenv("X", d)`, `os.environ.get("X", d)`, `os.environ["X"]`, `"X" in os.environ`."""
        where = f"{frame.path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Subscript) and (dotted(node.value) or "").endswith("environ"):
            name = self._literal(node.slice, frame)
            return _EnvRead(name, None, where) if name else None
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            name = self._literal(node.left, frame)
            environ = (dotted(node.comparators[0]) or "").endswith("environ")
            return _EnvRead(name, None, where) if name and environ else None
        if not isinstance(node, ast.Call) or not node.args:
            return None
        callee = dotted(node.func) or ""
        name = self._literal(node.args[0], frame)
        if not name or not (callee.endswith("getenv") or callee.endswith("environ.get")):
            return None
        return _EnvRead(name, _written(_get_default(node)), where)

    def _chosen(self, name: str, frame: _Frame) -> ast.expr | None:
        """The first assignment of `name` that reads the environment (a flag computed once)."""
        if frame.path != SETUP or name in frame.seen:
            return None
        inner = frame.entering(name)
        return next((v for v in self.bound(name, frame.place) if self.reads(v, inner)), None)

    def _helper(self, call: ast.AST, frame: _Frame) -> _Inlined | None:
        """A setup.py helper called with literal arguments: its return expression, parameters bound."""
        name = call.func.id if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) else None
        function = self.helpers.get(name or "") if frame.path == SETUP and name not in frame.seen else None
        if function is None or not isinstance(call, ast.Call):
            return None
        parameters = [a.arg for a in function.args.posonlyargs + function.args.args]
        arguments = dict(zip(parameters, call.args, strict=False))
        arguments.update({k.arg: k.value for k in call.keywords if k.arg})
        if not all(isinstance(a, ast.Constant) for a in arguments.values()):
            return None
        expression = _single_return(function)
        inner = _Frame(frame.path, function, arguments, frame.seen | {function.name})
        return _Inlined(expression, inner) if expression is not None else None

    def reads(self, node: ast.AST, frame: _Frame) -> list[_EnvRead]:
        """The env reads of an expression in source order, through names, helpers and `envs` modules."""
        direct = self._direct(node, frame)
        if direct:
            return [direct]
        if isinstance(node, ast.Name):
            chosen = self._chosen(node.id, frame)
            return self.reads(chosen, frame.entering(node.id)) if chosen is not None else []
        if self._module_attribute(node, frame):
            assert isinstance(node, ast.Attribute)
            return self._module_reads(node)
        helper = self._helper(node, frame)
        if helper:
            return self.reads(helper.expression, helper.frame)
        return [read for child in ast.iter_child_nodes(node) for read in self.reads(child, frame)]

    def _module_attribute(self, node: ast.AST, frame: _Frame) -> bool:
        """`envs.X`: an attribute spelled like a variable, of a module setup.py imports or loads."""
        return (
            frame.path == SETUP
            and isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in self.modules
            and ENV_NAME.fullmatch(node.attr) is not None
        )

    def _module_reads(self, node: ast.Attribute) -> list[_EnvRead]:
        """`envs.X`: the reads of its definition in a repository `envs.py`, X's own first; X itself where
        none is told (no definition found, or one through a helper of that file)."""
        assert isinstance(node.value, ast.Name)
        definition = self._definition(node.value.id, node.attr, node.lineno)
        if definition is None:
            return [_EnvRead(node.attr, None, f"{SETUP}:{node.lineno}")]
        found = self.reads(definition.expression, _Frame(definition.path))
        where = f"{definition.path}:{definition.expression.lineno}"
        return sorted(found, key=lambda r: r.name != node.attr) or [_EnvRead(node.attr, None, where)]

    def _definition(self, module: str, name: str, line: int) -> _Definition | None:
        key = f"{module}.{name}"
        if key not in self.definitions:
            found = next((d for path in self._candidates(module) if (d := self._defined_in(path, name))), None)
            if found is None:
                self.gaps.append(f"{SETUP}:{line}: {key} is defined in no {module}.py of the repository")
            self.definitions[key] = found
        return self.definitions[key]

    def _candidates(self, module: str) -> list[str]:
        """Files named `<module>.py`, those whose path parts setup.py spells first (its load path)."""
        paths = [p for p in self.subject.list() if PurePosixPath(p).name == f"{module}.py"]
        spelled = self.literals | {f"{module}.py"}
        return sorted(paths, key=lambda p: (-sum(part in spelled for part in p.split("/")), p.count("/"), p))

    def _defined_in(self, path: str, name: str) -> _Definition | None:
        """`"X": lambda: <expr>` in a dict, or `X = <expr>`, of the file at `path`."""
        source = read_file(self.subject, path, self.gaps)
        tree = parse_file(source, path, self.gaps) if source is not None else None
        for node in ast.walk(tree) if tree else []:
            pairs = zip(node.keys, node.values, strict=True) if isinstance(node, ast.Dict) else iter(())
            value = next((v for k, v in pairs if isinstance(k, ast.Constant) and k.value == name), None)
            targets = node.targets if isinstance(node, ast.Assign) else []
            if value is None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
                assert isinstance(node, ast.Assign)
                value = node.value
            if value is not None:
                return _Definition(value.body if isinstance(value, ast.Lambda) else value, path)
        return None

    # -- what a test evaluates to -----------------------------------------------------------------

    def truth(self, node: ast.expr, frame: _Frame, setting: _Setting) -> bool:
        """A test's outcome under `setting`; what no env read decides takes `setting.free`."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.truth(node.operand, frame, setting)
        if isinstance(node, ast.BoolOp):
            outcomes = (self.truth(v, frame, setting) for v in node.values)
            return all(outcomes) if isinstance(node.op, ast.And) else any(outcomes)
        value = self.value(node, frame, setting)
        return setting.free if value is UNKNOWN else bool(value)

    def value(self, node: ast.expr, frame: _Frame, setting: _Setting) -> object:
        """What an expression evaluates to under `setting`, UNKNOWN where static reading cannot tell."""
        read = self._direct(node, frame)
        if read:
            return self._read_value(node, read, frame, setting)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [self.value(e, frame, setting) for e in node.elts]
            return UNKNOWN if any(i is UNKNOWN for i in items) else tuple(items)
        if isinstance(node, ast.Name) and node.id in frame.scope:
            return self.value(frame.scope[node.id], frame, setting)
        if isinstance(node, ast.Name):
            chosen = self._chosen(node.id, frame)
            return UNKNOWN if chosen is None else self.value(chosen, frame.entering(node.id), setting)
        if isinstance(node, ast.Attribute) and self._module_attribute(node, frame):
            return self._module_value(node, setting)
        if isinstance(node, ast.Call):
            return self._call_value(node, frame, setting)
        return self._operation_value(node, frame, setting)

    def _read_value(self, node: ast.expr, read: _EnvRead, frame: _Frame, setting: _Setting) -> object:
        env = setting.value if read.name == setting.variable else setting.others
        if isinstance(node, ast.Compare):
            return (env is not None) == isinstance(node.ops[0], ast.In)
        if env is not None:
            return env
        if isinstance(node, ast.Subscript):
            return UNKNOWN  # os.environ["X"] raises when unset
        default = _get_default(node) if isinstance(node, ast.Call) else None
        return None if default is None else self.value(default, frame, setting)

    def _module_value(self, node: ast.Attribute, setting: _Setting) -> object:
        assert isinstance(node.value, ast.Name)
        definition = self._definition(node.value.id, node.attr, node.lineno)
        if definition is None:
            return setting.value if node.attr == setting.variable else setting.others
        return self.value(definition.expression, _Frame(definition.path), setting)

    def _call_value(self, node: ast.Call, frame: _Frame, setting: _Setting) -> object:
        """Conversions (`int(...)`), string methods (`.strip().lower()`) and setup.py helpers."""
        helper = self._helper(node, frame)
        if helper:
            return self.value(helper.expression, helper.frame, setting)
        name = dotted(node.func) or ""
        if isinstance(node.func, ast.Attribute) and node.func.attr in STRING_METHODS and not node.args:
            operand = self.value(node.func.value, frame, setting)
            return getattr(operand, node.func.attr)() if isinstance(operand, str) else UNKNOWN
        if name not in CONVERSIONS or len(node.args) != 1:
            return UNKNOWN
        operand = self.value(node.args[0], frame, setting)
        try:
            return UNKNOWN if operand is UNKNOWN else CONVERSIONS[name](operand)
        except (TypeError, ValueError):
            return UNKNOWN

    def _operation_value(self, node: ast.expr, frame: _Frame, setting: _Setting) -> object:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            operand = self.value(node.operand, frame, setting)
            if operand is UNKNOWN:
                return UNKNOWN
            return not operand if isinstance(node.op, ast.Not) else _negated(operand)
        if isinstance(node, ast.BoolOp):
            return self._bool_value(node, frame, setting)
        if isinstance(node, ast.Compare):
            return self._compare_value(node, frame, setting)
        if isinstance(node, ast.IfExp):
            branch = node.body if self.truth(node.test, frame, setting) else node.orelse
            return self.value(branch, frame, setting)
        return UNKNOWN

    def _bool_value(self, node: ast.BoolOp, frame: _Frame, setting: _Setting) -> object:
        """`a or b` / `a and b` as Python evaluates them: the operand that decides."""
        result: object = UNKNOWN
        for operand in node.values:
            result = self.value(operand, frame, setting)
            if result is UNKNOWN or bool(result) == isinstance(node.op, ast.Or):
                return result
        return result

    def _compare_value(self, node: ast.Compare, frame: _Frame, setting: _Setting) -> object:
        left = self.value(node.left, frame, setting)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.value(comparator, frame, setting)
            if left is UNKNOWN or right is UNKNOWN or type(op) not in COMPARE:
                return UNKNOWN
            try:
                if not COMPARE[type(op)](left, right):
                    return False
            except TypeError:
                return UNKNOWN
            left = right
        return True

    # -- switches ---------------------------------------------------------------------------------

    def _polarity(self, test: ast.expr, frame: _Frame, variable: str) -> bool | None:
        """Whether the test holds when `variable` is on (and fails when off); None when its value never
        changes the outcome, whatever the other variables and conditions are."""
        for others in (None, ON):
            for free in (True, False):
                on = self.truth(test, frame, _Setting(variable, ON, others, free))
                if any(self.truth(test, frame, _Setting(variable, off, others, free)) != on for off in OFF):
                    return on
        return None

    def arm_switch(self, test_node: ast.If | ast.IfExp, in_body: bool) -> EnvSwitch | None:
        """The switch an env-reading test puts on one of its arms (`in_body`: the body, else `else`)."""
        frame = _Frame(SETUP, self.place_of(test_node))
        unique: dict[str, _EnvRead] = {}
        for read in self.reads(test_node.test, frame):
            unique.setdefault(read.name, read)
        reads = list(unique.values())
        if not reads:
            return None
        first = reads[0]
        holds = self._polarity(test_node.test, frame, first.name)
        builds = holds if holds is None or in_body else not holds
        others = tuple(r.name for r in reads[1:])
        return EnvSwitch(first.name, first.default, first.where, f"{SETUP}:{test_node.lineno}", builds, others)

    def gate(self, node: ast.AST) -> EnvSwitch | None:
        """The innermost `if` (or conditional expression) around `node` whose test reads the environment."""
        child, parent = node, self.parents.get(node)
        while parent is not None:
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                in_body = child is parent.body or (isinstance(parent.body, list) and child in parent.body)
                switch = self.arm_switch(parent, in_body)
                if switch:
                    return switch
            child, parent = parent, self.parents.get(parent)
        return None


def _modules(tree: ast.Module) -> set[str]:
    """Names setup.py binds to modules: imports, and assignments from a module loader (`envs =
    load_module_from_path("envs", ...)`, `importlib.import_module(...)`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            loads = "module" in (dotted(node.value.func) or "").lower()
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)} if loads else set()
    return found


def _negated(operand: object) -> object:
    return -operand if isinstance(operand, (int, float)) else UNKNOWN
