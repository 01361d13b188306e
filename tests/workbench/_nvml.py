"""A cached virtual env with nvidia-ml-py (the real ``pynvml`` module), for the occupancy tests.

The occupancy check runs its NVML probe in the target interpreter; this is a real interpreter with
the real library, so what it reports on a machine without ``libnvidia-ml`` is the library's own
answer. Built like the CPU vLLM venv: in a ``.tmp`` sibling under a lock, checked, marked complete
and renamed into place.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ._cache import cache_root, file_lock, require_free_disk
from ._venvs import COMPLETE_MARKER, _run_logged

NVIDIA_ML_PY_VERSION = "13.580.82"
#: The wheel is under 100 kB; the venv's pip is most of it.
_INSTALL_GIB = 0.2


def nvml_python() -> Path:
    """Interpreter of ``<cache>/venvs/nvidia-ml-py-<version>`` (built on first use, a few seconds)."""
    venvs = cache_root() / "venvs"
    final = venvs / f"nvidia-ml-py-{NVIDIA_ML_PY_VERSION}"
    python = final / "bin" / "python"
    if (final / COMPLETE_MARKER).is_file():
        return python
    with file_lock(venvs / f".nvidia-ml-py-{NVIDIA_ML_PY_VERSION}.lock"):
        if (final / COMPLETE_MARKER).is_file():
            return python
        shutil.rmtree(final, ignore_errors=True)
        build = venvs / f"nvidia-ml-py-{NVIDIA_ML_PY_VERSION}.tmp"
        shutil.rmtree(build, ignore_errors=True)
        require_free_disk(venvs, _INSTALL_GIB)
        log = venvs / f"nvidia-ml-py-{NVIDIA_ML_PY_VERSION}.log"
        log.write_text("")
        _run_logged([sys.executable, "-m", "venv", str(build)], log)
        build_python = build / "bin" / "python"
        _run_logged([str(build_python), "-m", "pip", "install", f"nvidia-ml-py=={NVIDIA_ML_PY_VERSION}"], log)
        _run_logged([str(build_python), "-c", "import pynvml; print(pynvml.__file__)"], log)
        (build / COMPLETE_MARKER).write_text(f"nvidia-ml-py=={NVIDIA_ML_PY_VERSION}\n")
        os.replace(build, final)
    return python
