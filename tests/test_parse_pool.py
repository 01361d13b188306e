"""The parse pool's workers end with the process that started them, however it ends.

A call's worker keeps one pool for its life and leaves by `os._exit` when cancelled, which runs no pool
shutdown; a worker forked while the call was ignoring SIGTERM (its cleanup after a cancel) would ignore a
group stop too. Two such pool workers once outlived a server in a full run (test_agent_interface). Real
processes here: a child Python starts the pool through `scan_all`, lists its own children, and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import os, signal, sys
from vllm_metax_mcp.core.code.blob_store import PARALLEL_THRESHOLD, scan_all
if sys.argv[1] == "ignoring":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a cancelled call's worker does while it cleans up
items = [(str(n), b"x" * n) for n in range(PARALLEL_THRESHOLD * 2)]
assert scan_all(items, len, "scanning") == {str(n): n for n in range(PARALLEL_THRESHOLD * 2)}
pid = os.getpid()
with open(sys.argv[2], "w") as listing:
    listing.write(open(f"/proc/{pid}/task/{pid}/children").read())
os._exit(143)
"""


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _workers_after_exit(mode: str, tmp_path: Path) -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    listing = tmp_path / "children"
    # no pipes: a worker left alive would hold them open
    code = subprocess.run([sys.executable, "-c", CHILD, mode, str(listing)], env=env, timeout=120).returncode
    assert code == 143
    workers = [int(pid) for pid in listing.read_text().split()]
    assert len(workers) == 2, workers  # the pool's two workers were running when the parent exited
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in workers if _alive(pid)]


def test_pool_workers_end_when_their_process_exits_without_shutdown(tmp_path: Path) -> None:
    left = _workers_after_exit("default", tmp_path)
    _kill(left)
    assert left == []


def test_pool_workers_forked_while_sigterm_is_ignored_still_end(tmp_path: Path) -> None:
    left = _workers_after_exit("ignoring", tmp_path)
    _kill(left)
    assert left == []


def _kill(pids: list[int]) -> None:
    """A failing run leaves nothing behind either."""
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


KILL_ONE = r"""
import os, signal, time
from vllm_metax_mcp.core.code.blob_store import PARALLEL_THRESHOLD, scan_all
items = [(str(n), b"x" * n) for n in range(PARALLEL_THRESHOLD * 2)]
expected = {str(n): n for n in range(PARALLEL_THRESHOLD * 2)}
assert scan_all(items, len, "scanning") == expected
pid = os.getpid()
victim = int(open(f"/proc/{pid}/task/{pid}/children").read().split()[0])
os.kill(victim, signal.SIGKILL)  # between two batches, as the OOM killer might
while os.path.exists(f"/proc/{victim}"):  # reaped by the pool's own thread, which marks the pool broken
    time.sleep(0.01)
assert scan_all(items, len, "scanning") == expected
print("answered")
"""


def test_a_pool_worker_killed_between_batches_costs_the_next_batch_nothing() -> None:
    """The kept pool breaks when one of its workers dies; the next scan runs on new workers instead of
    failing a call for work that never ran."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", KILL_ONE], env=env, timeout=120, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "answered", out.stderr[-2000:]
