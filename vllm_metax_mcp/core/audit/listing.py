"""The list action: the range's commits (or one commit, or its patch), each expanded into a row with
the files it touched, the upstream symbols it changed, the plugin symbols depending on them and the
ledger entries it has; the tool pages the rows by size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from ..code.overrides import find_overrides, override_facts
from ..foundation.errors import not_found
from .commits import (
    Commit,
    Hit,
    Listing,
    OtherFiles,
    SymbolChange,
    Touched,
    commit_patch,
    list_commits,
    other_files,
    symbol_changes,
)
from .counts import CommitCounts, FileCount, commit_counts, file_counts
from .dependents import Dependent, Dependents
from .ledger import entries_by_commit
from .scope import Scope, ScopeRequest, resolve_scope
from .session import AuditSession

PatchScope = Literal["mapped", "all"]
LINE_CHARS = 2000
"""The most of one patch line a page shows."""


@dataclass(frozen=True)
class ListedCommit:
    commit: Commit
    local_files: list[str]
    """Audited plugin files this commit needs an entry for."""
    hits: list[Hit]
    others: OtherFiles
    changes: list[SymbolChange]
    dependents: list[Dependent]
    entries: list[dict[str, Any]]
    """Its ledger entries as stored, by plugin file."""


@dataclass(frozen=True)
class RowContext:
    """What every row reads besides its commit, made once per call however many batches a page builds."""

    dependents: Dependents
    entries: dict[str, list[dict[str, Any]]]
    """The ledger's entries by commit."""


@dataclass(frozen=True)
class ListView:
    """What every page of the list action reads: the range's commits (or the one asked for), their
    counts, the files with commits in range, and how to expand a commit into its row."""

    session: AuditSession
    scope: Scope
    listing: Listing
    commits: list[Commit]
    """Oldest first; with `commit` only that one."""
    counts: CommitCounts
    files: list[FileCount]
    """Every audited file with commits in its range."""
    unknowns: list[str]

    @cached_property
    def context(self) -> RowContext:
        return RowContext(_dependents(self.session, self.scope), entries_by_commit(self.session.ledger))

    def rows(self, commits: Sequence[Commit]) -> list[ListedCommit]:
        """The rows of `commits` (symbol records parsed in one batch)."""
        return listed_commits(self.session, self.listing, self.context, commits)

    def patch(self, scope: PatchScope) -> list[str]:
        """The patch of the one commit asked for, of its mapped files (or whole), long lines clipped."""
        sha = self.commits[0].sha
        lines = commit_patch(self.session.upstream.repo, sha, self.listing.hits_of(sha) if scope == "mapped" else None)
        return [clip_line(line) for line in lines]

    def first_undecided(self, rows: Sequence[ListedCommit]) -> ListedCommit | None:
        """The first row with an audited file still lacking an entry."""
        recorded = self.session.recorded()
        return next((r for r in rows if any((r.commit.sha, f) not in recorded for f in r.local_files)), None)


def clip_line(line: str) -> str:
    """A patch line cut to LINE_CHARS, saying how much was cut (a minified file can be one huge line)."""
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS]}… [{len(line) - LINE_CHARS} more chars]"


def _dependents(session: AuditSession, scope: Scope) -> Dependents:
    """Who depends on what in the plugin, patches and registrations included."""
    code = scope.code
    packages = frozenset({scope.trees.package.name})
    overrides = find_overrides(code, override_facts(session.store, code, packages), None)
    return Dependents(code, scope.pairs, overrides, scope.trees.affixes)


def list_view(session: AuditSession, request: ScopeRequest, commit: str | None) -> ListView:
    """The range's commits oldest first; with `commit` only that one (it must touch an audited file in range)."""
    scope = resolve_scope(session, request)
    repo = session.upstream.repo
    listing = list_commits(repo, scope.tracks, session.target)
    recorded = session.recorded()
    commits = listing.ordered()
    if commit:
        sha = repo.resolve_commit(commit)
        if sha not in listing.commits:
            raise not_found(
                f"{commit} touches none of the audited files' upstream files within their ranges; list without commit."
            )
        commits = [listing.commits[sha]]
    files = [f for f in file_counts(scope, listing, recorded) if f.commits]
    return ListView(
        session, scope, listing, commits, commit_counts(listing, recorded), files, scope.unknowns + listing.unknowns
    )


def listed_commits(
    session: AuditSession, listing: Listing, context: RowContext, commits: Sequence[Commit]
) -> list[ListedCommit]:
    touched = [Touched(c, listing.hits_of(c.sha)) for c in commits]
    changes = symbol_changes(session.upstream.repo, session.cache, touched)
    dependents, by_commit = context.dependents, context.entries
    return [
        ListedCommit(
            item.commit,
            listing.files_of(item.commit.sha),
            item.hits,
            other_files(item.commit, item.hits),
            changes[item.commit.sha],
            dependents.of_changes(changes[item.commit.sha], {hit.path: hit.target_path for hit in item.hits}),
            sorted(by_commit.get(item.commit.sha, []), key=lambda e: e["file"]),
        )
        for item in touched
    ]
