"""The baseline and recheck actions: diff_model's difference matrix, each file measured from the base
its range starts at, taken as the baseline, or weighed against the baseline and the ledger's entries."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from ..code.plugin_facts import plugin_facts
from ..compare.matrix import MatrixRow, difference_matrix
from ..foundation.progress import phase
from .commits import Listing, Touched, list_commits, symbol_changes
from .counts import CommitCounts, commit_counts
from .differences import Unaccounted, baseline_rows, differences, unaccounted
from .ledger import Ledger
from .ranges import matrix_bases
from .scope import Scope, ScopeRequest, resolve_scope
from .session import AuditSession


@dataclass(frozen=True)
class Matrix:
    rows: list[MatrixRow]
    gaps: list[str]
    """What the matrix could not compare (a base that does not parse)."""

    def class_counts(self) -> dict[str, int]:
        """Differences per proposed class."""
        return dict(sorted(Counter(r.proposed_class.value for r in self.rows).items()))


def matrix(session: AuditSession, scope: Scope) -> Matrix:
    bases = matrix_bases(session.upstream.repo, scope.bases)
    rows, gaps = difference_matrix(
        scope.trees,
        scope.pairs,
        plugin_facts(session.plugin, scope.trees.package.name),
        session.cache,
        bases.closest,
        bases.releases,
    )
    return Matrix(rows, gaps)


@dataclass(frozen=True)
class Baseline:
    rows: int
    """Rows imported for the audited files."""
    matrix: Matrix
    unknowns: list[str]


def take_baseline(session: AuditSession, request: ScopeRequest) -> Baseline:
    """Store today's differences of the audited files as the baseline (other files' rows stay)."""
    scope = resolve_scope(session, request)
    with phase("comparing each pair with its base", 1.0):
        found = matrix(session, scope)
    imported = baseline_rows(differences(found.rows, scope.trees))
    audited = set(session.local_files)

    def store(ledger: Ledger) -> None:
        rows = (ledger.get("baseline") or {}).get("rows") or {}
        kept = {k: v for k, v in rows.items() if v["local"] not in audited}
        ledger["baseline"] = {"taken_at": time.time(), "rows": {**kept, **imported}}

    session.change(store)
    return Baseline(len(imported), found, scope.unknowns + found.gaps)


@dataclass(frozen=True)
class Recheck:
    scope: Scope
    listing: Listing
    matrix: Matrix
    unaccounted: list[Unaccounted]
    counts: CommitCounts

    @property
    def complete(self) -> bool:
        return not self.unaccounted and self.counts.without_entry == 0 and not self.scope.unknowns

    @property
    def unknowns(self) -> list[str]:
        return self.scope.unknowns + self.listing.unknowns + self.matrix.gaps


def run_recheck(session: AuditSession, request: ScopeRequest) -> Recheck:
    """The differences now, and which of them neither the baseline nor an entry explains."""
    scope = resolve_scope(session, request)
    listing = list_commits(session.upstream.repo, scope.tracks, session.target)
    found = matrix(session, scope)
    current = differences(found.rows, scope.trees)
    involved = sorted({d.local for d in current})
    touched = {
        sha: Touched(listing.commits[sha], hits)
        for local in involved
        for sha, hits in listing.hits.get(local, {}).items()
    }
    changes = symbol_changes(session.upstream.repo, session.cache, list(touched.values()))
    changed: dict[str, dict[str, list[str]]] = {}
    for local in involved:
        for sha in listing.hits.get(local, {}):
            for change in changes[sha]:
                changed.setdefault(local, {}).setdefault(change.qualified, []).append(sha)
    counts = commit_counts(listing, session.recorded())
    return Recheck(scope, listing, found, unaccounted(current, session.ledger, changed), counts)
