"""Where each plugin file's audit range starts, and which upstream files it follows.

A file's range runs from its base to the target: one base the caller names, or the file's
closest release (`core/compare/releases.py`: the newest release with the fewest differing lines), or the
base the ledger recorded for it when an earlier call named one. The range follows the file's
counterpart at the target (`core/compare/pairing.py`) and, on request, the upstream modules that
counterpart imports. The same bases give the difference matrix its per-file base, so the commits
listed and the differences rechecked are measured from the same release.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..code.codebase import Codebase
from ..code.module_index import RecordCache
from ..compare.inputs import PairingInputs
from ..compare.pairs import Pair, Status, Trees
from ..compare.releases import Counterpart, FileReleases, Release, closest_releases, release_pairs
from ..compare.textdiff import StatsCache
from ..foundation.errors import bad_input
from ..sources.git import Repository
from ..sources.subjects import RevisionSubject, Subject
from .commits import Track, range_commits


@dataclass(frozen=True)
class FileBase:
    """Where one plugin file's range starts; kept in the ledger so later calls need no releases."""

    label: str
    """The release (or base) as the caller named it."""
    commit: str
    path: str | None = None
    """The file's upstream counterpart at the base, when pairing there found one."""
    sha: str | None = None


@dataclass(frozen=True)
class Range:
    """The commits of base..target: what a `commit` evidence item or an entry's commit must lie in."""

    label: str
    commits: frozenset[str]


def stored_bases(ledger: Mapping[str, Any] | None, files: list[str]) -> dict[str, FileBase]:
    stored = (ledger or {}).get("bases", {})
    return {local: FileBase(**stored[local]) for local in files if local in stored}


def remember(stored: dict[str, Any], bases: Mapping[str, FileBase]) -> None:
    """Record `bases` in a ledger's `bases`; a counterpart path known for the same commit stays."""
    for local, base in bases.items():
        if base.path is None and (stored.get(local) or {}).get("commit") == base.commit:
            continue
        stored[local] = asdict(base)


def ancestor_release(repo: Repository, label: str, target: str) -> Release:
    """A release (or base) of the upstream repository that the target descends from."""
    subject = RevisionSubject(repo, label)
    if repo.text("merge-base", subject.commit, target).strip() != subject.commit:
        raise bad_input(
            f"{label} ({subject.commit[:12]}) is not an ancestor of the target: "
            "a range runs from an older release to the target."
        )
    return Release(label, subject, subject.commit)


def file_bases(
    plugin: Subject,
    releases: list[Release],
    cache: RecordCache,
    stats: StatsCache,
    inputs: PairingInputs,
    known: Mapping[str, list[Pair]],
    one_base: bool,
) -> dict[str, FileBase]:
    """Each file's closest release, or (`one_base`) the single release for every file, with the
    counterpart pairing finds there."""
    if one_base:
        return _one_base(plugin, releases[0], cache, inputs, known)
    closest = closest_releases(plugin, releases, cache, stats, inputs, known)
    by_label = {r.label: r for r in releases}
    bases = {}
    for local, found in closest.items():
        label = found.closest
        if label is None:
            continue
        counterpart = found.counterparts.get(label)
        path, sha = (counterpart.path, counterpart.sha) if counterpart else (None, None)
        bases[local] = FileBase(label, by_label[label].commit or "", path, sha)
    return bases


def _one_base(
    plugin: Subject, release: Release, cache: RecordCache, inputs: PairingInputs, known: Mapping[str, list[Pair]]
) -> dict[str, FileBase]:
    """Every file's base is the one release, with the counterpart pairing finds there: no release is
    chosen, so no file is read and no line counted (`closest_releases` counts them to choose)."""
    pairs = known.get(release.commit or "") or release_pairs(plugin, release, cache, inputs)
    found = {p.local: p.counterpart for p in pairs}
    bases = {}
    for local in inputs.local_files:
        path = found.get(local)
        sha = release.subject.sha(path) if path is not None else None
        bases[local] = FileBase(release.label, release.commit or "", path, sha)
    return bases


def counterpart_imports(trees: Trees, code: Codebase, counterpart: str) -> list[str]:
    """Upstream files a counterpart imports, on any branch an out-of-tree platform may take."""
    module = trees.upstream_modules.get(counterpart)
    if module is None:
        return []
    found: set[str] = set()
    for record in module.record.imports:
        if record.branch == "not_taken":
            continue
        target = module.absolute(record.module)
        originals: list[str | None] = [original for original, _alias in record.names] or [None]
        for original in originals:
            resolved = code.resolve(target, None if original in (None, "*") else original)
            indexed = code.get(resolved.module)
            if indexed is not None and indexed.side == "upstream" and indexed.path != counterpart:
                found.add(indexed.path)
    return sorted(found)


@dataclass(frozen=True)
class TrackedFiles:
    tracks: list[Track]
    """What to list per file with a counterpart and a base."""
    unknowns: list[str]
    """The files whose range is unknown (no base)."""


def file_tracks(
    pairs: list[Pair], bases: Mapping[str, FileBase], imports: Callable[[str], list[str]] | None
) -> TrackedFiles:
    tracks: list[Track] = []
    unknowns: list[str] = []
    for pair in pairs:
        if pair.upstream is None or pair.status is Status.LOCAL_ONLY:
            continue
        base = bases.get(pair.local)
        if base is None:
            unknowns.append(
                f"{pair.local}: no base — none of the releases has its counterpart and the ledger records none; "
                "pass base."
            )
            continue
        carried = [pair.upstream, *pair.merged_from]
        followed = sorted({p for c in carried for p in imports(c)} - set(carried)) if imports else []
        paths = (*carried, *followed)
        tracks.append(Track(pair.local, paths, base.commit, base.path, merged=len(pair.merged_from)))
    return TrackedFiles(tracks, unknowns)


def file_ranges(repo: Repository, bases: Mapping[str, FileBase], target: str, target_label: str) -> dict[str, Range]:
    """Each file's base..target commits (one rev-list per distinct base)."""
    by_commit = {commit: range_commits(repo, commit, target) for commit in {b.commit for b in bases.values()}}
    return {local: Range(f"{b.label}..{target_label}", by_commit[b.commit]) for local, b in bases.items()}


@dataclass(frozen=True)
class MatrixBases:
    """The releases and per-file closest releases `difference_matrix` takes."""

    releases: list[Release]
    closest: dict[str, FileReleases]


def matrix_bases(repo: Repository, bases: Mapping[str, FileBase]) -> MatrixBases:
    """The difference matrix's bases, from the files' bases."""
    releases: dict[str, Release] = {}
    closest: dict[str, FileReleases] = {}
    for local, base in bases.items():
        if base.path is None or base.sha is None:
            continue
        label = base.label
        if label in releases and releases[label].commit != base.commit:
            label = f"{base.label}@{base.commit[:12]}"  # one name, two commits (e.g. HEAD~3 named by two calls)
        releases.setdefault(label, Release(label, RevisionSubject(repo, base.commit), base.commit))
        closest[local] = FileReleases(local, {label: Counterpart(base.path, base.sha, 0)}, label)
    return MatrixBases(list(releases.values()), closest)
