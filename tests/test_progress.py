"""Progress of a slow worker call through the SDK's real in-process Client: a cold trace_dependency of the
real vllm-ascend snapshot against the real vLLM 0.26.0 tree (tens of seconds on two cores, most of it
parsing modules). Notifications arrive at least every HEARTBEAT_S (asserted with slack for a loaded
machine), strictly increase, stay below the total and name the phase. The phase tracker and the
monotonic forwarder are also checked on their own, and a real-weight-shaped job's counts (which restart
per phase) reach the client increasing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from test_real_plugins import ARCHIVE, PLUGINS, needs_snapshots, snapshot_repo

from vllm_metax_mcp.core.foundation.jobs import Jobs
from vllm_metax_mcp.core.foundation.progress import Monotonic, advance, phase, reporting
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.foundation.worker import Progress
from vllm_metax_mcp.core.trim.real import _Reporter
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools.spec import Runtime

GAP_LIMIT_S = 4.0
"""Heartbeats go out every second; twice the required 2 s allows for a machine other tests load."""
ARCH = "DeepseekV4ForCausalLM"


def traced_workspace(tmp_path: Path, upstream: Path) -> tuple[Runtime, dict[str, Any]]:
    """A review server over the real snapshot and the real upstream tree, with an empty state (cold)."""
    assert PLUGINS is not None
    root = tmp_path / "root"
    root.mkdir()
    repo = snapshot_repo(PLUGINS / ARCHIVE, root)
    runtime = Runtime.create([str(root), str(upstream)], mode="review", state_dir=str(tmp_path / "state"))
    return runtime, {"arch": ARCH, "plugin_repo": str(repo), "upstream": str(upstream), "section": "inventory"}


Seen = list[tuple[float, float, float | None, str | None]]


def call_with_progress(runtime: Runtime, arguments: dict[str, Any]) -> tuple[Any, Seen, float]:
    seen: Seen = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic(), done, total, message))

    async def main() -> Any:
        async with Client(build_server(runtime), mode="auto") as client:
            return await client.call_tool("trace_dependency", arguments, progress_callback=progress)

    started = time.monotonic()
    result = anyio.run(main)
    return result, seen, started


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_snapshots
def test_a_cold_trace_reports_phased_strictly_increasing_progress(tmp_path: Path, upstream_026: Path) -> None:
    runtime, arguments = traced_workspace(tmp_path, upstream_026)
    result, seen, started = call_with_progress(runtime, arguments)
    ended = time.monotonic()
    assert not result.is_error, result.content
    assert len(seen) >= 3, seen
    times = [started] + [at for at, *_ in seen] + [ended]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    print(
        f"{len(seen)} notifications in {ended - started:.1f} s, first at {gaps[0]:.2f} s, largest gap {max(gaps):.2f} s"
    )
    assert max(gaps) <= GAP_LIMIT_S, f"largest gap {max(gaps):.1f} s between notifications (or the call's ends)"
    values = [done for _, done, _, _ in seen]
    assert all(later > earlier for earlier, later in zip(values, values[1:], strict=False)), values
    assert all(total == 100 and done < total for _, done, total, _ in seen)
    messages = {message for *_, message in seen}
    assert all(messages), seen
    assert {"indexing plugin and upstream modules", "tracing dependencies: checking the path"} <= messages


def test_phases_weigh_their_share_and_never_go_back() -> None:
    sent: list[tuple[float, float, str]] = []
    with reporting(lambda value, ceiling, message: sent.append((value, ceiling, message))) as tracker:
        tracker.sent_at = -10.0
        with phase("first", 0.25):
            advance(1, 2)
        with phase("second", 0.5):
            with phase("inner", 0.5):
                pass
            advance(5, 10)  # only throttled reports may be dropped; phase starts always go out
        with phase("rest", 1.0):
            pass
    assert [(round(v, 3), round(c, 3), m) for v, c, m in sent][:1] == [(0.0, 0.25, "first")]
    starts = {m: (round(v, 3), round(c, 3)) for v, c, m in sent}
    assert starts["second: inner"] == (0.25, 0.5)
    assert starts["rest"] == (0.75, 1.0)
    values = [v for v, _, _ in sent]
    assert values == sorted(values) and max(values) < 1.0


def test_monotonic_forwarding_turns_restarting_counts_into_an_increasing_sequence() -> None:
    """A trim-shaped sequence of job counts (each phase restarting at 0) and heartbeats in between."""
    sent: list[tuple[float, float | None, str | None]] = []

    async def send(value: float, total: float | None, message: str | None) -> None:
        sent.append((value, total, message))

    async def main() -> None:
        progress = Monotonic(send)
        for done, message in [(0, "copying"), (1e9, "copying"), (2e9, "copying"), (0, "verifying"), (1e9, "v")]:
            await progress.report(done, 2e9, message)
            await progress.beat()
        await progress.report(2e9, 2e9, "done")

    anyio.run(main)
    values = [value for value, _, _ in sent]
    assert all(later > earlier for earlier, later in zip(values, values[1:], strict=False)), values
    assert all(value < 2e9 for value in values)
    assert "verifying" in {message for *_, message in sent}


def test_a_real_trim_counts_its_bytes_over_the_whole_job(tmp_path: Path) -> None:
    """The real-weight trim's reporter, writing into a job's status document as the worker does: hashing
    the source moves the retained bytes once, the shipped script's copy and its overlapping sha256 check
    once each in one phase (renamed when the copy ends), so the count never restarts."""
    jobs = Jobs(StateStore(tmp_path / "state"))
    jobs.store.write("jobs/j-0123456789abcdef/status.json", {"id": "j-0123456789abcdef", "status": "running"})
    reporter = _Reporter(Progress(jobs, "j-0123456789abcdef"), 2_150_000_000)
    recorded = []

    def now() -> dict[str, Any]:
        reporter.last = -10.0  # as if PROGRESS_EVERY_S had passed
        return jobs.get("j-0123456789abcdef")["progress"]

    reporter.start("hashing the retained source bytes")
    recorded.append(now())
    for _ in range(2):
        reporter.add(1_075_000_000)
        recorded.append(now())
    reporter.start("extract.py: copying tensor bytes", passes=2)
    recorded.append(now())
    for _ in range(3):  # copied and hashed lines interleave
        reporter.add(1_075_000_000)
        recorded.append(now())
    reporter.relabel("extract.py: checking the sha256 of every file it wrote")
    recorded.append(now())
    reporter.add(1_075_000_000)
    recorded.append(now())
    reporter.add(5_000)  # hashing counts the headers, index and config too: never past the phase
    recorded.append(now())
    reporter.start("done")
    recorded.append(now())
    done = [p["done"] for p in recorded]
    assert done == sorted(done) and done[0] == 0, done
    assert {p["total"] for p in recorded} == {3 * 2_150_000_000}
    assert done[2] == done[3] == 2_150_000_000 and done[6] == done[7] == 2_150_000_000 + 3 * 1_075_000_000
    assert done[8] == done[9] == done[10] == 3 * 2_150_000_000
    assert recorded[7]["message"].startswith("extract.py: checking")
