"""Guides, records and prompts through a real MCP client in both protocol eras; guides checked
against the tools' real schemas."""

from __future__ import annotations

import re
from importlib import resources as package_files
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from workbench import git

from vllm_metax_mcp.resources import GUIDES
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools.spec import Runtime

CALL = re.compile(r"`([A-Za-z_][\w.]*)\(([^`]*)\)`")
FIELD = re.compile(r"`([a-z_]+)\.([a-z_]+)`")
CODE_CALLS_IN_PROSE = frozenset(
    {"has_device_capability", "is_device_capability", "is_cuda", "is_rocm", "is_out_of_tree"}
)
"""Calls the guides quote from upstream code, not tool calls."""


def documents() -> dict[str, str]:
    texts = {
        f"resources/{p.name}": p.read_text()
        for p in package_files.files("vllm_metax_mcp.resources").iterdir()
        if p.name.endswith(".md")
    }
    texts |= {
        f"prompts/{p.name}": p.read_text()
        for p in package_files.files("vllm_metax_mcp.prompts").iterdir()
        if p.name.endswith(".md")
    }
    return texts


def schemas() -> dict[str, tuple[set[str], set[str]]]:
    return {
        spec.name: (
            set(spec.input_model.model_json_schema()["properties"]),
            set(spec.output_model.model_json_schema()["properties"]),
        )
        for spec in ALL_TOOLS
    }


def test_every_guide_file_is_served() -> None:
    on_disk = {
        name.removeprefix("resources/").removesuffix(".md") for name in documents() if name.startswith("resources/")
    }
    assert on_disk == {guide.slug for guide in GUIDES}


@pytest.mark.parametrize("name", sorted(documents()))
def test_tool_mentions_match_the_real_schemas(name: str) -> None:
    text, tools = documents()[name], schemas()
    problems = []
    for tool, arguments in CALL.findall(text):
        if tool in CODE_CALLS_IN_PROSE or "." in tool:
            continue
        if tool not in tools:
            problems.append(f"`{tool}(...)` is not a tool")
            continue
        for argument in filter(None, (a.strip() for a in arguments.split(","))):
            key = argument.split("=", 1)[0].strip()
            if key not in tools[tool][0]:
                problems.append(f"{tool} has no argument {key!r}")
    for tool, field in FIELD.findall(text):
        if tool in tools and field not in tools[tool][1]:
            problems.append(f"{tool} has no output field {field!r}")
    assert not problems, problems


@pytest.fixture()
def workspace(tmp_path: Path) -> dict[str, Path]:
    plugin = tmp_path / "plugin"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("")
    (plugin / "AGENTS.md").write_text("rules\n")
    git(tmp_path, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    return {"root": tmp_path, "plugin": plugin, "state": tmp_path / "state"}


def with_client(ws: dict[str, Path], mode: str, body: Any) -> Any:
    async def main() -> Any:
        runtime = Runtime.create([str(ws["root"])], state_dir=str(ws["state"]))
        async with Client(build_server(runtime), mode=mode) as client:
            return await body(client)

    return anyio.run(main)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_static_and_dynamic_resources_read(workspace: dict[str, Path], mode: str) -> None:
    async def body(client: Client) -> None:
        listed = {str(r.uri) for r in (await client.list_resources()).resources}
        assert listed == {guide.uri for guide in GUIDES}
        for guide in GUIDES:
            text = (await client.read_resource(guide.uri)).contents[0].text
            assert text.startswith("# ")
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {
            "vllm-metax://environments/{record_id}",
            "vllm-metax://jobs/{job_id}",
            "vllm-metax://results/{result_id}",
            "vllm-metax://smoke/{run_id}",
        } <= templates
        established = await client.call_tool(
            "environment",
            {"plugin_repo": "plugin", "action": "establish", "python": str(Path(__import__("sys").executable))},
        )
        assert not established.is_error, established.content
        result_id = established.structured_content["result_id"]
        record_id = established.structured_content["record_id"]
        cited = (await client.read_resource(f"vllm-metax://results/{result_id}")).contents[0].text
        assert '"tool": "environment"' in cited
        record = (await client.read_resource(f"vllm-metax://environments/{record_id}")).contents[0].text
        assert '"probe_id"' in record
        for refused in (
            "vllm-metax://results/..%2F..%2Fetc",
            "vllm-metax://environments/%2Fetc%2Fpasswd",
            "vllm-metax://jobs/j-nothex",
        ):
            with pytest.raises(MCPError):
                await client.read_resource(refused)

    with_client(workspace, mode, body)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_prompts_fill_in_what_the_record_knows(workspace: dict[str, Path], mode: str) -> None:
    async def body(client: Client) -> None:
        names = {p.name for p in (await client.list_prompts()).prompts}
        assert names == {"upgrade_model", "review_upgrade", "trim_model", "smoke_test"}
        before = (await client.get_prompt("review_upgrade", {"plugin_repo": "plugin"})).messages[0].content.text
        assert "No environment record yet" in before
        await client.call_tool(
            "environment", {"plugin_repo": "plugin", "action": "establish", "python": __import__("sys").executable}
        )
        after = (
            (await client.get_prompt("upgrade_model", {"models": "DeepseekV4ForCausalLM", "plugin_repo": "plugin"}))
            .messages[0]
            .content.text
        )
        assert "DeepseekV4ForCausalLM" in after and "AGENTS.md" in after
        assert __import__("sys").executable in after
        trim = (await client.get_prompt("trim_model", {"source": "ckpt"})).messages[0].content.text
        assert "inspect_config(model=ckpt)" in trim

    with_client(workspace, mode, body)
