"""What a client receives for a result (tools/output.py, server/app.py), through the SDK's real Client: compact
JSON without empty fields, a running job's small shape, a document as plain text after its JSON, and — for a
result a tool failed to page — the largest fields given way with the stored whole one a resource away.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel, Field

from vllm_metax_mcp.core.foundation.policy import Effect
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools.output import compact, sent, text_of
from vllm_metax_mcp.tools.spec import JobInfo, JobOutput, NextCall, Runtime, ToolEnv, ToolOutput, ToolSpec

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class CoreRow:
    """A core dataclass a tool passes through as a row."""

    name: str
    lines: list[int]


class ShapeInput(BaseModel):
    rows: int = Field(default=3, ge=0, le=100_000)
    width: int = Field(default=10, ge=1, le=100_000)


class ShapeOutput(ToolOutput):
    plain_text_field: ClassVar[str] = "document"
    title: str
    notes: list[str] = Field(default_factory=list)
    rows: list[str] = Field(default_factory=list)
    core: list[CoreRow] = Field(default_factory=list)
    count: int = 0
    document: str | None = None


def shapes(args: ShapeInput, env: ToolEnv) -> ShapeOutput:
    """A tool whose answer grows with its arguments, as a forgetful tool's would."""
    return ShapeOutput(
        title="t",
        rows=["x" * args.width for _ in range(args.rows)],
        core=[CoreRow("a", [1, 2])],
        document='--- a\n+++ b\n@@ -1 +1 @@\n-"old"\n+new\n',
    )


SPEC = ToolSpec("shapes", Effect.READS, shapes, ShapeInput, ShapeOutput, "shapes")


def call(tmp_path: Path, arguments: dict[str, Any]) -> tuple[Any, list[str]]:
    runtime = Runtime.create([str(tmp_path)], state_dir=str(tmp_path.parent / f"{tmp_path.name}-state"))
    server = build_server(runtime, tools=(SPEC,))

    async def body() -> tuple[Any, list[str]]:
        async with Client(server) as client:
            result = await client.call_tool("shapes", arguments)
            pages, uri = [], (result.structured_content.get("omitted") or {}).get("resource")
            while uri:
                read = await client.read_resource(uri)
                pages.append(read.contents[0].text)
                uri = json.loads(pages[-1]).get("next")
            return result, pages

    return anyio.run(body)


def test_a_result_is_compact_json_without_empty_fields_and_its_document_as_plain_text(tmp_path: Path) -> None:
    result, _ = call(tmp_path, {})
    structured = result.structured_content
    assert "notes" not in structured and structured["count"] == 0  # empty goes, a zero count stays
    assert structured["core"] == [{"name": "a", "lines": [1, 2]}]  # a dataclass row as its fields
    head, document = result.content[0].text.split("\n", 1)
    assert json.loads(head) == {k: v for k, v in structured.items() if k != "document"}
    assert head == json.dumps(json.loads(head), separators=(",", ":"))
    assert document == structured["document"] and "+new\n" in document  # unescaped, as the diff reads


def test_a_result_too_big_gives_way_field_by_field_and_points_at_the_whole(tmp_path: Path) -> None:
    result, pages = call(tmp_path, {"rows": 400, "width": 200})  # ~82k of rows: the tool forgot to page
    text = result.content[0].text
    assert len(text) <= RESULT_BUDGET
    omitted = result.structured_content["omitted"]
    assert omitted["fields"] == ["rows"] and omitted["resource"].endswith(result.structured_content["result_id"])
    assert result.structured_content["title"] == "t"  # what fits stays
    assert pages and all(len(page) <= RESULT_BUDGET for page in pages)
    rows = [row for page in pages for row in json.loads(page)["rows"]]
    assert sum(1 for path, _ in rows if path[:2] == ["output", "rows"]) == 400  # the whole result, paged


def test_a_running_job_answers_only_its_job() -> None:
    class Pending(JobOutput):
        total: int = 0
        items: list[str] = Field(default_factory=list)

    running = Pending(
        job=JobInfo(id="j-1", status="running", message="copying"), poll_after_s=3.0, resource="vllm-metax://jobs/j-1"
    )
    assert compact(running) == {
        "job": {"id": "j-1", "status": "running", "message": "copying"},
        "poll_after_s": 3.0,
        "resource": "vllm-metax://jobs/j-1",
    }
    assert compact(Pending(total=2)) == {"total": 2}
    assert sent(running).text == text_of(running)


class SetInput(BaseModel):
    first: int = 1
    second: str = "b"


class SetOutput(ToolOutput):
    given: list[str]


def given(args: SetInput, env: ToolEnv) -> SetOutput:
    return SetOutput(given=sorted(args.model_fields_set))


def test_a_tool_sees_the_arguments_the_client_sent_not_the_filled_in_defaults(tmp_path: Path) -> None:
    """The SDK validates a call into every field with its default; tools that refuse an argument another
    one makes meaningless (`revision` without subject=revision, ...) must see only what was sent."""
    runtime = Runtime.create([str(tmp_path)], state_dir=str(tmp_path.parent / f"{tmp_path.name}-state"))
    spec = ToolSpec("given", Effect.READS, given, SetInput, SetOutput, "given")
    server = build_server(runtime, tools=(spec,))

    async def body() -> list[list[str]]:
        async with Client(server) as client:
            return [(await client.call_tool("given", a)).structured_content["given"] for a in ({}, {"second": "c"})]

    assert anyio.run(body) == [[], ["second"]]


class EchoInput(BaseModel):
    paths: list[str] = Field(default_factory=list, max_length=100_000)
    sleep_s: float = 0.0


class EchoOutput(ToolOutput):
    rows: list[str] = Field(default_factory=list)


def echo(args: EchoInput, env: ToolEnv) -> EchoOutput:
    """A page that fits without its next_step, which repeats the call's (long) arguments."""
    time.sleep(args.sleep_s)
    following = NextCall(tool="echo", arguments={"paths": args.paths, "cursor": "c2"}, why="the next page.")
    return EchoOutput(rows=["r" * 100] * 150, next_step=following)


def test_a_next_step_repeating_long_arguments_gives_way_before_the_data(tmp_path: Path) -> None:
    runtime = Runtime.create([str(tmp_path)], state_dir=str(tmp_path.parent / f"{tmp_path.name}-state"))
    server = build_server(runtime, tools=(ToolSpec("echo", Effect.READS, echo, EchoInput, EchoOutput, "echo"),))

    async def body() -> Any:
        async with Client(server) as client:
            return await client.call_tool("echo", {"paths": [f"pkg/file_{i}.py" for i in range(1500)]})

    result = anyio.run(body)
    assert len(result.content[0].text) <= RESULT_BUDGET and len(result.structured_content["rows"]) == 150
    step = result.structured_content["next_step"]
    assert step["arguments"] == {"cursor": "c2"} and "Pass this call's own paths as well." in step["why"]
    assert "omitted" not in result.structured_content


def test_a_slow_call_in_a_thread_reports_progress(tmp_path: Path) -> None:
    """Tools that run in a thread report nothing themselves: after a second the server says the call works,
    and the heartbeat keeps it rising (strictly) until the answer."""
    runtime = Runtime.create([str(tmp_path)], state_dir=str(tmp_path.parent / f"{tmp_path.name}-state"))
    server = build_server(runtime, tools=(ToolSpec("echo", Effect.READS, echo, EchoInput, EchoOutput, "echo"),))
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async def body() -> Any:
        async with Client(server) as client:
            return await client.call_tool("echo", {"sleep_s": 3.5}, progress_callback=on_progress)

    assert not anyio.run(body).is_error
    assert len(seen) >= 2 and all(message == "echo: working" for _, message in seen)
    assert all(b[0] > a[0] for a, b in zip(seen, seen[1:], strict=False))
