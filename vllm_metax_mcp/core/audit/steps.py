"""What an agent calls after each audit_commits action: the arguments beside the call's scope (plugin,
upstream, paths, bases) and why. Every step is a call that succeeds as it stands; the tool adds the
scope (or, for a further page, the whole call) and names the tool."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .counts import CommitCounts


@dataclass(frozen=True)
class Step:
    arguments: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    same_call: bool = False
    """Repeat the call as it was with `arguments` (a cursor) set; else the scope plus `arguments`."""


def further(cursor: str, what: str) -> Step:
    return Step({"cursor": cursor}, f"The next page of {what}.", same_call=True)


def review(sha: str) -> Step:
    return Step(
        {"action": "list", "commit": sha, "patch": "mapped"},
        f"Read {sha[:12]}'s patch of the mapped files; then record one entry per (commit, local file).",
    )


def after_list(counts: CommitCounts, undecided: str | None, cursor: str | None) -> Step:
    """A page of commits: review its first commit still lacking an entry, else the next page."""
    if undecided:
        return review(undecided)
    if cursor:
        return further(cursor, "commits")
    return _settled(counts)


def after_detail(sha: str, undecided: bool, counts: CommitCounts) -> Step:
    return review(sha) if undecided else _settled(counts)


def after_patch(cursor: str | None) -> Step:
    if cursor:
        return further(cursor, "the patch")
    return Step(
        {"action": "status"},
        "Record an entry per (commit, local file) with action=record; status then counts what is left.",
    )


def after_decisions(refused: int) -> Step:
    why = "Fix and resend the refused entries; status counts" if refused else "Status counts"
    return Step({"action": "status"}, f"{why} the commits still without an entry.")


def after_status(counts: CommitCounts, cursor: str | None) -> Step:
    if cursor:
        return further(cursor, "files")
    return _settled(counts)


def _settled(counts: CommitCounts) -> Step:
    if counts.without_entry:
        return Step({"action": "list"}, f"{counts.without_entry} commits still lack an entry: list them.")
    return Step({"action": "recheck"}, "Every commit has an entry: recheck the differences nothing explains.")


def after_baseline() -> Step:
    return Step({"action": "recheck"}, "After edits, recheck reports differences the baseline no longer explains.")


def after_recheck(complete: bool, counts: CommitCounts, commit: str | None, cursor: str | None) -> Step:
    """Explain the unaccounted differences (review the commit behind the first), then the missing entries."""
    if complete:
        return Step({"action": "export"}, "Complete: export the ledger.")
    if commit:
        return review(commit)
    if cursor:
        return further(cursor, "unaccounted differences")
    if counts.without_entry:
        return _settled(counts)
    return Step(
        {"action": "baseline"},
        "No commit explains these differences: edit the plugin, or take a new baseline if they are intended.",
    )


def after_local(cursor: str | None) -> Step:
    if cursor:
        return further(cursor, "plugin commits")
    return Step(
        {"action": "list"},
        "Fix each dangling reference and each dropped binding still called; then audit the upstream range.",
    )


def after_export(complete: bool, counts: CommitCounts) -> Step | None:
    return None if complete else _settled(counts)
