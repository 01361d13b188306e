"""Subjects: the exact code a tool reads — worktree, staged index, a revision, a directory, installed.

All subjects answer the same questions with repository-relative POSIX paths; `sha` is the git
blob id of the content, so the same bytes have the same id in every subject.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import ClassVar

from ..foundation.errors import ErrorCode, ToolFailure, bad_input, not_found
from ..foundation.policy import Policy, is_within, real
from .git import Repository

SKIPPED_DIRS = frozenset({".git", "__pycache__"})


SourceReader = Callable[[list[str]], Mapping[str, bytes]]
"""The bytes of the given paths of a subject (its own `read_many`, or a reader sharing one read of it)."""


class SubjectKind(str, Enum):
    WORKTREE = "worktree"
    INDEX = "index"
    REVISION = "revision"
    DIRECTORY = "directory"
    INSTALLED = "installed"


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def clean_path(path: str) -> str:
    """A relative POSIX path inside the subject; anything else is refused."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\\" in path or "\0" in path:
        raise bad_input(f"{path!r} is not a repository-relative path; pass e.g. 'vllm_metax/models/x.py'.")
    return "/".join(part for part in pure.parts if part != ".")


def _under(path: str, prefix: str) -> bool:
    prefix = clean_path(prefix) if prefix else ""
    return not prefix or path == prefix or path.startswith(prefix.rstrip("/") + "/")


@dataclass(frozen=True)
class Entry:
    path: str
    sha: str
    executable: bool = False


class Subject:
    """Common behaviour; subclasses provide `_entries` and `_read_many`."""

    kind: SubjectKind
    batched_reads: ClassVar[bool] = False
    """Whether one `read_many` of many paths costs about what a read of one does (a git subject
    starts a process per read; a directory reads file by file)."""

    def __init__(self) -> None:
        self._cache: dict[str, Entry] | None = None

    @property
    def label(self) -> str:
        return self.kind.value

    def _entries(self) -> dict[str, Entry]:
        raise NotImplementedError

    def _read_many(self, entries: list[Entry]) -> dict[str, bytes]:
        raise NotImplementedError

    def entries(self) -> dict[str, Entry]:
        if self._cache is None:
            self._cache = self._entries()
        return self._cache

    def list(self, prefix: str = "") -> list[str]:
        return sorted(p for p in self.entries() if _under(p, prefix))

    def _entry(self, path: str) -> Entry:
        entry = self.entries().get(clean_path(path))
        if entry is None:
            raise not_found(f"{path} does not exist in the {self.label} subject.")
        return entry

    def sha(self, path: str) -> str:
        return self._entry(path).sha

    def read(self, path: str) -> bytes:
        entry = self._entry(path)
        return self._read_many([entry])[entry.path]

    def read_many(self, paths: Iterable[str]) -> dict[str, bytes]:
        return self._read_many([self._entry(p) for p in paths])

    def tree_hash(self) -> str:
        """Identity of the whole snapshot (paths and contents), comparable across subject kinds."""
        digest = hashlib.sha256()
        for path, entry in sorted(self.entries().items()):
            digest.update(f"{path}\0{entry.sha}\n".encode())
        return digest.hexdigest()

    def export(self, dest: Path, prefix: str = "") -> int:
        """Write the snapshot (or the part under `prefix`) into `dest`; returns the file count."""
        wanted = [self.entries()[p] for p in self.list(prefix)]
        for start in range(0, len(wanted), 512):
            batch = wanted[start : start + 512]
            for path, data in self._read_many(batch).items():
                target = dest / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                if self.entries()[path].executable:
                    target.chmod(0o755)
        return len(wanted)


# -- git-backed subjects ---------------------------------------------------------------------


def read_blobs(repo: Repository, shas: list[str]) -> dict[str, bytes]:
    """Contents of many blobs through one `git cat-file --batch` (no filters, no index access)."""
    unique = list(dict.fromkeys(shas))
    blobs: dict[str, bytes] = {}
    for sha, found in zip(unique, repo.read_objects(unique), strict=True):
        if found is None:
            raise not_found(
                f"git object {sha} is missing from the repository (a partial or shallow clone?); the server never "
                "fetches missing objects: fetch it yourself, or use a full clone."
            )
        if found.kind != "blob":
            raise ToolFailure(ErrorCode.FAILED, f"git object {sha} is not a readable blob.")
        blobs[sha] = found.data
    return blobs


class _GitSubject(Subject):
    batched_reads = True

    def __init__(self, repo: Repository) -> None:
        super().__init__()
        self.repo = repo

    def _read_many(self, entries: list[Entry]) -> dict[str, bytes]:
        blobs = read_blobs(self.repo, [e.sha for e in entries])
        return {e.path: blobs[e.sha] for e in entries}


class IndexSubject(_GitSubject):
    """The staged snapshot: what `git commit` would record now, unstaged edits excluded."""

    kind = SubjectKind.INDEX

    def __init__(self, repo: Repository) -> None:
        super().__init__(repo)
        self.unmerged: list[str] = []

    def _entries(self) -> dict[str, Entry]:
        entries: dict[str, Entry] = {}
        for record in self.repo.run("ls-files", "--stage", "-z").split(b"\0"):
            if not record:
                continue
            meta, path = record.decode().split("\t", 1)
            mode, sha, stage = meta.split()
            if stage != "0":
                self.unmerged.append(path)
            elif mode in ("100644", "100755"):
                entries[path] = Entry(path, sha, mode == "100755")
        if self.unmerged:
            raise ToolFailure(
                ErrorCode.BLOCKED,
                f"The index has unmerged paths ({', '.join(sorted(set(self.unmerged))[:5])}); resolve the merge "
                "before reviewing the staged snapshot.",
            )
        return entries


class RevisionSubject(_GitSubject):
    kind = SubjectKind.REVISION

    def __init__(self, repo: Repository, revision: str) -> None:
        super().__init__(repo)
        self.commit = repo.resolve_commit(revision)

    @property
    def label(self) -> str:
        return f"revision {self.commit[:12]}"

    def _entries(self) -> dict[str, Entry]:
        entries: dict[str, Entry] = {}
        for record in self.repo.run("ls-tree", "-r", "-z", "--full-tree", self.commit).split(b"\0"):
            if not record:
                continue
            meta, path = record.decode().split("\t", 1)
            mode, kind, sha = meta.split()
            if kind == "blob" and mode in ("100644", "100755"):
                entries[path] = Entry(path, sha, mode == "100755")
        return entries


# -- file-system subjects --------------------------------------------------------------------

_STAT_SHA_CACHE: dict[tuple[str, int, int, int], str] = {}


def _file_sha(path: str, info: os.stat_result) -> str:
    key = (path, info.st_size, info.st_mtime_ns, info.st_ino)
    sha = _STAT_SHA_CACHE.get(key)
    if sha is None:
        with open(path, "rb") as handle:
            sha = blob_sha(handle.read())
        _STAT_SHA_CACHE[key] = sha
    return sha


class _FileSubject(Subject):
    """Files on disk under `top`; symlinks that leave `top` are not followed."""

    def __init__(self, top: Path, only: str = "") -> None:
        super().__init__()
        self.top = top
        self.only = only

    def _candidates(self) -> Iterable[str]:
        top = str(self.top)
        for directory, dirs, files in os.walk(os.path.join(top, self.only) if self.only else top):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            relative = os.path.relpath(directory, top)
            for name in files:
                yield name if relative == "." else f"{relative}/{name}"

    walked = True
    """Candidates come from os.walk, which never descends through a symlinked directory."""

    def _entries(self) -> dict[str, Entry]:
        entries: dict[str, Entry] = {}
        top = str(self.top)
        for rel in self._candidates():
            path = os.path.join(top, rel)
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode) or not self.walked:
                    if not is_within(real(path), self.top):
                        continue
                    info = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(info.st_mode):
                entries[rel] = Entry(rel, _file_sha(path, info), bool(info.st_mode & stat.S_IXUSR))
        return entries

    def _read_many(self, entries: list[Entry]) -> dict[str, bytes]:
        return {e.path: (self.top / e.path).read_bytes() for e in entries}


class WorktreeSubject(_FileSubject):
    """Tracked and untracked-but-not-ignored files as they are on disk now."""

    kind = SubjectKind.WORKTREE
    walked = False  # ls-files paths may cross a directory replaced by a symlink since

    def __init__(self, repo: Repository) -> None:
        super().__init__(repo.top)
        self.repo = repo

    def _candidates(self) -> Iterable[str]:
        listed = self.repo.run("ls-files", "-z", "--cached", "--others", "--exclude-standard")
        return sorted({p.decode() for p in listed.split(b"\0") if p})


class DirectorySubject(_FileSubject):
    kind = SubjectKind.DIRECTORY


class InstalledSubject(_FileSubject):
    """The package as the target interpreter imports it (from the environment record's probe)."""

    kind = SubjectKind.INSTALLED


@dataclass(frozen=True)
class SubjectRequest:
    kind: SubjectKind
    path: str | None = None
    revision: str | None = None
    installed_origin: str | None = field(default=None, repr=False)


def open_subject(policy: Policy, request: SubjectRequest, repo: Repository | None) -> Subject:
    """Build the subject a call asked for; git kinds need `repo`, `installed` the probe's origin."""
    kind = request.kind
    if kind is not SubjectKind.REVISION and request.revision:
        raise bad_input(f"revision is only meaningful with subject=revision, not {kind.value}.")
    if kind in (SubjectKind.WORKTREE, SubjectKind.INDEX, SubjectKind.REVISION):
        if repo is None:
            raise bad_input(f"subject={kind.value} needs a git repository; pass the plugin repository path.")
        if kind is SubjectKind.WORKTREE:
            if repo.bare:
                raise bad_input("The repository has no work tree; use subject=index or subject=revision.")
            return WorktreeSubject(repo)
        if kind is SubjectKind.INDEX:
            return IndexSubject(repo)
        if not request.revision:
            raise bad_input("subject=revision needs revision (a commit, tag or branch).")
        return RevisionSubject(repo, request.revision)
    if kind is SubjectKind.DIRECTORY:
        if not request.path:
            raise bad_input("subject=directory needs path.")
        top = policy.readable(request.path)
        if not top.is_dir():
            raise not_found(f"{request.path} is not a directory.")
        return DirectorySubject(top)
    if not request.installed_origin:
        raise not_found(
            "No installed package is known: run environment action=establish so the probe finds where the "
            "target interpreter imports vllm_metax from."
        )
    package_dir = policy.readable(request.installed_origin)
    return InstalledSubject(package_dir.parent, only=package_dir.name)


@dataclass(frozen=True)
class GitPosition:
    """Where a git subject stands in its repository's history: its commit, or HEAD for the index
    and the work tree (whose history is HEAD's)."""

    repo: Repository
    revision: str


def git_position(subject: Subject) -> GitPosition | None:
    """A git subject's repository and revision; None for a directory or an installed package."""
    if isinstance(subject, RevisionSubject):
        return GitPosition(subject.repo, subject.commit)
    if isinstance(subject, (IndexSubject, WorktreeSubject)):
        return GitPosition(subject.repo, "HEAD")
    return None
