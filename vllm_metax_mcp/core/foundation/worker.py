"""Entry point of a job's worker process: `python -m vllm_metax_mcp.core.foundation.worker STATE_DIR JOB_ID`.

The first process forks and exits at once, so the worker is re-parented away from the server
(no zombies there) and keeps running if the server goes away.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import threading
import time
import traceback
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .errors import ErrorCode, ToolFailure
from .jobs import CANCELLING, FINAL_STATES, HEARTBEAT_INTERVAL_S, Jobs
from .state import StateStore


class Progress:
    """Handed to a job target: records progress in the job's status document. `done` never goes back
    (a lower value keeps the highest so far, with the new message): MCP progress only increases."""

    def __init__(self, jobs: Jobs, job_id: str) -> None:
        self._jobs = jobs
        self._job_id = job_id
        self._done = 0.0

    def report(self, done: float, total: float | None = None, message: str | None = None) -> None:
        self._done = max(self._done, done)
        progress = {"done": self._done, "total": total, "message": message}
        self._jobs.store.update(
            f"jobs/{self._job_id}/status.json", lambda status: {**(status or {}), "progress": progress}
        )


def _beat(path: Path, stop: threading.Event) -> None:
    while not stop.is_set():
        path.touch()
        stop.wait(HEARTBEAT_INTERVAL_S)


def _resolve(target: str) -> Callable[[Any, Progress], Any]:
    module_name, _, function_name = target.partition(":")
    try:
        function: Callable[[Any, Progress], Any] = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError):
        raise ToolFailure(
            ErrorCode.FAILED,
            f"this server has no job target {target}; the job was queued by another version of vllm-metax-mcp: "
            "start the call again.",
        ) from None
    return function


def _payload(function: Callable[..., Any], args: Any) -> Any:
    """The target's own payload type (the dataclass its first parameter names), rebuilt from the stored JSON
    and validated; a target that takes a plain dict gets the JSON as it is."""
    first = next(iter(inspect.signature(function).parameters), None)
    kind = typing.get_type_hints(function).get(first) if first else None
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        return args
    try:
        return TypeAdapter(kind).validate_python(args)
    except ValidationError as exc:
        raise ToolFailure(
            ErrorCode.FAILED,
            f"the job's stored payload is not a {kind.__name__} of this server ({exc.error_count()} problem(s), "
            f"first at {'.'.join(map(str, exc.errors()[0]['loc'])) or 'the top'}); it was queued by another "
            "version of vllm-metax-mcp: start the call again.",
        ) from None


def _set_status(jobs: Jobs, job_id: str, **fields: Any) -> None:
    def change(status: dict[str, Any] | None) -> dict[str, Any]:
        status = dict(status or {"id": job_id})
        if status.get("status") in FINAL_STATES:
            return status
        if status.get("status") == CANCELLING and fields.get("status") == "running":
            fields.pop("status")  # a cancel that came first stays visible while the worker starts
        status.update(fields)
        return status

    jobs.store.update(f"jobs/{job_id}/status.json", change)


def run(state_dir: str, job_id: str) -> int:
    jobs = Jobs(StateStore(Path(state_dir)))
    spec = jobs.store.read(f"jobs/{job_id}/spec.json")
    stop = threading.Event()
    jobs.heartbeat_file(job_id).touch()
    threading.Thread(target=_beat, args=(jobs.heartbeat_file(job_id), stop), daemon=True).start()
    _set_status(jobs, job_id, status="running", pid=os.getpid(), pgid=os.getpgid(0), started_at=time.time())
    try:
        if spec is None:
            raise ToolFailure(ErrorCode.NOT_FOUND, f"The spec of job {job_id} is missing from the state directory.")
        target = _resolve(spec["target"])
        result = target(_payload(target, spec["args"]), Progress(jobs, job_id))
    except ToolFailure as failure:
        _set_status(jobs, job_id, status="failed", finished_at=time.time(), error=failure.to_dict())
        return 1
    except Exception as exc:  # the job log keeps the traceback; the result keeps a clean message
        traceback.print_exc()
        message = f"the job failed unexpectedly ({type(exc).__name__}); see its log in the state directory"
        _set_status(
            jobs, job_id, status="failed", finished_at=time.time(), error={"code": "failed", "message": message}
        )
        return 1
    finally:
        stop.set()
    _set_status(jobs, job_id, status="succeeded", finished_at=time.time(), result=result)
    return 0


def main() -> None:
    state_dir, job_id = sys.argv[1], sys.argv[2]
    if os.fork() != 0:
        os._exit(0)
    os.setsid()  # the worker leads its own process group, which cancellation stops as a whole
    sys.exit(run(state_dir, job_id))


if __name__ == "__main__":
    main()
