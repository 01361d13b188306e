"""The server's own state directory, shared by several servers: locked, atomic JSON writes."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .atomic import write_bytes_atomic


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "vllm-metax-mcp"


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
