"""The smoke server's processes: found, watched and stopped without ever touching one this run did not start.

The server is launched in a new session (its own process group) with a marker variable, and only
members of that group or carriers of that marker are signalled. While the group's leader is not
reaped (exits are observed with WNOWAIT until teardown ends), its group id cannot be reused by
anyone else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .ray_cluster import RayTeardown

SMOKE_MARKER_ENV = "VLLM_METAX_MCP_SMOKE"
TEARDOWN = ((signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))
"""Each signal of the teardown and how long the processes get to end after it."""


@dataclass(frozen=True)
class SignalStep:
    signal: str
    pids: list[int]
    """The processes alive when the signal was sent."""


@dataclass(frozen=True)
class Teardown:
    steps: list[SignalStep]
    leftover_pids: list[int]
    """Still alive after the last step (the run fails then)."""
    seconds: float
    ray: RayTeardown | None = None
    """On a Ray cluster: the end of the server's Ray job (its actors live outside this process group)."""


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first, process group third)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_group(pid: int) -> int | None:
    """The process group of a live process (None: gone, or not visible here)."""
    fields = stat_fields(pid)
    try:
        return int(fields[2]) if fields else None
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/PID/stat field 22): with its pid, an identity
    that a reused pid does not share."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def processes_of(pgid: int, marker: str) -> list[int]:
    """Live processes in the server's group or carrying its marker: exactly what this run started."""
    needle = f"{SMOKE_MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == pgid:
            found.append(pid)
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return sorted(found)


def exit_status(pid: int) -> int | None:
    """The child's exit status without reaping it (so its pid and group id stay ours); None while it runs."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -1
    if result is None:
        return None
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


def stop_server(proc: subprocess.Popen[bytes], marker: str) -> Teardown:
    """SIGINT, then SIGTERM, then SIGKILL to what this run started, each with a deadline; then verify."""
    started = time.monotonic()
    steps = []
    for sig, grace in TEARDOWN:
        pids = processes_of(proc.pid, marker)
        if not pids:
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        outside = [pid for pid in pids if process_group(pid) != proc.pid]
        for pid in outside:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        steps.append(SignalStep(sig.name, pids))
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and processes_of(proc.pid, marker):
            time.sleep(0.2)
    leftover = processes_of(proc.pid, marker)
    try:
        proc.wait(timeout=5)  # reap the leader only now: until here its group id could not be reused
    except subprocess.TimeoutExpired:
        pass
    return Teardown(steps, leftover, round(time.monotonic() - started, 2))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
