"""Job targets for the tests, run inside a real job worker (`module:function`, called with
`(args, progress)`). The worker imports this module, so tests put `tests/` on PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure

# The child sleeps and starts two grandchildren: one in the worker's process group, one that
# moves to a session of its own (it escapes a plain killpg, but still carries the job marker).
_CHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen(["sleep", "600"])
detached = subprocess.Popen(["sleep", "601"], start_new_session=True)
print(grandchild.pid, detached.pid, flush=True)
time.sleep(600)
"""


def sleep_with_progress(args: dict[str, Any], progress: Any) -> dict[str, Any]:
    steps = int(args.get("steps", 5))
    delay = float(args.get("delay", 0.1))
    for step in range(steps):
        progress.report(step, steps, f"step {step}")
        time.sleep(delay)
    progress.report(steps, steps, "done")
    return {"steps": steps, "message": f"slept {steps} steps"}


def spawn_and_sleep(args: dict[str, Any], progress: Any) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    grandchild, detached = (int(x) for x in child.stdout.readline().split())
    pids = {"worker": os.getpid(), "child": child.pid, "grandchild": grandchild, "detached": detached}
    pidfile = Path(args["pidfile"])
    tmp = pidfile.with_name(pidfile.name + ".tmp")
    tmp.write_text(json.dumps(pids))
    os.replace(tmp, pidfile)
    deadline = time.monotonic() + float(args.get("seconds", 600))
    step = 0
    while time.monotonic() < deadline:
        progress.report(step, None, "sleeping")
        step += 1
        time.sleep(0.5)
    child.kill()
    return {"steps": step, "message": "woke up"}


def raise_unexpected(args: dict[str, Any], progress: Any) -> dict[str, Any]:
    raise RuntimeError(f"internal detail {Path(__file__).resolve()} should stay in the log")


def raise_blocked(args: dict[str, Any], progress: Any) -> dict[str, Any]:
    raise ToolFailure(ErrorCode.BLOCKED, "the device is busy with a process this server did not start")


@dataclass(frozen=True)
class Place:
    directory: Path
    names: tuple[str, ...]


@dataclass(frozen=True)
class TypedOrder:
    """A typed payload: the worker rebuilds it from the stored JSON by `describe_order`'s annotation."""

    kind: Literal["copy", "move"]
    count: int
    place: Place


def describe_order(order: TypedOrder, progress: Any) -> dict[str, Any]:
    return {
        "type": type(order).__name__,
        "place_type": type(order.place).__name__,
        "directory_is_path": isinstance(order.place.directory, Path),
        "names": list(order.place.names),
        "text": f"{order.kind} x{order.count} in {order.place.directory}",
    }
