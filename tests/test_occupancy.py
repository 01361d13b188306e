"""Issue 24, part 3: occupancy read the way the platform reads it.

The NVML probe runs in the target interpreter (pymxsml, then pynvml; mx-smi / nvidia-smi only as
fallbacks), each process on a device is attributed by the real /proc, and a device busy with a
process this server did not start blocks the run without anything being signalled.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import workbench

from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.smoke import devices
from vllm_metax_mcp.core.smoke.devices import DeviceProcess, LibraryAttempt
from vllm_metax_mcp.core.smoke.evidence import DeviceEvidence, ServerRecord
from vllm_metax_mcp.core.smoke.processes import SMOKE_MARKER_ENV, start_ticks

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024
PYMXSML_MISSING = LibraryAttempt("pymxsml", "missing", error="ModuleNotFoundError: No module named 'pymxsml'")


def fallback_source() -> str:
    """What the vendor-tool fallback answers on this machine (neither tool is installed here)."""
    return "mx-smi" if shutil.which("mx-smi") else "nvidia-smi" if shutil.which("nvidia-smi") else "none"


def nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False


def nulls_or_empties(value: Any) -> list[str]:
    """Paths in a JSON value that hold null or an empty list/dict (the evidence carries none)."""
    if isinstance(value, dict):
        found = [k for k, v in value.items() if v is None or v == [] or v == {}]
        return found + [f"{k}.{p}" for k, v in value.items() for p in nulls_or_empties(v)]
    if isinstance(value, list):
        return [f"[{i}].{p}" for i, v in enumerate(value) for p in nulls_or_empties(v)]
    return []


def test_real_nvidia_ml_py_without_a_driver_library_reports_why_and_falls_back(tmp_path: Path) -> None:
    """The real nvidia-ml-py in a real interpreter: here (no GPU, no libnvidia-ml) its nvmlInit raises
    the library-not-found NVML error, which the occupancy keeps beside the fallback's answer."""
    python = workbench.nvml_python()
    occupancy = devices.detect(python, StateStore(tmp_path / "state"))
    pynvml = occupancy.library[1]
    assert occupancy.library[0] == PYMXSML_MISSING
    assert pynvml.module == "pynvml" and pynvml.version == workbench.NVIDIA_ML_PY_VERSION
    if nvml_loadable():  # a machine with the NVIDIA driver: the library answers, or says why it cannot
        assert pynvml.outcome in ("answered", "init_failed", "no_devices"), pynvml
        return
    assert pynvml == LibraryAttempt(
        "pynvml",
        "init_failed",
        workbench.NVIDIA_ML_PY_VERSION,
        "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
    )
    assert occupancy.source == fallback_source()
    if occupancy.source == "none":
        assert occupancy.kind == "cpu" and occupancy.devices == []
        record = occupancy.as_dict()
        assert record == {
            "kind": "cpu",
            "source": "none",
            "library": [
                {"module": "pymxsml", "outcome": "missing", "error": PYMXSML_MISSING.error},
                {"module": "pynvml", "outcome": "init_failed", "version": pynvml.version, "error": pynvml.error},
            ],
        }
        assert devices.choose(occupancy, 1, None, None) == ([], [])
        (reason,) = devices.choose(occupancy, 1, [0], None).reasons
        assert "pymxsml, pynvml" in reason and "mx-smi, nvidia-smi" in reason


def test_an_interpreter_without_an_nvml_module_falls_back_and_says_so(tmp_path: Path) -> None:
    occupancy = devices.detect(sys.executable, StateStore(tmp_path / "state"))
    assert occupancy.library == [
        PYMXSML_MISSING,
        LibraryAttempt("pynvml", "missing", error="ModuleNotFoundError: No module named 'pynvml'"),
    ]
    assert occupancy.library_error is None and occupancy.source == fallback_source()
    assert [a["outcome"] for a in occupancy.as_dict()["library"]] == ["missing", "missing"]


STAND_IN = '''
"""A stand-in for MetaX's pymxsml: the NVML API surface with fixed data (no device here)."""
import sys

__version__ = "0.0-stand-in"
MIB = 1024 * 1024
NOT_AVAILABLE = (1 << 64) - 1
DEVICES = {devices!r}


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class Record:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def nvmlInit():
    if "torch" in sys.modules:
        raise NVMLError("the probe imported torch")
    {init}


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(DEVICES)


def nvmlDeviceGetHandleByIndex(index):
    return DEVICES[index]


def nvmlDeviceGetName(handle):
    return handle["name"].encode() if handle["bytes_name"] else handle["name"]


def nvmlDeviceGetMemoryInfo(handle):
    if handle["total"] is None:
        raise NVMLError_NotSupported("Not Supported")
    return Record(total=handle["total"] * MIB, used=handle["used"] * MIB, free=(handle["total"] - handle["used"]) * MIB)


def _processes(listed):
    return [Record(pid=pid, usedGpuMemory=NOT_AVAILABLE if used is None else used * MIB) for pid, used in listed]


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _processes(handle["compute"])


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return _processes(handle["graphics"])
'''


def stand_in(directory: Path, device_list: list[dict[str, Any]], init: str = "pass") -> list[Path]:
    """A `pymxsml` module on a directory the probe gets as its PYTHONPATH."""
    directory.mkdir()
    (directory / "pymxsml.py").write_text(textwrap.dedent(STAND_IN).format(devices=device_list, init=init))
    return [directory]


def device(name: str, total: int | None, used: int, compute: list[Any], graphics: list[Any]) -> dict[str, Any]:
    """One device of the stand-in (a name ending in b is returned as bytes, as older bindings do)."""
    return {
        "name": name,
        "bytes_name": name.endswith("b"),
        "total": total,
        "used": used,
        "compute": compute,
        "graphics": graphics,
    }


@pytest.fixture
def smoke_processes() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """Two real processes in sessions of their own carrying the smoke marker, the way run.py launches
    a server: one for a run whose record names its group, one for a run known only by its marker."""
    started = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"],
            env={**os.environ, SMOKE_MARKER_ENV: run_id},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        for run_id in ("s-running", "s-moved")
    ]
    try:
        yield started[0], started[1]
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_devices_listed_with_processes_are_attributed_by_proc_and_foreign_ones_block(
    tmp_path: Path, smoke_processes: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]
) -> None:
    """The device side, on a stand-in for the vendor library (no accelerator here): the stand-in `pymxsml`
    serves fixed NVML data whose pids are real processes. Everything else is the code under test: the
    probe script in a real interpreter, its JSON, detect(), the attribution read from the real /proc
    against the state directory's run records, choose() and busy_reason()."""
    running, moved = smoke_processes
    ours = os.getpid()  # a process this server did not start (the test itself)
    store = StateStore(tmp_path / "state")
    leaders = (
        ("s-running", running.pid, start_ticks(running.pid)),
        ("s-moved", 1, None),  # its process left the group; its marker still says whose it is
        ("s-reused", os.getpgrp(), 1),  # the group id is alive, but its leader started at another time
        ("s-done", os.getpgrp(), start_ticks(os.getpgrp())),
    )
    for run_id, pgid, ticks in leaders:
        record = ServerRecord(pgid, pgid, run_id, None, 1, 0.0, ticks)
        store.write(f"smoke/{run_id}/server.json", asdict(record))
    # finished: its group id and its (published) run id may be anyone's now
    store.write("smoke/s-done/evidence.json", {"run_id": "s-done"})
    pythonpath = stand_in(
        tmp_path / "vendor",
        [
            device("MXC500", 65536, 800, [], []),
            device("MXC500b", 65536, 30000, [(running.pid, 20000)], [(moved.pid, None), (running.pid, None)]),
            device("MXC500", 65536, 1000, [(ours, 512)], []),
            device("MXC500", None, 0, [], []),
        ],
    )
    occupancy = devices.detect(sys.executable, store, pythonpath)
    assert (occupancy.kind, occupancy.source, occupancy.version) == ("metax", "pymxsml", "0.0-stand-in")
    free, shared, foreign, unreadable = occupancy.devices
    assert (free.name, free.total_mib, free.used_mib, free.free_mib, free.processes) == (
        "MXC500",
        65536,
        800,
        64736,
        [],
    )
    assert shared.name == "MXC500b" and shared.processes == sorted(
        [DeviceProcess(running.pid, 20000, True, "s-running"), DeviceProcess(moved.pid, None, True, "s-moved")],
        key=lambda p: p.pid,
    )
    assert foreign.processes == [DeviceProcess(ours, 512, False, None)]
    assert unreadable.processes is None and unreadable.error == "memory: NVMLError_NotSupported: Not Supported"

    assert devices.choose(occupancy, 1, None, None) == ([0], [])
    assert devices.choose(occupancy, 1, [2], None).reasons == [
        f"device 2 runs 1 process(es) this server did not start (pid {ours}); they are left alone"
    ]
    assert devices.choose(occupancy, 1, [1], None).reasons == [
        "device 1 runs the smoke server of run s-moved, s-running, started by this server"
    ]
    selected, reasons = devices.choose(occupancy, 2, None, None)
    assert selected == [] and reasons[0] == "2 device(s) needed, 1 free"
    assert reasons[-1] == "device 3: free memory unknown (memory: NVMLError_NotSupported: Not Supported)"

    record = DeviceEvidence(occupancy, 1, [2]).to_json()
    assert nulls_or_empties(record) == [] and "library" not in record
    assert record["devices"][2] == {
        "index": 2,
        "name": "MXC500",
        "total_mib": 65536,
        "used_mib": 1000,
        "free_mib": 64536,
        "processes": [{"pid": ours, "used_mib": 512, "started_by_this_server": False}],
    }
    assert record["needed"] == 1 and record["requested"] == [2] and "selected" not in record
    assert running.poll() is None and moved.poll() is None, "nothing was signalled"


def test_a_library_that_cannot_initialise_or_crashes_is_reported_and_the_fallback_runs(tmp_path: Path) -> None:
    """Stand-ins for a vendor library whose driver is missing, one whose import needs a missing module,
    and one whose native code crashes the probe (the way a broken driver library does)."""
    no_driver = stand_in(tmp_path / "no-driver", [], init='raise NVMLError("Driver Not Loaded")')
    occupancy = devices.detect(sys.executable, None, no_driver)
    assert occupancy.library[0] == LibraryAttempt(
        "pymxsml", "init_failed", "0.0-stand-in", "NVMLError: Driver Not Loaded"
    )
    assert occupancy.source == fallback_source()

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pymxsml.py").write_text("import libmxsml_bindings\n")
    occupancy = devices.detect(sys.executable, None, [broken])
    assert occupancy.library[0] == LibraryAttempt(
        "pymxsml", "import_failed", error="ModuleNotFoundError: No module named 'libmxsml_bindings'"
    )

    crashing = stand_in(tmp_path / "crashing", [], init="import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    occupancy = devices.detect(sys.executable, None, crashing)
    assert occupancy.library == [] and occupancy.source == fallback_source()
    assert occupancy.library_error == (
        "the NVML probe died: SIGSEGV (segmentation fault in native code) while initialising pymxsml"
    )
