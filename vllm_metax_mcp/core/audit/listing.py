"""The list action: a page of the range's commits (or one commit, or a page of its patch), each with
the files it touched, the upstream symbols it changed, the plugin symbols depending on them and the
ledger entries it has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..code.overrides import find_overrides, override_facts
from ..foundation.errors import not_found
from ..foundation.results import Page
from .commits import (
    Commit,
    Hit,
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
from .session import AuditSession, Paging

PatchScope = Literal["none", "mapped", "all"]


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
class CommitPage:
    commits: list[ListedCommit]
    files: list[FileCount]
    """The files of these commits."""
    counts: CommitCounts
    patch: list[str]
    """With a patch asked for: this page of it."""
    total: int
    next_cursor: str | None
    unknowns: list[str]


def _dependents(session: AuditSession, scope: Scope) -> Dependents:
    """Who depends on what in the plugin, patches and registrations included."""
    code = scope.code
    packages = frozenset({scope.trees.package.name})
    overrides = find_overrides(code, override_facts(session.store, code, packages), None)
    return Dependents(code, scope.pairs, overrides, scope.trees.affixes)


def list_page(
    session: AuditSession, request: ScopeRequest, paging: Paging, commit: str | None, patch: PatchScope
) -> CommitPage:
    """A page of the range's commits oldest first; with `commit` only that one, and with `patch` a
    page of its patch (of its mapped files or whole) instead."""
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
    counts = commit_counts(listing, recorded)
    lines: list[str] = []
    page: Page[Any]
    if patch != "none":
        hits = listing.hits_of(commits[0].sha) if patch == "mapped" else None
        page = paging.page(commit_patch(repo, commits[0].sha, hits), "patch")
        lines = page.items
    else:
        page = paging.page(commits, "commits")
        commits = page.items
    touched = [Touched(c, listing.hits_of(c.sha)) for c in commits]
    changes = symbol_changes(repo, session.cache, touched)
    dependents = _dependents(session, scope)
    by_commit = entries_by_commit(session.ledger)
    listed = [
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
    involved = {f for c in listed for f in c.local_files}
    files = [f for f in file_counts(scope, listing, recorded) if f.local in involved]
    return CommitPage(listed, files, counts, lines, page.total, page.next_cursor, scope.unknowns + listing.unknowns)
