"""port_model as a tool: a real git upstream with two releases, a real plugin repository, a real
output directory. What it writes, what it refuses, and that it never touches the repository."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import git, make_repo, snapshot
from workbench import build_upstream_history

from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.foundation.policy import Mode
from vllm_metax_mcp.tools import port_model as tool
from vllm_metax_mcp.tools import served_tools
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

MODEL = "vllm/model_executor/models/foo.py"
FORK = "vllm_metax/models/foo.py"
OLD = """\
from vllm.model_executor.layers.linear import ReplicatedLinear


class FooMLP:
    def __init__(self):
        self.proj = ReplicatedLinear()

    def forward(self, x):
        return self.proj(x)


class FooForCausalLM:
    def __init__(self):
        self.mlp = FooMLP()
"""
NEW = OLD.replace("        return self.proj(x)", "        x = self.proj(x)\n        return x * 2").replace(
    "        self.mlp = FooMLP()", "        self.mlp = FooMLP()\n        self.head = FooMLP()"
)
LOCAL = (
    OLD.replace("from vllm.model_executor.layers.linear", "from vllm_metax.model_executor.layers.linear")
    .replace("class Foo", "class MacaFoo")
    .replace("= FooMLP()", "= MacaFooMLP()")
)
LINEAR = "class ReplicatedLinear:\n    pass\n"


def release_tree(root: Path, model: str) -> Path:
    for path, text in {
        "vllm/__init__.py": "",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/models/__init__.py": "",
        "vllm/model_executor/layers/__init__.py": "",
        "vllm/model_executor/layers/linear.py": LINEAR,
        MODEL: model,
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture
def workspace(tmp_path: Path) -> dict[str, Path]:
    sources = {"0.1.0": release_tree(tmp_path / "r1", OLD), "0.2.0": release_tree(tmp_path / "r2", NEW)}
    build_upstream_history(tmp_path / "root" / "vllm", ["0.1.0", "0.2.0"], sources=sources)
    plugin = make_repo(tmp_path / "root" / "plugin")
    for path, text in {
        "vllm_metax/__init__.py": "",
        "vllm_metax/models/__init__.py": "",
        "vllm_metax/model_executor/__init__.py": "",
        "vllm_metax/model_executor/layers/__init__.py": "",
        "vllm_metax/model_executor/layers/linear.py": LINEAR,
        FORK: LOCAL,
    }.items():
        (plugin / path).parent.mkdir(parents=True, exist_ok=True)
        (plugin / path).write_text(text)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "fork foo")
    out = tmp_path / "out"
    out.mkdir()
    return {"root": tmp_path / "root", "plugin": plugin, "out": out, "state": tmp_path / "state"}


def call(ws: dict[str, Path], mode: str = "edit", **arguments: Any) -> Any:
    runtime = Runtime.create([str(ws["root"])], [str(ws["out"])], mode=mode, state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="port_model")
    given = {"plugin_repo": str(ws["plugin"]), "upstream": str(ws["root"] / "vllm"), "target": "v0.2.0"}
    given |= {"releases": ["v0.1.0"], "paths": ["vllm_metax/models/"], "output": str(ws["out"] / "port")}
    return anyio.run(lambda: invoke(tool.SPEC, given | arguments, env))


def test_the_fork_is_carried_onto_the_target_with_its_contract_and_verified(workspace: dict[str, Path]) -> None:
    before = snapshot(workspace["plugin"])
    result = call(workspace)
    written = (workspace["out"] / "port" / FORK).read_text()
    # upstream's two changes, in the local names and with the local import swap
    assert "        x = self.proj(x)\n        return x * 2" in written
    assert "        self.head = MacaFooMLP()" in written
    assert "from vllm_metax.model_executor.layers.linear import ReplicatedLinear" in written
    assert "class FooMLP" not in written
    report = json.loads((workspace["out"] / "port" / "port_report.json").read_text())
    assert next(iter(report)) == "format" and report["format"].startswith("vllm-metax-mcp/port-report/")
    (entry,) = [f for f in report["files"] if f["local"] == FORK]
    assert (entry["status"], entry["base"], entry["upstream"]) == ("ported", "v0.1.0", MODEL)
    assert entry["verification"]["passed"] and entry["verification"]["unresolved"] == []
    rules = {(r["kind"], r["upstream"], r["local"], r["evidence"]) for r in entry["contract"]["rules"]}
    assert ("rename", "FooMLP", "MacaFooMLP", f"{FORK}:4") in rules
    assert ("import_swap", "vllm.model_executor.layers.linear", "vllm_metax.model_executor.layers.linear",
            f"{FORK}:1") in rules  # fmt: skip
    assert result.summary["verified"] == result.summary["written"]
    assert [(f.status, f.conflicts) for f in result.files if f.local == FORK] == [("ported", 0)]
    assert (workspace["out"] / "port" / "PORT_REPORT.md").is_file()
    patch = (workspace["out"] / "port" / "port.patch").read_text()
    assert patch.startswith(f"--- a/{FORK}\n+++ b/{FORK}\n")
    git(workspace["plugin"], "apply", "--check", str(workspace["out"] / "port" / "port.patch"))
    assert snapshot(workspace["plugin"]) == before, "the repository is never written"


def test_an_existing_output_is_refused_and_an_earlier_port_replaced_only_with_overwrite(
    workspace: dict[str, Path],
) -> None:
    (workspace["out"] / "taken").mkdir()
    with pytest.raises(ToolFailure, match="already exists"):
        call(workspace, output=str(workspace["out"] / "taken"))
    call(workspace)
    with pytest.raises(ToolFailure, match="already exists"):
        call(workspace)
    call(workspace, overwrite=True)
    with pytest.raises(ToolFailure):
        call(workspace, output=str(workspace["out"] / "taken"), overwrite=True)  # not an earlier output


def test_bad_bases_are_refused_before_anything_is_written(workspace: dict[str, Path]) -> None:
    with pytest.raises(ToolFailure, match="not one of releases"):
        call(workspace, bases={FORK: "v0.0.9"})
    with pytest.raises(ToolFailure, match="not a compared plugin file"):
        call(workspace, bases={"vllm_metax/models/bar.py": "v0.1.0"})
    assert not (workspace["out"] / "port").exists()
    assert [p.name for p in workspace["out"].iterdir()] == []


def test_review_mode_does_not_offer_it_and_the_output_must_lie_in_an_output_root(workspace: dict[str, Path]) -> None:
    assert "port_model" not in {t.name for t in served_tools(Mode.REVIEW)}
    assert "port_model" in {t.name for t in served_tools(Mode.EDIT)}
    with pytest.raises(ToolFailure):
        call(workspace, output=str(workspace["plugin"] / "ported"))
    assert not (workspace["plugin"] / "ported").exists()
