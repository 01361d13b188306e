"""Op facts of source trees: `torch.ops` uses and op registrations, found by scanning code.

Registrations come from a text scan of C/C++/CUDA sources (every `TORCH_LIBRARY*` macro family, stable
ABI included: `.def` schemas, `.impl` kernels and their dispatch keys; a `PYBIND11_MODULE` registers no
torch op and is not read) and from Python registration calls or decorators (`direct_register_custom_op`,
`torch.library` functions, `Library` methods) in either tree; each says what it adds (`kind`). Serves
trace_dependency (kernels on the path) and diff_model / audit_commits (the ops the plugin registers).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..foundation.state import StateStore
from .codebase import Codebase
from .dispatch import dotted, walk_nodes
from .fact_cache import FactCache
from .native_scan import NativeFacts, NativeHow, scan_native

PYTHON_FACTS_VERSION = 4
NATIVE_FACTS_VERSION = 3
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hpp", ".hip", ".mm")
DEFAULT_NAMESPACE = "vllm"
"""`direct_register_custom_op` without `target_lib` registers into vLLM's own library."""
PYTHON_NEEDLES = (
    b"torch.ops",
    b"Library",
    b"library",
    b".define(",
    b".impl(",
    b"custom_op",
    b"triton_op",
    b"register_fake",
    b"register_kernel",
    b"impl_abstract",
)
"""A file the scan finds anything in holds one of these: `torch.ops`, `Library`, a `Library` method
called as one (`LIBRARY_FORMS`), or a registration function's own name (`QUALIFIED_FORMS`,
`direct_register_custom_op`; a bare `define`/`impl` is imported from `torch.library`). The other
files, about half of vLLM's, are not parsed."""

RegistrationKind = Literal["def", "impl", "fake"]
"""What a registration adds: the op itself (its schema), a kernel for a dispatch key, a fake (meta) kernel."""
DEFINITIONS: tuple[RegistrationKind, ...] = ("def",)
"""The default view: what makes an op exist. An impl or fake only adds a kernel to an op defined elsewhere."""
TorchLibraryHow = Literal["torch.library.custom_op", "torch.library.triton_op", "torch.library.define"]
TorchKernelHow = Literal["torch.library.impl", "torch.library.register_kernel"]
TorchFakeHow = Literal["torch.library.register_fake", "torch.library.impl_abstract"]
LibraryHow = Literal["direct_register_custom_op", "Library.define", "Library.impl", "Library.register_fake"]
RegistrationHow = Literal[NativeHow, TorchLibraryHow, TorchKernelHow, TorchFakeHow, LibraryHow]


# -- Python facts ----------------------------------------------------------------------------


def const_string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def call_argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if len(call.args) > position else None


@dataclass(frozen=True)
class _Form:
    """How one registration function reads: what it adds, where its dispatch key is, what it needs."""

    kind: RegistrationKind
    key_position: int = 99
    key_keyword: str = ""
    arguments: int = 1
    """Arguments a registration passes at least (a kernel beside the name), so `x.impl(y)` is no match."""


QUALIFIED_FORMS = {
    "custom_op": _Form("def", 3, "device_types"),
    "triton_op": _Form("def"),
    "define": _Form("def"),
    "impl": _Form("impl", 1, "types"),
    "register_kernel": _Form("impl", 1, "device_types"),
    "register_fake": _Form("fake"),
    "impl_abstract": _Form("fake"),
}
"""`torch.library` functions, which name the op `ns::name`."""
LIBRARY_FORMS = {
    "define": _Form("def"),
    "impl": _Form("impl", 2, "dispatch_key", 2),
    "register_fake": _Form("fake", arguments=2),
    "_register_fake": _Form("fake", arguments=2),
}
"""`Library` methods, which name the op inside the object's namespace (`lib.impl("name", fn, "CUDA")`)."""
DIRECT_FORM = _Form("def", 5, "dispatch_key")
"""vLLM's `direct_register_custom_op(op_name, op_func, mutates_args, fake_impl, target_lib, dispatch_key)`."""


def _dispatch_key(node: ast.AST | None) -> str | None:
    """A literal dispatch key or device type; a literal list of them joined by commas."""
    if isinstance(node, (ast.List, ast.Tuple)):
        keys = [const_string(item) for item in node.elts]
        return ",".join(k for k in keys if k) if keys and all(keys) else None
    return const_string(node)


def _qualified_op(literal: str | None) -> str | None:
    """`ns.name` of a literal `ns::name` or `ns::name(schema)`."""
    if not literal or "::" not in literal:
        return None
    namespace, _, rest = literal.partition("::")
    return f"{namespace}.{rest.split('(')[0].strip()}"


def _registered(callee: str, how: str, form: _Form, call: ast.Call, **names: str | None) -> dict[str, Any]:
    key = _dispatch_key(call_argument(call, form.key_position, form.key_keyword))
    return {"callee": callee, "how": how, "kind": form.kind, "dispatch_key": key, **names}


def _on_library(call: ast.Call, callee: str, lib: str, last: str) -> dict[str, Any] | None:
    """`lib.define/impl/_register_fake("name", ...)`; a name computed at run time is kept (None), so that
    a library object of the file can say it registers ops no scan can name."""
    form = LIBRARY_FORMS.get(last)
    if form is None or len(call.args) + len(call.keywords) < form.arguments:
        return None
    first = const_string(call.args[0]) if call.args else None
    how = f"Library.{last.lstrip('_')}"
    if op := _qualified_op(first):
        return _registered(callee, how, form, call, op=op)
    name = first.split("(")[0].strip() if first else None
    return _registered(callee, how, form, call, name=name, lib=lib, schema=first if last == "define" else None)


def _registration(call: ast.Call) -> dict[str, Any] | None:
    """A registration call: a `Library` object's method, else a `torch.library` function (or its imported
    name), which names the op `ns::name`."""
    callee = dotted(call.func) or ""
    receiver, _, last = callee.rpartition(".")
    if last == "direct_register_custom_op":
        name, lib = const_string(call_argument(call, 0, "op_name")), call_argument(call, 4, "target_lib")
        direct = _registered(callee, last, DIRECT_FORM, call, name=name, lib=dotted(lib) if lib else None)
        return direct if name else None
    found = _on_library(call, callee, receiver, last) if receiver.rsplit(".", 1)[-1] not in ("", "library") else None
    if found:
        return found
    op, form = _qualified_op(const_string(call.args[0]) if call.args else None), QUALIFIED_FORMS.get(last)
    if not op or not form:
        return None
    signature = const_string(call_argument(call, 1, "schema")) if last == "define" else None
    schema = f"{op.partition('.')[2]}{signature}" if signature else None
    return _registered(callee, f"torch.library.{last}", form, call, op=op, schema=schema)


def scan_python(source: bytes) -> dict[str, Any]:
    """`torch.ops` uses, `Library("ns", ...)` objects and op registrations of one Python file."""
    if not any(needle in source for needle in PYTHON_NEEDLES):
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    uses: list[list[Any]] = []
    libraries: dict[str, str] = {}
    defined: list[list[Any]] = []
    registrations: list[dict[str, Any]] = []
    for node in walk_nodes(tree):
        if isinstance(node, ast.Attribute):
            parts = (dotted(node) or "").split(".")
            if len(parts) == 4 and parts[:2] == ["torch", "ops"]:
                uses.append([f"{parts[2]}.{parts[3]}", node.lineno])
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            callee = dotted(node.value.func) or ""
            namespace = const_string(node.value.args[0]) if node.value.args else None
            if callee.rsplit(".", 1)[-1] == "Library" and namespace:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        libraries[target.id] = namespace
                if const_string(call_argument(node.value, 1, "kind")) == "DEF":
                    defined.append([namespace, node.lineno])
        if isinstance(node, ast.Call):
            found = _registration(node)
            if found:
                registrations.append({**found, "line": node.lineno})
    return {
        "uses": sorted(uses, key=lambda u: (u[0], u[1])),
        "libraries": libraries,
        "defined": defined,
        "registrations": [r for r in registrations if r.get("op") or r.get("name") or r.get("lib") in libraries],
    }


@dataclass(frozen=True)
class OpSite:
    """An op (`ns.name`) and the line of a file that uses or registers it."""

    op: str
    line: int


@dataclass(frozen=True)
class NamespaceDefinition:
    """`Library("ns", "DEF")`: the file defines the namespace outright."""

    namespace: str
    line: int


@dataclass(frozen=True)
class PythonRegistration:
    """One op registration call as the scan keeps it."""

    callee: str
    how: RegistrationHow
    line: int
    op: str | None = None
    """`ns.name` when the call spells the namespace out (`torch.library`)."""
    name: str | None = None
    """The op name alone (the namespace is library `lib`'s or the helper's); None: computed at run time."""
    lib: str | None = None
    schema: str | None = None
    kind: RegistrationKind = "def"
    dispatch_key: str | None = None
    """The dispatch key or device type(s) the call names literally."""


@dataclass(frozen=True)
class PythonOpFacts:
    """What `scan_python` found in one file, read back from its JSON (the cached form)."""

    uses: list[OpSite]
    libraries: dict[str, str]
    """Variable -> namespace of the `Library(...)` objects the file creates."""
    defined: list[NamespaceDefinition]
    registrations: list[PythonRegistration]

    @classmethod
    def from_json(cls, facts: dict[str, Any]) -> PythonOpFacts:
        return cls(
            [OpSite(op, line) for op, line in facts.get("uses", [])],
            dict(facts.get("libraries", {})),
            [NamespaceDefinition(namespace, line) for namespace, line in facts.get("defined", [])],
            [PythonRegistration(**item) for item in facts.get("registrations", [])],
        )

    def local_ops(self) -> list[OpSite]:
        """Each op the file defines in a namespace the file itself names; `direct_register_custom_op`
        without a target library registers into vLLM's own. Impls and fakes define no op."""
        found = []
        for item in self.registrations:
            if item.kind != "def" or not (item.op or item.name):
                continue
            if item.op:
                found.append(OpSite(item.op, item.line))
            elif item.how == "direct_register_custom_op":
                found.append(OpSite(f"{self.libraries.get(item.lib or '', DEFAULT_NAMESPACE)}.{item.name}", item.line))
            elif item.lib in self.libraries:
                found.append(OpSite(f"{self.libraries[item.lib]}.{item.name}", item.line))
        return found


NO_FACTS = PythonOpFacts([], {}, [], [])


@dataclass(frozen=True)
class OpRegistration:
    op: str
    """ns.name; a namespace with '*' comes from the build (`TORCH_EXTENSION_NAME`)."""
    where: str
    how: RegistrationHow
    schema: str | None = None
    module: str | None = None
    """The Python module that registers it when imported (None for C++)."""
    kind: RegistrationKind = "def"
    dispatch_key: str | None = None
    """The dispatch key (C++) or key / device type(s) (Python) of an impl, when written literally."""

    def matches(self, op: str) -> bool:
        namespace, _, name = op.partition(".")
        mine, _, own = self.op.partition(".")
        return own == name and re.fullmatch(re.escape(mine).replace(r"\*", ".*"), namespace) is not None


@dataclass(frozen=True)
class _NativeFile:
    path: str
    facts: NativeFacts


def python_facts(store: StateStore, code: Codebase) -> dict[str, PythonOpFacts]:
    """Op facts of every Python module of both trees, by module name."""
    cache = FactCache(store, "ops-python", PYTHON_FACTS_VERSION)
    facts: dict[str, PythonOpFacts] = {}
    for side, subject in code.subjects.items():
        modules = {m.path: m.name for m in code.index.modules.values() if m.side == side}
        for path, value in cache.get_many(subject, sorted(modules), scan_python, PYTHON_NEEDLES).items():
            facts[modules[path]] = PythonOpFacts.from_json(value)
    return facts


def _native_files(store: StateStore, code: Codebase) -> Iterator[_NativeFile]:
    cache = FactCache(store, "ops-native", NATIVE_FACTS_VERSION)
    for subject in code.subjects.values():
        paths = [p for p in subject.list() if p.endswith(NATIVE_SUFFIXES)]
        for path, value in sorted(cache.get_many(subject, paths, scan_native).items()):
            yield _NativeFile(path, NativeFacts.from_json(value))


def native_registrations(
    store: StateStore, code: Codebase, kinds: Collection[RegistrationKind] = DEFINITIONS
) -> list[OpRegistration]:
    """C/C++ registrations of both trees: the ops they define, and with `kinds` the kernels they add."""
    found = []
    for file in _native_files(store, code):
        facts = file.facts
        for item in facts.registrations if "def" in kinds else []:
            where = f"{file.path}:{item.line}"
            found.append(OpRegistration(f"{item.ns}.{item.name}", where, facts.how_at(item.line), item.schema))
        for kernel in facts.impls if "impl" in kinds else []:
            where, how = f"{file.path}:{kernel.line}", facts.how_at(kernel.line)
            found.append(
                OpRegistration(f"{kernel.ns}.{kernel.name}", where, how, None, None, "impl", kernel.dispatch_key)
            )
    return found


def _library_namespace(
    code: Codebase, facts: dict[str, PythonOpFacts], module: str, lib: str | None, callee: str
) -> str | None:
    """The namespace of a `Library` object named in `module`, or the registering helper's default."""
    if lib is not None:
        local = facts.get(module, NO_FACTS).libraries
        if lib in local:
            return local[lib]
        ref = code.bind(module, lib)
        return facts.get(ref.module, NO_FACTS).libraries.get(ref.path[0]) if ref and len(ref.path) == 1 else None
    ref = code.bind(module, callee)
    defaults = list(facts.get(ref.module, NO_FACTS).libraries.values()) if ref else []
    return defaults[0] if len(set(defaults)) == 1 else None


def python_registrations(
    code: Codebase, facts: dict[str, PythonOpFacts], kinds: Collection[RegistrationKind] = DEFINITIONS
) -> tuple[list[OpRegistration], list[str]]:
    """Registrations in Python of `kinds`, plus unknowns (one whose op name or namespace cannot be told)."""
    found, unknowns = [], []
    for module, value in sorted(facts.items()):
        for item in value.registrations:
            if item.kind not in kinds:
                continue
            where = code.where(module, item.line)
            op = item.op
            if op is None and item.name is None:
                unknowns.append(f"{where}: {item.callee} registers an op whose name is computed at run time")
                continue
            if op is None:
                namespace = _library_namespace(code, facts, module, item.lib, item.callee)
                if namespace is None:
                    unknowns.append(
                        f"{where}: op {item.name!r} is registered into a library whose namespace is not known "
                        "statically"
                    )
                    continue
                op = f"{namespace}.{item.name}"
            found.append(OpRegistration(op, where, item.how, item.schema, module, item.kind, item.dispatch_key))
    return found, unknowns
