"""Which audit_commits arguments each action reads: one an action would ignore is refused before any
work, so a misplaced argument never passes for a default (the tool's input model asks here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PAGED_ACTIONS = ("list", "local", "status", "recheck")
READ_BY: dict[str, tuple[str, ...]] = {
    "patch": ("list",),
    "commit": ("list",),
    "local_range": ("local", "record"),
    "entries": ("record", "annotate"),
    "cursor": PAGED_ACTIONS,
    "limit": PAGED_ACTIONS,
}
NOT_LOCAL = ("upstream", "target", "base", "releases", "mapping_overrides", "include_dependencies")
"""What action=local never reads: it walks the plugin's own history only."""
RECORD_NEEDS = ("commit", "file", "local_edit", "affected_interface")


def problems(action: str, given: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with this combination; `given` holds the arguments set (not defaults), `entries`
    each entry's set fields."""
    found = [
        f"{name} is only used with action={' or '.join(by)} (not {action})"
        for name, by in READ_BY.items()
        if name in given and action not in by
    ]
    if action == "local":
        found += [
            f"{name} is not used by action=local (it reads the plugin's history only)"
            for name in NOT_LOCAL
            if name in given
        ]
        if "local_range" not in given:
            found.append("action=local needs local_range=START..END")
    if "patch" in given and "commit" not in given:
        found.append("patch needs commit (the sha whose patch to read)")
    if action in ("record", "annotate") and not entries:
        found.append(f"action={action} needs entries")
    if action in ("record", "annotate"):
        found += [f"entries[{i}]: {why}" for i, entry in enumerate(entries) if (why := entry_problem(action, entry))]
    return found


def entry_problem(action: str, entry: Mapping[str, Any]) -> str | None:
    """record: commit, file, local_edit, affected_interface (plugin_symbols, side optional); annotate: node."""
    if action == "annotate":
        extra = [name for name in (*RECORD_NEEDS, "plugin_symbols", "side") if name in entry]
        return (
            f"annotate takes node, disposition, evidence; not {', '.join(extra)}"
            if extra
            else (None if "node" in entry else "annotate needs node")
        )
    if "node" in entry:
        return "node is for action=annotate"
    missing = [name for name in RECORD_NEEDS if name not in entry]
    return f"record needs {', '.join(missing)}" if missing else None
