"""The evidence a ledger decision or annotation is accepted with, checked by the server.

A `file` item must name a line that exists in that path at the cited blob or revision, a `commit`
item must lie in the file's range, a `tool_result` or `probe` must exist in the state directory,
and a `note` never stands alone — nor does the judged commit itself, whose title or patch is what
is being decided on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compare.textdiff import split_lines
from ..foundation.errors import ErrorCode, ToolFailure, bad_input, not_found
from ..foundation.evidence import (
    CommitEvidence,
    Evidence,
    FileEvidence,
    ProbeEvidence,
    ToolResultEvidence,
)
from ..foundation.results import load_result
from ..foundation.state import StateStore
from ..sources.git import Repository
from ..sources.subjects import Subject, clean_path
from .ranges import Range

HEX = frozenset("0123456789abcdef")


def read_at(repo: Repository, commit: str, path: str) -> bytes | None:
    """The bytes of `path` at `commit`, or None where the path does not exist there."""
    (found,) = repo.read_objects([f"{commit}:{path}"])
    return found.data if found is not None and found.kind == "blob" else None


@dataclass(frozen=True)
class FileAt:
    """A cited file as found: the full blob or commit id it was read at, and its bytes."""

    revision: str
    data: bytes


@dataclass
class EvidenceChecker:
    """Verifies evidence items against the trees, repositories and state directory of one call."""

    store: StateStore
    trees: list[Subject]
    """Snapshots whose blob ids a `file` item may cite: the plugin subject, the target, the bases."""
    repos: list[Repository]
    """Repositories whose revisions a `file` item may cite: upstream first, then the plugin."""
    upstream: Repository

    def check(self, items: list[Evidence], scope: Range | None, judged: str | None = None) -> list[Evidence]:
        """Refuse (ToolFailure) unless some item is checkable and every item checks out; return the
        items with revisions resolved (full commit or blob ids), so the record does not move."""
        own = {judged} if judged else set()
        checkable = [
            i for i in items if i.kind != "note" and not (isinstance(i, CommitEvidence) and self._sha(i.sha) in own)
        ]
        if not checkable:
            why = " (the entry's own commit is what is being judged)" if any(i.kind == "commit" for i in items) else ""
            raise bad_input(
                "A decision needs at least one checkable evidence item — a file line at a revision, a commit in the "
                f"range, an earlier tool result, a test or a probe; a note alone is not evidence{why}."
            )
        checked = []
        for position, item in enumerate(items):
            try:
                checked.append(self._item(item, scope))
            except ToolFailure as failure:
                raise ToolFailure(failure.code, f"evidence[{position}] ({item.kind}): {failure.message}") from None
        return checked

    def _item(self, item: Evidence, scope: Range | None) -> Evidence:
        if isinstance(item, FileEvidence):
            return item.model_copy(update={"path": clean_path(item.path), "rev": self._file(item)})
        if isinstance(item, CommitEvidence):
            sha = self.upstream.resolve_commit(item.sha)
            if scope is None:
                raise bad_input("no range is known to check the commit against: pass base or releases.")
            if sha not in scope.commits:
                raise bad_input(f"commit {sha[:12]} is not in the range {scope.label}.")
            return item.model_copy(update={"sha": sha})
        if isinstance(item, ToolResultEvidence) and load_result(self.store, item.result_id) is None:
            raise not_found(f"no tool result {item.result_id} in this server's state directory.")
        if isinstance(item, ProbeEvidence):
            body = item.probe_id[2:]
            if not (
                item.probe_id.startswith("p-")
                and body
                and set(body) <= HEX
                and self.store.read(f"probes/{item.probe_id}.json")
            ):
                raise not_found(f"no probe {item.probe_id} in this server's state directory.")
        return item

    def _sha(self, revision: str) -> str | None:
        try:
            return self.upstream.resolve_commit(revision)
        except ToolFailure:
            return None

    def _file(self, item: FileEvidence) -> str:
        """Check the line exists; return the full blob or commit id the path was read at."""
        path = clean_path(item.path)
        if "\n" in path:
            raise bad_input("a path must not contain a newline.")
        found = self._blob(path, item.rev.lower()) or self._revision(path, item.rev)
        lines = len(split_lines(found.data))
        if item.line > lines:
            raise bad_input(f"{path} has {lines} lines at {item.rev}; line {item.line} does not exist.")
        return found.revision

    def _blob(self, path: str, rev: str) -> FileAt | None:
        if len(rev) < 7 or not set(rev) <= HEX:
            return None
        for tree in self.trees:
            entry = tree.entries().get(path)
            if entry is not None and entry.sha.startswith(rev):
                return FileAt(entry.sha, tree.read(path))
        return None

    def _revision(self, path: str, rev: str) -> FileAt:
        resolved = []
        for repo in self.repos:
            try:
                commit = repo.resolve_commit(rev)
            except ToolFailure as failure:
                if failure.code is ErrorCode.INVALID_REVISION:
                    continue
                raise
            data = read_at(repo, commit, path)
            if data is not None:
                return FileAt(commit, data)
            resolved.append(commit[:12])
        if resolved:
            raise not_found(f"{path} does not exist at {rev} ({', '.join(resolved)}).")
        raise bad_input(
            f"{rev!r} is neither the blob of {path} in the plugin subject, the target or a base, nor a revision of the "
            "upstream or plugin repository; cite the commit (or tag) the line is at."
        )
