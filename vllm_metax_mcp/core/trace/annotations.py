"""What an inventory row says beside where it is: its upstream counterpart and how the plugin's
definitions differ from it, what changed upstream between base and target, and the disposition
recorded for it in the audit ledger.

A plugin module's counterpart is the upstream module on the same path (`vllm_metax.a.b` ->
`vllm.a.b`); definitions are compared by body hash (core/code/scanner.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..code.module_index import ModuleIndex
from .walk import Row

CHANGES_SHOWN = 6


def plugin_packages(index: ModuleIndex) -> frozenset[str]:
    """The top-level packages of the plugin subject."""
    return frozenset(
        m.name for m in index.modules.values() if m.side == "plugin" and "." not in m.name and m.is_package
    )


def _counterpart(name: str, index: ModuleIndex, packages: frozenset[str]) -> str | None:
    """`vllm.a.b[:Name]` for a plugin row `vllm_metax.a.b[:Name]`, when upstream has that module."""
    module, _, symbol = name.partition(":")
    top, _, rest = module.partition(".")
    if top not in packages or not rest:
        return None
    candidate = f"vllm.{rest}"
    indexed = index.get(candidate)
    if indexed is None or indexed.side != "upstream":
        return None
    return f"{candidate}:{symbol}" if symbol else candidate


def _definition_hashes(index: ModuleIndex, module: str) -> dict[str, str]:
    indexed = index.get(module)
    return {d.name: d.body_hash for d in indexed.record.definitions} if indexed else {}


def _delta(before: dict[str, str], after: dict[str, str], symbol: str | None) -> list[str]:
    """`added:` / `removed:` / `changed:` per definition (or for `symbol` alone)."""
    names = [symbol] if symbol else sorted(set(before) | set(after))
    changes = []
    for name in names:
        if name not in before and name in after:
            changes.append(f"added:{name}")
        elif name in before and name not in after:
            changes.append(f"removed:{name}")
        elif name in before and before[name] != after[name]:
            changes.append(f"changed:{name}")
    return changes


def _describe_difference(plugin_hashes: dict[str, str], upstream_hashes: dict[str, str], symbol: str | None) -> str:
    changes = _delta(upstream_hashes, plugin_hashes, symbol)
    if not changes:
        return "identical definitions"
    more = len(changes) - CHANGES_SHOWN
    shown = ", ".join(changes[:CHANGES_SHOWN]) + (f", … {more} more" if more > 0 else "")
    return f"{len(changes)} definition(s) differ from upstream: {shown}"


def annotate(rows: list[Row], index: ModuleIndex, base_index: ModuleIndex | None, packages: frozenset[str]) -> None:
    """Fill each row's counterpart and MetaX difference (plugin rows) and, with a base, its
    upstream delta (base -> target), unless the stability judgement already gave the relevant one
    (the used definitions that changed, core/trace/stability.py)."""
    for row in rows:
        module, _, symbol = row.name.partition(":")
        if row.side == "plugin":
            row.upstream_counterpart = _counterpart(row.name, index, packages)
            if row.upstream_counterpart:
                row.metax_difference = _describe_difference(
                    _definition_hashes(index, module),
                    _definition_hashes(index, row.upstream_counterpart.split(":")[0]),
                    symbol or None,
                )
        upstream_module = module if row.side == "upstream" else (row.upstream_counterpart or "").split(":")[0]
        if base_index is not None and upstream_module and row.upstream_delta is None:
            row.upstream_delta = _delta(
                _definition_hashes(base_index, upstream_module),
                _definition_hashes(index, upstream_module),
                symbol or None,
            )


def recorded_annotations(rows: list[Row], ledger: Mapping[str, Any] | None) -> None:
    """Dispositions recorded for inventory nodes with audit_commits(action=annotate), read from the
    ledger document as stored (core/audit/ledger.py)."""
    recorded = (ledger or {}).get("annotations") or {}
    for row in rows:
        note = recorded.get(row.name)
        if note:
            row.annotation = f"{note['disposition']} ({len(note.get('evidence') or [])} evidence item(s), ledger)"
