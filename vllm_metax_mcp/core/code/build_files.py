"""What a repository's build compiles: extension modules (setup.py, CMakeLists.txt), the environment
switches that gate them, and the packages the build takes precompiled kernels from instead.

A trace needs it to tell where a `torch.ops.<ns>` namespace comes from (an extension registers under
the last component of its module name, which the build passes as `TORCH_EXTENSION_NAME`) and whether
a switch can leave the kernels out. Read statically: setup.py through its AST, CMake files as text.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from ..foundation.errors import ToolFailure
from ..sources.subjects import Subject
from .dispatch import dotted

SETUP = "setup.py"
CMAKE = "CMakeLists.txt"
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
"""An attribute spelled like an environment variable (`envs.COMPILE_KERNELS`) reads one."""
FALSY = (None, False, 0, "", "0", "false", "False", "no", "off")
"""Literals a test compares an env value with to mean "off" (`== "0"`, `is None`)."""
CONVERSIONS = ("bool", "int", "float", "str")
REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PIP_INSTALL = re.compile(r"\bpip3?\s+install\s+(?:-\S+\s+)*([A-Za-z0-9][A-Za-z0-9._-]*)")
CMAKE_TARGET = re.compile(
    r"^[ \t]*(\w*_extension_target|pybind11_add_module|python3?_add_library|add_library)\s*\(", re.I | re.M
)
"""CMake commands that make a Python extension module (`add_library` only as MODULE or SHARED)."""
CMAKE_SET = re.compile(r"^[ \t]*(?:set\s*\(\s*|list\s*\(\s*(APPEND)\s+)(\w+)([^)]*)\)", re.I | re.M)
"""`set(VAR ...)` and `list(APPEND VAR ...)`: what `${VAR}` in a target's arguments stands for."""
CMAKE_KEYWORD = re.compile(r"[A-Z][A-Z0-9_]+")
CMAKE_WORD = re.compile(r'"[^"]*"|[^\s"]+')

PrecompiledHow = Literal["requirement", "wheel", "pip", "import"]


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
    builds_when: bool
    """True: the extension is built when the variable is truthy; False: when it is falsy."""


@dataclass(frozen=True)
class BuiltExtension:
    module: str
    """The extension's module name (`vllm._C`; a CMake target's `DESTINATION` prefixes it)."""
    namespace: str
    """The `torch.ops` namespace it registers under by default: what `TORCH_EXTENSION_NAME` becomes."""
    where: str
    how: str
    """The call that declares it (`CMakeExtension`, `CUDAExtension`, `define_gpu_extension_target`)."""
    sources: list[str] = field(default_factory=list)
    """Literal source files or directories the declaration names."""
    switch: EnvSwitch | None = None


@dataclass(frozen=True)
class PrecompiledSource:
    """A package the build takes kernels from when a switch turns compiling off."""

    package: str
    how: PrecompiledHow
    switch: EnvSwitch
    where: str


@dataclass
class BuildFacts:
    extensions: list[BuiltExtension] = field(default_factory=list)
    precompiled: list[PrecompiledSource] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    """Build files that could not be read or parsed, names no scan could tell."""


@dataclass(frozen=True)
class _EnvRead:
    name: str
    default: str | None
    where: str


@dataclass(frozen=True)
class _Reading:
    """An `if` test that reads an env variable; `truthy`: the test holds when the variable is truthy."""

    read: _EnvRead
    truthy: bool


def _read(subject: Subject, path: str, facts: BuildFacts) -> bytes | None:
    try:
        return subject.read(path)
    except (OSError, ToolFailure) as failed:
        facts.gaps.append(f"{path}: not readable ({failed})")
        return None


def _written(node: ast.AST | None) -> str | None:
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return None
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ast.unparse(node)


def _direct_read(node: ast.AST, path: str) -> _EnvRead | None:
    """`os.getenv("X", d)`, `os.environ.get("X", d)`, `os.environ["X"]`."""
    if isinstance(node, ast.Subscript) and (dotted(node.value) or "").endswith("environ"):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return _EnvRead(key.value, None, f"{path}:{node.lineno}")
    if not isinstance(node, ast.Call) or not node.args:
        return None
    callee = dotted(node.func) or ""
    name = node.args[0]
    reads = callee.endswith("getenv") or callee.endswith("environ.get")
    if not reads or not isinstance(name, ast.Constant) or not isinstance(name.value, str):
        return None
    default = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "default"), None)
    return _EnvRead(name.value, _written(default), f"{path}:{node.lineno}")


def _first_read(node: ast.AST, path: str, name: str | None = None) -> _EnvRead | None:
    """The first env read inside an expression (of variable `name` when given)."""
    for inner in ast.walk(node):
        found = _direct_read(inner, path)
        if found and name in (None, found.name):
            return found
    return None


def _parse(source: bytes, path: str, facts: BuildFacts) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError) as failed:
        facts.gaps.append(f"{path}: not parseable ({failed.__class__.__name__})")
        return None


class _SetupScan:
    """One setup.py: env reads through names and `envs` modules, extensions and what gates them."""

    def __init__(self, subject: Subject, tree: ast.Module, facts: BuildFacts) -> None:
        self.subject, self.tree, self.facts = subject, tree, facts
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        self.names: dict[str, _EnvRead] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and (read := _first_read(node.value, SETUP)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.names.setdefault(target.id, read)
        self.literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        self.modules: dict[str, _EnvRead] = {}

    def reading(self, test: ast.AST, truthy: bool = True) -> _Reading | None:
        """Which env variable a test reads, through `not`, `and`, comparisons and conversions."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.reading(test.operand, not truthy)
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return next((r for r in (self.reading(v, truthy) for v in test.values) if r), None)
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            negative = isinstance(test.ops[0], (ast.NotEq, ast.NotIn, ast.IsNot))
            right = test.comparators[0]
            falsy = isinstance(right, ast.Constant) and right.value in FALSY
            return self.reading(test.left, truthy == (negative == falsy))
        read = self._read(test)
        if read:
            return _Reading(read, truthy)
        if isinstance(test, ast.Call) and len(test.args) == 1 and dotted(test.func) in CONVERSIONS:
            return self.reading(test.args[0], truthy)
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and not test.args:
            return self.reading(test.func.value, truthy)  # .strip().lower()
        return None

    def _read(self, node: ast.AST) -> _EnvRead | None:
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id != "os":
            return self._module_read(node.value.id, node.attr, node.lineno) if ENV_NAME.fullmatch(node.attr) else None
        return _direct_read(node, SETUP)

    def _module_read(self, module: str, name: str, line: int) -> _EnvRead:
        """`envs.X`: the default from a `<module>.py` of the repository that reads X (`"X": lambda: ...`)."""
        key = f"{module}.{name}"
        if key not in self.modules:
            found = next((r for path in self._candidates(module) if (r := self._defined_in(path, name))), None)
            if found is None:
                self.facts.gaps.append(f"{SETUP}:{line}: {key} is defined in no {module}.py of the repository")
            self.modules[key] = found or _EnvRead(name, None, f"{SETUP}:{line}")
        return self.modules[key]

    def _candidates(self, module: str) -> list[str]:
        """Files named `<module>.py`, those whose path parts setup.py spells first (its load path)."""
        paths = [p for p in self.subject.list() if PurePosixPath(p).name == f"{module}.py"]
        spelled = self.literals | {f"{module}.py"}
        return sorted(paths, key=lambda p: (-sum(part in spelled for part in p.split("/")), p.count("/"), p))

    def _defined_in(self, path: str, name: str) -> _EnvRead | None:
        source = _read(self.subject, path, self.facts)
        tree = _parse(source, path, self.facts) if source is not None else None
        for node in ast.walk(tree) if tree else []:
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == name:
                        return _first_read(value, path, name) or _first_read(value, path)
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return _first_read(node, path)
        return None

    def gate(self, node: ast.AST) -> EnvSwitch | None:
        """The innermost `if` (or conditional expression) around `node` whose test reads an env variable."""
        child, parent = node, self.parents.get(node)
        while parent is not None:
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                reading = self.reading(parent.test)
                in_body = child is parent.body or (isinstance(parent.body, list) and child in parent.body)
                if reading:
                    return self.switch(reading, parent, reading.truthy == in_body)
            child, parent = parent, self.parents.get(parent)
        return None

    def switch(self, reading: _Reading, test: ast.AST, builds_when: bool) -> EnvSwitch:
        read = reading.read
        return EnvSwitch(read.name, read.default, read.where, f"{SETUP}:{getattr(test, 'lineno', 0)}", builds_when)

    def build_gate(self) -> EnvSwitch | None:
        """`if <env>: ... return` in a build command's method (`build_extensions`): it gates every
        extension the command builds."""
        classes = [c for c in ast.walk(self.tree) if isinstance(c, ast.ClassDef)]
        methods = [m for c in classes for m in c.body if isinstance(m, ast.FunctionDef) and m.name.startswith("build")]
        for statement in (s for m in methods for s in m.body):
            returns = isinstance(statement, ast.If) and isinstance(statement.body[-1], ast.Return)
            reading = self.reading(statement.test) if returns and isinstance(statement, ast.If) else None
            if reading:
                return self.switch(reading, statement, not reading.truthy)
        return None


def _extension_call(node: ast.AST) -> str | None:
    """The callee of `...Extension(...)` (setuptools, torch, CMake or vendor subclasses)."""
    if not isinstance(node, ast.Call):
        return None
    callee = (dotted(node.func) or "").rsplit(".", 1)[-1]
    return callee if callee.endswith("Extension") else None


def _sources(call: ast.Call) -> list[str]:
    """Literal strings the sources argument (or a `*dir` keyword) names, through helper calls."""
    nodes = [k.value for k in call.keywords if k.arg and (k.arg == "sources" or k.arg.endswith("dir"))]
    return [literal for node in nodes + call.args[1:2] for literal in _literals(node)]


def _setup_extensions(scan: _SetupScan) -> None:
    fallback = scan.build_gate()
    for node in ast.walk(scan.tree):
        how = _extension_call(node)
        if how is None or not isinstance(node, ast.Call):
            continue
        name_node = next((k.value for k in node.keywords if k.arg == "name"), node.args[0] if node.args else None)
        name = name_node.value if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str) else None
        if name is None:
            scan.facts.gaps.append(f"{SETUP}:{node.lineno}: {how}(...) names its module with no literal")
            continue
        where, switch = f"{SETUP}:{node.lineno}", scan.gate(node) or fallback
        scan.facts.extensions.append(BuiltExtension(name, name.rsplit(".", 1)[-1], where, how, _sources(node), switch))


def _literals(node: ast.AST) -> list[str]:
    """Every string literal inside an expression."""
    return [str(n.value) for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _requirement(node: ast.AST) -> list[str]:
    """Requirement strings added to an install_requires-like list (`.append`, `.extend`, `+=`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        adds = node.func.attr in ("append", "extend", "insert") and "require" in (dotted(node.func.value) or "")
        return [literal for argument in node.args for literal in _literals(argument)] if adds else []
    if isinstance(node, ast.AugAssign) and "require" in (dotted(node.target) or ""):
        return _literals(node.value)
    return []


def _wheel(text: str) -> str | None:
    """The distribution of a wheel file name or URL (`vllm-1.0.0.dev-cp38-abi3-...whl` -> `vllm`)."""
    if ".whl" not in text:
        return None
    found = REQUIREMENT.match(text.rsplit("/", 1)[-1])
    return found.group(0).split("-")[0] if found else None


def _pip(node: ast.AST) -> str | None:
    """`pip install <pkg>` as one command string or an argument list."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        found = PIP_INSTALL.search(node.value)
        return found.group(1) if found else None
    if isinstance(node, (ast.List, ast.Tuple)):
        words = [literal for element in node.elts for literal in _literals(element)]
        after = words[words.index("install") + 1 :] if "install" in words else []
        return next((w for w in after if not w.startswith("-")), None)
    return None


def _arm_sources(arm: list[ast.stmt], switch: EnvSwitch) -> list[PrecompiledSource]:
    """What a no-build arm fetches instead of compiling: requirements it adds, wheels it names, packages
    it pip-installs, or imports whose files it copies."""
    found: dict[str, PrecompiledSource] = {}
    nodes = [n for statement in arm for n in ast.walk(statement)]
    copies = any(isinstance(n, ast.Call) and "copy" in (dotted(n.func) or "") for n in nodes)

    def add(package: str | None, how: PrecompiledHow, line: int) -> None:
        if package:
            found.setdefault(f"{how}:{package}", PrecompiledSource(package, how, switch, f"{SETUP}:{line}"))

    for node in nodes:
        line = getattr(node, "lineno", 0)
        for requirement in _requirement(node):
            add(m.group(0) if (m := REQUIREMENT.match(requirement)) else None, "requirement", line)
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(c.value) if isinstance(c, ast.Constant) else "{}" for c in node.values)
            add(wheel if (wheel := _wheel(text)) and "{" not in wheel else None, "wheel", line)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            add(_wheel(node.value), "wheel", line)
        add(_pip(node), "pip", line)
        if copies and isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                add(name.split(".")[0], "import", line)
    return list(found.values())


def _empties(arm: list[ast.stmt], lists: set[str]) -> bool:
    """The arm sets the extension list to `[]`."""
    assigns = [n for statement in arm for n in ast.walk(statement) if isinstance(n, ast.Assign)]
    empty = [a for a in assigns if isinstance(a.value, ast.List) and not a.value.elts]
    return any(dotted(t) in lists for a in empty for t in a.targets)


def _precompiled(scan: _SetupScan) -> None:
    """Arms of env-switch `if`s where the build compiles nothing: the other side of a switch that gates
    an extension, or an arm that empties the extension list; what each fetches instead."""
    gated = {e.switch.name: e.switch.builds_when for e in scan.facts.extensions if e.switch}
    lists = {"ext_modules"} | {
        name
        for n in ast.walk(scan.tree)
        if isinstance(n, ast.keyword) and n.arg == "ext_modules"
        for name in [dotted(n.value)]
        if name
    }
    for node in ast.walk(scan.tree):
        reading = scan.reading(node.test) if isinstance(node, ast.If) else None
        if reading is None or not isinstance(node, ast.If):
            continue
        for arm, runs_when in ((node.body, reading.truthy), (node.orelse, not reading.truthy)):
            if gated.get(reading.read.name, runs_when) != runs_when or _empties(arm, lists):
                scan.facts.precompiled += _arm_sources(arm, scan.switch(reading, node, not runs_when))


def _cmake_words(text: str, variables: dict[str, list[str]]) -> list[str]:
    """The arguments of one command, `${VAR}` replaced by what `set`/`list(APPEND)` gave it."""
    words = []
    for word in (w.strip('"') for w in CMAKE_WORD.findall(text)):
        whole = re.fullmatch(r"\$\{(\w+)\}", word)
        words += variables.get(whole.group(1), [word]) if whole else [word]
    return words


def _cmake_sources(rest: list[str]) -> list[str]:
    """Literal files after `SOURCES` (or after the target name and its options), up to the next keyword."""
    listed = rest[rest.index("SOURCES") + 1 :] if "SOURCES" in rest else rest
    while listed and CMAKE_KEYWORD.fullmatch(listed[0]):
        listed = listed[1:]
    end = next((i for i, word in enumerate(listed) if CMAKE_KEYWORD.fullmatch(word)), len(listed))
    return [word for word in listed[:end] if "${" not in word and "$<" not in word]


def _cmake(path: str, text: str, facts: BuildFacts) -> None:
    """Extension targets of one CMake file (`DESTINATION pkg` makes the module `pkg.<target>`)."""
    text = re.sub(r"#[^\n]*", "", text)
    variables: dict[str, list[str]] = {}
    for found in CMAKE_SET.finditer(text):
        values = _cmake_words(found.group(3), variables)
        variables[found.group(2)] = (variables.get(found.group(2), []) if found.group(1) else []) + values
    for match in CMAKE_TARGET.finditer(text):
        words = _cmake_words(text[match.end() : text.find(")", match.end())], variables)
        command = match.group(1)
        if not words or (command.lower() == "add_library" and words[1:2] not in (["MODULE"], ["SHARED"])):
            continue
        target, rest = words[0], words[1:]
        destination = rest[rest.index("DESTINATION") + 1] if "DESTINATION" in rest[:-1] else None
        module = f"{destination.replace('/', '.')}.{target}" if destination else target
        where = f"{path}:{text.count(chr(10), 0, match.start()) + 1}"
        extension = BuiltExtension(module, target.rsplit(".", 1)[-1], where, command, _cmake_sources(rest))
        facts.extensions.append(extension)


def build_facts(subject: Subject) -> BuildFacts:
    """The extensions a repository's build files declare, the env switches that gate them, and the
    packages a switch takes precompiled kernels from. Unreadable files become gaps, never errors."""
    facts = BuildFacts()
    paths = subject.list()
    source = _read(subject, SETUP, facts) if SETUP in paths else None
    tree = _parse(source, SETUP, facts) if source is not None else None
    if tree is not None:
        scan = _SetupScan(subject, tree, facts)
        _setup_extensions(scan)
        _precompiled(scan)
    for path in paths:
        text = _read(subject, path, facts) if PurePosixPath(path).name == CMAKE else None
        if text is not None:
            _cmake(path, text.decode("utf-8", errors="replace"), facts)
    return facts
