"""Where an architecture is registered: the plugin's `register_model` calls, upstream's registry tables."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..sources.subjects import Subject
from .op_scanners import const_string


@dataclass(frozen=True)
class Registration:
    arch: str
    module: str
    symbol: str
    path: str
    line: int


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
            if not (isinstance(node, ast.Call) and len(node.args) >= 2):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arch, target = const_string(node.args[0]), const_string(node.args[1])
            if name != "register_model" or arch is None:
                continue
            if target and ":" in target:
                module, symbol = target.split(":", 1)
            elif isinstance(node.args[1], ast.Name):
                module, symbol = "", node.args[1].id  # a class object: resolved through the caller's imports
            else:
                continue
            found.append(Registration(arch, module, symbol, path, node.lineno))
    return found


def upstream_registrations(subject: Subject, arch: str, prefix: str = "vllm/") -> list[Registration]:
    """Entries `"Arch": ("module", "Class")` of upstream registry tables.

    A module without dots is relative to the registry module's package (the classic
    `vllm.model_executor.models` layout); a dotted one is absolute.
    """
    needle = f'"{arch}"'.encode()
    found: list[Registration] = []
    candidates = [p for p in subject.list(prefix) if p.endswith(".py")]
    for path, source in subject.read_many(candidates).items():
        if needle not in source:
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        package = path[:-3].split("/")[:-1]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None or const_string(key) != arch or not isinstance(value, ast.Tuple) or len(value.elts) != 2:
                    continue
                module, symbol = const_string(value.elts[0]), const_string(value.elts[1])
                if module and symbol:
                    absolute = module if "." in module else ".".join([*package, module])
                    found.append(Registration(arch, absolute, symbol, path, key.lineno))
    return found


@dataclass(frozen=True)
class RegisteringFile:
    """A plugin file that calls `register_model`: where the first call is and how many it makes."""

    first_line: int
    calls: int


def registering_files(subject: Subject, prefixes: list[str]) -> dict[str, RegisteringFile]:
    """The files under `prefixes` that register architectures (pairing's plugin-only rule)."""
    found: dict[str, RegisteringFile] = {}
    for prefix in prefixes:
        for registration in plugin_registrations(subject, prefix):
            seen = found.get(registration.path)
            first = min(seen.first_line, registration.line) if seen else registration.line
            found[registration.path] = RegisteringFile(first, (seen.calls if seen else 0) + 1)
    return found
