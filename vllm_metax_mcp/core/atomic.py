"""Outputs appear whole or not at all: written to a temporary sibling, renamed into place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ErrorCode, ToolFailure


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


@contextmanager
def staged_directory(target: Path, *, replace: bool = False, tag: str = "") -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it becomes `target`, on failure it vanishes.

    An existing `target` is refused unless `replace` is set, and is only swapped out once the
    new content is complete. `tag` (a job id) goes into the sibling's name, so whoever stops a
    killed job can find what it left.
    """
    if target.exists() and not replace:
        raise ToolFailure(
            ErrorCode.BAD_INPUT,
            f"{target.name} already exists; choose a new output directory or pass overwrite=true.",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=scratch_prefix(target, tag), suffix=".partial", dir=target.parent))
    retired: Path | None = None
    try:
        yield staging
        if target.exists():
            retired = Path(tempfile.mkdtemp(prefix=scratch_prefix(target, tag), suffix=".old", dir=target.parent))
            os.replace(target, retired / "old")
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if retired is not None and (retired / "old").exists() and not target.exists():
            os.replace(retired / "old", target)  # interrupted between the two renames: the old output comes back
            shutil.rmtree(retired, ignore_errors=True)
        raise
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)
