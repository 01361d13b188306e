"""A git repository inside the read roots, read through the hardened runner (git_runner.py) once
the guard (git_guard.py) has accepted it: commits, objects, and the files a work tree tracks."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..foundation.errors import ErrorCode, ToolFailure
from ..foundation.policy import Policy, is_within, real
from .git_guard import guard_repository
from .git_runner import run_git, scrub_paths

MISSING_OBJECT = re.compile(
    r"not a valid object name|bad object|bad tree|not a tree object|missing|unable to read|could not read|"
    r"invalid object|unknown revision|bad revision",
    re.IGNORECASE,
)


ObjectKind = Literal["blob", "tree", "commit", "tag"]
OBJECT_KINDS: dict[str, ObjectKind] = {"blob": "blob", "tree": "tree", "commit": "commit", "tag": "tag"}


def _object_kind(name: str) -> ObjectKind:
    if name not in OBJECT_KINDS:
        raise ToolFailure(ErrorCode.FAILED, f"git cat-file printed an unknown object type {name!r}.")
    return OBJECT_KINDS[name]


@dataclass(frozen=True)
class GitObject:
    """An object as `git cat-file --batch` prints it."""

    kind: ObjectKind
    data: bytes


@dataclass(frozen=True)
class Repository:
    """A git repository whose work tree (if any) and git dirs all lie inside the read roots."""

    top: Path
    git_dir: Path
    common_dir: Path
    bare: bool
    roots: tuple[Path, ...] = ()
    """The read roots every file git reads for this repository must lie in (default: its own dirs)."""

    def run(self, subcommand: str, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        guard_repository(self)
        proc = run_git(self.top, subcommand, *args, input=input)
        if check and proc.returncode != 0:
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            last = scrub_paths(lines[-1], self.allowed) if lines else str(proc.returncode)
            if MISSING_OBJECT.search(last):
                raise ToolFailure(
                    ErrorCode.NOT_FOUND,
                    f"git {subcommand} failed: {last}. The object is not in this repository, and the server never "
                    "fetches missing objects; fetch it yourself if it should be there.",
                )
            raise ToolFailure(ErrorCode.FAILED, f"git {subcommand} failed: {last}")
        return proc.stdout

    def text(self, subcommand: str, *args: str) -> str:
        return self.run(subcommand, *args).decode()

    def resolve_commit(self, revision: str) -> str:
        """A full commit sha for a caller's revision; option-like or unknown revisions are refused."""
        if not revision or revision.startswith("-") or any(c in revision for c in "\0\n\r"):
            raise ToolFailure(
                ErrorCode.INVALID_REVISION,
                f"{revision!r} is not a revision: it must not be empty or start with '-'. Pass a commit, tag or "
                "branch name.",
            )
        guard_repository(self)
        proc = run_git(self.top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}")
        if proc.returncode != 0:
            raise ToolFailure(
                ErrorCode.INVALID_REVISION,
                f"{revision!r} does not name a commit in this repository (missing objects are never fetched); "
                "check the revision with `git log`.",
            )
        return proc.stdout.decode().strip()

    def read_objects(self, names: list[str]) -> list[GitObject | None]:
        """Many objects through one `git cat-file --batch` (no filters, no index access), in the order
        named (a sha, or `revision:path`); None where the repository has no object by that name, a failure
        where the name is ambiguous or the output unreadable."""
        if not names:
            return []
        raw = self.run("cat-file", "--batch", input=("\n".join(names) + "\n").encode())
        found: list[GitObject | None] = []
        offset = 0
        for _ in names:
            header_end = raw.find(b"\n", offset)
            if header_end < 0:
                raise ToolFailure(ErrorCode.FAILED, "git cat-file ended before it described every object named.")
            header = raw[offset:header_end].decode(errors="replace")
            offset = header_end + 1
            if header.endswith(" missing"):
                found.append(None)
                continue
            parts = header.split()
            if len(parts) != 3 or not parts[2].isdigit():
                raise ToolFailure(ErrorCode.FAILED, f"git cannot read object {header!r} as one object.")
            size = int(parts[2])
            if offset + size > len(raw):
                raise ToolFailure(ErrorCode.FAILED, f"git cat-file ended inside object {parts[0]}.")
            found.append(GitObject(_object_kind(parts[1]), raw[offset : offset + size]))
            offset += size + 1
        return found

    @property
    def allowed(self) -> tuple[Path, ...]:
        return self.roots or (self.top, self.common_dir)

    @property
    def key(self) -> str:
        """Repositories (and their worktrees) are identified by their git common dir."""
        return str(self.common_dir)


def open_repository(path: str | os.PathLike[str], policy: Policy) -> Repository:
    """Open the repository at `path`, checking that its work tree and git dirs are inside the roots."""
    start = policy.readable(path)
    if not start.exists():
        raise ToolFailure(ErrorCode.NOT_FOUND, f"{path} does not exist.")
    probe_dir = start if start.is_dir() else start.parent
    lines = _rev_parse(probe_dir, "--is-bare-repository", "--absolute-git-dir", "--git-common-dir")
    if lines is None or len(lines) != 3:
        raise ToolFailure(ErrorCode.NOT_FOUND, f"{path} is not inside a git repository; pass the repository root.")
    bare = lines[0] == "true"
    git_dir = real(lines[1])
    common = Path(lines[2])
    common_dir = real(common if common.is_absolute() else probe_dir / common)
    top = git_dir
    if not bare:
        toplevel = _rev_parse(probe_dir, "--show-toplevel")
        if not toplevel:
            raise ToolFailure(
                ErrorCode.NOT_FOUND, f"{path} is inside a git directory, not a work tree; pass the repository root."
            )
        top = real(toplevel[0])
    for location, what in ((git_dir, "git directory"), (common_dir, "git common directory"), (top, "work tree")):
        if not any(is_within(location, root) for root in policy.roots):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"The repository's {what} lies outside the server's roots (a .git file or worktree pointing "
                "elsewhere); add a --root that covers it or use a plain checkout.",
            )
    repo = Repository(top=top, git_dir=git_dir, common_dir=common_dir, bare=bare, roots=tuple(policy.roots))
    guard_repository(repo)
    return repo


def _rev_parse(directory: Path, *flags: str) -> list[str] | None:
    proc = run_git(directory, "rev-parse", *flags)
    return proc.stdout.decode().splitlines() if proc.returncode == 0 else None


def tracked_below(policy: Policy, top: Path, target: Path) -> list[str]:
    """The files the work tree at `top` tracks at or below `target`, through the hardened runner (the
    overwrite rule's question, `Policy.tracked_files`); ValueError when `target` is not below its top."""
    repo = open_repository(top, policy)
    relative = target.relative_to(repo.top).as_posix()
    listed = repo.run("ls-files", "-z", "--", f":(literal){relative}")
    return [name.decode("utf-8", "replace") for name in listed.split(b"\0") if name]


@dataclass(frozen=True)
class PathRemoval:
    """The commit that last removed one of some paths: deleted, or moved (`renamed_to`)."""

    commit: str
    subject: str
    path: str
    renamed_to: str | None


def last_removal(repo: Repository, revision: str, paths: list[str]) -> PathRemoval | None:
    """The newest commit up to `revision` that deleted or moved one of `paths` absent at `revision`
    (git's rename detection names where a moved file went)."""
    present = repo.read_objects([f"{revision}:{p}" for p in paths])
    paths = [p for p, found in zip(paths, present, strict=True) if found is None]
    if not paths:
        return None
    specs = [f":(literal){p}" for p in paths]
    found = repo.run("log", "-n1", "--diff-filter=D", "--no-renames", "--format=%H%x1f%s", revision, "--", *specs)
    if not found.strip():
        return None
    sha, _, subject = found.decode(errors="replace").strip().partition("\x1f")
    tokens = repo.run("show", "-M", "--name-status", "-z", "--format=", sha).decode(errors="replace").split("\0")
    gone = set(paths)
    index = 0
    while index < len(tokens) - 1:
        status = tokens[index].strip()
        if status[:1] in ("R", "C") and index + 2 < len(tokens):
            if tokens[index + 1] in gone:
                return PathRemoval(sha, subject, tokens[index + 1], tokens[index + 2])
            index += 3
        else:
            if status[:1] == "D" and tokens[index + 1] in gone:
                return PathRemoval(sha, subject, tokens[index + 1], None)
            index += 2
    return PathRemoval(sha, subject, paths[0], None)


@dataclass(frozen=True)
class PathOrigin:
    """The commit that brought a path into the tree: added, or renamed or copied from `source`."""

    commit: str
    subject: str
    source: str | None


def path_origin(repo: Repository, revision: str, path: str) -> PathOrigin | None:
    """The newest commit up to `revision` that created `path` (git's rename and copy detection
    names the file it came from)."""
    found = repo.run(
        "log",
        "-n1",
        "--follow",
        "-M",
        "-C",
        "--diff-filter=ACR",
        "--name-status",
        "-z",
        "--format=%x1e%H%x1f%s",
        revision,
        "--",
        f":(literal){path}",
    )
    for record in found.split(b"\x1e")[1:]:
        header, _, body = record.partition(b"\0")
        sha, _, subject = header.decode(errors="replace").strip().partition("\x1f")
        tokens = body.decode(errors="replace").lstrip("\n").split("\0")
        copied = tokens[0][:1] in ("R", "C") and len(tokens) >= 3 and tokens[2] == path
        return PathOrigin(sha, subject, tokens[1] if copied else None)
    return None
