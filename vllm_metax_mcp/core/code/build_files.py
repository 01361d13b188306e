"""What a repository's build compiles: extension modules (setup.py, CMakeLists.txt), the environment
switches that gate them (`build_switches`), and the packages the build takes precompiled kernels from
instead.

A trace needs it to tell where a `torch.ops.<ns>` namespace comes from (an extension registers under
the last component of its module name, which the build passes as `TORCH_EXTENSION_NAME`) and whether
a switch can leave the kernels out. Read statically: setup.py through its AST, CMake files as text
(`build_cmake`). A package counts as precompiled kernels only on evidence of fetching it in an arm
that compiles nothing: a requirement added there, a wheel named, a pip install run, or a package
whose files the arm copies.
"""

from __future__ import annotations

import ast
import posixpath
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Literal

from ..sources.subjects import Subject
from .build_cmake import CMakeTarget, cmake_targets
from .build_switches import SETUP, EnvSwitch, SetupSwitches, parse_file, read_file
from .dispatch import dotted

REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
PIP_INSTALL = re.compile(r"\bpip3?\s+install\s+(?:-\S+\s+)*([A-Za-z0-9][A-Za-z0-9._-]*)")
WILDCARD = re.compile(r"[*?\[]")
RUNNERS = frozenset(
    f"subprocess.{name}" for name in ("run", "call", "check_call", "check_output", "Popen", "getoutput")
) | {"os.system", "os.popen"}
"""Calls that run a command: a `pip install` counts only as an argument of one of them."""
COMMAND_BASES = ("build_ext", "BuildExtension")
"""Base classes of the command that compiles extensions (setuptools', torch's, their subclasses)."""
BUILD_METHODS = ("build_extension", "build_extensions", "run")
"""The methods of that command that compile: an early return there leaves every extension out."""
PrecompiledHow = Literal["requirement", "wheel", "pip", "import"]


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
    """Source files or directories the declaration names (a glob by its fixed directory); for a
    setup.py extension that CMake builds, the CMake target's sources too."""
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


# -- setup.py extensions ---------------------------------------------------------------------


def _extension_call(node: ast.AST) -> str | None:
    """The callee of `...Extension(...)` (setuptools, torch, CMake or vendor subclasses)."""
    if not isinstance(node, ast.Call):
        return None
    callee = (dotted(node.func) or "").rsplit(".", 1)[-1]
    return callee if callee.endswith("Extension") else None


def _takes_sources_second(how: str, tree: ast.Module) -> bool:
    """Whether the class's second parameter is `sources` (setuptools' and torch's are; a CMake
    extension's is its CMakeLists directory): the file's own class says, else its name."""
    local = next((c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name == how), None)
    methods = local.body if local else []
    init = next((m for m in methods if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
    if init is None:
        return "CMake" not in how
    return [a.arg for a in init.args.posonlyargs + init.args.args][2:3] == ["sources"]


@dataclass(frozen=True)
class _PathArguments:
    """A declaration's sources argument, and its directory arguments (`cmake_lists_dir`, `sourcedir`),
    which name where CMake starts, no source."""

    sources: list[ast.expr]
    directories: list[ast.expr]


def _path_arguments(call: ast.Call, how: str, tree: ast.Module) -> _PathArguments:
    sources = [k.value for k in call.keywords if k.arg == "sources"]
    directories = [k.value for k in call.keywords if k.arg and k.arg.endswith("dir")]
    second = call.args[1:2]
    if _takes_sources_second(how, tree):
        return _PathArguments(sources or second, directories)
    return _PathArguments(sources, directories + second)


def _fixed(path: str) -> str | None:
    """A path up to its first wildcard part, normalised; None for the repository root."""
    parts = []
    for part in path.split("/"):
        if WILDCARD.search(part):
            break
        parts.append(part)
    fixed = posixpath.normpath("/".join(parts)) if parts else "."
    return None if fixed in (".", "/") else fixed


class _Paths:
    """The paths an expression of setup.py names: literals, `os.path.join` parts joined (a part built
    from `__file__` is the root), a glob's fixed directory, through names and helper calls."""

    def __init__(self, scan: SetupSwitches) -> None:
        self.scan = scan

    def of(self, node: ast.AST, place: ast.AST, seen: frozenset[str] = frozenset()) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [p for p in [_fixed(node.value)] if p]
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [p for e in node.elts for p in self.of(e, place, seen)]
        if isinstance(node, (ast.Starred, ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self.of(node.value if isinstance(node, ast.Starred) else node.elt, place, seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.of(node.left, place, seen) + self.of(node.right, place, seen)
        if isinstance(node, ast.Name) and node.id not in seen:
            return [p for v in self.scan.bound(node.id, place) for p in self.of(v, place, seen | {node.id})]
        joined = self._joined(node, place, seen)
        if joined is not None:
            return [p for p in [_fixed(joined)] if p]
        if isinstance(node, ast.Call):
            receiver = [node.func.value] if isinstance(node.func, ast.Attribute) else []
            arguments = receiver + node.args + [k.value for k in node.keywords]
            return [p for argument in arguments for p in self.of(argument, place, seen)]
        return []

    def _joined(self, node: ast.AST, place: ast.AST, seen: frozenset[str]) -> str | None:
        """`os.path.join(a, b)`, `Path(a) / b`: the known parts joined, up to the first unknown one."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.left, node.right]
        elif isinstance(node, ast.Call) and (dotted(node.func) or "").endswith("path.join"):
            parts = list(node.args)
        else:
            return None
        known = []
        for part in (self._part(p, place, seen) for p in parts):
            if part is None:
                break
            known.append(part)
        return posixpath.join(*known) if known else None

    def _part(self, node: ast.AST, place: ast.AST, seen: frozenset[str]) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node)):
            return ""
        if isinstance(node, ast.Name) and node.id not in seen:
            values = self.scan.bound(node.id, place)
            return self._part(values[0], place, seen | {node.id}) if values else None
        return self._joined(node, place, seen)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _empties(arm: list[ast.stmt], lists: set[str]) -> bool:
    """The arm sets the extension list to `[]`."""
    assigns = [n for statement in arm for n in ast.walk(statement) if isinstance(n, ast.Assign)]
    empty = [a for a in assigns if isinstance(a.value, ast.List) and not a.value.elts]
    return any(dotted(t) in lists for a in empty for t in a.targets)


def _list_of(scan: SetupSwitches, node: ast.AST) -> str | None:
    """The list a declaration goes into: `L = [...]`, `L += [...]`, `L.append(...)`."""
    child, parent = node, scan.parents.get(node)
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and child in parent.args:
            return dotted(parent.func.value)
        child, parent = parent, scan.parents.get(parent)
    if isinstance(parent, (ast.Assign, ast.AugAssign)):
        return dotted(parent.targets[0] if isinstance(parent, ast.Assign) else parent.target)
    return None


def _emptied(scan: SetupSwitches, node: ast.AST) -> EnvSwitch | None:
    """An env-switch arm after the declaration that empties its list (`ext_modules = []`): the
    extension is built only when that arm does not run."""
    name = _list_of(scan, node)
    later = [n for n in ast.walk(scan.tree) if isinstance(n, ast.If) and n.lineno > getattr(node, "lineno", 0)]
    for test, arm, in_body in ((n, a, a is n.body) for n in later for a in (n.body, n.orelse)):
        switch = scan.arm_switch(test, in_body) if name and _empties(arm, {name}) else None
        if switch:
            runs_when = switch.builds_when
            return replace(switch, builds_when=None if runs_when is None else not runs_when)
    return None


def _is_build_ext(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == "build_ext"


def _registered_commands(tree: ast.Module) -> set[str]:
    """Classes registered under "build_ext" (`cmdclass={"build_ext": X}`, `cmdclass["build_ext"] = X`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found |= {dotted(v) or "" for k, v in zip(node.keys, node.values, strict=True) if _is_build_ext(k)}
        elif isinstance(node, ast.Assign):
            subscripts = [t for t in node.targets if isinstance(t, ast.Subscript) and _is_build_ext(t.slice)]
            found |= {dotted(node.value) or ""} if subscripts else set()
        elif isinstance(node, ast.keyword) and node.arg == "build_ext":
            found.add(dotted(node.value) or "")
    return {name.rsplit(".", 1)[-1] for name in found if name}


def _extends(command: ast.ClassDef, commands: set[str]) -> bool:
    names = [dotted(base) or "" for base in command.bases]
    return any(n.endswith(COMMAND_BASES) or n.rsplit(".", 1)[-1] in commands for n in names)


def _build_methods(tree: ast.Module) -> list[ast.FunctionDef]:
    """`build_extension(s)` and `run` of the classes that build extensions: subclasses of a build_ext
    or BuildExtension (also through the file's own classes), or what `cmdclass` registers as build_ext."""
    classes = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
    commands, grown = _registered_commands(tree), True
    while grown:
        new = {c.name for c in classes if c.name not in commands and _extends(c, commands)}
        commands, grown = commands | new, bool(new)
    methods = [m for c in classes if c.name in commands for m in c.body if isinstance(m, ast.FunctionDef)]
    return [m for m in methods if m.name in BUILD_METHODS]


def _build_gate(scan: SetupSwitches) -> EnvSwitch | None:
    """`if <env>: ... return` opening a build_ext command's compiling method: it gates every extension
    the command builds (the code after it runs when the test fails)."""
    for method in _build_methods(scan.tree):
        early = [s for s in method.body if isinstance(s, ast.If) and isinstance(s.body[-1], ast.Return)]
        switch = next((w for s in early if (w := scan.arm_switch(s, in_body=False))), None)
        if switch:
            return switch
    return None


def _setup_extensions(scan: SetupSwitches, facts: BuildFacts) -> list[str]:
    """setup.py's extension declarations, gated by the innermost env switch around them, else by a later
    switch arm that empties their list, else by the build command's early return; returns the CMake
    directories the declarations name."""
    fallback, paths, directories = _build_gate(scan), _Paths(scan), []
    for node in ast.walk(scan.tree):
        how = _extension_call(node)
        if how is None or not isinstance(node, ast.Call):
            continue
        name_node = next((k.value for k in node.keywords if k.arg == "name"), node.args[0] if node.args else None)
        name = name_node.value if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str) else None
        if name is None:
            scan.gaps.append(f"{SETUP}:{node.lineno}: {how}(...) names its module with no literal")
            continue
        place = scan.place_of(node)
        arguments = _path_arguments(node, how, scan.tree)
        directories += [p for d in arguments.directories for p in paths.of(d, place)]
        found = _unique([p for s in arguments.sources for p in paths.of(s, place)])
        where, switch = f"{SETUP}:{node.lineno}", scan.gate(node) or _emptied(scan, node) or fallback
        facts.extensions.append(BuiltExtension(name, name.rsplit(".", 1)[-1], where, how, found, switch))
    return directories


# -- precompiled kernels -----------------------------------------------------------------------


def _strings(node: ast.AST) -> list[str]:
    """The string literals a list expression holds (`["a", "b"] + ["c"]`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _strings(node.left) + _strings(node.right)
    return []


def _requirement_list(node: ast.AST) -> bool:
    return "require" in (dotted(node) or "").lower()


def _requirements(node: ast.AST) -> list[str]:
    """Requirement strings an install_requires-like list gets (`.append/.extend/.insert`, `+=`, `=`,
    `install_requires=[...]`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        adds = node.func.attr in ("append", "extend", "insert") and _requirement_list(node.func.value)
        return [s for argument in node.args for s in _strings(argument)] if adds else []
    if isinstance(node, ast.AugAssign) and _requirement_list(node.target):
        return _strings(node.value)
    if isinstance(node, ast.Assign) and any(_requirement_list(t) for t in node.targets):
        return _strings(node.value)
    return _strings(node.value) if isinstance(node, ast.keyword) and node.arg == "install_requires" else []


def _package(requirement: str) -> str | None:
    found = REQUIREMENT.match(requirement)
    return found.group(0) if found else None


def _normal(package: str) -> str:
    return re.sub(r"[-_.]+", "-", package).lower()


def _wheel(node: ast.AST) -> str | None:
    """The distribution of a wheel file name or URL (`vllm-1.0.0.dev-cp38-abi3-...whl` -> `vllm`)."""
    if isinstance(node, ast.JoinedStr):
        text = "".join(str(c.value) if isinstance(c, ast.Constant) else "{}" for c in node.values)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    else:
        return None
    found = REQUIREMENT.match(text.rsplit("/", 1)[-1]) if ".whl" in text else None
    return found.group(0).split("-")[0] if found else None


def _pip(node: ast.AST) -> str | None:
    """`pip install <pkg>` as one command string or an argument list."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        found = PIP_INSTALL.search(node.value)
        return found.group(1) if found else None
    words = _strings(node)
    after = words[words.index("install") + 1 :] if "install" in words and "pip" in " ".join(words) else []
    return next((w for w in after if not w.startswith("-")), None)


@dataclass(frozen=True)
class _Imported:
    package: str
    line: int


class _Evidence:
    """What an arm that compiles nothing fetches instead, told apart from what the build always needs."""

    def __init__(self, scan: SetupSwitches) -> None:
        self.aliases: dict[str, str] = {}
        for node in ast.walk(scan.tree):
            if isinstance(node, ast.Import):
                self.aliases.update({a.asname or a.name: a.name for a in node.names})
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self.aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        unconditional = [n for n in ast.walk(scan.tree) if _requirements(n) and scan.gate(n) is None]
        self.always = {_normal(p) for n in unconditional for r in _requirements(n) if (p := _package(r))}

    def _runs(self, call: ast.Call) -> bool:
        first, dot, rest = (dotted(call.func) or "").partition(".")
        return f"{self.aliases.get(first, first)}{dot}{rest}" in RUNNERS

    def sources(self, arm: list[ast.stmt], switch: EnvSwitch) -> list[PrecompiledSource]:
        """Requirements the arm adds, wheels it names, packages its commands pip-install, imports whose
        files it copies; none the build requires unconditionally."""
        nodes = [n for statement in arm for n in ast.walk(statement)]
        assigned = {
            t.id: n.value for n in nodes if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        found: dict[str, PrecompiledSource] = {}

        def add(package: str | None, how: PrecompiledHow, line: int) -> None:
            if package and _normal(package) not in self.always:
                found.setdefault(f"{how}:{package}", PrecompiledSource(package, how, switch, f"{SETUP}:{line}"))

        for node in nodes:
            line = getattr(node, "lineno", 0)
            for requirement in _requirements(node):
                add(_package(requirement), "requirement", line)
            add(_wheel(node), "wheel", line)
            for argument in node.args if isinstance(node, ast.Call) and self._runs(node) else []:
                command = assigned.get(argument.id, argument) if isinstance(argument, ast.Name) else argument
                add(_pip(command), "pip", line)
        for imported in _copied_imports(nodes, assigned):
            add(imported.package, "import", imported.line)
        return list(found.values())


def _copied_imports(nodes: list[ast.AST], assigned: dict[str, ast.expr]) -> list[_Imported]:
    """Packages imported in the arm whose files a copy call there takes (`copytree(pkg.__path__[0], ...)`,
    also through a name the arm assigns); never the standard library."""
    calls = [n for n in nodes if isinstance(n, ast.Call)]
    copies = [c for c in calls if "copy" in (dotted(c.func) or "").rsplit(".", 1)[-1].lower()]
    pending = [a for call in copies for a in call.args + [k.value for k in call.keywords]]
    referenced: set[str] = set()
    while pending:
        names = {n.id for n in ast.walk(pending.pop()) if isinstance(n, ast.Name)} - referenced
        referenced |= names
        pending += [assigned[name] for name in names if name in assigned]
    found = []
    for node in (n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))):
        for alias in node.names:
            module = alias.name if isinstance(node, ast.Import) else node.module or ""
            bound = alias.asname or (alias.name.split(".")[0] if isinstance(node, ast.Import) else alias.name)
            package = module.split(".")[0]
            local = isinstance(node, ast.ImportFrom) and node.level > 0
            if bound in referenced and package and not local and package not in sys.stdlib_module_names:
                found.append(_Imported(package, node.lineno))
    return found


def _precompiled(scan: SetupSwitches, facts: BuildFacts) -> None:
    """Arms of env-switch `if`s where the build compiles nothing: the other side of a switch that gates
    an extension, or an arm that empties the extension list; what each fetches instead."""
    gated = {e.switch.name: e.switch.builds_when for e in facts.extensions if e.switch}
    keywords = [n for n in ast.walk(scan.tree) if isinstance(n, ast.keyword) and n.arg == "ext_modules"]
    lists = {"ext_modules"} | {name for k in keywords if (name := dotted(k.value))}
    evidence = _Evidence(scan)
    for node in (n for n in ast.walk(scan.tree) if isinstance(n, ast.If)):
        for arm, in_body in ((node.body, True), (node.orelse, False)):
            switch = scan.arm_switch(node, in_body)
            if switch is None:
                break
            runs_when = switch.builds_when  # what an extension in this arm would need
            opposite = runs_when is not None and gated.get(switch.name, runs_when) not in (runs_when, None)
            if opposite or _empties(arm, lists):
                instead = replace(switch, builds_when=None if runs_when is None else not runs_when)
                facts.precompiled += evidence.sources(arm, instead)


# -- the whole build -----------------------------------------------------------------------------


def _builds(extension: BuiltExtension, target: CMakeTarget) -> bool:
    """The CMake target builds a declared extension: same module, or (no DESTINATION) its last part."""
    return target.module == extension.module or (
        not target.packaged and target.target == extension.module.rsplit(".", 1)[-1]
    )


def _merged(declared: list[BuiltExtension], targets: list[CMakeTarget]) -> list[BuiltExtension]:
    """setup.py's extensions, each with the sources of the CMake target that builds it; the targets no
    declaration names after them."""
    merged = list(declared)
    for target in targets:
        index = next((i for i, e in enumerate(declared) if _builds(e, target)), None)
        if index is None:
            merged.append(BuiltExtension(target.module, target.target, target.where, target.how, target.sources))
        else:
            merged[index] = replace(merged[index], sources=_unique(merged[index].sources + target.sources))
    return merged


def build_facts(subject: Subject) -> BuildFacts:
    """The extensions a repository's build files declare, the env switches that gate them, and the
    packages a switch takes precompiled kernels from. Unreadable files become gaps, never errors."""
    facts = BuildFacts()
    source = read_file(subject, SETUP, facts.gaps) if SETUP in subject.list() else None
    tree = parse_file(source, SETUP, facts.gaps) if source is not None else None
    directories: list[str] = []
    if tree is not None:
        scan = SetupSwitches(subject, tree, facts.gaps)
        directories = _setup_extensions(scan, facts)
        _precompiled(scan, facts)
    facts.extensions = _merged(facts.extensions, cmake_targets(subject, directories, facts.gaps))
    return facts
