"""The upstream release each plugin file represents: its closest release, per file and per family.

Every release is paired with the plugin files by the same rules as the target (`core/compare/pairing.py`),
so a counterpart that moved between releases is still found where it was. A file's distance to a
release is the number of differing lines (added + removed of a zero-context diff) between the
local file and its counterpart there. It is cheap to ask many releases: line counts are cached by
blob pair (`StatsCache`), so a counterpart unchanged across releases is diffed once, and the
record cache keeps each module record in memory by blob sha, so unchanged files are not read
again for the next release's index. The closest release is the newest one (in the caller's
oldest-first order) with the fewest differing lines: equal counts mean equal content, and the
newest such release leaves the fewest upstream commits to review.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..code.module_index import RecordCache
from ..foundation.errors import ErrorCode, ToolFailure, bad_input
from ..foundation.policy import Policy
from ..sources.git import Repository
from ..sources.subjects import DirectorySubject, RevisionSubject, Subject
from .inputs import PairingInputs
from .pairing import build_trees, pair_files
from .pairs import Pair, PluginPackage
from .textdiff import StatsCache

MAX_RELEASES = 12


@dataclass(frozen=True)
class Release:
    label: str
    """As the caller named it: a revision of the upstream repository or a directory."""
    subject: Subject
    commit: str | None
    """None for a release directory."""


@dataclass(frozen=True)
class Counterpart:
    path: str
    sha: str
    lines: int
    """Differing lines: added plus removed."""


@dataclass
class FileReleases:
    local: str
    counterparts: dict[str, Counterpart] = field(default_factory=dict)
    """Release label -> the counterpart there; a release without one is absent."""
    closest: str | None = None

    def per_release(self, labels: list[str]) -> dict[str, int | None]:
        return {label: c.lines if (c := self.counterparts.get(label)) else None for label in labels}


@dataclass(frozen=True)
class FamilyReleases:
    family: str
    """Local family directory, e.g. `vllm_metax/models/deepseek_v4/` (under the plugin's package)."""
    files: dict[str, int]
    """Closest release -> number of the family's files it is closest for."""
    newest: str
    by_rule: dict[str, list[str]]
    """Pairing rule at the target -> the closest releases of the files it paired (oldest first)."""
    lagging: list[str]
    """Files whose closest release is older than `newest`."""


def resolve_releases(policy: Policy, labels: list[str], repo: Repository | None) -> list[Release]:
    """Releases as subjects: revisions of the upstream repository, else directories containing `vllm/`."""
    if len(labels) > MAX_RELEASES:
        raise bad_input(f"releases names {len(labels)} releases; pass at most {MAX_RELEASES}.")
    if len(set(labels)) != len(labels):
        raise bad_input("releases names a release twice; list each once, oldest first.")
    releases = []
    for label in labels:
        if repo is not None:
            try:
                subject = RevisionSubject(repo, label)
                releases.append(Release(label, subject, subject.commit))
                continue
            except ToolFailure as failure:
                if failure.code is not ErrorCode.INVALID_REVISION:
                    raise
        releases.append(Release(label, _directory(policy, label, repo is not None), None))
    return releases


def _directory(policy: Policy, label: str, tried_revision: bool) -> DirectorySubject:
    top = policy.readable(label)
    if not (top / "vllm").is_dir():
        if tried_revision:
            raise bad_input(
                f"release {label!r} is neither a revision of the upstream repository nor a directory containing "
                "vllm/; pass a tag such as v0.25.0."
            )
        raise bad_input(
            f"release {label!r} is not a directory containing vllm/; the upstream is a plain directory, "
            "so releases must be directories too."
        )
    policy.protect(top)
    return DirectorySubject(Path(top))


def release_pairs(local: Subject, release: Release, cache: RecordCache, inputs: PairingInputs) -> list[Pair]:
    """The plugin files paired against one release, by the target's rules (content flags skipped)."""
    extra = [u for u in inputs.overrides.values() if u and u in release.subject.entries()]
    trees = build_trees(local, release.subject, cache, inputs.package, inputs.prefixes, extra)
    return pair_files(trees, inputs, judge_content=False).pairs


def closest_releases(
    local: Subject,
    releases: list[Release],
    cache: RecordCache,
    stats: StatsCache,
    inputs: PairingInputs,
    known: Mapping[str, list[Pair]] | None = None,
) -> dict[str, FileReleases]:
    """Per local file: its counterpart and differing lines at each release, and the closest release.

    `known` maps a commit to pairs already computed for it (the target's), which are reused.
    """
    found = {path: FileReleases(path) for path in inputs.local_files}
    for release in releases:
        pairs = (known or {}).get(release.commit or "") or release_pairs(local, release, cache, inputs)
        for pair in pairs:
            upstream = pair.counterpart
            if upstream is None:
                continue
            theirs, mine = release.subject.sha(upstream), local.sha(pair.local)
            counted = stats.get(theirs, mine, partial(_texts, release.subject, upstream, local, pair.local))
            found[pair.local].counterparts[release.label] = Counterpart(
                upstream, theirs, counted.added + counted.removed
            )
    order = {release.label: position for position, release in enumerate(releases)}
    for item in found.values():
        if item.counterparts:
            item.closest = min(item.counterparts, key=lambda label: (item.counterparts[label].lines, -order[label]))
    return found


def _texts(upstream: Subject, upstream_path: str, local: Subject, local_path: str) -> tuple[bytes, bytes]:
    return upstream.read(upstream_path), local.read(local_path)


def family_of(local: str, package: PluginPackage) -> str | None:
    """The local family directory (`<package>/models/<family>/`) a file lies in, if any."""
    models = package.models
    rest = local[len(models) :] if local.startswith(models) else ""
    return f"{models}{rest.split('/')[0]}/" if "/" in rest else None


def family_summaries(
    files: Mapping[str, FileReleases], rules: Mapping[str, str], labels: list[str], package: PluginPackage
) -> list[FamilyReleases]:
    """Per local family: how many files are closest to which release, per pairing rule, and who lags."""
    order = {label: position for position, label in enumerate(labels)}
    members: dict[str, list[FileReleases]] = {}
    for item in files.values():
        family = family_of(item.local, package)
        if family and item.closest:
            members.setdefault(family, []).append(item)
    summaries = []
    for family, items in sorted(members.items()):
        newest = max((i.closest for i in items if i.closest), key=order.__getitem__)
        by_rule: dict[str, set[str]] = {}
        for item in items:
            by_rule.setdefault(rules.get(item.local, ""), set()).add(item.closest or "")
        counts = {label: sum(1 for i in items if i.closest == label) for label in labels}
        summaries.append(
            FamilyReleases(
                family=family,
                files={label: count for label, count in counts.items() if count},
                newest=newest,
                by_rule={rule: sorted(found, key=order.__getitem__) for rule, found in sorted(by_rule.items())},
                lagging=sorted(i.local for i in items if i.closest != newest),
            )
        )
    return summaries
