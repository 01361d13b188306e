"""The upstream files of the mapped directories that no plugin file pairs with.

The mapped directories are the families the plugin mirrors and the other upstream directories a
pair reaches into. Another platform's (or an unreferenced) family sub-directory is one entry, with
the dispatch condition that selects it; so is any directory with more than `DIR_COLLAPSE` such files.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .family import SubdirKind
from .pairing_context import PairingContext
from .pairs import FAMILIES, Pair, TargetKind, TargetOnly

DIR_COLLAPSE = 8
"""Target-only files of one directory beyond this count are reported as one directory entry."""

_SUBDIR_KIND: dict[SubdirKind, TargetKind] = {
    SubdirKind.BRANCH: "branch",
    SubdirKind.SHARED: "shared",
    SubdirKind.OTHER_PLATFORM: "other_platform",
    SubdirKind.UNREFERENCED: "unreferenced",
}
_COLLAPSED: tuple[TargetKind, ...] = ("other_platform", "unreferenced")


@dataclass(frozen=True)
class _Group:
    directory: str
    kind: TargetKind
    guard: str | None


def _family_groups(context: PairingContext, families: list[str], paired: set[str]) -> dict[_Group, list[str]]:
    groups: dict[_Group, list[str]] = {}
    for family in families:
        layout = context.layout(family)
        for upstream in context.families[family]:
            if upstream in paired:
                continue
            subdir = layout.subdir_of(upstream)
            kind: TargetKind = _SUBDIR_KIND[layout.kinds[subdir]] if subdir else "family"
            directory = f"{layout.root}/{subdir}" if kind in _COLLAPSED else posixpath.dirname(upstream)
            decided = layout.evidence.get(subdir or "")
            guard = decided.guard if decided is not None and kind == "other_platform" else None
            groups.setdefault(_Group(directory, kind, guard), []).append(upstream)
    return groups


def target_only(context: PairingContext, pairs: list[Pair]) -> list[TargetOnly]:
    """Upstream files of the mapped directories that no local file pairs with."""
    paired = {p.upstream for p in pairs if p.upstream}
    families = sorted({f for p in pairs if (f := context.local_family(p.local))})
    groups = _family_groups(context, families, paired)
    upstream_files = context.trees.upstream_files
    roots = tuple(FAMILIES + f + "/" for f in families)
    directories = sorted({posixpath.dirname(u) for u in paired if u in upstream_files and not u.startswith(roots)})
    for directory in directories:
        rest = [u for u in upstream_files if posixpath.dirname(u) == directory and u not in paired]
        if rest:
            groups.setdefault(_Group(directory, "directory", None), []).extend(rest)
    entries: list[TargetOnly] = []
    for group, files in sorted(groups.items(), key=lambda item: (item[0].directory, item[0].kind)):
        if group.kind in _COLLAPSED or len(files) > DIR_COLLAPSE:
            entries.append(TargetOnly(group.directory + "/", group.kind, len(files), group.guard))
        else:
            entries += [TargetOnly(f, group.kind, 1) for f in sorted(files)]
    return entries
