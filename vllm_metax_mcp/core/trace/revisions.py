"""Upstream revisions between base and target, read lazily, and the first one where a check fails.

Only the modules a check asks for are read and scanned (through the shared record cache), so
bisecting the commits between two releases costs a few `ls-tree`s and a handful of blobs. Two
histories answer the same question (`first_break`): a git upstream (the commits on the ancestry
path base..target; the release is the first version tag that contains the failing commit, from
`for-each-ref --contains`) and a series of releases (tags or release directories, oldest first;
the release is the first one where the check fails).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..code.codebase import Lookup
from ..code.module_index import IndexedModule, RecordCache
from ..foundation.evidence import CommitEvidence, Evidence, FileEvidence, NoteEvidence
from ..sources.git import Repository
from ..sources.subjects import RevisionSubject, Subject

VERSION_TAG = re.compile(r"\d+\.\d+")
PRE_RELEASE = re.compile(r"\d[._-]?(rc|a|b|alpha|beta|dev|pre)[._-]?\d*$")
"""A version tag ending in a pre-release marker (`v0.27.0rc1`, `v1.0.0-beta.2`); `.post1` is final."""


@dataclass
class RevisionModules:
    """Modules of one upstream revision or release, parsed on demand: a lookup for `codebase.resolve_name`."""

    subject: Subject
    cache: RecordCache
    _found: dict[str, IndexedModule | None] = field(default_factory=dict)

    def get(self, name: str) -> IndexedModule | None:
        if name not in self._found:
            self._found[name] = self._load(name)
        return self._found[name]

    def _load(self, name: str) -> IndexedModule | None:
        stem = name.replace(".", "/")
        entries = self.subject.entries()
        for path, package in ((f"{stem}.py", False), (f"{stem}/__init__.py", True)):
            if path in entries:
                record = self.cache.get_many(self.subject, [path])[path]
                return IndexedModule(name, "upstream", path, package, record)
        return None


Check = Callable[[Lookup], bool]
"""A check run against one revision's modules."""


@dataclass(frozen=True)
class Break:
    """Where a check that holds at base first fails."""

    release: str | None
    """The first release tag containing the failing commit, or the first release where it fails."""
    text: str
    evidence: list[Evidence]


@dataclass
class UpstreamHistory:
    repo: Repository
    base: str
    commits: list[str]
    """After base up to and including target, oldest first."""
    cache: RecordCache
    _revisions: dict[str, RevisionModules] = field(default_factory=dict)
    _releases: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    def modules(self, commit: str) -> RevisionModules:
        if commit not in self._revisions:
            self._revisions[commit] = RevisionModules(RevisionSubject(self.repo, commit), self.cache)
        return self._revisions[commit]

    def first_failing(self, holds: Check) -> str | None:
        """The earliest commit where `holds` is false, assuming it holds at base and fails at target."""
        if not self.commits or holds(self.modules(self.commits[-1]).get):
            return None
        low, high = 0, len(self.commits) - 1
        while low < high:
            middle = (low + high) // 2
            if holds(self.modules(self.commits[middle]).get):
                low = middle + 1
            else:
                high = middle
        return self.commits[low]

    def releases(self, commit: str) -> tuple[str | None, str | None]:
        """The first version tag containing `commit`, and the first final (not pre-release) one."""
        if commit not in self._releases:
            listed = self.repo.text(
                "for-each-ref",
                f"--contains={commit}",
                "--sort=version:refname",
                "--sort=creatordate",
                "--format=%(refname:short)",
                "refs/tags",
            ).split()
            tags = [t for t in listed if VERSION_TAG.search(t)]
            final = next((t for t in tags if not PRE_RELEASE.search(t)), None)
            self._releases[commit] = (tags[0] if tags else None, final)
        return self._releases[commit]

    def first_break(self, holds: Check) -> Break | None:
        commit = self.first_failing(holds)
        if commit is None:
            return None
        first, final = self.releases(commit)
        if first is None:
            where = "in no release tag yet"
        elif final and final != first:
            where = f"first released in {first} (final release {final})"
        else:
            where = f"first released in {first}"
        return Break(first, f"first fails at commit {commit[:12]}, {where}", [CommitEvidence(sha=commit)])

    def base_evidence(self, path: str, line: int) -> Evidence:
        return FileEvidence(path=path, line=max(line, 1), rev=self.base)


def upstream_history(repo: Repository, base: str, target: str, cache: RecordCache) -> UpstreamHistory:
    """The commits on the ancestry path base..target (just the target when base is not its ancestor)."""
    listed = repo.text("rev-list", "--ancestry-path", "--reverse", f"{base}..{target}").split()
    return UpstreamHistory(repo, base, listed or [target], cache)


@dataclass
class ReleaseSeries:
    """Releases oldest first, base first and target last: revisions or release directories."""

    releases: list[tuple[str, Subject]]
    cache: RecordCache
    _modules: dict[str, RevisionModules] = field(default_factory=dict)

    def modules(self, label: str, subject: Subject) -> RevisionModules:
        if label not in self._modules:
            self._modules[label] = RevisionModules(subject, self.cache)
        return self._modules[label]

    def first_break(self, holds: Check) -> Break | None:
        """The first release after base where `holds` is false (bisected, as for commits)."""
        later = self.releases[1:]
        if not later or holds(self.modules(*later[-1]).get):
            return None
        low, high = 0, len(later) - 1
        while low < high:
            middle = (low + high) // 2
            if holds(self.modules(*later[middle]).get):
                low = middle + 1
            else:
                high = middle
        label, subject = later[low]
        before = self.releases[low][0]
        evidence: list[Evidence] = [NoteEvidence(text=f"resolves in release {before}, not in {label}")]
        if isinstance(subject, RevisionSubject):
            evidence.insert(0, CommitEvidence(sha=subject.commit))
        return Break(label, f"first fails in release {label} (resolves in {before})", evidence)

    def base_evidence(self, path: str, line: int) -> Evidence:
        subject = self.releases[0][1]
        rev = subject.commit if isinstance(subject, RevisionSubject) else subject.sha(path)
        return FileEvidence(path=path, line=max(line, 1), rev=rev)


History = UpstreamHistory | ReleaseSeries
