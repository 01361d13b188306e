"""Outputs appear whole or not at all: written to a temporary sibling, renamed into place.

An existing output is replaced only when it is an earlier output of this server: it carries one of
the server's markers (`trim_manifest.json` of a trim, `.vllm-metax-mcp-export.json` of an export,
`port_report.json` of a port, each starting with its `"format": "vllm-metax-mcp/..."` line), the
server's state directory recorded writing exactly that directory and marker (`OutputRecords`, see
`core/foundation/state.py`: a repository can commit a marker, it cannot write into the state
directory), and it neither is nor holds a git repository (a `.git` directory, file or link, or a
bare repository). The walk that looks for one never follows a symlink, stops at the first repository
and gives up (refusing) after REPLACE_WALK_LIMIT entries, so a huge tree costs at most that many
directory entries — and a tree without a recorded marker is refused before any walk.
`Policy.replaceable` is the one overwrite rule: it adds what needs the policy (output roots, read
roots, the state directory, files tracked by an enclosing repository) and calls `check_replaceable`;
`staged_directory(replace=True, policy=...)` applies it when it starts and right before the swap,
since a job may run for hours between the call and the rename, and records the new output once the
swap succeeded."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .errors import ErrorCode, ToolFailure

if TYPE_CHECKING:
    from .policy import Policy

TRIM_MANIFEST = "trim_manifest.json"
EXPORT_MARKER = ".vllm-metax-mcp-export.json"
PORT_REPORT = "port_report.json"
OUTPUT_MARKERS = {
    TRIM_MANIFEST: "vllm-metax-mcp/trim-manifest/",
    EXPORT_MARKER: "vllm-metax-mcp/export/",
    PORT_REPORT: "vllm-metax-mcp/port-report/",
}
"""Marker file -> the format prefix its first key must carry."""
MARKER_HEAD_BYTES = 4096
MARKER_MAX_BYTES = 256 * 1024 * 1024
REPLACE_WALK_LIMIT = 200_000
_FORMAT_LINE = re.compile(rb'\A\s*\{\s*"format"\s*:\s*"([^"]{1,200})"')


def write_bytes_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace `path` with `data` in one rename; readers never see a partial file.

    Caches pass durable=False: a lost cache entry is recomputed, so it skips the fsync.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def scratch_prefix(target: Path, tag: str = "") -> str:
    """The name prefix of temporary siblings of `target` (staging, scratch), with the job's tag."""
    return f".{target.name}.{tag + '.' if tag else ''}"


def output_marker(directory: Path) -> str | None:
    """The marker naming `directory` an earlier output of this server, or None (links are not followed).

    The server writes `"format"` as a marker's first key, so its first bytes decide; a marker written
    with other key order (older real trims) is parsed whole, up to MARKER_MAX_BYTES."""
    for name, prefix in OUTPUT_MARKERS.items():
        path = directory / name
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MARKER_MAX_BYTES:
                continue
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            with os.fdopen(fd, "rb") as handle:
                head = handle.read(MARKER_HEAD_BYTES)
                found = _FORMAT_LINE.match(head)
                if found:
                    value = found.group(1).decode("utf-8", "replace")
                else:
                    document = json.loads(head + handle.read(MARKER_MAX_BYTES))
                    value = document.get("format") if isinstance(document, dict) else None
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(value, str) and value.startswith(prefix):
            return name
    return None


def output_fingerprint(directory: Path) -> dict[str, Any] | None:
    """What identifies the output this server wrote at `directory`: which marker it carries, the marker's
    sha256, size, device, inode and mtime, and the directory's own device and inode. Recorded once the
    swap succeeded and compared before any replacement: a marker copied, committed or checked out by
    someone else differs in inode (and mostly in mtime); a directory replaced around the marker differs
    in its own inode. None when `directory` carries no marker (links are never followed)."""
    name = output_marker(directory)
    if name is None:
        return None
    try:
        folder = os.lstat(directory)
        fd = os.open(directory / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > MARKER_MAX_BYTES:
                return None
            digest = hashlib.sha256()
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    return {
        "marker": name,
        "sha256": digest.hexdigest(),
        "size": info.st_size,
        "dev": info.st_dev,
        "ino": info.st_ino,
        "mtime_ns": info.st_mtime_ns,
        "dir_dev": folder.st_dev,
        "dir_ino": folder.st_ino,
    }


class OutputRecords(Protocol):
    """The outputs the server's state directory recorded writing (`core/foundation/state.py: OutputRegistry`)."""

    def mismatch(self, target: Path) -> str | None:
        """None when `target` is the output recorded at its path, else why not (in words)."""

    def record(self, target: Path) -> None:
        """Record the output now at `target` (after its swap succeeded)."""


def _is_bare_repository(path: str) -> bool:
    return all(os.path.lexists(os.path.join(path, part)) for part in ("HEAD", "objects", "refs"))


def repository_within(directory: Path, limit: int | None = None) -> str | None:
    """Where `directory` is or holds a git repository (relative, '.' for itself), "" when the walk passed
    `limit` entries (default REPLACE_WALK_LIMIT) without deciding, None when it holds none. Symlinks are
    never followed; the walk stops at the first repository."""
    limit = REPLACE_WALK_LIMIT if limit is None else limit
    if os.path.lexists(directory / ".git") or _is_bare_repository(str(directory)):
        return "."
    seen = 0
    pending = [str(directory)]
    while pending:
        current = pending.pop()
        try:
            with os.scandir(current) as entries:
                for entry in entries:
                    seen += 1
                    if seen > limit:
                        return ""
                    if entry.name == ".git":
                        return os.path.relpath(current, directory)
                    if entry.is_dir(follow_symlinks=False):
                        if _is_bare_repository(entry.path):
                            return os.path.relpath(entry.path, directory)
                        pending.append(entry.path)
        except OSError:
            return ""
    return None


REPLACE_RULE = (
    "overwrite replaces only an earlier output of this server (a directory carrying its trim_manifest.json or "
    f"{EXPORT_MARKER} that its state directory recorded writing), never a path that is, contains or lies above a git "
    "repository, a read root, an output root, a protected path or the state directory, nor one holding files a "
    "repository tracks. Choose a new output directory"
)


def check_replaceable(target: Path, shown: str | None = None, records: OutputRecords | None = None) -> None:
    """Refuse to replace `target` unless it is an earlier output of this server holding no git repository.

    With `records` (every tool passes them, through `Policy.replaceable`) the marker must also be the one
    the state directory recorded writing at this path; without, only the marker is looked at (the
    primitive alone, for tests)."""
    shown = shown or target.name
    rule = REPLACE_RULE + "."
    if target.is_symlink() or not target.is_dir():
        raise ToolFailure(
            ErrorCode.PROTECTED_PATH, f"{shown} exists and is not an output directory of this server; {rule}"
        )
    if os.path.lexists(target / ".git") or _is_bare_repository(str(target)):
        raise ToolFailure(ErrorCode.PROTECTED_PATH, f"{shown} is a git repository; {rule}")
    if output_marker(target) is None:
        raise ToolFailure(
            ErrorCode.PROTECTED_PATH, f"{shown} exists and is not an earlier output of this server; {rule}"
        )
    if records is not None:
        why = records.mismatch(target)
        if why is not None:
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{shown} carries this server's marker, but {why}: a marker alone is not enough, since any repository "
                f"can commit one. {REPLACE_RULE}, or delete {shown} yourself if it is yours.",
            )
    found = repository_within(target)
    if found == "":
        raise ToolFailure(
            ErrorCode.PROTECTED_PATH,
            f"{shown} holds more than {REPLACE_WALK_LIMIT} entries (or unreadable ones), so it cannot be verified "
            f"to hold no git repository; {rule}",
        )
    if found is not None:
        raise ToolFailure(ErrorCode.PROTECTED_PATH, f"{shown} contains a git repository ({found}); {rule}")


def _check(target: Path, shown: str | None, policy: Policy | None) -> None:
    if policy is not None:
        policy.replaceable(target, shown or target.name)
    else:
        check_replaceable(target, shown)


def _flush(path: Path | str) -> None:
    """One regular file or folder of the server's own staged output flushed to disk (no link followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_tree(directory: Path) -> None:
    """Every file and folder of a staged output made durable before it is renamed into place, so a crash
    after the rename never shows the output with missing or empty files. A file already flushed (a real
    trim's shards) costs nothing again."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _flush_tree(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                _flush(entry.path)
    _flush(directory)


@contextmanager
def staged_directory(
    target: Path, *, replace: bool = False, tag: str = "", shown: str | None = None, policy: Policy | None = None
) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it becomes `target`, on failure it vanishes.

    An existing `target` is refused unless `replace` is set and it is an earlier output of this
    server (`policy.replaceable`, checked again right before the swap); it is only swapped out once
    the new content is complete, and the new directory keeps the old one's mode. `tag` (a job id)
    goes into the sibling's name, so whoever stops a killed job can find what it left. `shown` is the
    caller's spelling of the target, for messages. With `policy` (every tool passes it) the new output
    is recorded in the state directory once the swap succeeded, so a later overwrite recognises it;
    without, only the marker is checked (the primitive alone, for tests).
    """
    if target.exists() or target.is_symlink():
        if not replace:
            raise ToolFailure(
                ErrorCode.BAD_INPUT,
                f"{shown or target.name} already exists; choose a new output directory or pass overwrite=true.",
            )
        _check(target, shown, policy)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=scratch_prefix(target, tag), suffix=".partial", dir=target.parent))
    retired: Path | None = None
    try:
        yield staging
        if target.exists() or target.is_symlink():
            # it may have appeared or changed while the new content was written
            if not replace:
                raise ToolFailure(
                    ErrorCode.BAD_INPUT,
                    f"{shown or target.name} appeared while the output was written; nothing was replaced.",
                )
            _check(target, shown, policy)
            os.chmod(staging, stat.S_IMODE(os.lstat(target).st_mode))  # the replacement keeps the old output's mode
            retired = Path(tempfile.mkdtemp(prefix=scratch_prefix(target, tag), suffix=".old", dir=target.parent))
            os.replace(target, retired / "old")
        _flush_tree(staging)
        os.replace(staging, target)
        _flush(target.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None and (retired / "old").exists() and not target.exists():
            os.replace(retired / "old", target)  # interrupted between the two renames: the old output comes back
            shutil.rmtree(retired, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
    if policy is not None:
        policy.record_output(target, shown or target.name)
