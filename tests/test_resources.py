"""Guides, records and prompts through a real MCP client in both protocol eras; guides checked
against the tools' real schemas."""

from __future__ import annotations

import json
import re
from importlib import resources as package_files
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from workbench import git

from vllm_metax_mcp.core.audit.ledger import Annotation, Decision, change_ledger, new_ledger
from vllm_metax_mcp.core.foundation.evidence import FileEvidence
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
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
            "vllm-metax://environments/{record_id}{?cursor}",
            "vllm-metax://jobs/{job_id}{?cursor}",
            "vllm-metax://results/{result_id}{?cursor}",
            "vllm-metax://smoke/{run_id}{?cursor}",
            "vllm-metax://ledgers/{ledger_id}{?cursor}",
        } <= templates
        established = await client.call_tool(
            "environment",
            {"plugin_repo": "plugin", "action": "establish", "python": str(Path(__import__("sys").executable))},
        )
        assert not established.is_error, established.content
        result_id = established.structured_content["result_id"]
        record_id = established.structured_content["record_id"]
        cited = (await client.read_resource(f"vllm-metax://results/{result_id}")).contents[0].text
        assert json.loads(cited)["tool"] == "environment" and len(cited) <= RESULT_BUDGET
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


def big_ledger(runtime: Runtime, decisions: int) -> dict[str, Any]:
    """A ledger the size of a real fork's (hundreds of decisions with evidence, a baseline, annotations),
    written through the ledger's own storage functions."""
    evidence = (FileEvidence(path="vllm_metax/models/deepseek_v2.py", line=120, rev="e" * 40),)
    identifier = "ab" * 12
    fresh = new_ledger(identifier, "plugin-key", {"path": "vllm", "target": "v0.26.0", "target_commit": "c" * 40})
    upstream = [
        Decision(
            f"{i:040x}", f"vllm_metax/models/m{i % 40}.py", "merge", True, "forward", ("M.forward",), evidence, 1.0
        )
        for i in range(decisions)
    ]
    notes = [Annotation(f"vllm.model_executor.layers.node{i}", "inherited", 1.0, evidence) for i in range(200)]

    def fill(ledger: dict[str, Any]) -> None:
        for decision in upstream:
            ledger[decision.section][decision.key] = decision.stored()
        for note in notes:
            ledger["annotations"][note.key] = note.stored()
        rows = {f"row{i}": {"file": f"f{i}.py", "kind": "differs"} for i in range(300)}
        ledger["baseline"] = {"taken_at": 1.0, "rows": rows}

    return change_ledger(runtime.store, fresh, fill)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_big_ledger_reads_in_pages_under_the_result_budget(workspace: dict[str, Path], mode: str) -> None:
    """Every page of the ledger resource is at most RESULT_BUDGET chars; following `next` to the end and
    setting each row's path rebuilds the stored ledger exactly; a foreign cursor is refused."""
    runtime = Runtime.create([str(workspace["root"])], state_dir=str(workspace["state"]))
    stored = big_ledger(runtime, 600)
    assert len(json.dumps(stored)) > 200_000
    uri = f"vllm-metax://ledgers/{stored['id']}"

    async def body(client: Client) -> list[str]:
        pages, following = [], uri
        while following:
            text = (await client.read_resource(following)).contents[0].text
            pages.append(text)
            following = json.loads(text).get("next")
        with pytest.raises(MCPError):
            await client.read_resource(f"{uri}?cursor=not-a-cursor")
        return pages

    async def main() -> list[str]:
        async with Client(build_server(runtime), mode=mode) as client:
            return await body(client)

    pages = anyio.run(main)
    assert len(pages) > 10 and max(len(page) for page in pages) <= RESULT_BUDGET
    rebuilt: dict[str, Any] = {}
    offsets = []
    for page in map(json.loads, pages):
        offsets.append(page["offset"])
        for path, value in page["rows"]:
            place = rebuilt
            for key in path[:-1]:
                place = place.setdefault(key, {})
            place[path[-1]] = value
    assert rebuilt == stored
    assert offsets == sorted(offsets) and offsets[0] == 0
    first_keys = [row[0] for row in json.loads(pages[0])["rows"][:4]]
    assert all(len(path) == 1 for path in first_keys), "the ledger's own fields come first"
