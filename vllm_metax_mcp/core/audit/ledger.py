"""The audit ledger's storage: one ledger per plugin repository (git common dir) and upstream target
commit, in the state directory, so it survives restarts and every server sharing the directory sees
one copy.

It holds a decision per (upstream commit, plugin file) under `entries`, the baseline (the difference
matrix as it stood when imported, each row with the identity of the code on both sides), inventory
annotations and the base each file's range was computed from. The stored JSON is the format
(trace_dependency and the ledger resource read it); `Decision` and `Annotation` are how a checked
item is written into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..foundation.atomic import write_bytes_atomic
from ..foundation.evidence import Evidence
from ..foundation.results import digest
from ..foundation.state import StateStore

LEDGER_VERSION = 1
Disposition = Literal["inherited", "merge", "coordinated_dependency", "platform_specific", "unsupported_architecture"]
Side = Literal["upstream", "plugin"]
"""Whose commit a decision judges: an upstream commit in a file's range, or a plugin commit of a local range."""
Ledger = dict[str, Any]
"""A ledger as stored: version, id, plugin_repository, upstream, bases, entries, local_entries (plugin
commits), baseline, annotations."""


def ledger_id(repository_key: str, target_commit: str) -> str:
    return digest({"repository": repository_key, "target": target_commit}, 24)


def ledger_path(identifier: str) -> str:
    return f"ledgers/{identifier}.json"


def new_ledger(identifier: str, repository_key: str, upstream: dict[str, Any]) -> Ledger:
    return {
        "version": LEDGER_VERSION,
        "id": identifier,
        "plugin_repository": repository_key,
        "upstream": upstream,
        "bases": {},
        "entries": {},
        "local_entries": {},
        "baseline": None,
        "annotations": {},
    }


def load_ledger(store: StateStore, identifier: str) -> Ledger | None:
    return store.read(ledger_path(identifier))


def change_ledger(store: StateStore, fresh: Ledger, change: Callable[[Ledger], None]) -> Ledger:
    """Apply `change` to the stored ledger (or `fresh`) under the state directory's lock."""

    def apply(current: Ledger | None) -> Ledger:
        ledger = current or fresh
        change(ledger)
        return ledger

    return store.update(ledger_path(fresh["id"]), apply)


def entry_key(commit: str, local: str) -> str:
    return f"{commit} {local}"


def entries_by_commit(ledger: Ledger | None) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in (ledger or {}).get("entries", {}).values():
        found.setdefault(entry["commit"], []).append(entry)
    return found


def recorded_pairs(ledger: Ledger | None) -> frozenset[tuple[str, str]]:
    """The (commit, plugin file) pairs that have an entry."""
    return frozenset((e["commit"], e["file"]) for e in (ledger or {}).get("entries", {}).values())


def write_text(store: StateStore, relative: str, text: str) -> None:
    with store.locked():
        write_bytes_atomic(store.path(relative), text.encode())


@dataclass(frozen=True)
class Decision:
    """A checked decision for one (commit, plugin file): an upstream commit's under `entries`, a
    plugin commit's (`side` plugin) under `local_entries`."""

    commit: str
    file: str
    disposition: Disposition
    local_edit: bool
    affected_interface: str
    plugin_symbols: tuple[str, ...]
    evidence: tuple[Evidence, ...]
    """Checked, with revisions resolved to full ids."""
    recorded_at: float
    side: Side = "upstream"

    @property
    def key(self) -> str:
        return entry_key(self.commit, self.file)

    @property
    def section(self) -> str:
        return "entries" if self.side == "upstream" else "local_entries"

    def stored(self) -> dict[str, Any]:
        return {
            **({"side": self.side} if self.side == "plugin" else {}),
            "commit": self.commit,
            "file": self.file,
            "disposition": self.disposition,
            "local_edit": self.local_edit,
            "affected_interface": self.affected_interface,
            "plugin_symbols": list(self.plugin_symbols),
            "evidence": [item.model_dump(mode="json") for item in self.evidence],
            "recorded_at": self.recorded_at,
        }


@dataclass(frozen=True)
class Annotation:
    """A checked disposition of one trace_dependency inventory row, stored under `annotations`."""

    node: str
    disposition: Disposition
    recorded_at: float
    evidence: tuple[Evidence, ...]

    @property
    def key(self) -> str:
        return self.node

    def stored(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "disposition": self.disposition,
            "recorded_at": self.recorded_at,
            "evidence": [item.model_dump(mode="json") for item in self.evidence],
        }
