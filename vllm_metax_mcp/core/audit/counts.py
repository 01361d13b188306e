"""What is recorded against what is listed: per plugin file and over the range's commits (the
status action, and the counts list, recheck and export report)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .commits import Listing, list_commits
from .lagging import Window, upgrade_window
from .scope import Scope, ScopeRequest, resolve_scope
from .session import AuditSession

Recorded = frozenset[tuple[str, str]]
"""The (commit, plugin file) pairs with an entry."""


@dataclass(frozen=True)
class FileCount:
    """One plugin file's range and how many of its commits have an entry."""

    local: str
    upstream: str | None
    rule: str
    base: str | None
    followed: list[str]
    dependencies: int
    commits: int
    with_entry: int
    without_entry: int
    behind_declared: list[str] = field(default_factory=list)
    """Commits of its range below the release the plugin declares (its base is older), oldest first."""
    behind_total: int = 0


@dataclass(frozen=True)
class CommitCounts:
    """Commits in range touching the audited files; with an entry for every audited file they touch, or not."""

    total: int = 0
    with_entry: int = 0
    without_entry: int = 0


def file_counts(scope: Scope, listing: Listing, recorded: Recorded) -> list[FileCount]:
    tracks = {t.local: t for t in scope.tracks}
    rows = []
    for pair in scope.pairs:
        shas = listing.hits.get(pair.local, {})
        done = sum(1 for sha in shas if (sha, pair.local) in recorded)
        track = tracks.get(pair.local)
        rows.append(
            FileCount(
                local=pair.local,
                upstream=pair.upstream,
                rule=pair.rule.value,
                base=scope.bases[pair.local].label if track else None,
                followed=listing.followed.get(pair.local, []),
                dependencies=len(track.paths) - 1 - track.merged if track else 0,
                commits=len(shas),
                with_entry=done,
                without_entry=len(shas) - done,
            )
        )
    return rows


def commit_counts(listing: Listing, recorded: Recorded) -> CommitCounts:
    done = sum(1 for sha in listing.commits if all((sha, f) in recorded for f in listing.files_of(sha)))
    return CommitCounts(total=len(listing.commits), with_entry=done, without_entry=len(listing.commits) - done)


@dataclass(frozen=True)
class Status:
    files: list[FileCount]
    counts: CommitCounts
    unknowns: list[str]
    window: Window


def status(session: AuditSession, request: ScopeRequest) -> Status:
    """The status action: every file's counts and the commits' (the tool pages the files), and the
    files lagging the release the plugin declares."""
    scope = resolve_scope(session, request)
    listing = list_commits(session.upstream.repo, scope.tracks, session.target)
    recorded = session.recorded()
    window = upgrade_window(session, scope, listing, request.releases)
    files = [
        replace(f, behind_declared=b.shas, behind_total=b.total) if (b := window.behind.get(f.local)) else f
        for f in file_counts(scope, listing, recorded)
    ]
    unknowns = scope.unknowns + listing.unknowns + window.unknowns
    return Status(files, commit_counts(listing, recorded), unknowns, window)
