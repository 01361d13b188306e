"""Kernels on a model's path, checked against the installed binaries.

`torch.ops.<ns>.<op>` uses come from the walked modules; registrations from a plain text scan of
C/C++/CUDA sources (`TORCH_LIBRARY*` blocks and their `.def(...)` schemas) and from Python
custom-op registration (`direct_register_custom_op`, `torch.library.custom_op` / `define`,
`Library(...).define`) in either tree. A probe in the target interpreter loads the installed
extensions and reports which ops exist and their schemas; without an interpreter, torch or a
package the answer is unknown (an evidence gap), never a guess. JIT kernels (Triton, TileLang)
launched from plugin code are listed with the parameters they require.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .codebase import Codebase, Ref
from .dispatch import dotted
from .isolated import ProbeDeath, ProbeDied, run_isolated
from .factcache import FactCache
from .pyindex import ModuleIndex
from .results import digest
from .state import StateStore

PYTHON_FACTS_VERSION = 2
NATIVE_FACTS_VERSION = 1
NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hpp", ".hip", ".mm")
PROBE_MARKER = "@@OPPROBE@@"
OP_PROBE_TIMEOUT_S = 240
BUILD_NAMESPACE = "TORCH_EXTENSION_NAME"
"""The macro the build defines as the extension's name: the namespace is only known from the build."""
LIBRARY = re.compile(r"\bTORCH_LIBRARY(_FRAGMENT|_EXPAND)?\s*\(")
JIT_MARKERS = ("jit", "autotune")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
DEFAULT_NAMESPACE = "vllm"
"""`direct_register_custom_op` without `target_lib` registers into vLLM's own library."""
DEFINE = re.compile(r"#\s*define\s+(\w+)\s+(\w+)")
STRING_OR_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)


# -- Python facts ----------------------------------------------------------------------------


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _argument(call: ast.Call, position: int, keyword: str) -> ast.AST | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if len(call.args) > position else None


def _registration(call: ast.Call) -> dict[str, Any] | None:
    callee = dotted(call.func) or ""
    last = callee.rsplit(".", 1)[-1]
    if last == "direct_register_custom_op":
        name = _const(_argument(call, 0, "op_name"))
        lib = _argument(call, 99, "target_lib")
        return {"callee": callee, "name": name, "lib": dotted(lib) if lib is not None else None, "how": "direct_register_custom_op"} if name else None
    first = _const(call.args[0]) if call.args else None
    if last in ("custom_op", "define") and first and "::" in first:
        namespace, _, rest = first.partition("::")
        return {"callee": callee, "op": f"{namespace}.{rest.split('(')[0].strip()}", "how": f"torch.library.{last}"}
    if last == "define" and first and isinstance(call.func, ast.Attribute):
        return {"callee": callee, "name": first.split("(")[0].strip(), "lib": dotted(call.func.value), "how": "Library.define", "schema": first}
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
            namespace = _const(node.value.args[0]) if node.value.args else None
            if callee.rsplit(".", 1)[-1] == "Library" and namespace:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        libraries[target.id] = namespace
                if _const(_argument(node.value, 1, "kind")) == "DEF":
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


def local_ops(facts: dict[str, Any]) -> list[tuple[str, int]]:
    """(`ns.op`, line) of each registration whose namespace the file itself names; `direct_register_custom_op`
    without a target library registers into vLLM's own."""
    libraries = facts.get("libraries", {})
    found = []
    for item in facts.get("registrations", []):
        if item.get("op"):
            found.append((item["op"], item["line"]))
        elif item["how"] == "direct_register_custom_op":
            found.append((f"{libraries.get(item.get('lib') or '', DEFAULT_NAMESPACE)}.{item['name']}", item["line"]))
        elif item.get("lib") in libraries:
            found.append((f"{libraries[item['lib']]}.{item['name']}", item["line"]))
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
                    {"ns": namespace, "name": name, "schema": schema if "(" in schema else None, "line": text.count("\n", 0, start) + 1}
                )
    return {"registrations": registrations}


# -- assembly --------------------------------------------------------------------------------


@dataclass
class OpRegistration:
    op: str
    """ns.name; a namespace with '*' comes from the build (`TORCH_EXTENSION_NAME`)."""
    where: str
    how: str
    schema: str | None = None
    module: str | None = None
    """The Python module that registers it when imported (None for C++)."""

    def matches(self, op: str) -> bool:
        namespace, _, name = op.partition(".")
        mine, _, own = self.op.partition(".")
        return own == name and re.fullmatch(re.escape(mine).replace(r"\*", ".*"), namespace) is not None


@dataclass
class OpRow:
    op: str
    used_in: list[str] = field(default_factory=list)
    """Every use on the path, plugin modules first."""
    registered_in: list[OpRegistration] = field(default_factory=list)
    installed: bool | None = None
    schema: list[str] = field(default_factory=list)
    schema_from: str | None = None


@dataclass
class KernelLaunch:
    kernel: Ref
    file: str
    line: int
    decorators: list[str]
    required: list[str]
    params: list[str]
    launched_from: list[str] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)
    """launch site -> required parameters it does not pass."""
    gained: list[str] = field(default_factory=list)
    """Parameters the target kernel has and the base kernel had not (with a base)."""


def python_facts(store: StateStore, code: Codebase) -> dict[str, dict[str, Any]]:
    """Op facts of every Python module of both trees, by module name."""
    cache = FactCache(store, "ops-python", PYTHON_FACTS_VERSION)
    facts: dict[str, dict[str, Any]] = {}
    for side, subject in code.subjects.items():
        modules = {m.path: m.name for m in code.index.modules.values() if m.side == side}
        for path, value in cache.get_many(subject, sorted(modules), scan_python).items():
            facts[modules[path]] = value
    return facts


def native_registrations(store: StateStore, code: Codebase) -> list[OpRegistration]:
    cache = FactCache(store, "ops-native", NATIVE_FACTS_VERSION)
    found = []
    for subject in code.subjects.values():
        paths = [p for p in subject.list() if p.endswith(NATIVE_SUFFIXES)]
        for path, value in sorted(cache.get_many(subject, paths, scan_native).items()):
            for item in value.get("registrations", []):
                found.append(OpRegistration(f"{item['ns']}.{item['name']}", f"{path}:{item['line']}", "TORCH_LIBRARY", item["schema"]))
    return found


def _library_namespace(code: Codebase, facts: dict[str, dict[str, Any]], module: str, lib: str | None, callee: str) -> str | None:
    """The namespace of a `Library` object named in `module`, or the registering helper's default."""
    if lib is not None:
        local = facts.get(module, {}).get("libraries", {})
        if lib in local:
            return local[lib]
        ref = code.bind(module, lib)
        return facts.get(ref.module, {}).get("libraries", {}).get(ref.path[0]) if ref and len(ref.path) == 1 else None
    ref = code.bind(module, callee)
    defaults = list(facts.get(ref.module, {}).get("libraries", {}).values()) if ref else []
    return defaults[0] if len(set(defaults)) == 1 else None


def python_registrations(code: Codebase, facts: dict[str, dict[str, Any]]) -> tuple[list[OpRegistration], list[str]]:
    """Registrations in Python, plus unknowns (a registration whose namespace cannot be told)."""
    found, unknowns = [], []
    for module, value in sorted(facts.items()):
        for item in value.get("registrations", []):
            where = code.where(module, item["line"])
            op = item.get("op")
            if op is None:
                namespace = _library_namespace(code, facts, module, item.get("lib"), item["callee"])
                if namespace is None:
                    unknowns.append(f"{where}: op {item['name']!r} is registered into a library whose namespace is not known statically")
                    continue
                op = f"{namespace}.{item['name']}"
            found.append(OpRegistration(op, where, item["how"], item.get("schema"), module))
    return found, unknowns


def op_rows(code: Codebase, facts: dict[str, dict[str, Any]], walked: list[str], registrations: list[OpRegistration]) -> list[OpRow]:
    """Every op the walked modules use, with the sources that register it."""
    rows: dict[str, OpRow] = {}
    ordered = sorted(walked, key=lambda m: code.get(m) is None or code.get(m).side != "plugin")  # plugin uses first
    for module in ordered:
        for op, line in facts.get(module, {}).get("uses", []):
            rows.setdefault(op, OpRow(op)).used_in.append(code.where(module, line))
    for row in rows.values():
        row.registered_in = [r for r in registrations if r.matches(row.op)]
        declared = [r.schema for r in row.registered_in if r.schema]
        if declared:
            row.schema, row.schema_from = declared, "source"
    return sorted(rows.values(), key=lambda r: r.op)


# -- the probe -------------------------------------------------------------------------------


@dataclass
class ProbeOutcome:
    probe_id: str | None
    gaps: list[str] = field(default_factory=list)


def _probe_key(python: Path, identity: str | None, request: dict[str, Any]) -> str:
    info = os.stat(python)
    return digest({"python": str(python), "stat": [info.st_size, info.st_mtime_ns], "record": identity, "request": request}, 20)


def probe_ops(python: Path, store: StateStore, rows: list[OpRow], packages: list[str], identity: str | None) -> ProbeOutcome:
    """Ask the target interpreter which ops exist; fills `installed` and `schema` of each row.

    A complete report is reused for the same interpreter, environment record and request. A probe
    that dies (a signal, the deadline) is an answer too: what its last report held is kept, every
    other op is unknown, and the gap says how it died and at which step.
    """
    modules = sorted({r.module for row in rows for r in row.registered_in if r.module})
    request = {"ops": [row.op for row in rows], "packages": packages, "modules": modules}
    key = f"cache/opprobe/{_probe_key(python, identity, request)}.json"
    cached = store.read(key)
    report = store.read(f"probes/{cached['probe_id']}.json") if cached else None
    if report is not None:
        return ProbeOutcome(cached["probe_id"], _apply(rows, report["report"], python))
    script = Path(__file__).with_name("op_probe_script.py").read_text()
    died: ProbeDeath | None = None
    try:
        body = run_isolated(
            python, script, PROBE_MARKER, what="op probe", stdin=json.dumps(request).encode(), timeout_s=OP_PROBE_TIMEOUT_S
        )
    except ProbeDied as death:
        died, body = death.death, death.partial or {}
    report = {"kind": "ops", "python": str(python), "request": request, "report": body}
    if died is not None:
        report["died"] = {"cause": died.cause, "step": died.step}
    probe_id = f"p-{digest(report)}"
    store.write(f"probes/{probe_id}.json", report)
    if died is None:
        store.write(key, {"probe_id": probe_id})
    gaps = _apply(rows, body, python)
    if died is not None:
        for row in rows:
            if not row.installed:
                row.installed = None
        kept = " (ops found before that are kept)" if any(row.installed for row in rows) else ""
        gaps.insert(0, f"The target's kernels could not all be checked here: {died.sentence()}{kept}; every other op is unknown.")
    return ProbeOutcome(probe_id, gaps)


def _apply(rows: list[OpRow], report: dict[str, Any], python: Path) -> list[str]:
    """Mark each row found / not found / unknown, and say why an answer is unknown."""
    if "error" in report.get("torch", {}):
        return [f"torch does not import in {python} ({report['torch']['error']}): no op could be checked"]
    missing = [name for name, info in report.get("packages", {}).items() if not info.get("installed")]
    failed = {name: problem for name, problem in report.get("errors", {}).items() if "." in name and name.split(".")[0] in report.get("packages", {})}
    gaps = [f"{name} is not installed in {python}: ops it would provide cannot be checked" for name in missing]
    gaps += [f"{name} failed to load in {python}: {problem}" for name, problem in sorted(failed.items())]
    for row in rows:
        schemas = report.get("ops", {}).get(row.op, [])
        if schemas:
            row.installed, row.schema, row.schema_from = True, schemas, "installed"
        else:
            row.installed = None if (missing or failed) else False
    return gaps


# -- JIT kernels -----------------------------------------------------------------------------


def _provided(decorators: list[ast.expr]) -> tuple[set[str], bool]:
    """Meta-parameters autotune configs and heuristics supply; False when they cannot be read."""
    provided: set[str] = set()
    readable = True
    for decorator in decorators:
        if not isinstance(decorator, ast.Call):
            continue
        name = (dotted(decorator.func) or "").rsplit(".", 1)[-1]
        if name == "heuristics" and decorator.args and isinstance(decorator.args[0], ast.Dict):
            provided |= {k for k in map(_const, decorator.args[0].keys) if k}
        elif name == "autotune":
            configs = _argument(decorator, 0, "configs")
            calls = [c for c in ast.walk(configs) if isinstance(c, ast.Call)] if configs is not None else []
            dicts = [c.args[0] for c in calls if c.args and isinstance(c.args[0], ast.Dict)]
            if not dicts:
                readable = False
            for item in dicts:
                provided |= {k for k in map(_const, item.keys) if k}
    return provided, readable


def kernel_definition(code: Codebase, ref: Ref) -> tuple[ast.FunctionDef, list[str], list[str]] | None:
    """(definition, decorators, required parameters) of a JIT kernel, or None when unreadable."""
    tree = code.tree(ref.module)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ref.path[0]), None) if tree else None
    if node is None:
        return None
    provided, readable = _provided(node.decorator_list)
    if not readable:
        return None
    params = [*node.args.posonlyargs, *node.args.args]
    required = [p.arg for p in params[: len(params) - len(node.args.defaults)] if p.arg not in provided]
    return node, [ast.unparse(d).split("(")[0] for d in node.decorator_list], required


def _is_jit(code: Codebase, ref: Ref) -> bool:
    """A Triton / TileLang kernel: a module-level function under a `jit` or `autotune` decorator."""
    indexed = code.get(ref.module)
    if indexed is None or len(ref.path) != 1:
        return False
    heads = [k.split(" @", 1) for k in indexed.record.jit_kernels]
    return any(name == ref.path[0] and any(m in head.lower() for m in JIT_MARKERS) for name, head in heads)


def _passed(call: ast.Call, params: list[str]) -> set[str] | None:
    """Parameters a launch passes; None when it unpacks *args/**kwargs."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    return set(params[: len(call.args)]) | {k.arg for k in call.keywords if k.arg}


def _gained(base: ModuleIndex | None, ref: Ref, params: list[str]) -> list[str]:
    indexed = base.get(ref.module) if base else None
    before = indexed.record.definition(ref.path[0]) if indexed else None
    if before is None or not before.signature:
        return []
    try:
        arguments = ast.parse(f"def _f{before.signature}:\n    pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return []
    old = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    return [p for p in params if p not in old]


def kernel_launches(code: Codebase, modules: list[str], base: ModuleIndex | None) -> list[KernelLaunch]:
    """JIT kernels the given (plugin) modules launch (`k[grid](...)` or a call), with missing parameters."""
    launches: dict[str, KernelLaunch] = {}
    for module in modules:
        tree = code.tree(module)
        for node in ast.walk(tree) if tree else []:
            if not isinstance(node, ast.Call):
                continue
            head = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            name = dotted(head)
            ref = code.bind(module, name) if name else None
            if ref is None or not _is_jit(code, ref):
                continue
            launch = launches.get(ref.symbol)
            if launch is None:
                found = kernel_definition(code, ref)
                if found is None:
                    continue
                definition, decorators, required = found
                indexed = code.get(ref.module)
                params = [a.arg for a in (*definition.args.posonlyargs, *definition.args.args)]
                launch = launches[ref.symbol] = KernelLaunch(ref, indexed.path, definition.lineno, decorators, required, params)
                launch.gained = _gained(base, ref, params)
            site = code.where(module, node.lineno)
            launch.launched_from.append(site)
            passed = _passed(node, launch.params)
            if passed is not None and (absent := [p for p in launch.required if p not in passed]):
                launch.missing[site] = absent
    return sorted(launches.values(), key=lambda k: k.kernel.symbol)

