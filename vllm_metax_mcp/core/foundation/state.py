"""The server's own state directory, shared by several servers: locked, atomic JSON writes."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .atomic import output_fingerprint, write_bytes_atomic
from .errors import ErrorCode, ToolFailure
from .policy import Mode, Policy, is_within, real


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "vllm-metax-mcp"


def _resolved(path: Path) -> Path:
    """realpath of the deepest existing ancestor, with the missing tail appended (nothing is created)."""
    absolute = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    missing: list[str] = []
    current = absolute
    while not current.exists() and current.parent != current:
        missing.append(current.name)
        current = current.parent
    resolved = real(current)
    for part in reversed(missing):
        resolved = resolved / part
    return resolved


def _repository_holding(path: Path) -> Path | None:
    """The nearest directory at or above `path` that is a git repository (worktree with a `.git`
    directory or file, or a bare repository), or a `.git` directory itself."""
    for place in (path, *path.parents):
        if place.name == ".git" or (place / ".git").exists():
            return place
        if (place / "HEAD").is_file() and (place / "objects").is_dir() and (place / "refs").is_dir():
            return place
    return None


def check_state_dir(path: Path, policy: Policy) -> Path:
    """The state directory, resolved, after refusing a place it must never be: inside a read root in
    review mode (the review would leave files in the reviewed tree); in any mode above a read root or an
    output root (the store's jobs/, results/, outputs/ would share a tree with it, and every output there
    would be refused as the state's), inside a git repository, or inside a protected path (the HF cache,
    the server's site-packages). Nothing is created.

    A state directory holding some other repository below it is not looked for (that would walk the
    whole store at every start): the store writes only its own subdirectories, and no output ever goes
    into the state directory or replaces it, so nothing below it is ever removed."""
    resolved = _resolved(path)
    shown = os.fspath(path)
    advice = "choose a state directory outside it with --state-dir (the default is $XDG_STATE_HOME/vllm-metax-mcp)."
    if policy.mode is Mode.REVIEW:
        for root in policy.roots:
            if is_within(resolved, root):
                raise ToolFailure(
                    ErrorCode.BAD_INPUT,
                    f"The state directory {shown} lies inside the read root {root}: in review mode nothing is written "
                    f"into a reviewed tree; {advice}",
                )
    for kind, places in (("read root", policy.roots), ("output root", policy.output_roots)):
        for root in places:
            if is_within(root, resolved):
                raise ToolFailure(
                    ErrorCode.BAD_INPUT,
                    f"The state directory {shown} is or contains the {kind} {root}: the state store's files would "
                    "share a tree with it (in review mode, the reviewed tree), and no output may go into the state "
                    "directory; choose a state directory beside the roots with --state-dir (the default is "
                    "$XDG_STATE_HOME/vllm-metax-mcp).",
                )
    repository = _repository_holding(resolved)
    if repository is not None:
        raise ToolFailure(
            ErrorCode.BAD_INPUT,
            f"The state directory {shown} lies inside the git repository {repository}, where its files would show up "
            f"as untracked changes; {advice}",
        )
    site = {real(p) for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib")) if p}
    for place in [*policy.protected, *policy.readable_extra, *site]:
        if is_within(resolved, place):
            raise ToolFailure(
                ErrorCode.BAD_INPUT,
                f"The state directory {shown} lies inside the protected path {place} (the HF cache or site-packages); "
                f"{advice}",
            )
    return resolved


class StateStore:
    """JSON documents under one directory; every write holds an exclusive file lock."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.root / ".lock"

    @contextmanager
    def locked(self) -> Iterator[None]:
        with open(self._lock_path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def path(self, relative: str) -> Path:
        return self.root / relative

    def read(self, relative: str) -> Any | None:
        try:
            return json.loads(self.path(relative).read_text())
        except FileNotFoundError:
            return None

    def write(self, relative: str, document: Any) -> None:
        with self.locked():
            self._write_unlocked(relative, document)

    def update(self, relative: str, change: Callable[[Any | None], Any]) -> Any:
        """Read-modify-write under the lock, so concurrent servers never lose an update."""
        with self.locked():
            updated = change(self.read(relative))
            self._write_unlocked(relative, updated)
            return updated

    def list(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if not p.name.startswith("."))

    def _write_unlocked(self, relative: str, document: Any) -> None:
        write_bytes_atomic(self.path(relative), json.dumps(document, indent=1, sort_keys=True).encode())


OUTPUTS_DIR = "outputs"
"""The state store's record of the outputs this server wrote (`OutputRegistry`)."""


class OutputRegistry:
    """The outputs this server wrote, one document per output under `outputs/`, keyed by the output's
    resolved path: the fingerprint of the directory and its marker taken once the swap succeeded
    (`atomic.output_fingerprint`). Overwrite replaces a directory only when its fingerprint still
    matches: a repository can commit a marker anywhere, it cannot write into the state directory."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def _relative(self, target: Path) -> str:
        return f"{OUTPUTS_DIR}/{hashlib.sha256(os.fsencode(target)).hexdigest()[:40]}.json"

    def record(self, target: Path) -> None:
        fingerprint = output_fingerprint(target)
        if fingerprint is None:  # no marker: nothing a later overwrite could recognise
            return
        self.store.write(self._relative(target), {"path": os.fspath(target), "recorded_at": time.time(), **fingerprint})

    def mismatch(self, target: Path) -> str | None:
        try:
            entry = self.store.read(self._relative(target))
        except (OSError, ValueError):
            entry = None
        if not isinstance(entry, dict) or entry.get("path") != os.fspath(target):
            return "this server's state directory has no record of writing it there"
        current = output_fingerprint(target)
        if current is None:
            return "its marker cannot be read"
        if current["marker"] != entry.get("marker"):
            return f"this server recorded writing {entry.get('marker')} there, not {current['marker']}"
        if (current["dir_dev"], current["dir_ino"]) != (entry.get("dir_dev"), entry.get("dir_ino")):
            return "the directory is not the one this server wrote there (it was replaced since)"
        changed = [key for key in ("sha256", "size", "dev", "ino", "mtime_ns") if current[key] != entry.get(key)]
        if changed:
            return (
                f"its marker is not the one this server wrote ({', '.join(changed)} differ: replaced or edited since)"
            )
        return None
