"""Where consumer code reads each field a plan changes, kept in the state directory by content.

Searching (`find_consumers`) parses every file that names the field: seconds over an installed vLLM,
on every plan_trim call with an environment record. Its answer is a pure function of what the cache
key covers:

- the searched trees, in order: each tree's label and every file's path and bytes (one SHA-256 over
  all of them, never mtimes), so an edited, added or removed file changes the key. The record, its
  interpreter, the upstream revision and the subject choose the trees and reach the search only
  through these bytes; so do the checkpoint and the plan, through the field names;
- the field's leaf name (an entry inside the document) and READERS_PER_FIELD;
- the search itself: the source of consumers.py and of this module, CACHE_FORMAT and the server's
  Python version (`ast.parse` decides which files parse), so a changed search never reads an older
  one's answers.

An entry under the same key is therefore what a fresh search returns. An entry that cannot be read
is a miss; a cache that cannot be written is skipped (recomputed next time).
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import consumers
from ..checkpoint.consumers import SourceTree, find_consumers
from ..foundation.state import StateStore

READERS_PER_FIELD = 3
CACHE_FORMAT = 1
CACHE_DIR = "trim-readers"


@dataclass(frozen=True)
class ReaderSearch:
    readers: dict[str, list[str]]
    """Per field (as given): where consumer code reads it, `tree path:line`."""
    searched: int
    """Leaf names searched now (the rest were read from the cache)."""


@functools.cache
def _code_digest() -> bytes:
    """The search code's source: a changed search never reads answers cached by an older one."""
    digest = hashlib.sha256()
    for module_file in (consumers.__file__, __file__):
        digest.update(Path(module_file).read_bytes())
    return digest.digest()


def _feed(digest: hashlib._Hash, part: bytes) -> None:
    """Each part length-prefixed, so no two different sequences of parts hash alike."""
    digest.update(len(part).to_bytes(8, "little"))
    digest.update(part)


def cache_key(trees: Iterable[SourceTree]) -> str:
    """The key of everything a search's answer depends on except the leaf name (see the module docstring)."""
    digest = hashlib.sha256()
    _feed(digest, f"{CACHE_FORMAT}:{READERS_PER_FIELD}:{sys.version}".encode())
    _feed(digest, _code_digest())
    for tree in trees:
        _feed(digest, tree.label.encode())
        _feed(digest, str(len(tree.files)).encode())
        for path, data in tree.files:
            _feed(digest, path.encode())
            _feed(digest, data)
    return digest.hexdigest()[:40]


def _cached(store: StateStore, relative: str) -> dict[str, list[str]]:
    try:
        document = store.read(relative)
    except (OSError, ValueError):
        return {}
    readers = document.get("readers") if isinstance(document, dict) else None
    if not isinstance(readers, dict):
        return {}
    return {
        name: found
        for name, found in readers.items()
        if isinstance(found, list) and all(isinstance(item, str) for item in found)
    }


def _search(trees: list[SourceTree], leaf: str) -> list[str]:
    locations, _ = find_consumers(trees, leaf, READERS_PER_FIELD)
    return [f"{loc.tree} {loc.path}:{loc.line}" for loc in locations]


def field_readers(store: StateStore | None, trees: list[SourceTree], fields: Iterable[str]) -> ReaderSearch:
    """Where the trees' code reads each field (by its leaf name), from the cache where the key has it
    (no store: every leaf is searched)."""
    leaves = {name: name.rsplit(".", 1)[-1] for name in fields}
    relative = f"{CACHE_DIR}/{cache_key(trees)}.json"
    cached = _cached(store, relative) if store else {}
    missing = sorted(set(leaves.values()) - cached.keys())
    found = {leaf: _search(trees, leaf) for leaf in missing}
    if found and store:
        try:
            store.write(relative, {"format": CACHE_FORMAT, "readers": {**cached, **found}})
        except OSError:  # a cache that cannot be written is recomputed next time
            pass
    known = {**cached, **found}
    return ReaderSearch({name: known[leaf] for name, leaf in leaves.items()}, len(missing))
