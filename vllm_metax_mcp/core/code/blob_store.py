"""Per-blob results of a scanner, kept in the state directory and computed in parallel when missing.

A scan's result depends only on the file's bytes, so it is keyed by the blob sha. Results are
appended to one of 256 shard files by the first two hex digits (`blobs/ab.rec`, lines of
`sha<TAB>text`), not written one file per blob: creating 2,000 small files took a tenth of a cold
index of the vLLM tree. A request over a whole tree also keeps a bundle of the results it read
(`trees/<key>.rec`, replaced atomically), so the same request again reads one file.
"""

from __future__ import annotations

import gc
import hashlib
import os
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing import get_context
from pathlib import Path

from ..foundation.atomic import write_bytes_atomic
from ..foundation.process_call import ends_with_its_parent
from ..foundation.progress import advancing

PARALLEL_THRESHOLD = 8
"""Fewer misses than this are scanned in this process: sending them to the workers would cost more."""
BUNDLE_THRESHOLD = 64
"""Requests for at least this many blobs (a tree, not a lookup) are also kept as one bundle."""
MAX_BUNDLES = 8
"""Bundles kept per store, most recently used first."""

TextScan = Callable[[bytes], str]
"""A scanner that turns a file's bytes into one line of text (no newline)."""


@contextmanager
def collection_paused() -> Iterator[None]:
    """Decoding many small containers makes the cycle collector run over and over for nothing
    (rows and syntax trees hold no cycles); pause it meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def bundle_key(shas: Collection[str]) -> str:
    return hashlib.sha1("\n".join(sorted(shas)).encode()).hexdigest()


def _append(path: Path, data: bytes) -> None:
    """Append in one write to an O_APPEND file, which keeps concurrent appenders' lines apart; a
    line that still comes out damaged (a crash, a short write) only reads back as a miss. Callers
    start the data with a newline, so a line cut short never swallows the next one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(handle, data) :]
    finally:
        os.close(handle)


def _prune(directory: Path, keep: int) -> None:
    """Remove all but the `keep` most recently used files of a directory."""
    dated = []
    for path in directory.iterdir():
        try:
            dated.append((path.stat().st_mtime, path))
        except OSError:
            continue
    for _, path in sorted(dated, reverse=True)[keep:]:
        path.unlink(missing_ok=True)


def _rows(path: Path) -> dict[str, str]:
    """The lines of a shard or bundle by sha, the last of a sha kept (a record parsed again after a
    damaged line is appended after it). Results are ASCII (JSON as
    `json.dumps` writes it), so a byte cut short is replaced and the line then fails `accept`."""
    try:
        lines = path.read_bytes().decode("ascii", errors="replace").split("\n")
    except OSError:
        return {}
    rows: dict[str, str] = {}
    for line in lines:
        sha, _, text = line.partition("\t")
        if text:
            rows[sha] = text
    return rows


class BlobStore:
    """Text per blob sha under `root`: shards, and bundles of whole requests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._shards: dict[str, dict[str, str]] = {}
        """Shards read by this process, so records asked for one at a time read each shard once."""

    def _shard(self, prefix: str) -> Path:
        return self.root / "blobs" / f"{prefix}.rec"

    def _bundle(self, key: str) -> Path:
        return self.root / "trees" / f"{key}.rec"

    def read(
        self, wanted: Collection[str], bundle: str | None = None, accept: Callable[[str, str], bool] | None = None
    ) -> dict[str, str]:
        """The stored text of each wanted sha found, from the bundle first, then the shards.
        `accept(sha, text)` rejects a damaged line (it then counts as not found)."""
        found: dict[str, str] = {}
        wanted = set(wanted)
        if bundle is not None:
            for sha, text in _rows(self._bundle(bundle)).items():
                if sha in wanted and (accept is None or accept(sha, text)):
                    found[sha] = text
        by_prefix: dict[str, list[str]] = {}
        for sha in wanted - found.keys():
            by_prefix.setdefault(sha[:2], []).append(sha)
        for prefix, shas in sorted(by_prefix.items()):
            if prefix not in self._shards:
                self._shards[prefix] = _rows(self._shard(prefix))
            shard = self._shards[prefix]
            for sha in shas:
                stored = shard.get(sha)
                if stored is not None and (accept is None or accept(sha, stored)):
                    found[sha] = stored
        return found

    def append(self, rows: Mapping[str, str]) -> None:
        shards: dict[str, list[str]] = {}
        for sha, text in rows.items():
            shards.setdefault(sha[:2], []).append(f"{sha}\t{text}\n")
        for prefix, lines in shards.items():
            _append(self._shard(prefix), ("\n" + "".join(lines)).encode())
        for sha, text in rows.items():
            self._shards.get(sha[:2], {})[sha] = text

    def has_bundle(self, key: str) -> bool:
        return self._bundle(key).is_file()

    def keep_bundle(self, key: str, rows: Mapping[str, str]) -> None:
        """Write the bundle of a request (replacing an older one of the same key)."""
        path = self._bundle(key)
        write_bytes_atomic(path, "".join(f"{sha}\t{rows[sha]}\n" for sha in sorted(rows)).encode(), durable=False)
        _prune(path.parent, MAX_BUNDLES)

    def touch_bundle(self, key: str) -> None:
        try:
            os.utime(self._bundle(key))
        except OSError:
            pass  # pruned meanwhile by another process: it is written again next time


def _apply(scan: TextScan, item: tuple[str, bytes]) -> str:
    return scan(item[1])


@dataclass(frozen=True)
class _Pool:
    executor: ProcessPoolExecutor
    owner: int
    """The pid that started it: a process forked since must not use its parent's workers."""


_pool: _Pool | None = None
"""The worker processes of the main thread, started on first use and kept for the process's life (a
call's worker: one call): a call that makes records a few at a time (a walk reading ahead) sends each
batch to running workers. They end with the process that started them, however it ends."""


def _init_worker(parent: int | None) -> None:
    gc.disable()
    ends_with_its_parent(parent)


def _new_pool(count: int, parent: int | None) -> ProcessPoolExecutor:
    """Forked workers (as the call's own pools are: the call's worker is single-threaded when it forks)."""
    return ProcessPoolExecutor(
        max_workers=count, mp_context=get_context("fork"), initializer=_init_worker, initargs=(parent,)
    )


@contextmanager
def _workers(count: int) -> Iterator[ProcessPoolExecutor]:
    """The main thread's kept pool; another thread (a tool run in the server's threads) gets a pool for this
    batch only: the kernel ties a child's end to the thread that forked it, and such threads come and go."""
    global _pool
    if threading.current_thread() is not threading.main_thread():
        with _new_pool(count, None) as transient:
            yield transient
        return
    if _pool is None or _pool.owner != os.getpid():
        _pool = _Pool(_new_pool(count, os.getpid()), os.getpid())
    yield _pool.executor


def _drop_broken_pool() -> None:
    global _pool
    if _pool is not None and _pool.owner == os.getpid():
        _pool.executor.shutdown(wait=False, cancel_futures=True)
    _pool = None


def _scan_in_workers(items: list[tuple[str, bytes]], run: Callable[..., str], what: str, workers: int) -> list[str]:
    """The texts in worker processes. Scans are pure, so a batch whose pool broke (a worker killed, between
    batches or during this one) runs once more on new workers; a second break is the answer."""
    chunks = max(1, len(items) // (workers * 32))

    def mapped() -> list[str]:
        with _workers(workers) as pool:
            return list(advancing(pool.map(run, items, chunksize=chunks), len(items), what))

    try:
        return mapped()
    except BrokenProcessPool:
        _drop_broken_pool()
    try:
        return mapped()
    except BrokenProcessPool:
        _drop_broken_pool()
        raise


def scan_all(items: list[tuple[str, bytes]], scan: TextScan, what: str, workers: int = 2) -> dict[str, str]:
    """`scan` of each (sha, bytes), biggest first so the workers finish together; in worker processes
    when there are several (`scan` must then be a module-level function or a partial of one)."""
    items = sorted(items, key=lambda item: -len(item[1]))
    run = partial(_apply, scan)
    if len(items) >= PARALLEL_THRESHOLD and workers > 1:
        texts = _scan_in_workers(items, run, what, workers)
    else:
        texts = [run(item) for item in advancing(items, len(items), what)]
    return {sha: text for (sha, _), text in zip(items, texts, strict=True)}
