#!/usr/bin/env python3
"""Recreate a trimmed real-weight checkpoint from its source checkpoint: raw tensor bytes, never decoded.

Usage: python extract.py [--progress] SOURCE_DIR OUTPUT_DIR

trim_model (vllm-metax-mcp, output_mode="real") writes this file beside the checkpoint it made,
with the exact plan embedded below (which source tensor becomes which output tensor in which
shard, the reduced config.json, the assets and the sha256 of every file, computed from the source
bytes before anything was written), and makes the checkpoint by running it: the output it ships
is this script's output. It needs the standard library only. It checks every source header (offsets
inside the file, contiguous, no duplicate names), every mapped tensor's dtype, shape and size,
and every file it writes against the recorded sha256; OUTPUT_DIR must not exist yet.

In vllm-metax-mcp this module is also the one implementation of the safetensors header parser
and of the byte copy, so the shipped script is the code that made the checkpoint.
"""

import collections
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Deque, Dict, List

PLAN_JSON = None  # trim_model embeds the plan here (a JSON string) in the extract.py it writes

CHUNK_BYTES = 8 << 20
PIECE_BYTES = 256 << 20
MAX_HEADER_BYTES = 100 << 20
INDEX_NAME = "model.safetensors.index.json"
PROGRESS_PREFIX = "@progress"
"""--progress: each copied or hashed stretch as a line `@progress copied|hashed NBYTES` on stdout, and
`@progress written 0` once every file is written (its checks may still be running)."""
DTYPE_BITS = {
    "F64": 64,
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "I64": 64,
    "I32": 32,
    "I16": 16,
    "I8": 8,
    "U64": 64,
    "U32": 32,
    "U16": 16,
    "U8": 8,
    "BOOL": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "C64": 64,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "F4": 4,
}
"""The dtypes safetensors defines, in bits per element (sub-byte types are packed)."""


class HeaderError(ValueError):
    """A safetensors header that cannot be trusted; the message says why."""


class Entry:
    """One tensor of a shard: begin and end are offsets in the data buffer (after the header)."""

    __slots__ = ("dtype", "shape", "begin", "end")

    def __init__(self, dtype, shape, begin, end):
        self.dtype, self.shape, self.begin, self.end = dtype, tuple(shape), begin, end


class Header:
    """A parsed shard header: where the data starts, the tensors, the metadata."""

    __slots__ = ("data_start", "entries", "metadata")

    def __init__(self, data_start, entries, metadata):
        self.data_start, self.entries, self.metadata = data_start, entries, metadata


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise HeaderError("names tensor %r twice" % key)
        seen[key] = value
    return seen


def _entry(name, raw, data_size):
    if not isinstance(raw, dict):
        raise HeaderError("entry %r is not an object" % name)
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str):
        raise HeaderError("entry %r has no dtype" % name)
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise HeaderError("entry %r has an invalid shape" % name)
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_size
    ):
        raise HeaderError("entry %r has data offsets outside the file's %d data bytes" % (name, data_size))
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise HeaderError("entry %r has dtype %r, which safetensors does not define" % (name, dtype))
    count = 1
    for dim in shape:
        count *= dim
    if (count * bits) % 8 or offsets[1] - offsets[0] != count * bits // 8:
        raise HeaderError(
            "entry %r spans %d bytes, not %s for %s %s"
            % (name, offsets[1] - offsets[0], count * bits / 8, dtype, shape)
        )
    return Entry(dtype, shape, offsets[0], offsets[1])


def _check_layout(entries, data_size):
    """The data buffer is exactly the tensors, back to back: no overlap, no hole, nothing after."""
    position = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin < position:
            raise HeaderError("entry %r overlaps the tensor before it (offset %d < %d)" % (name, entry.begin, position))
        if entry.begin > position:
            raise HeaderError("leaves a hole of %d bytes before entry %r" % (entry.begin - position, name))
        position = entry.end
    if position != data_size:
        raise HeaderError("has %d data bytes after its last tensor" % (data_size - position))


def open_regular(path):
    """A read-only descriptor of path, refused unless it is a regular file (a FIFO, a device or a directory
    swapped in is never read: opened without blocking, checked on the descriptor itself)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HeaderError("%s is not a regular file" % os.path.basename(path))
    return fd


def parse_header(path):
    """The header of one shard, checked against the file's size; raises HeaderError."""
    fd = open_regular(path)
    try:
        return parse_header_fd(fd)
    finally:
        os.close(fd)


def parse_header_fd(fd):
    """parse_header on an open descriptor (the one the data is then read from)."""
    size = os.fstat(fd).st_size
    prefix = os.pread(fd, 8, 0)
    if len(prefix) < 8:
        raise HeaderError("%d bytes long, shorter than the 8-byte header length" % size)
    length = int.from_bytes(prefix, "little")
    if length < 2 or length > MAX_HEADER_BYTES or length > size - 8:
        raise HeaderError("declares a %d-byte header in a %d-byte file" % (length, size))
    raw = os.pread(fd, length, 8)
    if len(raw) != length:
        raise HeaderError("ended inside its %d-byte header" % length)
    try:
        document = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        if isinstance(exc, HeaderError):
            raise
        raise HeaderError("header is not valid JSON (%s)" % exc) from None
    if not isinstance(document, dict):
        raise HeaderError("header is not a JSON object")
    data_size = size - 8 - length
    metadata = document.pop("__metadata__", None)
    entries = {name: _entry(name, raw_entry, data_size) for name, raw_entry in document.items()}
    _check_layout(entries, data_size)
    return Header(8 + length, entries, metadata if isinstance(metadata, dict) else None)


def header_bytes(tensors):
    """The header of an output shard for [(name, dtype, shape, nbytes)] in data order, padded to 8 bytes."""
    header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def index_bytes(shards):
    """model.safetensors.index.json for {shard: [(name, nbytes), ...]}."""
    weight_map = {name: shard for shard, tensors in shards.items() for name, _ in tensors}
    total = sum(nbytes for tensors in shards.values() for _, nbytes in tensors)
    document = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return (json.dumps(document, indent=2) + "\n").encode()


def copy_range(source_fd, source_offset, target_fd, target_offset, length):
    """Copy bytes between files in the kernel where it can (copy_file_range), else through a bounded buffer."""
    done = 0
    copier = getattr(os, "copy_file_range", None)
    while copier is not None and done < length:
        try:
            moved = copier(source_fd, target_fd, length - done, source_offset + done, target_offset + done)
        except OSError:
            break  # other filesystems or kernels: fall back to pread/pwrite for the rest
        if moved == 0:
            break
        done += moved
    while done < length:
        chunk = os.pread(source_fd, min(CHUNK_BYTES, length - done), source_offset + done)
        if not chunk:
            raise HeaderError("a source shard ended %d bytes early" % (length - done))
        written = 0
        while written < len(chunk):
            written += os.pwrite(target_fd, chunk[written:], target_offset + done + written)
        done += len(chunk)


def check_entry(entry, dtype, shape, nbytes, where):
    """The source tensor still is what the plan recorded."""
    if entry is None:
        raise HeaderError("%s is not in its shard's header" % where)
    if entry.dtype != dtype or list(entry.shape) != list(shape) or entry.end - entry.begin != nbytes:
        raise HeaderError(
            "%s is %s %s (%d bytes) in the source, the plan recorded %s %s (%d bytes)"
            % (where, entry.dtype, list(entry.shape), entry.end - entry.begin, dtype, list(shape), nbytes)
        )


def _planned(items, sources):
    """The checked source entries of one output shard, in data order: (target, entry, fd, data_start)."""
    planned = []
    for target, shard, name, dtype, shape, nbytes in items:
        fd, header = sources[shard]
        entry = header.entries.get(name)
        check_entry(entry, dtype, shape, nbytes, "%s (in %s)" % (name, shard))
        planned.append((target, entry, fd, header.data_start))
    return planned


def _runs(planned):
    """(fd, source offset, length) of each stretch of consecutive tensors that is contiguous in one source
    file: one copy per stretch instead of one per tensor."""
    runs: List[List[int]] = []
    for _, entry, fd, data_start in planned:
        begin, length = data_start + entry.begin, entry.end - entry.begin
        if runs and runs[-1][0] == fd and runs[-1][1] + runs[-1][2] == begin:
            runs[-1][2] += length
        else:
            runs.append([fd, begin, length])
    return runs


def _shard_header(planned):
    return header_bytes([(t, e.dtype, e.shape, e.end - e.begin) for t, e, _, _ in planned])


def write_shard(path, items, sources, on_bytes=None):
    """Write one output shard: items are (target, source_shard, source_name, dtype, shape, nbytes) in data
    order; sources maps a source shard to (fd, Header)."""
    planned = _planned(items, sources)
    head = _shard_header(planned)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, head)
        offset = len(head)
        for source_fd, begin, length in _runs(planned):
            for piece in range(0, length, PIECE_BYTES):  # pieces only so that progress moves
                size = min(PIECE_BYTES, length - piece)
                copy_range(source_fd, begin + piece, fd, offset + piece, size)
                if on_bytes is not None:
                    on_bytes(size)
            offset += length
    finally:
        os.close(fd)


def file_sha256(path, on_bytes=None):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


def settle(path, on_bytes=None, stop=None):
    """A written file's sha256, read back once, then the file flushed to disk: hashing first lets the
    kernel's writeback of the same file run meanwhile, and the read comes from the page cache while the
    file is fresh. None once `stop` (an Event) is set: the write failed and nobody needs the answer."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            if stop is not None and stop.is_set():
                return None
            chunk = os.read(fd, CHUNK_BYTES)
            if not chunk:
                break
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        os.fsync(fd)
    finally:
        os.close(fd)
    return digest.hexdigest()


def open_sources(directory, shard_names, paths=None):
    """(fd, Header) per source shard, the header read from the descriptor the data is read from; paths may
    give each shard's resolved file."""
    sources = {}
    try:
        for shard in shard_names:
            fd = open_regular((paths or {}).get(shard) or os.path.join(directory, shard))
            try:
                sources[shard] = (fd, parse_header_fd(fd))
            except BaseException:
                os.close(fd)
                raise
    except BaseException:
        close_sources(sources)
        raise
    return sources


def copy_asset(source, target):
    """An asset copied from a descriptor checked to be a regular file (never a device that never ends)."""
    fd = open_regular(source)
    try:
        size = os.fstat(fd).st_size
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            copy_range(fd, 0, out, 0, size)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def flush_directory(path):
    """A directory's entries made durable (the names of the files in it, or a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def close_sources(sources):
    for fd, _ in sources.values():
        os.close(fd)


def extract(plan, source_dir, output_dir, progress=None):
    """Write every file of the plan beside output_dir, check each one's sha256, then rename it into place:
    output_dir appears whole or not at all. progress(phase, nbytes) hears of the bytes copied and hashed."""
    output_dir = os.path.abspath(output_dir)
    if os.path.lexists(output_dir):
        raise HeaderError("%s already exists; give a new OUTPUT_DIR" % os.path.basename(output_dir))
    partial = tempfile.mkdtemp(
        prefix="." + os.path.basename(output_dir) + ".", suffix=".partial", dir=os.path.dirname(output_dir)
    )
    try:
        _write_all(plan, source_dir, partial, progress or (lambda phase, nbytes: None))
        flush_directory(partial)
        os.rename(partial, output_dir)
        flush_directory(os.path.dirname(output_dir))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _write_all(plan, source_dir, output_dir, progress):
    """Each file written, then checked and flushed by a worker while the next one is written (copying runs
    in the kernel, hashing releases the GIL); a shard is written only while fewer checks wait than there
    are workers, so a check reads its file while it is still in the page cache."""
    lock = threading.Lock()

    def report(phase, nbytes):  # the copier and the checking workers print whole lines, one at a time
        with lock:
            progress(phase, nbytes)

    workers = min(4, os.cpu_count() or 1)
    checks: Dict[str, Future] = {}
    pending: Deque[Future] = collections.deque()
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=workers) as pool:

        def room():  # before a shard is written: no more checks waiting than workers to run them
            while len(pending) >= workers:
                pending.popleft().result()

        def check(name):
            path = os.path.join(output_dir, name)
            checks[name] = pool.submit(settle, path, lambda n: report("hashed", n), stop)
            pending.append(checks[name])

        try:
            _write_every_file(plan, source_dir, output_dir, report, room, check)
            digests = {name: future.result() for name, future in checks.items()}
        except BaseException:
            stop.set()  # the checks still running end at their next chunk instead of hashing on
            raise
    expected = plan["sha256"]
    wrong = sorted(name for name in set(expected) | set(digests) if digests.get(name) != expected.get(name))
    if wrong:
        raise HeaderError("written files differ from the recorded checkpoint: %s" % ", ".join(wrong))


def _write_every_file(plan, source_dir, output_dir, report, room, check):
    """Every file of the plan written, each handed to `check(name)` once complete; `room()` before each
    shard."""
    shards = plan["shards"]
    sources = open_sources(source_dir, sorted({item[1] for items in shards.values() for item in items}))
    try:
        for shard, items in shards.items():
            room()
            write_shard(os.path.join(output_dir, shard), items, sources, lambda n: report("copied", n))
            check(shard)
    finally:
        close_sources(sources)
    sized = {shard: [(item[0], item[5]) for item in items] for shard, items in shards.items()}
    with open(os.path.join(output_dir, INDEX_NAME), "wb") as handle:
        handle.write(index_bytes(sized))
    check(INDEX_NAME)
    with open(os.path.join(output_dir, "config.json"), "wb") as handle:
        handle.write(plan["config"].encode("utf-8"))
    check("config.json")
    for name in plan["assets"]:
        copy_asset(os.path.join(source_dir, name), os.path.join(output_dir, name))
        check(name)
    report("written", 0)


def _report_progress(phase, nbytes):
    print("%s %s %d" % (PROGRESS_PREFIX, phase, nbytes), flush=True)


def main(argv):
    if PLAN_JSON is None:
        print("error: no plan is embedded; this is the template, not a written extract.py", file=sys.stderr)
        return 2
    progress = _report_progress if argv[1:2] == ["--progress"] else None
    argv = [argv[0], *argv[2:]] if progress else argv
    if len(argv) != 3:
        print("usage: python extract.py [--progress] SOURCE_DIR OUTPUT_DIR", file=sys.stderr)
        return 2
    plan = json.loads(PLAN_JSON)
    try:
        extract(plan, argv[1], argv[2], progress)
    except HeaderError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 1
    except OSError as exc:
        where = " (%s)" % os.path.basename(exc.filename) if exc.filename else ""
        print("error: %s%s" % (exc.strerror or type(exc).__name__, where), file=sys.stderr)
        return 1
    count = sum(len(items) for items in plan["shards"].values())
    if not progress:  # with --progress the caller reads machine lines only (and no path to encode)
        print(
            "wrote %d tensors in %d shards to %s; every file matches its recorded sha256"
            % (count, len(plan["shards"]), argv[2])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
