"""The history rule's lookup: where a plugin file's path counterpart was, and the commit that deleted it.

One `git log --diff-filter=D` over every expected place answers all files at once; a directory
upstream (no history) answers nothing. Inside a family, a deleted file counts only where the
out-of-tree platform would have used it (not in another platform's or an unreferenced directory).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ..sources.subjects import RevisionSubject
from .family import SubdirKind
from .pairing_context import PairingContext
from .pairs import CLASSIC, FAMILIES, UPSTREAM_ROOT


@dataclass(frozen=True)
class Deletion:
    path: str
    """The deleted upstream path."""
    commit: str
    """The commit that deleted it."""


@dataclass(frozen=True)
class _ExpectedPlace:
    """Where a path counterpart would be: the pathspecs to search, and the directory and path within it."""

    pathspecs: tuple[str, ...]
    directory: str
    """Empty for a flat model file (either upstream model directory)."""
    within: str


def _expected(context: PairingContext, local: str) -> _ExpectedPlace | None:
    """Where a local file's path counterpart would be upstream (None outside the plugin's package)."""
    package = context.trees.package
    family = context.local_family(local)
    if family:
        within = local[len(package.models) + len(family) + 1 :]
        return _ExpectedPlace(
            (f":(glob){FAMILIES}{family}/**/{posixpath.basename(within)}",), FAMILIES + family, within
        )
    if local.startswith(package.models):
        inner = local[len(package.models) :]
        return _ExpectedPlace((FAMILIES + inner, CLASSIC + inner), "", inner)
    if local.startswith(package.root):
        rest = local[len(package.root) :]
        return _ExpectedPlace((f"{UPSTREAM_ROOT}/{rest}",), UPSTREAM_ROOT, rest)
    return None


def _is_expected(context: PairingContext, deleted: str, place: _ExpectedPlace) -> bool:
    """Whether a deleted upstream path is the counterpart expected at `place`."""
    directory, within = place.directory, place.within
    if not directory:
        return deleted in (FAMILIES + within, CLASSIC + within)
    if not deleted.startswith(directory + "/"):
        return False
    relative = deleted[len(directory) + 1 :]
    if directory.startswith(FAMILIES) and relative.count("/"):
        kind = context.layout(directory[len(FAMILIES) :]).kinds.get(relative.split("/")[0])
        if kind in (SubdirKind.OTHER_PLATFORM, SubdirKind.UNREFERENCED):
            return False
        return posixpath.basename(relative) == posixpath.basename(within)
    return relative == within


def deletions(context: PairingContext, locals_: list[str]) -> dict[str, Deletion]:
    """local -> its path counterpart's deletion, from the upstream git history."""
    upstream = context.trees.upstream
    expected = {local: place for local in locals_ if (place := _expected(context, local))}
    if not isinstance(upstream, RevisionSubject) or not expected:
        return {}
    specs = sorted({spec for place in expected.values() for spec in place.pathspecs})
    log = upstream.repo.text(
        "log",
        "--no-renames",
        "--diff-filter=D",
        "--name-only",
        "--format=format:@%H",
        upstream.commit,
        "--",
        *specs,
    )
    deleted: dict[str, str] = {}
    commit = ""
    for line in log.splitlines():
        if line.startswith("@"):
            commit = line[1:]
        elif line and line not in deleted and line not in context.trees.upstream_files:
            deleted[line] = commit
    found: dict[str, Deletion] = {}
    for local, place in expected.items():
        hit = next((p for p in deleted if _is_expected(context, p, place)), None)
        if hit:
            found[local] = Deletion(hit, deleted[hit])
    return found
