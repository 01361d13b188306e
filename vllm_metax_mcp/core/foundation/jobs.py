"""Long work as detached jobs: a worker per job, in its own process group, with a heartbeat.

A job outlives the call (and the server) that started it; any server sharing the state
directory can report, wait for or cancel it. Processes are only ever killed when they carry
the job's marker in their environment, so a server never kills a process it did not start.
"""

from __future__ import annotations

import builtins
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import TypeAdapter

from .errors import ErrorCode, ToolFailure
from .state import StateStore

JOB_MARKER_ENV = "VLLM_METAX_MCP_JOB"
HEARTBEAT_INTERVAL_S = 1.0
STALE_AFTER_S = 10.0
TERMINATE_GRACE_S = 5.0
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})
CANCELLING = "cancelling"
"""A cancel was asked for and the job's processes are still being stopped; `cancelled` once they are gone."""
MIN_POLL_S, DEFAULT_POLL_S, MAX_POLL_S = 2.0, 5.0, 10.0
CANCELLED_ERROR = {"code": "failed", "message": "cancelled on request"}


@dataclass(frozen=True)
class JobHandle:
    """What a tool returns instead of its output when its work runs as a job."""

    job_id: str


class Stopped(BaseException):
    """Raised in a job's worker when it is asked to stop (SIGTERM from a cancel), so its cleanup still runs;
    the worker records nothing, and the canceller marks the job cancelled."""


def stop_requested(signum: int, frame: Any) -> None:
    """SIGTERM handler for job workers: raise Stopped once, ignore repeats while cleaning up."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stopped()


def _now() -> float:
    return time.time()


@dataclass(frozen=True)
class Scratch:
    """What a job's worker may leave beside an output if it is killed: temporary siblings in `directory`
    whose names start with `prefix` ("{job}" in it becomes the job id), for the output named `output`."""

    directory: str
    prefix: str
    output: str


def job_resource(job_id: str) -> str:
    """The URI of a job's status resource (registered by the server's resources)."""
    return f"vllm-metax://jobs/{job_id}"


def progress_message(status: dict[str, Any]) -> str:
    """One line for an agent: the job's state, the phase its worker reported and how far it got."""
    progress = status.get("progress") or {}
    done, total, phase = progress.get("done"), progress.get("total"), progress.get("message")
    text = status["status"] + (f": {phase}" if phase else "")
    if isinstance(done, (int, float)) and isinstance(total, (int, float)) and total > 0:
        text += f" ({min(done / total, 1.0):.0%})"
    return text


def poll_after(status: dict[str, Any], now: float | None = None) -> float:
    """Seconds until a poll is worth making: a quarter of the expected time left at the rate so far,
    within MIN_POLL_S..MAX_POLL_S (MIN while cancelling or queued, a middle value without a rate)."""
    if status["status"] in (CANCELLING, "queued"):
        return MIN_POLL_S
    progress = status.get("progress") or {}
    done, total = progress.get("done"), progress.get("total")
    started = status.get("started_at") or status.get("created_at")
    elapsed = (now or _now()) - started if started else 0.0
    if not (isinstance(done, (int, float)) and isinstance(total, (int, float)) and done > 0 and elapsed > 0):
        return DEFAULT_POLL_S
    left = max(total - done, 0) * elapsed / done
    return round(min(max(left / 4, MIN_POLL_S), MAX_POLL_S), 1)


class Jobs:
    def __init__(self, store: StateStore) -> None:
        self.store = store

    def _status_path(self, job_id: str) -> str:
        return f"jobs/{job_id}/status.json"

    def heartbeat_file(self, job_id: str) -> Path:
        return self.store.path(f"jobs/{job_id}/heartbeat")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, tool: str, target: str, payload: Any, scratch: list[Scratch] | None = None) -> JobHandle:
        """Spawn a detached worker that runs `target` ("module:function") on `payload`.

        `payload`: the target's own dataclass (stored as JSON, rebuilt and validated by the worker from the
        target's annotation), or a plain JSON dict. `scratch`: what the worker may leave if it is killed.
        Stopping the job (cancel, or reaping a lost one) removes it, after putting back an output that was set
        aside for replacement (`<prefix>*.old/old`) if none took its place.
        """
        job_id = f"j-{uuid.uuid4().hex[:16]}"
        job_dir = self.store.path(f"jobs/{job_id}")
        job_dir.mkdir(parents=True)
        leftovers = [[item.directory, item.prefix.replace("{job}", job_id), item.output] for item in scratch or []]
        args = payload if isinstance(payload, dict) else TypeAdapter(type(payload)).dump_python(payload, mode="json")
        self.store.write(
            f"jobs/{job_id}/spec.json",
            {"id": job_id, "tool": tool, "target": target, "args": args, "scratch": leftovers},
        )
        self.store.write(
            self._status_path(job_id),
            {"id": job_id, "tool": tool, "status": "queued", "created_at": _now(), "progress": None},
        )
        env = dict(os.environ, **{JOB_MARKER_ENV: job_id, "PYTHONDONTWRITEBYTECODE": "1"})
        with open(job_dir / "log", "ab") as log:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "vllm_metax_mcp.core.foundation.worker", str(self.store.root), job_id],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        launcher.wait()  # the launcher forks the worker and exits at once
        return JobHandle(job_id)

    def get(self, job_id: str) -> dict[str, Any]:
        if not job_id.startswith("j-") or not all(c in "0123456789abcdef" for c in job_id[2:]):
            raise ToolFailure(ErrorCode.BAD_INPUT, f"{job_id!r} is not a job id; list jobs with the jobs tool.")
        status = self.store.read(self._status_path(job_id))
        if status is None:
            raise ToolFailure(
                ErrorCode.NOT_FOUND, f"No job {job_id} in this state directory; list jobs with the jobs tool."
            )
        return status

    def list(self) -> list[dict[str, Any]]:
        found = [self.store.read(self._status_path(job_id)) for job_id in self.store.list("jobs")]
        return sorted((s for s in found if s), key=lambda s: s.get("created_at", 0), reverse=True)

    def heartbeat_age(self, job_id: str) -> float | None:
        try:
            return _now() - self.heartbeat_file(job_id).stat().st_mtime
        except FileNotFoundError:
            return None

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Stop the job's whole process tree: the status reads `cancelling` (so any server polling it sees the
        cancel at once) until no process of the job is left, then `cancelled`."""
        status = self.get(job_id)
        if status["status"] in FINAL_STATES:
            return status
        self._set_open(job_id, status=CANCELLING, cancel_requested_at=_now())
        stop_job_processes(job_id)
        self._remove_scratch(job_id)
        return self._finish_if_open(job_id, "cancelled", error=CANCELLED_ERROR)

    def reap_stale(self) -> builtins.list[str]:
        """Stop what is left of jobs whose worker stopped beating; a live job is never touched."""
        reaped = []
        for status in self.list():
            if status["status"] in FINAL_STATES:
                continue
            age = self.heartbeat_age(status["id"])
            if age is None:
                age = _now() - status.get("created_at", 0)
            if age < STALE_AFTER_S:
                continue
            stop_job_processes(status["id"])
            self._remove_scratch(status["id"])
            if status["status"] == CANCELLING:  # the canceller went away before it finished
                self._finish_if_open(status["id"], "cancelled", error=CANCELLED_ERROR)
                reaped.append(status["id"])
                continue
            self._finish_if_open(
                status["id"],
                "lost",
                error={
                    "code": "failed",
                    "message": "the job's worker stopped without finishing (its heartbeat stopped); "
                    "its remaining processes were stopped. Run the tool again.",
                },
            )
            reaped.append(status["id"])
        return reaped

    def _remove_scratch(self, job_id: str) -> None:
        """What a stopped worker could not clean up itself (it was killed): its tagged temporary siblings."""
        spec = self.store.read(f"jobs/{job_id}/spec.json") or {}
        for directory, prefix, output in spec.get("scratch") or []:
            if job_id not in prefix:
                continue  # only names carrying this job's id are ever removed
            target = Path(directory) / output
            for path in Path(directory).glob(glob.escape(prefix) + "*"):
                if path.name.endswith(".old") and (path / "old").is_dir() and not target.exists():
                    os.replace(path / "old", target)
                shutil.rmtree(path, ignore_errors=True)

    def _set_open(self, job_id: str, **fields: Any) -> dict[str, Any]:
        def change(current: dict[str, Any] | None) -> dict[str, Any]:
            current = dict(current or {"id": job_id})
            if current.get("status") not in FINAL_STATES:
                current.update(fields)
            return current

        return self.store.update(self._status_path(job_id), change)

    def _finish_if_open(self, job_id: str, state: str, **fields: Any) -> dict[str, Any]:
        def change(current: dict[str, Any] | None) -> dict[str, Any]:
            current = dict(current or {"id": job_id})
            if current.get("status") not in FINAL_STATES:
                current.update(status=state, finished_at=_now(), **fields)
            return current

        return self.store.update(self._status_path(job_id), change)

    async def wait(
        self,
        job_id: str,
        timeout_s: float,
        on_progress: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends or `timeout_s` passes; report each new progress value."""
        deadline = time.monotonic() + timeout_s
        last_progress: Any = None
        while True:
            status = self.get(job_id)
            if on_progress and status.get("progress") and status["progress"] != last_progress:
                last_progress = status["progress"]
                await on_progress(last_progress)
            if status["status"] in FINAL_STATES or time.monotonic() >= deadline:
                return status
            await anyio.sleep(0.2)


def processes_of_job(job_id: str) -> list[int]:
    """Pids whose environment carries this job's marker (the worker and everything it started)."""
    marker = f"{JOB_MARKER_ENV}={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def stop_job_processes(job_id: str) -> None:
    """SIGTERM every process of the job (and its groups), then SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 2.0)):
        pids = processes_of_job(job_id)
        if not pids:
            return
        for pid in pids:
            _signal(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(pids):
            time.sleep(0.1)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        pgid = os.getpgid(pid)
        if pgid == pid:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False
