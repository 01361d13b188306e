"""The history rule's lookup: what became of a plugin file's path counterpart upstream — renamed (a chain
A→B→C, followed to the file at the target) or deleted, and in which commits.

One `git log --diff-filter=D` over every expected place finds the commits that removed the counterparts
(cheap: limited to those paths); one `git diff-tree --stdin -M` over just those commits asks git where
each went (rename detection needs the whole commit, so it runs on no other commit). A destination
that is gone at the target starts the next round. A directory upstream (no history) answers nothing.
Inside a family, a deleted file counts only where the out-of-tree platform would have used it (not in
another platform's or an unreferenced directory).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ..sources.git import Repository
from ..sources.subjects import RevisionSubject, read_blobs
from .family import SubdirKind
from .pairing_context import PairingContext
from .pairs import CLASSIC, FAMILIES, UPSTREAM_ROOT
from .textdiff import line_profile

MAX_STEPS = 16
"""Renames followed per file; a longer chain (or a cycle) ends where it stands."""


@dataclass(frozen=True)
class Step:
    """`path` left upstream in `commit`: renamed to `renamed_to`, or deleted (None)."""

    path: str
    commit: str
    renamed_to: str | None = None

    @property
    def note(self) -> str:
        if self.renamed_to is None:
            return f"{self.path} was deleted upstream in {self.commit[:12]}"
        return f"{self.path} was renamed to {self.renamed_to} in {self.commit[:12]}"


@dataclass(frozen=True)
class Trail:
    """What became of a path counterpart, step by step."""

    steps: tuple[Step, ...]
    current: str | None
    """The upstream file the renames end at, at the target; None when the counterpart is gone."""

    @property
    def last(self) -> str:
        """The last path the counterpart had among the compared upstream files."""
        return self.steps[-1].path


@dataclass(frozen=True)
class _ExpectedPlace:
    """Where a path counterpart would be: exact paths, or a file name anywhere in a family directory."""

    paths: tuple[str, ...] = ()
    family: str = ""
    within: str = ""
    """Family places: the local path below the family directory."""

    @property
    def pathspecs(self) -> tuple[str, ...]:
        if self.family:
            return (f":(glob){FAMILIES}{self.family}/**/{posixpath.basename(self.within)}",)
        return tuple(f":(literal){path}" for path in self.paths)


@dataclass(frozen=True)
class _Rename:
    source: str
    destination: str
    blobs: tuple[str, str]


def _expected(context: PairingContext, local: str) -> _ExpectedPlace | None:
    """Where a local file's path counterpart would be upstream (None outside the plugin's package).

    A file in a local model directory that is no upstream family (`<package>/models/<name>/<name>.py`)
    is also expected flat, where upstream keeps single-file models."""
    package = context.trees.package
    family = context.local_family(local)
    if family:
        return _ExpectedPlace(family=family, within=local[len(package.models) + len(family) + 1 :])
    if local.startswith(package.models):
        inner = local[len(package.models) :]
        paths = [FAMILIES + inner, CLASSIC + inner]
        name = posixpath.basename(inner)
        if inner.count("/") == 1 and name != "__init__.py":
            paths += [FAMILIES + name, CLASSIC + name]
        return _ExpectedPlace(tuple(paths))
    if local.startswith(package.root):
        return _ExpectedPlace((f"{UPSTREAM_ROOT}/{local[len(package.root) :]}",))
    return None


def _is_expected(context: PairingContext, deleted: str, place: _ExpectedPlace) -> bool:
    """Whether a deleted upstream path is the counterpart expected at `place`."""
    if not place.family:
        return deleted in place.paths
    directory = FAMILIES + place.family
    if not deleted.startswith(directory + "/"):
        return False
    relative = deleted[len(directory) + 1 :]
    if relative.count("/"):
        kind = context.layout(place.family).kinds.get(relative.split("/")[0])
        if kind in (SubdirKind.OTHER_PLATFORM, SubdirKind.UNREFERENCED):
            return False
        return posixpath.basename(relative) == posixpath.basename(place.within)
    return relative == place.within


def _deletions(upstream: RevisionSubject, specs: list[str], present: frozenset[str]) -> dict[str, str]:
    """Upstream path -> the newest commit before the target that removed it (paths gone at the target)."""
    log = upstream.repo.text(
        "log", "--no-renames", "--diff-filter=D", "--name-only", "--format=format:@%H", upstream.commit, "--", *specs
    )
    deleted: dict[str, str] = {}
    commit = ""
    for line in log.splitlines():
        if line.startswith("@"):
            commit = line[1:]
        elif line and line not in deleted and line not in present:
            deleted[line] = commit
    return deleted


def _renames(repo: Repository, commits: list[str]) -> dict[str, list[_Rename]]:
    """Commit -> the renames git detects in it (`-M`, its default similarity), over the whole commit."""
    raw = repo.run(
        "diff-tree",
        "--stdin",
        "-r",
        "-M",
        "--raw",
        "-z",
        "--no-abbrev",
        input="".join(f"{c}\n" for c in commits).encode(),
    )
    found: dict[str, list[_Rename]] = {}
    commit = ""
    fields = iter(raw.decode(errors="replace").split("\0"))
    for field in fields:
        field = field.strip("\n")
        if field.startswith(":"):
            meta = field[1:].split()
            paths = [next(fields, "")] + ([next(fields, "")] if meta[4][0] in "RC" else [])
            if meta[4][0] == "R":
                found[commit].append(_Rename(paths[0], paths[1], (meta[2], meta[3])))
        elif field:
            commit = field
            found.setdefault(commit, [])
    return found


def _confirmed(repo: Repository, renames: dict[str, list[_Rename]], wanted: set[tuple[str, str]]) -> dict[str, str]:
    """`commit:source` -> destination for the wanted sources git renamed, where more than git's byte
    similarity says so: the two files share a meaningful line (a license header alone pairs unrelated
    small files), or, for a file without code (a package marker), git moved what lies beside or below
    it to the same place below the destination's directory in that commit (its package moved)."""
    chosen = {(c, r.source): r for c, listed in renames.items() for r in listed if (c, r.source) in wanted}
    blobs = read_blobs(repo, [blob for r in chosen.values() for blob in r.blobs])
    result: dict[str, str] = {}
    for (commit, source), rename in chosen.items():
        before, after = (line_profile(blobs[blob]) for blob in rename.blobs)
        home, new_home = posixpath.dirname(source), posixpath.dirname(rename.destination)
        package_moved = any(
            r.source != source and r.source.startswith(home + "/") and r.destination == new_home + r.source[len(home) :]
            for r in renames[commit]
        )
        if before & after or (not before and package_moved):
            result[f"{commit}:{source}"] = rename.destination
    return result


def trails(context: PairingContext, locals_: list[str]) -> dict[str, Trail]:
    """local -> what became of its path counterpart, from the upstream git history (files whose
    counterpart is at the target, or never was upstream, have none)."""
    upstream = context.trees.upstream
    present = context.trees.upstream_files
    expected = {local: place for local in locals_ if (place := _expected(context, local))}
    if not isinstance(upstream, RevisionSubject) or not expected:
        return {}
    deleted = _deletions(upstream, sorted({spec for place in expected.values() for spec in place.pathspecs}), present)
    chains: dict[str, list[Step]] = {}
    for local, place in expected.items():
        hit = next((p for p in deleted if _is_expected(context, p, place)), None)
        if hit:
            chains[local] = [Step(hit, deleted[hit])]
    following = set(chains)
    for _ in range(MAX_STEPS):
        if not following:
            break
        last = {local: chains[local][-1] for local in following}
        renames = _renames(upstream.repo, sorted({step.commit for step in last.values()}))
        moved = _confirmed(upstream.repo, renames, {(step.commit, step.path) for step in last.values()})
        onward: dict[str, str] = {}
        for local, step in last.items():
            destination = moved.get(f"{step.commit}:{step.path}")
            if destination is None:
                continue
            chains[local][-1] = Step(step.path, step.commit, destination)
            if destination not in present and all(s.path != destination for s in chains[local]):
                onward[local] = destination
        following = set()
        if not onward:
            break
        later = _deletions(upstream, sorted({f":(literal){path}" for path in onward.values()}), present)
        for local, path in onward.items():
            if path in later:
                chains[local].append(Step(path, later[path]))
                following.add(local)
    found: dict[str, Trail] = {}
    for local, steps in chains.items():
        end = steps[-1].renamed_to
        found[local] = Trail(tuple(steps), end if end in present else None)
    return found
