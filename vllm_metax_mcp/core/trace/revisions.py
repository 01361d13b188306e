"""Upstream revisions between base and target, read lazily, and the first one where a check fails.

Only the modules a check asks for are read and scanned (through the shared record cache), so
bisecting the commits between two releases costs a few `ls-tree`s and a handful of blobs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..code.module_index import IndexedModule, RecordCache
from ..sources.git import Repository
from ..sources.subjects import RevisionSubject


@dataclass
class RevisionModules:
    """Modules of one upstream revision, parsed on demand: a lookup for `codebase.resolve_name`."""

    subject: RevisionSubject
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


@dataclass
class UpstreamHistory:
    repo: Repository
    commits: list[str]
    """After base up to and including target, oldest first."""
    tags: dict[str, list[str]]
    cache: RecordCache
    _revisions: dict[str, RevisionModules] = field(default_factory=dict)

    def modules(self, commit: str) -> RevisionModules:
        if commit not in self._revisions:
            self._revisions[commit] = RevisionModules(RevisionSubject(self.repo, commit), self.cache)
        return self._revisions[commit]

    def first_failing(self, holds: Callable[[RevisionModules], bool]) -> str | None:
        """The earliest commit where `holds` is false, assuming it holds at base and fails at target."""
        if not self.commits or holds(self.modules(self.commits[-1])):
            return None
        low, high = 0, len(self.commits) - 1
        while low < high:
            middle = (low + high) // 2
            if holds(self.modules(self.commits[middle])):
                low = middle + 1
            else:
                high = middle
        return self.commits[low]

    def release(self, commit: str) -> str | None:
        """The first tagged release that contains `commit` within the range."""
        start = self.commits.index(commit) if commit in self.commits else len(self.commits)
        for candidate in self.commits[start:]:
            if self.tags.get(candidate):
                return sorted(self.tags[candidate])[0]
        return None


def upstream_history(repo: Repository, base: str, target: str, cache: RecordCache) -> UpstreamHistory:
    """The commits on the ancestry path base..target and the tags that point into them."""
    listed = repo.text("rev-list", "--ancestry-path", "--reverse", f"{base}..{target}").split()
    commits = listed or [target]
    tags: dict[str, list[str]] = {}
    refs = repo.text("for-each-ref", "--format=%(objectname) %(*objectname) %(refname:short)", "refs/tags")
    wanted = set(commits)
    for line in refs.splitlines():
        parts = line.split()
        if len(parts) == 3:
            obj, peeled, name = parts
        elif len(parts) == 2:
            obj, peeled, name = parts[0], "", parts[1]
        else:
            continue
        commit = peeled or obj
        if commit in wanted:
            tags.setdefault(commit, []).append(name)
    return UpstreamHistory(repo, commits, tags, cache)
