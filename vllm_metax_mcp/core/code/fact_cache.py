"""Per-file facts cached by blob sha: a second scan of the same bytes reads and parses nothing.

The module index (`module_index`) keeps imports and definitions; mechanism scanners (overrides,
kernels) keep their own small JSON facts per file here, salted by scanner name and version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..foundation.atomic import write_bytes_atomic
from ..foundation.progress import advance
from ..foundation.state import StateStore
from ..sources.subjects import Subject

Scanner = Callable[[bytes], dict[str, Any]]


class FactCache:
    """JSON facts of one scanner, keyed by the content's blob sha in the state directory."""

    def __init__(self, store: StateStore, scanner: str, version: int) -> None:
        self.root = store.path(f"cache/facts/{scanner}-v{version}")

    def _path(self, sha: str) -> Path:
        return self.root / sha[:2] / f"{sha}.json"

    def get_many(self, subject: Subject, paths: list[str], scan: Scanner) -> dict[str, dict[str, Any]]:
        entries = subject.entries()
        facts: dict[str, dict[str, Any]] = {}
        missing: list[str] = []
        for path in paths:
            try:
                facts[path] = json.loads(self._path(entries[path].sha).read_text())
            except (FileNotFoundError, ValueError, KeyError):
                missing.append(path)
        for start in range(0, len(missing), 256):
            batch = missing[start : start + 256]
            for path, source in subject.read_many(batch).items():
                facts[path] = scan(source)
                self._store(entries[path].sha, facts[path])
                advance(len(facts), len(paths), f"scanning {len(missing)} files")
        return facts

    def _store(self, sha: str, data: dict[str, Any]) -> None:
        write_bytes_atomic(self._path(sha), json.dumps(data, separators=(",", ":")).encode(), durable=False)
