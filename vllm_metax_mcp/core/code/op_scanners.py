"""Op facts of source trees: `torch.ops` uses and op registrations, found by scanning code.

Registrations come from a plain text scan of C/C++/CUDA sources (`TORCH_LIBRARY*` blocks and their
`.def(...)` schemas) and from Python custom-op registration (`direct_register_custom_op`,
`torch.library.custom_op` / `define`, `Library(...).define`) in either tree. Serves trace_dependency
(kernels on the path) and diff_model / audit_commits (the ops the plugin registers).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Literal

from ..foundation.state import StateStore
from .codebase import Codebase
from .dispatch import dotted
from .fact_cache import FactCache

PYTHON_FACTS_VERSION = 2
NATIVE_FACTS_VERSION = 1
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hpp", ".hip", ".mm")
BUILD_NAMESPACE = "TORCH_EXTENSION_NAME"
"""The macro the build defines as the extension's name: the namespace is only known from the build."""
LIBRARY = re.compile(r"\bTORCH_LIBRARY(_FRAGMENT|_EXPAND)?\s*\(")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
DEFAULT_NAMESPACE = "vllm"
"""`direct_register_custom_op` without `target_lib` registers into vLLM's own library."""
DEFINE = re.compile(r"#\s*define\s+(\w+)\s+(\w+)")
STRING_OR_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)

RegistrationHow = Literal[
    "direct_register_custom_op", "torch.library.custom_op", "torch.library.define", "Library.define", "TORCH_LIBRARY"
]


# -- Python facts ----------------------------------------------------------------------------


def const_string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def call_argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if len(call.args) > position else None


def _registration(call: ast.Call) -> dict[str, Any] | None:
    callee = dotted(call.func) or ""
    last = callee.rsplit(".", 1)[-1]
    if last == "direct_register_custom_op":
        name = const_string(call_argument(call, 0, "op_name"))
        lib = call_argument(call, 99, "target_lib")
        return (
            {
                "callee": callee,
                "name": name,
                "lib": dotted(lib) if lib is not None else None,
                "how": "direct_register_custom_op",
            }
            if name
            else None
        )
    first = const_string(call.args[0]) if call.args else None
    if last in ("custom_op", "define") and first and "::" in first:
        namespace, _, rest = first.partition("::")
        return {"callee": callee, "op": f"{namespace}.{rest.split('(')[0].strip()}", "how": f"torch.library.{last}"}
    if last == "define" and first and isinstance(call.func, ast.Attribute):
        return {
            "callee": callee,
            "name": first.split("(")[0].strip(),
            "lib": dotted(call.func.value),
            "how": "Library.define",
            "schema": first,
        }
    return None


def scan_python(source: bytes) -> dict[str, Any]:
    """`torch.ops` uses, `Library("ns", ...)` objects and op registrations of one Python file."""
    if not any(needle in source for needle in (b"torch.ops", b"custom_op", b"Library", b".define(")):
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    uses: list[list[Any]] = []
    libraries: dict[str, str] = {}
    defined: list[list[Any]] = []
    registrations: list[dict[str, Any]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = dotted(node) or ""
            parts = chain.split(".")
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
        "registrations": registrations,
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
    """The op name alone, when the namespace is a library object's (`lib`) or the helper's default."""
    lib: str | None = None
    schema: str | None = None


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
            [
                PythonRegistration(
                    item["callee"],
                    item["how"],
                    item["line"],
                    item.get("op"),
                    item.get("name"),
                    item.get("lib"),
                    item.get("schema"),
                )
                for item in facts.get("registrations", [])
            ],
        )

    def local_ops(self) -> list[OpSite]:
        """Each registration whose namespace the file itself names; `direct_register_custom_op`
        without a target library registers into vLLM's own."""
        found = []
        for item in self.registrations:
            if item.op:
                found.append(OpSite(item.op, item.line))
            elif item.how == "direct_register_custom_op":
                found.append(OpSite(f"{self.libraries.get(item.lib or '', DEFAULT_NAMESPACE)}.{item.name}", item.line))
            elif item.lib in self.libraries:
                found.append(OpSite(f"{self.libraries[item.lib]}.{item.name}", item.line))
        return found


# -- native facts ----------------------------------------------------------------------------


def _balanced(text: str, start: int, opening: str, closing: str) -> int:
    """Index just past the bracket that closes the one at `start` (strings and chars skipped)."""
    depth, index, quote = 0, start, None
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return index + 1
        index += 1
    return len(text)


def _split_arguments(text: str) -> list[str]:
    """Top-level comma-separated arguments (brackets and string literals respected)."""
    parts, depth, current, quote, escaped = [], 0, "", None, False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        else:
            depth += (char in "([{") - (char in ")]}")
        current += char
    parts.append(current.strip())
    return parts


def _namespace(expression: str, expand: bool, macros: dict[str, str]) -> str:
    """The library namespace a macro argument names; '*' stands for the build-defined part."""
    if not expand:
        return expression
    tokens = re.findall(r"\w+", expression)
    if tokens and tokens[0] == "CONCAT":
        tokens = tokens[1:]
    return "".join("*" if t == BUILD_NAMESPACE else macros.get(t, t) for t in tokens) or "*"


def _blank_comments(text: str) -> str:
    """Comments replaced by spaces (newlines kept, so line numbers stay right)."""

    def blank(match: re.Match[str]) -> str:
        token = match.group(0)
        return token if token.startswith('"') else re.sub(r"[^\n]", " ", token)

    return STRING_OR_COMMENT.sub(blank, text)


def scan_native(source: bytes) -> dict[str, Any]:
    """`TORCH_LIBRARY*(ns, m) { m.def("name(schema) -> ...") }` registrations of one C/C++ file."""
    if b"TORCH_LIBRARY" not in source:
        return {}
    text = _blank_comments(source.decode("utf-8", errors="replace"))
    macros = dict(DEFINE.findall(text))
    registrations = []
    for match in LIBRARY.finditer(text):
        open_paren = match.end() - 1
        close = _balanced(text, open_paren, "(", ")")
        arguments = _split_arguments(text[open_paren + 1 : close - 1])
        if len(arguments) < 2:
            continue
        namespace = _namespace(arguments[0], match.group(1) == "_EXPAND", macros)
        brace = text.find("{", close)
        end = _balanced(text, brace, "{", "}") if brace >= 0 else close
        receiver = re.escape(arguments[1])
        for definition in re.finditer(rf"\b{receiver}\s*\.\s*def\s*\(", text[brace:end]):
            start = brace + definition.end() - 1
            body = text[start + 1 : _balanced(text, start, "(", ")") - 1]
            schema = "".join(STRING.findall(_split_arguments(body)[0]))
            name = schema.split("(")[0].strip()
            if name:
                registrations.append(
                    {
                        "ns": namespace,
                        "name": name,
                        "schema": schema if "(" in schema else None,
                        "line": text.count("\n", 0, start) + 1,
                    }
                )
    return {"registrations": registrations}


@dataclass(frozen=True)
class OpRegistration:
    op: str
    """ns.name; a namespace with '*' comes from the build (`TORCH_EXTENSION_NAME`)."""
    where: str
    how: RegistrationHow
    schema: str | None = None
    module: str | None = None
    """The Python module that registers it when imported (None for C++)."""

    def matches(self, op: str) -> bool:
        namespace, _, name = op.partition(".")
        mine, _, own = self.op.partition(".")
        return own == name and re.fullmatch(re.escape(mine).replace(r"\*", ".*"), namespace) is not None


def python_facts(store: StateStore, code: Codebase) -> dict[str, PythonOpFacts]:
    """Op facts of every Python module of both trees, by module name."""
    cache = FactCache(store, "ops-python", PYTHON_FACTS_VERSION)
    facts: dict[str, PythonOpFacts] = {}
    for side, subject in code.subjects.items():
        modules = {m.path: m.name for m in code.index.modules.values() if m.side == side}
        for path, value in cache.get_many(subject, sorted(modules), scan_python).items():
            facts[modules[path]] = PythonOpFacts.from_json(value)
    return facts


def _libraries(facts: dict[str, PythonOpFacts], module: str) -> dict[str, str]:
    found = facts.get(module)
    return found.libraries if found else {}


def native_registrations(store: StateStore, code: Codebase) -> list[OpRegistration]:
    cache = FactCache(store, "ops-native", NATIVE_FACTS_VERSION)
    found = []
    for subject in code.subjects.values():
        paths = [p for p in subject.list() if p.endswith(NATIVE_SUFFIXES)]
        for path, value in sorted(cache.get_many(subject, paths, scan_native).items()):
            for item in value.get("registrations", []):
                found.append(
                    OpRegistration(
                        f"{item['ns']}.{item['name']}", f"{path}:{item['line']}", "TORCH_LIBRARY", item["schema"]
                    )
                )
    return found


def _library_namespace(
    code: Codebase, facts: dict[str, PythonOpFacts], module: str, lib: str | None, callee: str
) -> str | None:
    """The namespace of a `Library` object named in `module`, or the registering helper's default."""
    if lib is not None:
        local = _libraries(facts, module)
        if lib in local:
            return local[lib]
        ref = code.bind(module, lib)
        return _libraries(facts, ref.module).get(ref.path[0]) if ref and len(ref.path) == 1 else None
    ref = code.bind(module, callee)
    defaults = list(_libraries(facts, ref.module).values()) if ref else []
    return defaults[0] if len(set(defaults)) == 1 else None


def python_registrations(code: Codebase, facts: dict[str, PythonOpFacts]) -> tuple[list[OpRegistration], list[str]]:
    """Registrations in Python, plus unknowns (a registration whose namespace cannot be told)."""
    found, unknowns = [], []
    for module, value in sorted(facts.items()):
        for item in value.registrations:
            where = code.where(module, item.line)
            op = item.op
            if op is None:
                namespace = _library_namespace(code, facts, module, item.lib, item.callee)
                if namespace is None:
                    unknowns.append(
                        f"{where}: op {item.name!r} is registered into a library whose namespace is not known "
                        "statically"
                    )
                    continue
                op = f"{namespace}.{item.name}"
            found.append(OpRegistration(op, where, item.how, item.schema, module))
    return found, unknowns
