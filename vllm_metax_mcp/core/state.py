"""The server's own state directory, shared by several servers: locked, atomic JSON writes."""

from __future__ import annotations

import fcntl
import json
import os
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .atomic import write_bytes_atomic
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
    review mode (the review would leave files in the reviewed tree), or in any mode inside a git
    repository or a protected path (the HF cache, the server's site-packages). Nothing is created."""
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
