"""Per-file facts cached by blob sha: a second scan of the same bytes reads and parses nothing.

The module index (`module_index`) keeps imports and definitions; mechanism scanners (overrides,
kernels, rewrites) keep their own small JSON facts per file here, salted by scanner name and
version, in a `BlobStore` (shards, and a bundle per tree), scanned in worker processes when many
files miss.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

from ..foundation.state import StateStore
from ..sources.subjects import Subject
from .blob_store import BUNDLE_THRESHOLD, BlobStore, bundle_key, collection_paused, scan_all

Scanner = Callable[[bytes], dict[str, Any]]


def _as_text(scan: Scanner, source: bytes) -> str:
    return json.dumps(scan(source), separators=(",", ":"))


def _is_json_object(_sha: str, text: str) -> bool:
    return text.startswith("{") and text.endswith("}")


class FactCache:
    """JSON facts of one scanner, keyed by the content's blob sha in the state directory."""

    def __init__(self, store: StateStore, scanner: str, version: int) -> None:
        self.blobs = BlobStore(store.path(f"cache/facts/{scanner}-v{version}"))

    def get_many(
        self, subject: Subject, paths: list[str], scan: Scanner, needles: tuple[bytes, ...] = ()
    ) -> dict[str, dict[str, Any]]:
        """Facts per path. `scan` must be a module-level function: misses are scanned in workers. With
        `needles`, a file holding none of them has no facts (`scan` must agree) and is not sent there."""
        entries = subject.entries()
        shas = {path: entry.sha if (entry := entries.get(path)) else subject.sha(path) for path in paths}
        unique = set(shas.values())
        key = bundle_key(unique) if len(unique) >= BUNDLE_THRESHOLD else None
        stored = self.blobs.read(unique, key, _is_json_object)
        missing = {sha: path for path, sha in shas.items() if sha not in stored}
        if missing:
            sources = subject.read_many(missing.values())
            items = [(sha, sources[path]) for sha, path in missing.items()]
            plain = {sha for sha, data in items if needles and not any(needle in data for needle in needles)}
            wanted = [(sha, data) for sha, data in items if sha not in plain]
            scanned = dict.fromkeys(plain, "{}")
            scanned.update(scan_all(wanted, partial(_as_text, scan), f"scanning {len(wanted)} files"))
            self.blobs.append(scanned)
            stored.update(scanned)
        if key is not None and (missing or not self.blobs.has_bundle(key)):
            self.blobs.keep_bundle(key, {sha: stored[sha] for sha in unique})
        elif key is not None:
            self.blobs.touch_bundle(key)
        with collection_paused():
            decoded = {sha: json.loads(stored[sha]) for sha in unique}
        return {path: decoded[sha] for path, sha in shas.items()}
