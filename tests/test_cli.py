"""The installed console script for scripted runs: `tools` and `call`, their output and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pytest
from helpers import REPO_ROOT, console_script
from mcp import Client, StdioServerParameters

from vllm_metax_mcp.tools import ALL_TOOLS

pytestmark = pytest.mark.timeout(60)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    script = console_script()
    assert script.exists(), f"console script not installed next to the interpreter: {script}"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=45, cwd=cwd)


@pytest.fixture
def dirs(tmp_path: Path) -> list[str]:
    root = tmp_path / "root"
    root.mkdir()
    return ["--root", str(root), "--state-dir", str(tmp_path / "state")]


def test_tools_in_review_mode_exclude_writes_tools() -> None:
    edit = cli("tools")
    review = cli("tools", "--mode", "review")
    assert edit.returncode == 0 and review.returncode == 0, (edit.stderr, review.stderr)
    edit_listing, review_listing = json.loads(edit.stdout), json.loads(review.stdout)

    writes = {spec.name for spec in ALL_TOOLS if spec.effect.value == "writes"}
    assert {t["name"] for t in edit_listing} == {spec.name for spec in ALL_TOOLS}
    assert {t["name"] for t in review_listing} == {spec.name for spec in ALL_TOOLS} - writes
    for tool in review_listing:
        assert tool["effect"] in ("reads", "validates"), tool
    for tool in edit_listing:
        hints = tool["annotations"]
        for hint in ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint"):
            assert hint in hints, (tool["name"], hint)
        assert hints["read_only_hint"] is (tool["effect"] == "reads")


def test_call_jobs_prints_its_result_as_json(dirs: list[str]) -> None:
    proc = cli("call", "jobs", "--args", '{"action": "list"}', *dirs)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["result_id"].startswith("r-") and result["jobs"] == [] and result["total"] == 0


def test_call_unknown_tool_is_a_usage_error(dirs: list[str]) -> None:
    proc = cli("call", "no_such_tool", *dirs)
    assert proc.returncode == 2
    assert proc.stdout == ""


@pytest.mark.parametrize("args", ["{not json", "[1, 2]", '"list"'])
def test_call_with_bad_args_json_is_a_usage_error(args: str, dirs: list[str]) -> None:
    proc = cli("call", "jobs", "--args", args, *dirs)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""


def test_call_tool_error_exits_1_with_error_json_on_stderr(dirs: list[str], tmp_path: Path) -> None:
    for args, code in (('{"action": "status"}', "bad_input"), ('{"action": "status", "job_id": "j-00"}', "not_found")):
        proc = cli("call", "jobs", "--args", args, *dirs)
        assert proc.returncode == 1, proc.stderr
        assert proc.stdout == ""
        error = json.loads(proc.stderr)["error"]
        assert error["code"] == code and error["message"]
        assert "Traceback" not in proc.stderr and str(tmp_path / "state") not in proc.stderr


def test_call_invalid_arguments_exit_1_with_bad_input(dirs: list[str]) -> None:
    proc = cli("call", "jobs", "--args", '{"action": "explode"}', *dirs)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stderr)["error"]["code"] == "bad_input"


def test_call_writes_tool_in_review_mode_is_refused(dirs: list[str], tmp_path: Path) -> None:
    writes = [spec.name for spec in ALL_TOOLS if spec.effect.value == "writes"]
    assert writes, "export_snapshot and trim_model are writes tools"
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "root").rglob("*"))
    proc = cli("call", writes[0], "--args", json.dumps({"output": "out"}), "--mode", "review", *dirs)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stderr)["error"]["code"] == "review_mode"
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "root").rglob("*")) == before


# -- the console script over stdio, the MCP Inspector CLI, the wheel --------------------------


def test_stdio_console_script_serves_the_sdk_client(dirs: list[str]) -> None:
    params = StdioServerParameters(command=str(console_script()), args=["serve", *dirs])

    async def main() -> tuple[list[str], dict]:
        async with Client(params) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            result = await client.call_tool("jobs", {"action": "list"})
            assert not result.is_error, result.content
            return tools, result.structured_content

    tools, structured = anyio.run(main)
    assert set(tools) == {spec.name for spec in ALL_TOOLS}
    assert structured["result_id"].startswith("r-") and structured["total"] == 0


def inspector_prefix() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vllm-metax-mcp-tests" / "npm"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mcp_inspector_cli_lists_and_calls_tools(tmp_path: Path) -> None:
    npm, npx = shutil.which("npm"), shutil.which("npx")
    if not npm or not npx:
        pytest.skip("npm/npx not found on PATH: the MCP Inspector CLI test needs Node.js and npm")
    prefix = inspector_prefix()
    binary = prefix / "node_modules" / ".bin" / "mcp-inspector"
    if not binary.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        install = subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "@modelcontextprotocol/inspector"],
            capture_output=True,
            text=True,
            timeout=540,
        )
        assert install.returncode == 0, install.stderr[-2000:]
    builds = (prefix / "node_modules" / "@modelcontextprotocol").glob("inspector*/build/*.js")
    nested = (prefix / "node_modules" / "@modelcontextprotocol").glob("inspector/cli/build/*.js")
    fmt = ["--format", "json"] if any('"--format' in p.read_text() for p in [*builds, *nested]) else []
    root = tmp_path / "root"
    root.mkdir()
    server = [str(console_script()), "serve", "--root", str(root), "--state-dir", str(tmp_path / "state")]

    def inspector(*method: str) -> dict:
        proc = subprocess.run(
            [npx, "--prefix", str(prefix), "mcp-inspector", "--cli", *server, *method, *fmt],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    listing = inspector("--method", "tools/list")
    assert {tool["name"] for tool in listing["tools"]} == {spec.name for spec in ALL_TOOLS}
    for tool in listing["tools"]:
        assert tool.get("outputSchema"), tool["name"]
        assert set(tool["annotations"]) >= {"readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"}
    called = inspector("--method", "tools/call", "--tool-name", "jobs", "--tool-arg", "action=list")
    assert not called.get("isError") and called["structuredContent"]["total"] == 0


@pytest.mark.timeout(300)
def test_wheel_has_one_top_level_package_and_its_markdown(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".pytest_cache"),
    )
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("vllm_metax_mcp-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        assert len(dist_info) == 1
        (info,) = dist_info
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        top_level_txt = (
            archive.read(f"{info}/top_level.txt").decode().split() if f"{info}/top_level.txt" in names else None
        )
    top_level = {n.split("/")[0] for n in names} - dist_info
    assert top_level == {"vllm_metax_mcp"}, top_level
    if top_level_txt is not None:
        assert top_level_txt == ["vllm_metax_mcp"]
    assert "vllm-metax-mcp = vllm_metax_mcp.server.cli:main" in entry_points

    markdown = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "vllm_metax_mcp").rglob("*.md"))
    for path in markdown:  # nothing to check until resources/prompts ship markdown
        assert names.count(path) == 1, f"{path} missing from the wheel (or there twice)"
