"""Cancelling a slow worker call leaves no process: a cold trace_dependency of the real vllm-ascend snapshot
against the real vLLM 0.26.0 tree, cancelled through the SDK's real Client at several points (at once,
after the first progress, once the worker has children of its own: its parse pool), then every process
is listed. Also over stdio: the server killed mid-call takes its worker tree with it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import console_script, live_pids_with_env
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from test_progress import traced_workspace
from test_real_plugins import needs_snapshots

from vllm_metax_mcp.core.foundation.process_call import group_members
from vllm_metax_mcp.server.app import build_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_snapshots]

GONE_WITHIN_S = 15.0
"""SIGTERM, a 3 s grace, SIGKILL: a worker tree ends well within this, even on a loaded machine."""
MARKER = "VMM_CANCEL_TEST"
STARTING = "starting the worker"
"""The dispatcher's first progress message, sent before the worker runs."""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def _processes() -> dict[int, tuple[str, int, int]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] != "Z":
            found[int(entry.name)] = stat
    return found


def _forkservers(processes: dict[int, tuple[str, int, int]]) -> list[int]:
    """This process's worker forkservers (multiprocessing starts one, with `forkserver` in its command line)."""
    found = []
    for pid, (_, parent, _) in processes.items():
        if parent == os.getpid():
            try:
                if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                continue
    return found


class Census:
    """The process groups of every worker seen while a call runs, and what is left of them."""

    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.most_members = 0

    def look(self) -> None:
        processes = _processes()
        servers = _forkservers(processes)
        for pid, (_, parent, group) in processes.items():
            if parent in servers and group == pid:  # a worker leads its group (until then it is in ours)
                self.groups.add(group)
        for group in self.groups:
            self.most_members = max(self.most_members, len(group_members(group)))

    def leftovers(self) -> list[int]:
        processes = _processes()
        servers = _forkservers(processes)
        return sorted(pid for pid, (_, parent, group) in processes.items() if group in self.groups or parent in servers)

    async def watch(self) -> None:
        while True:
            self.look()
            await anyio.sleep(0.02)


async def _wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await anyio.sleep(0.05)
    return time.monotonic() - started


async def _quiet(census: Census, hold_s: float = 2.0) -> float:
    """Seconds until no process of a worker is left, and none appeared for `hold_s` after (a cancel that
    comes before the worker started still sees it start, and stop)."""
    started = time.monotonic()
    while True:
        await _wait_until(lambda: not census.leftovers(), GONE_WITHIN_S, "no process left")
        gone = time.monotonic() - started
        await anyio.sleep(hold_s)
        if not census.leftovers():
            return gone


def _triggers(census: Census, progressed: anyio.Event) -> dict[str, Callable[[], Awaitable[Any]]]:
    return {
        "after 0.2 s": lambda: anyio.sleep(0.2),
        "after the first progress": progressed.wait,
        "with the worker's own children": lambda: _wait_until(
            lambda: census.most_members >= 2, 120, "the worker's parse pool"
        ),
    }


@pytest.mark.parametrize("point", ["after 0.2 s", "after the first progress", "with the worker's own children"])
def test_a_cancelled_call_leaves_no_process(point: str, tmp_path: Path, upstream_026: Path) -> None:
    runtime, arguments = traced_workspace(tmp_path, upstream_026)
    census = Census()
    outcome: dict[str, Any] = {}

    async def main() -> None:
        progressed = anyio.Event()

        async def progress(done: float, total: float | None, message: str | None) -> None:
            if message != STARTING:  # the first report of the worker itself, not the dispatcher's
                progressed.set()

        async with Client(build_server(runtime), mode="auto") as client:
            async with anyio.create_task_group() as group:
                group.start_soon(census.watch)
                call = anyio.CancelScope()

                async def slow_call() -> None:
                    with call:
                        outcome["result"] = await client.call_tool(
                            "trace_dependency", arguments, progress_callback=progress
                        )

                group.start_soon(slow_call)
                await _triggers(census, progressed)[point]()
                call.cancel()
                outcome["cleanup_s"] = await _quiet(census)
                group.cancel_scope.cancel()
            outcome["after"] = await client.call_tool("jobs", {})  # the server still serves

    anyio.run(main)
    census.look()
    gone = outcome["cleanup_s"]
    print(f"{point}: groups {sorted(census.groups)}, most members {census.most_members}, gone in {gone:.2f} s")
    assert "result" not in outcome, "the call was cancelled before it finished"
    assert census.leftovers() == []
    assert not outcome["after"].is_error
    if point == "with the worker's own children":
        assert census.most_members >= 2


def _with_marker(marker: str) -> list[int]:
    return live_pids_with_env(MARKER, marker)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_server_that_dies_mid_call_takes_its_workers_along(
    sig: signal.Signals, tmp_path: Path, upstream_026: Path
) -> None:
    runtime, arguments = traced_workspace(tmp_path, upstream_026)
    marker = uuid.uuid4().hex
    roots = [arg for root in runtime.policy.roots for arg in ("--root", str(root))]
    params = StdioServerParameters(
        command=str(console_script()),
        args=["serve", "--mode", "review", *roots, "--state-dir", str(runtime.store.root)],
        env={**os.environ, MARKER: marker},
    )
    seen: dict[str, Any] = {}

    async def main() -> None:
        progressed = anyio.Event()

        async def progress(done: float, total: float | None, message: str | None) -> None:
            if message != STARTING:  # the first report of the worker itself, not the dispatcher's
                progressed.set()

        async with Client(params) as client, anyio.create_task_group() as group:

            async def slow_call() -> None:
                try:
                    await client.call_tool("trace_dependency", arguments, progress_callback=progress)
                except Exception as exc:  # the server is gone: the call fails, as it should
                    seen["call"] = type(exc).__name__

            group.start_soon(slow_call)
            await progressed.wait()
            seen["before"] = await _wait_until(lambda: len(_with_marker(marker)) >= 3, 60, "server, forkserver, worker")
            seen["count"] = len(_with_marker(marker))
            server = min(_with_marker(marker))  # started first
            os.kill(server, sig)
            seen["gone"] = await _wait_until(lambda: not _with_marker(marker), GONE_WITHIN_S, "no process left")
            group.cancel_scope.cancel()

    try:
        anyio.run(main)
    except Exception:  # the client's transport to a dead server may fail on the way out
        pass
    print(f"{sig.name}: {seen}")
    assert _with_marker(marker) == [], "processes outlived the server"
    assert seen.get("count", 0) >= 3 and "gone" in seen
