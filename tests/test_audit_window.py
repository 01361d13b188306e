"""audit_commits status: the forked files whose closest release is older than the release the
plugin declares, with the upstream commits between the two that the upgrade did not bring in.

Real case: vllm-ascend b4b04c5eb1 is the vendor's "main2main vllm v0.27.1" upgrade and declares
v0.27.1 (Dockerfile:44 `ARG VLLM_TAG=v0.27.1`), but that commit touched no file under models/ (its
parent is the 351879064c snapshot). So every model file whose counterpart changed after 0.26.0
still matches 0.26.0 best and misses those commits; the counterparts that changed between 0.26.0
and 0.27.0 are test_real_plugins_audit.CHANGED (read with `diff` of the release trees), and
qwen3_dspark's also changed in 0.27.1 (`diff` 0.27.0 -> 0.27.1: :25 imports QuantizationConfig).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import workbench
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from test_real_plugins_audit import CHANGED, MODELS
from workbench import build_upstream_history

from vllm_metax_mcp.core.audit.lagging import declared_bases
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.tools import audit_commits as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

VERSIONS = ["0.26.0", "0.27.0", "0.27.1"]


@pytest.fixture(scope="module")
def window(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("window")
    sources = {v: workbench.upstream_source(v) for v in VERSIONS}
    history = build_upstream_history(root / "vllm", VERSIONS, sources=sources)
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / "vllm-ascend-b4b04c5eb1.tar.gz", root)
    runtime = Runtime.create([str(root)], mode="review", state_dir=str(tmp_path_factory.mktemp("window-state")))
    env = ToolEnv(runtime=runtime, tool="audit_commits")
    arguments = {
        "action": "status",
        "upstream": str(history.path),
        "target": "v0.27.1",
        "plugin_repo": str(repo),
        "paths": [f"{MODELS}/"],
        "releases": [f"v{v}" for v in VERSIONS],
        "limit": 100,
    }
    status = anyio.run(lambda: invoke(tool.SPEC, arguments, env))
    return {"status": status, "release": {v: history.rev_parse(f"v{v}") for v in VERSIONS}}


@pytest.mark.slow
@needs_snapshots
def test_files_behind_the_declared_release_and_the_commits_they_miss(window: dict[str, Any]) -> None:
    status, release = window["status"], window["release"]
    (declared,) = status.declared
    assert (declared.version, declared.where, declared.text) == ("0.27.1", "Dockerfile:44", "ARG VLLM_TAG=v0.27.1")
    assert status.declared_release == "v0.27.1"
    behind = {f.local: f for f in status.files if f.behind_total}
    assert set(behind) == set(CHANGED)
    for local, file in behind.items():
        assert file.base == "v0.26.0", local
        expected = [release["0.27.0"]] + ([release["0.27.1"]] if local == f"{MODELS}/qwen3_dspark.py" else [])
        assert file.behind_declared == expected and file.behind_total == len(expected), local
    # the others match the declared release (their counterparts did not change since 0.26.0)
    current = [f for f in status.files if f.upstream and not f.behind_total]
    assert current and all(f.base == "v0.27.1" for f in current)


def test_declarations_read_from_docker_requirements_and_packaging(tmp_path: Path) -> None:
    files = {
        # the plugin's own version argument is not vLLM's release; a commented line is not a declaration
        "Dockerfile": "FROM ubuntu\nARG VLLM_PLUGIN_VERSION=0.8.5\n# ARG VLLM_TAG=v0.1.0\nARG VLLM_VERSION=0.9.2\n",
        "requirements/common.txt": "vllm[audio]==0.9.2  # extras and a comment\n",
        "requirements-build.txt": "torch==2.13.0  # keep in sync with vllm==0.1.0\nvllm == 0.9.2\n",
        "pyproject.toml": '[project]\ndependencies = ["vllm==0.9.2", "vllm-flash-attn==2.6.1"]\n',
        # a lower bound is no declared release, and neither is prose that mentions a pin
        "setup.py": 'install_requires = ["vllm>=0.8"]\ndescription = "needs vllm == 0.6.0 or newer"\n',
        "docs/requirements.txt": "vllm==0.1.0\n",  # documentation, not the plugin's build
    }
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    found = [(d.version, d.where) for d in declared_bases(DirectorySubject(tmp_path))]
    assert found == [
        ("0.9.2", "Dockerfile:4"),
        ("0.9.2", "pyproject.toml:2"),
        ("0.9.2", "requirements-build.txt:2"),
        ("0.9.2", "requirements/common.txt:1"),
    ]
