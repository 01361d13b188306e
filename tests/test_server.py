"""The MCP server through the SDK's real `Client`, in-process, in both protocol eras."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import (
    JOB_TOOL,
    WRITE_TOOL,
    kill_pids,
    make_repo,
    pids_with_marker,
    snapshot,
    with_tests_on_pythonpath,
)
from mcp import Client, MCPError
from mcp_types import INVALID_PARAMS
from pydantic import BaseModel, Field

from vllm_metax_mcp.core.foundation.errors import ErrorCode
from vllm_metax_mcp.core.foundation.policy import Effect
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools.spec import Runtime, ToolOutput, ToolSpec

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("mode", ["auto", "legacy"])]

ERROR_CODES = {code.value for code in ErrorCode}

# Minimal valid arguments for every tool a review-mode server may list. A tool listed without
# an entry here fails the review test: add its read-only calls when the tool lands.
REVIEW_CALLS: dict[str, list[dict[str, Any]]] = {
    "jobs": [
        {},
        {"action": "list", "limit": 1},
        {"action": "status", "job_id": "j-0123456789abcdef"},
        {"action": "result", "job_id": "j-0123456789abcdef"},
    ],
    "cancel_job": [{"job_id": "j-0123456789abcdef"}],
    "environment": [
        {"action": "show"},
        {"action": "show", "subject": "index"},
        {"action": "show", "subject": "revision", "revision": "HEAD~1"},
    ],
    "trace_dependency": [
        {"arch": "DemoForCausalLM"},
        {"arch": "DemoForCausalLM", "upstream": ".", "target": "HEAD~1", "subject": "index"},
        {"symbol": "pkg.model", "direction": "consumers", "upstream": ".", "target": "HEAD"},
    ],
    "inspect_config": [{"model": ".", "construct": False}, {"model": "pkg"}],
    "plan_trim": [{"model": "."}, {"model": "pkg", "layers": [0], "device_memory_gb": 1}],
    "run_smoke_test": [{"model": "pkg"}, {"model": "pkg", "subject": "index"}],
    "diff_model": [
        {"upstream": ".", "target": "HEAD~1", "paths": ["pkg/"]},
        {"upstream": ".", "target": "HEAD", "paths": ["pkg/"], "subject": "index", "detail": "symbols"},
        {
            "upstream": ".",
            "target": "HEAD~1",
            "paths": ["pkg/"],
            "detail": "diff",
            "file": "pkg/model.py",
            "mapping_overrides": {"pkg/model.py": "pkg/model.py"},
        },
    ],
    "audit_commits": [
        {
            "upstream": ".",
            "target": "HEAD",
            "base": "HEAD~1",
            "paths": ["pkg/"],
            "mapping_overrides": {"pkg/model.py": "pkg/model.py"},
        },
        {"action": "status", "upstream": ".", "target": "HEAD", "paths": ["pkg/"], "subject": "index"},
        {
            "action": "export",
            "upstream": ".",
            "target": "HEAD",
            "paths": ["pkg/"],
            "mapping_overrides": {"pkg/model.py": "pkg/model.py"},
        },
    ],
}


def runtime_for(tmp_path: Path, server_mode: str = "edit", root: Path | None = None) -> Runtime:
    root = root or tmp_path / "root"
    root.mkdir(parents=True, exist_ok=True)
    return Runtime.create([str(root)], mode=server_mode, state_dir=str(tmp_path / "state"))


def run_client(server: Any, mode: str, body) -> Any:
    async def main() -> Any:
        async with Client(server, mode=mode) as client:
            return await body(client)

    return anyio.run(main)


def error_body(result: Any) -> dict[str, Any]:
    """An is_error result's text must be exactly the JSON error document."""
    assert result.is_error
    (content,) = result.content
    document = json.loads(content.text)
    assert set(document) == {"error"}
    assert document["error"]["code"] in ERROR_CODES
    assert document["error"]["message"]
    return document["error"]


def test_tools_list_has_full_annotations_and_output_schemas(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path))
    listing = run_client(server, mode, lambda c: c.list_tools())
    names = [tool.name for tool in listing.tools]
    assert "jobs" in names and len(names) == len(set(names))
    assert set(names) == {spec.name for spec in ALL_TOOLS}
    effects = {spec.name: spec.effect for spec in ALL_TOOLS}
    for tool in listing.tools:
        hints = tool.annotations
        assert hints is not None, tool.name
        for hint in ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint"):
            assert getattr(hints, hint) is not None, f"{tool.name}.{hint}"
        assert hints.read_only_hint is (effects[tool.name] is Effect.READS), tool.name
        assert tool.output_schema and tool.output_schema.get("type") == "object", tool.name
        assert "result_id" in tool.output_schema.get("properties", {}), tool.name
        assert tool.description, tool.name


class FactoryDefaultsInput(BaseModel):
    names: list[str] = Field(default_factory=list, description="A list with a factory default.")
    options: dict[str, int] = Field(default_factory=dict)


class FactoryDefaultsOutput(ToolOutput):
    count: int = 0


def count_names(args: FactoryDefaultsInput, env: Any) -> FactoryDefaultsOutput:
    """Count the names given."""
    return FactoryDefaultsOutput(count=len(args.names))


FACTORY_TOOL = ToolSpec(
    name="test_factory_defaults",
    effect=Effect.READS,
    run=count_names,
    input_model=FactoryDefaultsInput,
    output_model=FactoryDefaultsOutput,
    title="Factory defaults",
)


def test_input_fields_with_default_factory_and_description_register(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path), tools=(FACTORY_TOOL,))

    async def body(client: Client) -> tuple[Any, Any, Any]:
        listing = await client.list_tools()
        return (
            listing,
            await client.call_tool(FACTORY_TOOL.name, {}),
            await client.call_tool(FACTORY_TOOL.name, {"names": ["a", "b"]}),
        )

    listing, empty, two = run_client(server, mode, body)
    (tool,) = listing.tools
    assert tool.input_schema["properties"]["names"]["description"] == "A list with a factory default."
    assert empty.structured_content["count"] == 0 and two.structured_content["count"] == 2


def test_jobs_returns_structured_content_and_its_compact_json_copy(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path))
    result = run_client(server, mode, lambda c: c.call_tool("jobs", {"action": "list"}))
    assert not result.is_error
    structured = result.structured_content
    assert structured["result_id"].startswith("r-")
    # an empty list is not sent (tools/output.py compact); a count is, zero included
    assert "jobs" not in structured and structured["total"] == 0
    texts = [c.text for c in result.content if c.type == "text"]
    assert len(texts) == 1 and json.loads(texts[0]) == structured
    assert texts[0] == json.dumps(structured, separators=(",", ":"), ensure_ascii=False)
    assert (tmp_path / "state" / "results" / f"{structured['result_id']}.json").is_file()


def test_unknown_tool_is_a_jsonrpc_invalid_params_error(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path))

    async def body(client: Client) -> MCPError:
        with pytest.raises(MCPError) as info:
            await client.call_tool("no_such_tool", {})
        return info.value

    error = run_client(server, mode, body)
    assert error.error.code == INVALID_PARAMS


def test_writes_tool_is_hidden_and_refused_in_review_mode(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path, "review"), tools=ALL_TOOLS + (WRITE_TOOL,))
    target = tmp_path / "root" / "note.txt"
    writes_tools = [spec.name for spec in ALL_TOOLS + (WRITE_TOOL,) if spec.effect is Effect.WRITES]

    async def body(client: Client) -> None:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert "jobs" in listed
        assert not listed & set(writes_tools), listed
        for name in writes_tools:
            arguments = {"path": "note.txt"} if name == WRITE_TOOL.name else {}
            with pytest.raises(MCPError) as info:
                await client.call_tool(name, arguments)
            assert isinstance(info.value.error.data, dict)
            assert info.value.error.data["code"] == "review_mode", name

    run_client(server, mode, body)
    assert not target.exists()


def test_writes_tool_works_in_edit_mode(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path), tools=ALL_TOOLS + (WRITE_TOOL,))
    target = tmp_path / "root" / "notes" / "note.txt"

    async def body(client: Client) -> Any:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert listed[WRITE_TOOL.name].annotations.read_only_hint is False
        return await client.call_tool(WRITE_TOOL.name, {"path": "notes/note.txt", "text": "hi"})

    result = run_client(server, mode, body)
    assert not result.is_error, result.content
    assert result.structured_content["written"] == "note.txt"
    assert target.read_text() == "hi"


def test_tool_failures_are_json_errors_without_traceback_or_state_paths(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path), tools=ALL_TOOLS + (WRITE_TOOL,))
    calls = [
        ("jobs", {"action": "status"}, "bad_input"),
        ("jobs", {"action": "result", "job_id": "j-0123456789abcdef"}, "not_found"),
        (WRITE_TOOL.name, {"path": str(tmp_path / "elsewhere" / "x.txt")}, "outside_roots"),
    ]

    async def body(client: Client) -> list[Any]:
        return [await client.call_tool(name, args) for name, args, _ in calls]

    for (name, _, code), result in zip(calls, run_client(server, mode, body), strict=True):
        error = error_body(result)
        assert error["code"] == code, (name, error)
        text = result.content[0].text
        assert "Traceback" not in text and str(tmp_path / "state") not in text


def test_invalid_arguments_are_a_bad_input_json_error(mode: str, tmp_path: Path) -> None:
    server = build_server(runtime_for(tmp_path))

    async def body(client: Client) -> list[Any]:
        return [
            await client.call_tool("jobs", {"action": "explode"}),
            await client.call_tool("jobs", {"limit": "many"}),
        ]

    for result in run_client(server, mode, body):
        error = error_body(result)
        assert error["code"] == "bad_input"
        assert "pydantic.dev" not in result.content[0].text


def test_job_progress_reaches_the_client(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_tests_on_pythonpath(monkeypatch)
    runtime = runtime_for(tmp_path)
    server = build_server(runtime, tools=ALL_TOOLS + (JOB_TOOL,))
    seen: list[float] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(done)

    async def body(client: Client) -> Any:
        return await client.call_tool(JOB_TOOL.name, {"args": {"steps": 4, "delay": 0.3}}, progress_callback=progress)

    try:
        result = run_client(server, mode, body)
    finally:
        for job_id in runtime.store.list("jobs"):
            kill_pids(pids_with_marker(job_id))
    assert not result.is_error, result.content
    assert result.structured_content["steps"] == 4
    assert seen, "progress notifications were sent while the call was open"


def test_a_running_job_answers_only_its_small_shape(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a real client: `jobs` is read-only and `cancel_job` is not; polling a running job answers
    {job, poll_after_s, resource} (no `jobs: []` beside it), the resource reads, and cancel_job stops it."""
    with_tests_on_pythonpath(monkeypatch)
    runtime = runtime_for(tmp_path)
    server = build_server(runtime)
    pidfile = tmp_path / "pids.json"
    handle = runtime.jobs.start("test_job", "jobtargets:spawn_and_sleep", {"pidfile": str(pidfile), "seconds": 60})

    async def body(client: Client) -> tuple[Any, ...]:
        hints = {tool.name: tool.annotations.read_only_hint for tool in (await client.list_tools()).tools}
        while not pidfile.exists():
            await anyio.sleep(0.1)
        polled = await client.call_tool("jobs", {"action": "status", "job_id": handle.job_id})
        resource = await client.read_resource(polled.structured_content["resource"])
        cancelled = await client.call_tool("cancel_job", {"job_id": handle.job_id})
        return hints, polled, resource, cancelled

    try:
        hints, polled, resource, cancelled = run_client(server, mode, body)
    finally:
        kill_pids(pids_with_marker(handle.job_id))
    assert hints["jobs"] is True and hints["cancel_job"] is False
    sent = polled.structured_content
    assert set(sent) == {"job", "poll_after_s", "resource", "result_id"}, sent
    assert set(sent["job"]) == {"id", "status", "progress", "message"}, sent["job"]
    assert sent["job"]["status"] == "running" and sent["job"]["message"].startswith("running: sleeping")
    assert 2 <= sent["poll_after_s"] <= 10
    assert json.loads(polled.content[0].text) == sent
    document = json.loads(resource.contents[0].text)
    assert document["id"] == handle.job_id and document["message"] == sent["job"]["message"]
    assert cancelled.structured_content["job"]["status"] == "cancelled"
    assert not pids_with_marker(handle.job_id)


def test_review_mode_leaves_the_repository_byte_identical(mode: str, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "root" / "repo")
    server = build_server(runtime_for(tmp_path, "review", root=repo))
    before = snapshot(repo)

    async def body(client: Client) -> dict[str, int]:
        listed = [tool.name for tool in (await client.list_tools()).tools]
        missing = [name for name in listed if name not in REVIEW_CALLS]
        assert not missing, f"add read-only calls for {missing} to REVIEW_CALLS"
        made = {}
        for name in listed:
            for arguments in REVIEW_CALLS[name]:
                await client.call_tool(name, arguments)
            made[name] = len(REVIEW_CALLS[name])
        return made

    made = run_client(server, mode, body)
    assert made.get("jobs")
    assert snapshot(repo) == before
