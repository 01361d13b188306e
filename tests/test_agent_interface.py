"""The agent's side of the interface (issue 23), measured as a real client receives it: the console script
over stdio, driven by the SDK's `Client`, on a realistic workspace — the real vllm-ascend snapshot
(7662ec925a, written for vLLM 0.26.0) against the real vLLM 0.26.0 -> 0.27.0 trees, and a checkpoint with
the real DeepSeek-V3 config. Budgets: the tool list (name + description + inputSchema <= 16,000 chars, the
whole listing <= 40,000), every result's text <= 20,000 chars, progress from slow calls (strictly
increasing, with a message, frequent), cancels that leave no process, strict inputs.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import console_script, live_pids_with_env
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters
from mcp_types import INVALID_PARAMS
from test_inspect_config import fixture, write_model
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_upstream_history

from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), needs_snapshots]

TOOLS_CORE_BUDGET = 16_000
TOOLS_LIST_BUDGET = 40_000
ARCH = "DeepseekV4ForCausalLM"
"""vllm_ascend/models/__init__.py registers it (vllm_ascend.models.deepseek_v4); the trace issue's case."""
UPGRADE = {"plugin_repo": "fork/vllm-ascend", "upstream": "vllm", "target": "v0.27.0"}
MARKER = "VMM_INTERFACE_TEST"


def compact(document: Any) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("agent-root")
    build_upstream_history(root / "vllm", ["0.26.0", "0.27.0"], include=["vllm/"])
    assert PLUGINS is not None
    snapshot_repo(PLUGINS / "vllm-ascend-7662ec925a.tar.gz", root / "fork")
    write_model(root / "models" / "v3", fixture("v3"))
    return {"root": root, "out": tmp_path_factory.mktemp("agent-out"), "state": tmp_path_factory.mktemp("agent-state")}


@dataclass
class Session:
    client: Client
    marker: str
    texts: dict[str, int] = field(default_factory=dict)
    """The largest text result seen per tool."""

    async def call(self, tool: str, arguments: dict[str, Any], **options: Any) -> Any:
        result = await self.client.call_tool(tool, arguments, **options)
        text = "".join(block.text for block in result.content if block.type == "text")
        self.texts[tool] = max(self.texts.get(tool, 0), len(text))
        head = text.split("\n", 1)[0]
        assert len(text) <= RESULT_BUDGET, (tool, arguments, len(text))
        assert json.loads(head) is not None and "\n " not in head, (tool, "the text copy is compact JSON")
        return result


@asynccontextmanager
async def serve(ws: dict[str, Path], marker: str) -> AsyncIterator[Session]:
    """The console script over stdio; `marker` is in its environment, so every process it starts can be found."""
    args = ["serve", "--root", str(ws["root"]), "--output-root", str(ws["out"]), "--state-dir", str(ws["state"])]
    params = StdioServerParameters(command=str(console_script()), args=args, env={MARKER: marker}, cwd=ws["root"])
    async with Client(params) as client:
        yield Session(client, marker)


def processes_with(marker: str) -> list[int]:
    """Every live process whose environment carries the marker (the server and anything it started)."""
    return live_pids_with_env(MARKER, marker)


def run(ws: dict[str, Path], body: Callable[[Session], Awaitable[Any]], *, cold: bool = False) -> Any:
    """`body` against a fresh server; `cold`: with an empty state directory, so no cache helps."""
    marker = uuid.uuid4().hex
    space = {**ws, "state": Path(tempfile.mkdtemp(prefix="agent-cold-"))} if cold else ws

    async def main() -> Any:
        async with serve(space, marker) as session:
            return await body(session)

    outcome = anyio.run(main)
    deadline = time.monotonic() + 15
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == [], "processes outlived the server"
    return outcome


# -- the tool list -----------------------------------------------------------------------------


def test_the_tool_list_fits_its_budgets_and_inputs_are_strict(workspace: dict[str, Path]) -> None:
    async def body(session: Session) -> list[dict[str, Any]]:
        return [
            t.model_dump(mode="json", by_alias=True, exclude_none=True)
            for t in (await session.client.list_tools()).tools
        ]

    tools = run(workspace, body)
    core = sum(len(compact({k: t.get(k) for k in ("name", "description", "inputSchema")})) for t in tools)
    whole = sum(len(compact(t)) for t in tools)
    print(f"tools/list: {len(tools)} tools, core {core} chars, whole {whole} chars")
    assert core <= TOOLS_CORE_BUDGET and whole <= TOOLS_LIST_BUDGET, (core, whole)
    for tool in tools:
        schema = tool["inputSchema"]
        assert '"title"' not in compact(schema) and '"title"' not in compact(tool.get("outputSchema", {}))
        assert schema["additionalProperties"] is False, tool["name"]
        for name, prop in schema["properties"].items():
            if name == "limit":
                assert "maximum" in prop and "minimum" in prop, tool["name"]
            if "enum" in prop and len(prop["enum"]) > 2 and name != "subject":
                assert prop.get("description"), (tool["name"], name, "enum values are described")
        assert tool["outputSchema"]["properties"], tool["name"]


# -- strict inputs -------------------------------------------------------------------------------


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error, result.content
    return json.loads(result.content[0].text)["error"]


def test_inputs_that_would_be_ignored_or_mistyped_are_refused(workspace: dict[str, Path]) -> None:
    async def body(session: Session) -> None:
        typo = _error(await session.call("diff_model", {**UPGRADE, "detial": "diff"}))
        assert typo["code"] == "bad_input" and "'detial'" in typo["message"] and "'detail'" in typo["message"]
        over = _error(await session.call("trace_dependency", {**UPGRADE, "arch": ARCH, "limit": 100000}))
        assert over["code"] == "bad_input" and "limit" in over["message"]
        stray = _error(await session.call("trace_dependency", {**UPGRADE, "arch": ARCH, "revision": "HEAD"}))
        assert stray["code"] == "bad_input" and "subject=revision" in stray["message"]
        # the record's upstream with another target: the target is used, not dropped (it does not exist)
        await session.call("environment", {"action": "establish", **UPGRADE})
        missing = _error(
            await session.call(
                "trace_dependency", {"plugin_repo": UPGRADE["plugin_repo"], "arch": ARCH, "target": "nope-tag"}
            )
        )
        assert "nope-tag" in missing["message"], missing
        with pytest.raises(MCPError) as refused:
            await session.client.get_prompt("trim_model", {})
        assert refused.value.error.code == INVALID_PARAMS

    run(workspace, body)


# -- the upgrade and trim flows --------------------------------------------------------------------


async def follow(session: Session, tool: str, arguments: dict[str, Any], steps: int = 4) -> list[str]:
    """Call a tool and then the `next_step` each answer names; every answer must succeed and fit."""
    seen = []
    for _ in range(steps):
        result = await session.call(tool, arguments)
        assert not result.is_error, (tool, arguments, result.content[0].text[:500])
        seen.append(tool)
        step = (result.structured_content or {}).get("next_step")
        if not step:
            break
        tool, arguments = step["tool"], step["arguments"]
    return seen


def test_the_upgrade_flow_answers_summary_first_within_budget(workspace: dict[str, Path]) -> None:
    async def body(session: Session) -> dict[str, int]:
        await session.call("environment", {"action": "establish", **UPGRADE})
        starts: list[tuple[str, dict[str, Any]]] = [
            ("diff_model", {**UPGRADE, "paths": ["vllm_ascend/models/"]}),
            ("audit_commits", {**UPGRADE, "base": "v0.26.0", "paths": ["vllm_ascend/models/"]}),
            ("trace_dependency", {**UPGRADE, "base": "v0.26.0", "arch": ARCH, "probe_ops": False}),
        ]
        for tool, arguments in starts:
            await follow(session, tool, arguments, steps=3)
        summary = (
            await session.call("trace_dependency", {**UPGRADE, "base": "v0.26.0", "arch": ARCH, "probe_ops": False})
        ).structured_content
        assert summary["counts"].get("defects", 0) == 0 or summary.get("defects"), "defects are in the summary"
        for section in ("inventory", "defects", "ops"):
            await session.call(
                "trace_dependency",
                {**UPGRADE, "base": "v0.26.0", "arch": ARCH, "probe_ops": False, "section": section, "limit": 1000},
            )
        return session.texts

    sizes = run(workspace, body)
    print("largest result text per tool:", sizes)


def test_the_trim_flow_writes_outside_the_roots_and_smoke_reads_it(workspace: dict[str, Path]) -> None:
    model = workspace["out"] / "v3-trim"

    async def body(session: Session) -> None:
        await follow(session, "inspect_config", {"model": "models/v3"}, steps=2)
        await session.call("plan_trim", {"model": "models/v3", "subject": "worktree"})
        trimmed = await session.call(
            "trim_model", {"model": "models/v3", "subject": "worktree", "output": str(model), "output_mode": "dummy"}
        )
        assert not trimmed.is_error, trimmed.content[0].text[:800]
        smoke = await session.call("run_smoke_test", {"model": str(model), "subject": "worktree"})
        if smoke.is_error:
            assert _error(smoke)["code"] != "outside_roots", "the output root is readable"

    run(workspace, body)
    assert (model / "config.json").is_file()


# -- progress and cancel ---------------------------------------------------------------------------


@dataclass
class Report:
    at: float
    progress: float
    total: float | None
    message: str | None


COLD_TRACE = {**UPGRADE, "base": "v0.26.0", "arch": ARCH, "probe_ops": False}
"""With an empty state directory: tens of seconds on this machine (the issue measured 50 s)."""


def test_a_cold_trace_reports_increasing_progress_often(workspace: dict[str, Path]) -> None:
    reports: list[Report] = []

    async def body(session: Session) -> tuple[float, float]:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reports.append(Report(time.monotonic(), progress, total, message))

        start = time.monotonic()
        result = await session.call("trace_dependency", COLD_TRACE, progress_callback=on_progress)
        assert not result.is_error, result.content[0].text[:500]
        return start, time.monotonic()

    start, end = run(workspace, body, cold=True)
    elapsed = end - start
    assert reports, "no progress from a slow call"
    values = [r.progress for r in reports]
    assert all(b > a for a, b in zip(values, values[1:], strict=False)), values
    assert all(r.message for r in reports)
    assert all(r.total is None or r.progress <= r.total for r in reports)
    times = [start, *[r.at for r in reports]]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    print(f"cold trace {elapsed:.1f} s: {len(reports)} progress reports, largest gap {max(gaps):.2f} s")
    assert max(gaps) <= 5.0, gaps  # 2 s promised; slack for a loaded two-core machine


@pytest.mark.parametrize("cancel_after", ["early", "first_progress", "late"])
def test_cancelling_a_slow_call_leaves_no_process(workspace: dict[str, Path], cancel_after: str) -> None:
    async def body(session: Session) -> list[int]:
        first = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            first.set()

        async def call() -> None:
            await session.client.call_tool("trace_dependency", COLD_TRACE, progress_callback=on_progress)

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            if cancel_after == "early":
                await anyio.sleep(0.3)
            elif cancel_after == "first_progress":
                with anyio.fail_after(60):
                    await first.wait()
            else:
                await anyio.sleep(6)
            group.cancel_scope.cancel()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = [pid for pid in processes_with(session.marker) if _is_call_process(pid, session.marker)]
            if not left:
                break
            await anyio.sleep(0.2)
        # the server still answers after the cancel
        assert not (await session.call("jobs", {})).is_error
        return left

    left = run(workspace, body, cold=True)
    assert left == [], f"worker processes left after cancel: {left}"


def _is_call_process(pid: int, marker: str) -> bool:
    """A process a call started: below the server, and not one of the helpers multiprocessing keeps for the
    server's lifetime (the forkserver workers fork from, its resource tracker)."""
    if _parent(pid) not in processes_with(marker):
        return False
    try:
        command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"forkserver" not in command and b"resource_tracker" not in command


def _parent(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0
