"""Runs inside the *target* interpreter (any Python >= 3.8): accelerator occupancy read through the
NVML-compatible management library that interpreter has, as one JSON line after a marker.

MetaX's `pymxsml` first (vLLM-MetaX's platform reads its devices with it), then `pynvml`
(nvidia-ml-py). Only NVML calls are made: a management library creates no device context, and
torch is never imported. Every library tried is reported — not installed, failed to import,
failed to initialise (the NVML error as raised), failed to query, listed no device, or answered —
so the caller can say why it fell back to mx-smi / nvidia-smi.
"""

import importlib
import json
import re
import sys
from typing import Dict, Optional

MARKER = "@@NVML@@"
STEP = "@@STEP@@"
LIBRARIES = (("pymxsml", ("pymxsml",)), ("pynvml", ("nvidia-ml-py", "pynvml")))
"""Each module with the distributions that may provide it (for its version)."""
PROCESS_QUERIES = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")
MIB = 1024 * 1024
NOT_AVAILABLE = 1 << 63
"""NVML marks an unknown per-process memory with the top of the unsigned range."""


def step(text):
    """Announce what comes next, so a crash in native code can be placed."""
    sys.stdout.write("\n" + STEP + text + "\n")
    sys.stdout.flush()


def error(exc):
    """The exception in one line, without the file paths ImportError and OSError put in their text."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    text = re.sub(r"\s*\((?:/|[A-Za-z]:\\)[^()]*\)", "", text)
    text = re.sub(r"(?:/[^\s/:'\"]+){2,}", "<path>", text)
    return "%s: %s" % (type(exc).__name__, text[:300])


def version_of(module, distributions):
    found = getattr(module, "__version__", None)
    if found:
        return str(found)
    try:
        from importlib import metadata
    except ImportError:
        return None
    for name in distributions:
        try:
            return metadata.version(name)
        except Exception:  # not installed under that name
            continue
    return None


def text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def mib(value):
    if value is None or int(value) >= NOT_AVAILABLE:
        return None
    return int(value) // MIB


def processes(nvml, handle):
    """The processes on a device, once each (a process may be both compute and graphics), and what
    could not be listed."""
    found: Dict[int, Optional[int]] = {}
    problems = []
    queries = [(name, getattr(nvml, name)) for name in PROCESS_QUERIES if hasattr(nvml, name)]
    if not queries:
        problems.append("the library has no process query (%s)" % ", ".join(PROCESS_QUERIES))
    for name, query in queries:
        try:
            listed = query(handle)
        except Exception as exc:  # NotSupported on some devices: the device's error says the list is partial
            problems.append("%s: %s" % (name, error(exc)))
            continue
        for entry in listed:
            used = mib(getattr(entry, "usedGpuMemory", None))
            pid = int(entry.pid)
            if found.get(pid) is None:
                found[pid] = used
    return [{"pid": pid, "used_mib": found[pid]} for pid in sorted(found)], problems


def device(nvml, index):
    record = {"index": index}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:  # a lost device, or one this user may not query
        record["error"] = "handle: " + error(exc)
        return record
    try:
        record["name"] = text(nvml.nvmlDeviceGetName(handle))
    except Exception as exc:
        record["error"] = "name: " + error(exc)
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        record.update(total_mib=mib(memory.total), used_mib=mib(memory.used), free_mib=mib(memory.free))
    except Exception as exc:  # the caller treats the device as of unknown free memory
        record["error"] = "memory: " + error(exc)
        return record
    listed, problems = processes(nvml, handle)
    if problems:  # unlisted (only the memory decides) or partial: said either way
        record["error"] = "processes: " + "; ".join(problems)
    if listed or not problems:
        record["processes"] = listed
    return record


def attempt(name, distributions):
    """One library: (report of the attempt, its devices or None)."""
    report = {"module": name}
    step("importing " + name)
    try:
        nvml = importlib.import_module(name)
    except ImportError as exc:
        report.update(outcome="missing" if exc.name == name else "import_failed", error=error(exc))
        return report, None
    except BaseException as exc:  # a vendor module may raise anything on import
        report.update(outcome="import_failed", error=error(exc))
        return report, None
    report["version"] = version_of(nvml, distributions)
    step("initialising " + name)
    try:
        nvml.nvmlInit()
    except BaseException as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        report.update(outcome="init_failed", error=error(exc))
        return report, None
    try:
        step("querying " + name)
        found = [device(nvml, index) for index in range(int(nvml.nvmlDeviceGetCount()))]
    except BaseException as exc:
        report.update(outcome="query_failed", error=error(exc))
        return report, None
    finally:
        try:
            nvml.nvmlShutdown()
        except BaseException:  # the answer is read already
            pass
    report["outcome"] = "answered" if found else "no_devices"
    return report, found or None


def main():
    attempts = []
    devices = []
    for name, distributions in LIBRARIES:
        report, found = attempt(name, distributions)
        attempts.append(report)
        if found:
            devices = found
            break
    sys.stdout.write("\n" + MARKER + json.dumps({"attempts": attempts, "devices": devices}) + "\n")
    sys.stdout.flush()


main()
