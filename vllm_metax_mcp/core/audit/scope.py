"""What an action covers: the pairing at the target, each file's base (as the call names it, then
remembered, or as the ledger recorded it) and the upstream files listed per plugin file."""

from __future__ import annotations

from dataclasses import dataclass

from ..code.codebase import Codebase
from ..compare.pairing import build_trees, pair_files
from ..compare.pairs import Pair, Trees
from ..compare.textdiff import StatsCache
from ..foundation.errors import bad_input
from .commits import Track
from .ranges import FileBase, ancestor_release, counterpart_imports, file_bases, file_tracks, remember, stored_bases
from .session import AuditSession


@dataclass(frozen=True)
class ScopeRequest:
    """Where the call's ranges start, and what they follow."""

    base: str | None
    """One base revision for every file (overrides releases)."""
    releases: tuple[str, ...]
    """Upstream release tags, oldest first: each file's base is its closest release."""
    include_dependencies: bool = False
    """Also follow the upstream modules each counterpart imports."""


@dataclass(frozen=True)
class Scope:
    """Pairing at the target, each file's base, and what to list."""

    trees: Trees
    code: Codebase
    """The trees as one import graph."""
    pairs: list[Pair]
    bases: dict[str, FileBase]
    tracks: list[Track]
    unknowns: list[str]


def resolve_bases(session: AuditSession, request: ScopeRequest, pairs: list[Pair] | None) -> dict[str, FileBase]:
    """Each file's base, as the call names it (and then remembered) or as the ledger recorded it.

    Without the target's `pairs` (record, annotate) one explicit base is taken without pairing there.
    """
    if not (request.base or request.releases):
        return stored_bases(session.ledger, session.local_files)
    if len(set(request.releases)) != len(request.releases):
        raise bad_input("releases names a release twice; list each once, oldest first.")
    releases = [
        ancestor_release(session.upstream.repo, label, session.target)
        for label in ([request.base] if request.base else request.releases)
    ]
    if request.base and pairs is None:
        bases = {local: FileBase(request.base, releases[0].commit or "") for local in session.local_files}
    else:
        known = {session.target: pairs} if pairs else {}
        bases = file_bases(
            session.plugin,
            releases,
            session.cache,
            StatsCache(session.store),
            session.inputs,
            known,
            one_base=bool(request.base),
        )
    session.change(lambda ledger: remember(ledger["bases"], bases))
    return bases


def _codebase(session: AuditSession, trees: Trees) -> Codebase:
    """The plugin and target trees as one import graph."""
    return Codebase(
        trees.index,
        {"plugin": session.plugin, "upstream": session.upstream},
        frozenset({"vllm", trees.package.name}),
    )


def resolve_scope(session: AuditSession, request: ScopeRequest) -> Scope:
    inputs = session.inputs
    prefixes = sorted({inputs.package.root, *inputs.prefixes})
    extra = [u for u in inputs.overrides.values() if u]
    trees = build_trees(session.plugin, session.upstream, session.cache, inputs.package, prefixes, extra)
    pairs = pair_files(trees, inputs, judge_content=False).pairs
    bases = resolve_bases(session, request, pairs)
    code = _codebase(session, trees)
    imports = (
        (lambda counterpart: counterpart_imports(trees, code, counterpart)) if request.include_dependencies else None
    )
    tracked = file_tracks(pairs, bases, imports)
    if not tracked.tracks and any(p.upstream for p in pairs):
        raise bad_input(
            "No file has a base: pass releases (tags, oldest first) or base once; the ledger then remembers them."
        )
    return Scope(trees, code, pairs, bases, tracked.tracks, tracked.unknowns)
