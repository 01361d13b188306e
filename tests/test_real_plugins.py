"""diff_model on a real vendor plugin: vllm-ascend at 7662ec925a ("main2main vllm v0.26.0") paired
against the real upstream 0.26.0 tree.

The plugin keeps its forks in its own package, `vllm_ascend/`, not `vllm_metax/`: the rules that
compare the plugin's package with `vllm/` (same path, the family and platform-branch rules, the
family's target-only list, import swaps) must take the package from the paths the call compares.
Only pairs that evidence decides through those rules are asserted here; each assertion names the
evidence in the real code (file:line). The snapshots are the project's shared fixtures
(`shared/fixtures/plugins/`, beside or inside the checkout, or where VLLM_METAX_MCP_SHARED points).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import REPO_ROOT
from workbench import git

from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.tools import diff_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

ARCHIVE = "vllm-ascend-7662ec925a.tar.gz"


def shared_plugins() -> Path | None:
    """Where the real plugin snapshots are: VLLM_METAX_MCP_SHARED, else a `shared/` folder in or beside
    the checkout (the workspace keeps it beside; a device copy of the tree carries it inside)."""
    named = os.environ.get("VLLM_METAX_MCP_SHARED")
    candidates = [Path(named)] if named else [REPO_ROOT / "shared", REPO_ROOT.parent / "shared"]
    found = [c / "fixtures" / "plugins" for c in candidates if (c / "fixtures" / "plugins" / ARCHIVE).is_file()]
    return found[0] if found else None


PLUGINS = shared_plugins()
needs_snapshots = pytest.mark.skipif(
    PLUGINS is None,
    reason="the real plugin snapshots (shared/fixtures/plugins/) are not beside or inside this checkout; "
    "point VLLM_METAX_MCP_SHARED at the shared folder",
)
MODELS = "vllm_ascend/models"
MINIMAX = "vllm/models/minimax_m3"


def snapshot_repo(archive: Path, dest: Path) -> Path:
    """A git repository holding the snapshot's files as one commit (the archive has one top folder).

    Members are written one by one (plain files and directories with relative names only), which
    needs no extraction filter, so any Python >= 3.10 reads the archive the same way."""
    with tarfile.open(archive) as opened:
        members = opened.getmembers()
        (top,) = {Path(member.name).parts[0] for member in members}
        for member in members:
            relative = Path(member.name)
            assert not relative.is_absolute() and ".." not in relative.parts, member.name
            assert member.isfile() or member.isdir(), f"{member.name} is neither a file nor a directory"
            target = dest / relative
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = opened.extractfile(member)
            assert source is not None, member.name
            target.write_bytes(source.read())
    repo = dest / top
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"snapshot {archive.name}")
    return repo


def call(root: Path, upstream: Path, state: Path, **arguments: Any) -> Any:
    runtime = Runtime.create([str(root), str(upstream)], mode="review", state_dir=str(state))
    env = ToolEnv(runtime=runtime, tool="diff_model")
    return anyio.run(lambda: invoke(tool.SPEC, {"upstream": str(upstream), **arguments}, env))


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    """One pairing of vllm_ascend/models/ against 0.26.0, with symbols (import swaps) for every pair."""
    root = tmp_path_factory.mktemp("real-plugins")
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / ARCHIVE, root)
    state = tmp_path_factory.mktemp("real-plugins-state")
    result = call(root, upstream_026, state, plugin_repo=str(repo), paths=[f"{MODELS}/"], detail="symbols", limit=500)
    return {"result": result, "pairs": {p.local: p for p in result.pairs}}


@pytest.mark.slow
@needs_snapshots
def test_the_plugin_package_is_the_one_the_paths_lie_in(ascend: dict[str, Any]) -> None:
    pairs = ascend["pairs"]
    assert len(pairs) == ascend["result"].total == 16 and all(p.startswith(f"{MODELS}/") for p in pairs)

    # vllm_ascend/models/minimax_m3/__init__.py:3-11 re-exports MiniMaxM3SparseForCausalLM (from .minimax_m3)
    # and MiniMaxM3SparseForConditionalGeneration (from .minimax_m3_vl), as upstream
    # vllm/models/minimax_m3/__init__.py:16-20 does (from .nvidia.model); both are the registry's target module
    # (vllm_ascend/models/__init__.py:6-13 "vllm_ascend.models.minimax_m3:..." and
    # vllm/model_executor/models/registry.py:159,494 "vllm.models.minimax_m3"), at the same path below
    # vllm_ascend/models/ and vllm/models/.
    family_init = pairs[f"{MODELS}/minimax_m3/__init__.py"]
    assert (family_init.upstream, family_init.rule, family_init.status) == (
        f"{MINIMAX}/__init__.py",
        "same_path",
        "changed",
    )
    assert any(
        e.kind == "note" and e.text == f"same path under {MODELS}/minimax_m3/ and {MINIMAX}/"
        for e in family_init.evidence
    )

    # vllm_ascend/models/qwen3_dspark.py:29 AscendQwen3DSparkForCausalLM extends Qwen3DSparkForCausalLM, imported
    # at :5 from vllm.model_executor.models.qwen3_dspark (defined at qwen3_dspark.py:95); the plugin registers
    # Qwen3DSparkModel with it (vllm_ascend/models/__init__.py:22) as upstream's registry.py:610 does with
    # qwen3_dspark. The same base name under vllm_ascend/models/ and vllm/model_executor/models/ decides it.
    dspark = pairs[f"{MODELS}/qwen3_dspark.py"]
    assert (dspark.upstream, dspark.rule, dspark.status) == (
        "vllm/model_executor/models/qwen3_dspark.py",
        "same_path",
        "changed",
    )


@pytest.mark.slow
@needs_snapshots
def test_import_swaps_name_the_plugin_modules(ascend: dict[str, Any]) -> None:
    # vllm_ascend/models/minimax_m3/__init__.py:3 and :11 import the two classes from the plugin's own
    # vllm_ascend.models.minimax_m3.minimax_m3 and .minimax_m3_vl, where upstream
    # vllm/models/minimax_m3/__init__.py:17 imports both from vllm.models.minimax_m3.nvidia.model.
    swaps = {
        (s.name, s.local_module, s.line, s.upstream_module, s.upstream_line)
        for s in ascend["pairs"][f"{MODELS}/minimax_m3/__init__.py"].import_swaps
    }
    nvidia = "vllm.models.minimax_m3.nvidia.model"
    assert {
        ("MiniMaxM3SparseForCausalLM", "vllm_ascend.models.minimax_m3.minimax_m3", 3, nvidia, 17),
        ("MiniMaxM3SparseForConditionalGeneration", "vllm_ascend.models.minimax_m3.minimax_m3_vl", 11, nvidia, 17),
    } <= swaps


@pytest.mark.slow
@needs_snapshots
@pytest.mark.xfail(
    strict=True,
    reason="issue 20 mechanism 2: the package __init__ of a package copied from outside the family follows its "
    "members' package (common/ops/), not the platform branch",
)
def test_a_copied_package_init_follows_its_members_package(ascend: dict[str, Any]) -> None:
    # vllm_ascend/models/minimax_m3/ops/__init__.py holds the license header only; its members msa_m3_triton.py
    # and msa_m3_npu.py take their kernels from upstream vllm/models/minimax_m3/common/ops/ (sparse_attn.py,
    # index_topk.py), so the package maps to common/ops/ (tests/data/real_plugins/expected_pairs.json). Taking
    # the package from the paths moved it from local_only to the platform branch's nvidia/ops/__init__.py.
    ops_init = ascend["pairs"][f"{MODELS}/minimax_m3/ops/__init__.py"]
    assert ops_init.upstream == f"{MINIMAX}/common/ops/__init__.py"


@pytest.mark.slow
@needs_snapshots
def test_the_mirrored_family_lists_its_other_platform_directory(ascend: dict[str, Any]) -> None:
    # The plugin mirrors the family vllm/models/minimax_m3/ (vllm_ascend/models/minimax_m3/). Its dispatch takes
    # `.nvidia` when `TYPE_CHECKING or not current_platform.is_rocm()` (vllm/models/minimax_m3/__init__.py:16-21)
    # and `.amd` only otherwise (:22-27), which an out-of-tree platform never takes: amd/ (10 files) is another
    # platform's directory.
    amd = [t for t in ascend["result"].target_only if t.upstream == f"{MINIMAX}/amd/"]
    assert [(t.kind, t.files) for t in amd] == [("other_platform", 10)]
    assert "current_platform.is_rocm()" in (amd[0].guard or "")


def test_paths_outside_one_package_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    repo = root / "plugin"
    for path in (
        "vllm/__init__.py",
        "vllm/m.py",
        "pkg_a/__init__.py",
        "pkg_a/m.py",
        "pkg_b/__init__.py",
        "pkg_b/m.py",
        "loose/m.py",
    ):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("X = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "two packages and a plain directory")
    upstream = tmp_path / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    (upstream / "vllm" / "__init__.py").write_text("")
    refusals = {
        "several packages": (["pkg_a/", "pkg_b/m.py"], "paths span several top-level packages (pkg_a, pkg_b)"),
        "no package": (["loose/"], "paths lie in loose, which is not a Python package"),
        "whole subject": ([""], "paths names the whole subject"),
        "upstream's own package": (["vllm/"], "upstream's own package"),
    }
    for case, (paths, message) in refusals.items():
        with pytest.raises(ToolFailure) as refused:
            call(root, upstream, tmp_path / "state", plugin_repo=str(repo), paths=paths)
        assert refused.value.code.value == "bad_input" and message in refused.value.message, case
