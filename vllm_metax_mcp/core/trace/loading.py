"""Config rewriting and weight loading on a model's path.

Upstream rewrites a checkpoint's config for speculative decoding (MTP/draft) by setting its
`architectures` to a draft architecture; the sites that name an architecture registered to the
traced model's module are the ones that matter. Weight loading is the `load_weights` methods
and `WeightsMapper` tables of the classes the walk reaches.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Literal

from ..code.codebase import Codebase, Outcome, Ref
from ..code.dispatch import dotted
from ..code.fact_cache import FactCache
from ..foundation.state import StateStore

REWRITE_FACTS_VERSION = 1
ARCHITECTURES = "architectures"

WeightLoadingKind = Literal["load_weights", "weights_mapper"]


@dataclass(frozen=True)
class ConfigRewrite:
    file: str
    line: int
    architectures: list[str]
    guard: str | None
    model_types: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WeightLoading:
    symbol: str
    kind: WeightLoadingKind
    file: str
    line: int


@dataclass(frozen=True)
class RewriteSite:
    """A statement that sets `architectures` to string literals (`scan_rewrites`, read back)."""

    line: int
    architectures: list[str]
    guard: str | None


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _rewritten(node: ast.AST) -> list[str]:
    """Architectures a statement or expression sets, when they are string literals."""
    if isinstance(node, ast.Dict):
        return [
            a
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and k.value == ARCHITECTURES
            for a in _strings(v)
        ]
    if isinstance(node, ast.Call):
        return [a for k in node.keywords if k.arg == ARCHITECTURES for a in _strings(k.value)]
    if isinstance(node, ast.Assign):
        named = any(
            (isinstance(t, ast.Attribute) and t.attr == ARCHITECTURES)
            or (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == ARCHITECTURES)
            for t in node.targets
        )
        return _strings(node.value) if named else []
    return []


def scan_rewrites(source: bytes) -> dict[str, Any]:
    """The rewrite sites of one file as JSON (the cached form): line, architectures, guard."""
    if ARCHITECTURES.encode() not in source:
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    found: list[dict[str, Any]] = []

    def visit(node: ast.AST, guards: list[str]) -> None:
        if isinstance(node, ast.If):
            test = ast.unparse(node.test)
            for child in node.body:
                visit(child, [*guards, test])
            for child in node.orelse:
                visit(child, [*guards, f"not ({test})"])
            return
        architectures = _rewritten(node)
        if architectures and isinstance(node, (ast.stmt, ast.expr)):
            found.append(
                {"line": node.lineno, "architectures": architectures, "guard": " and ".join(guards[-2:]) or None}
            )
        for inner in ast.iter_child_nodes(node):
            visit(inner, [] if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) else guards)

    visit(tree, [])
    return {"rewrites": found}


def _model_types(guard: str | None) -> list[str]:
    """String constants the guard compares `model_type` with."""
    if not guard or "model_type" not in guard:
        return []
    try:
        tree = ast.parse(guard, mode="eval")
    except SyntaxError:
        return []
    return sorted({c.value for c in ast.walk(tree) if isinstance(c, ast.Constant) and isinstance(c.value, str)})


def registry_table(code: Codebase, module: str) -> dict[str, str]:
    """`"Arch": ("module", "Class")` entries of an upstream registry module -> absolute module."""
    tree = code.tree(module)
    indexed = code.get(module)
    package = indexed.name.rsplit(".", 1)[0] if indexed else ""
    table: dict[str, str] = {}
    for node in ast.walk(tree) if tree else []:
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and isinstance(value, ast.Tuple)
                and len(value.elts) == 2
            ):
                target = value.elts[0]
                if isinstance(target, ast.Constant) and isinstance(target.value, str):
                    table[key.value] = target.value if "." in target.value else f"{package}.{target.value}"
    return table


def config_rewrites(
    store: StateStore, code: Codebase, registry_module: str | None, model_module: str | None
) -> list[ConfigRewrite]:
    """Sites in the upstream target that rewrite `architectures` to one registered to the model's module."""
    if not registry_module or not model_module:
        return []
    table = registry_table(code, registry_module)
    subject = code.subjects["upstream"]
    modules = {m.path: m.name for m in code.index.modules.values() if m.side == "upstream"}
    facts = FactCache(store, "rewrites", REWRITE_FACTS_VERSION).get_many(
        subject, sorted(modules), scan_rewrites, (ARCHITECTURES.encode(),)
    )
    found = []
    for path, value in sorted(facts.items()):
        for site in (RewriteSite(**item) for item in value.get("rewrites", [])):
            if any(table.get(a) == model_module for a in site.architectures):
                found.append(ConfigRewrite(path, site.line, site.architectures, site.guard, _model_types(site.guard)))
    return found


def _is_mapper(call: ast.Call) -> bool:
    return (dotted(call.func) or "").rsplit(".", 1)[-1] == "WeightsMapper"


def weight_loading(code: Codebase, classes: list[Ref]) -> list[WeightLoading]:
    """`load_weights` and `WeightsMapper` class attributes of the given classes (`module:Class`,
    as written where the walk met them)."""
    found: list[WeightLoading] = []
    seen: set[tuple[str, str]] = set()
    for written, alias in ((ref.module, ref.path[0]) for ref in classes):
        resolved = code.resolve(written, alias)
        module, name = (
            (resolved.module, resolved.name or alias) if resolved.outcome is Outcome.DEFINED else (written, alias)
        )
        indexed = code.get(module)
        definition = indexed.record.definition(name) if indexed else None
        if indexed is None or definition is None or definition.kind != "class" or (module, name) in seen:
            continue
        if "load_weights" not in definition.members and "WeightsMapper" not in definition.names_used:
            continue
        seen.add((module, name))
        tree = code.tree(module)
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None
        for item in node.body if node else []:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "load_weights":
                found.append(WeightLoading(f"{module}:{name}.load_weights", "load_weights", indexed.path, item.lineno))
            elif isinstance(item, ast.Assign) and isinstance(item.value, ast.Call) and _is_mapper(item.value):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        found.append(
                            WeightLoading(f"{module}:{name}.{target.id}", "weights_mapper", indexed.path, item.lineno)
                        )
    return found
