"""Where an architecture is registered: the plugin's `register_model` calls, upstream's registry tables."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..foundation.atomic import write_bytes_atomic
from ..foundation.state import StateStore
from ..sources.subjects import SourceReader, Subject
from .dispatch import walk_nodes
from .op_scanners import const_string


@dataclass(frozen=True)
class Registration:
    arch: str
    module: str
    symbol: str
    path: str
    line: int


REGISTER_PARAMETERS = ("model_arch", "model_cls")
"""`ModelRegistry.register_model`'s parameters, which a call may also pass by keyword."""


def _register_arguments(node: ast.AST) -> tuple[ast.expr, ast.expr, int] | None:
    """The (architecture, class) arguments of a `register_model(...)` call, positional or by keyword,
    and the call's line."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) != "register_model":
        return None
    given: list[ast.expr | None] = [*node.args[:2], *[None] * (2 - len(node.args[:2]))]
    for keyword in node.keywords:
        if keyword.arg in REGISTER_PARAMETERS:
            given[REGISTER_PARAMETERS.index(keyword.arg)] = keyword.value
    arch, cls = given
    return (arch, cls, node.lineno) if arch is not None and cls is not None else None


def plugin_registrations(subject: Subject, prefix: str = "") -> list[Registration]:
    """`ModelRegistry.register_model("Arch", "pkg.module:Class")` calls (lazy string form, or a class)."""
    found: list[Registration] = []
    candidates = [p for p in subject.list(prefix) if p.endswith(".py")]
    for path, source in subject.read_many(candidates).items():
        if b"register_model" not in source:
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            arguments = _register_arguments(node)
            if arguments is None:
                continue
            arch, target = const_string(arguments[0]), const_string(arguments[1])
            if arch is None:
                continue
            if target and ":" in target:
                module, symbol = target.split(":", 1)
            elif isinstance(arguments[1], ast.Name):
                module, symbol = "", arguments[1].id  # a class object: resolved through the caller's imports
            else:
                continue
            found.append(Registration(arch, module, symbol, path, arguments[2]))
    return found


_TABLE_ENTRY = re.compile(rb'["\']\w+["\']\s*:\s*\(\s*["\'][\w.]+["\']\s*,\s*["\']\w+["\']\s*\)')
"""One `"Arch": ("module", "Class")` entry: the bytes test that finds registry tables without parsing."""


def _table_entries(path: str, tree: ast.AST, wanted: Callable[[str], bool]) -> list[Registration]:
    """The `"Arch": ("module", "Class")` entries of a module's dict literals whose arch is `wanted`.

    A module without dots is relative to the registry module's package (the classic
    `vllm.model_executor.models` layout); a dotted one is absolute.
    """
    package = path[:-3].split("/")[:-1]
    found: list[Registration] = []
    for node in walk_nodes(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            arch = const_string(key) if key is not None else None
            if arch is None or not wanted(arch) or not isinstance(value, ast.Tuple) or len(value.elts) != 2:
                continue
            module, symbol = const_string(value.elts[0]), const_string(value.elts[1])
            if module and symbol:
                absolute = module if "." in module else ".".join([*package, module])
                found.append(Registration(arch, absolute, symbol, path, key.lineno if key else value.lineno))
    return found


def upstream_registry(subject: Subject, prefix: str = "vllm/", read: SourceReader | None = None) -> list[Registration]:
    """Every entry of upstream's registry tables, in one pass: only files holding such entries are parsed
    (the files read by `read`, by default the subject's)."""
    found: list[Registration] = []
    candidates = [p for p in subject.list(prefix) if p.endswith(".py")]
    for path, source in sorted((read or subject.read_many)(candidates).items()):
        if not _TABLE_ENTRY.search(source):
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        found += _table_entries(path, tree, lambda arch: True)
    return found


REGISTRY_VERSION = 2


def cached_upstream_registry(
    store: StateStore,
    subject: Subject,
    prefix: str = "vllm/",
    read: SourceReader | None = None,
) -> list[Registration]:
    """`upstream_registry`, cached under a key of the tree's (path, blob) list: a second call reads one file."""
    entries = subject.entries()
    listed = "\n".join(f"{p} {entries[p].sha}" for p in sorted(subject.list(prefix)) if p.endswith(".py"))
    key = hashlib.sha256(listed.encode()).hexdigest()
    relative = f"cache/registry-v{REGISTRY_VERSION}/{key}.json"
    try:
        cached = store.read(relative)
        if cached is not None:
            return [Registration(**item) for item in cached]
    except (ValueError, TypeError):
        pass  # unreadable or of another shape: computed again
    found = upstream_registry(subject, prefix, read)
    write_bytes_atomic(store.path(relative), json.dumps([vars(r) for r in found]).encode(), durable=False)
    return found


def upstream_registrations(store: StateStore, subject: Subject, arch: str) -> list[Registration]:
    """Entries `"Arch": ("module", "Class")` of upstream registry tables for one architecture (read
    from the cached registry, so a second call reads one file instead of the whole tree)."""
    return [r for r in cached_upstream_registry(store, subject) if r.arch == arch]


@dataclass(frozen=True)
class RegisteringFile:
    """A plugin file that calls `register_model`: where the first call is and how many it makes."""

    first_line: int
    calls: int


def registering_files(registrations: list[Registration], prefixes: list[str]) -> dict[str, RegisteringFile]:
    """The files under `prefixes` that register architectures (pairing's plugin-only rule)."""
    found: dict[str, RegisteringFile] = {}
    for registration in registrations:
        if not any(registration.path.startswith(prefix) for prefix in prefixes):
            continue
        seen = found.get(registration.path)
        first = min(seen.first_line, registration.line) if seen else registration.line
        found[registration.path] = RegisteringFile(first, (seen.calls if seen else 0) + 1)
    return found
