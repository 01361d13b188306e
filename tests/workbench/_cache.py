"""Where the workbench keeps big, reusable artefacts, and the guards around them.

Wheels, extracted upstream trees and the CPU vLLM virtual env are hundreds of MB to
GB; they live outside the clone (so ``git status`` and packaging never see them) and
are shared between test runs and between parallel test processes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CACHE_ENV = "VLLM_METAX_MCP_TEST_CACHE"
_GIB = 1024**3


def cache_root() -> Path:
    """Return the test cache directory (created on demand).

    ``$VLLM_METAX_MCP_TEST_CACHE`` wins, so CI can point it at a persistent volume;
    otherwise ``${XDG_CACHE_HOME:-~/.cache}/vllm-metax-mcp-tests``.
    """
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        root = base / "vllm-metax-mcp-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


def require_free_disk(path: Path, gib: float) -> None:
    """Fail the test clearly when ``path``'s filesystem has less than ``gib`` GiB free.

    Called before every large download or install so that a full disk shows up as one
    readable message instead of a truncated wheel or a half-installed venv.
    """
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < gib * _GIB:
        pytest.fail(
            f"not enough free disk for the test workbench at {path}: "
            f"{free / _GIB:.1f} GiB free, {gib:.1f} GiB needed "
            f"(set ${CACHE_ENV} to a roomier place)",
            pytrace=False,
        )


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``lock_path`` for the duration of the block.

    Parallel pytest processes (xdist, or two sessions) build the same cached artefact;
    the lock makes the second one wait and then reuse the first one's result.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
