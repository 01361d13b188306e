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

import json
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
GCU_ARCHIVE = "vllm-gcu-7b5aaca941.tar.gz"
EXPECTED = json.loads((REPO_ROOT / "tests" / "data" / "real_plugins" / "expected_pairs.json").read_text())
"""Per model file of both snapshots: the counterpart its evidence decides, read from the real code
(tests/data/real_plugins/FINDINGS.md), with that evidence as file:line text."""


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


def paired(factory: pytest.TempPathFactory, archive: str, upstream: Path, models: str) -> dict[str, Any]:
    """One diff_model call over a snapshot's models/ with symbols for every pair, and its pairs by local path."""
    root = factory.mktemp("real-plugins")
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / archive, root)
    state = factory.mktemp("real-plugins-state")
    arguments = {"plugin_repo": str(repo), "paths": [f"{models}/"], "detail": "symbols", "limit": 500}
    result = page = call(root, upstream, state, **arguments)
    pairs = list(result.pairs)
    while page.next_cursor:  # pages end at the result budget
        page = call(root, upstream, state, **arguments, cursor=page.next_cursor)
        pairs += page.pairs
    return {"result": result, "pairs": {p.local: p for p in pairs}}


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    """vllm_ascend/models/ against 0.26.0 (the Dockerfile's VLLM_TAG)."""
    return paired(tmp_path_factory, ARCHIVE, upstream_026, MODELS)


@pytest.fixture(scope="module")
def gcu(tmp_path_factory: pytest.TempPathFactory, upstream_092: Path) -> dict[str, Any]:
    """vllm_gcu/models/ (the `<name>/<name>.py` layout) against the 0.9.2 it pins (requirements.txt)."""
    return paired(tmp_path_factory, GCU_ARCHIVE, upstream_092, "vllm_gcu/models")


def _expected(snapshot: str) -> list[Any]:
    return [pytest.param(snapshot, local, id=local) for local in EXPECTED[snapshot]["files"]]


@pytest.mark.slow
@needs_snapshots
@pytest.mark.parametrize(("snapshot", "local"), _expected("vllm-ascend-7662ec925a") + _expected("vllm-gcu-7b5aaca941"))
def test_every_model_file_pairs_as_its_evidence_says(snapshot: str, local: str, request: pytest.FixtureRequest) -> None:
    """The counterpart (or one the table accepts), the files a merge also carries, and the conflicting
    counterparts other evidence names: shown as alternatives or content candidates, never dropped."""
    expected = EXPECTED[snapshot]["files"][local]
    pair = request.getfixturevalue("gcu" if "gcu" in snapshot else "ascend")["pairs"][local]
    evidence = expected.get("evidence", "")
    assert pair.upstream in [expected["upstream"], *expected.get("acceptable", [])], evidence
    if pair.upstream == expected["upstream"]:
        assert set(expected.get("merged_from", [])) <= set(pair.merged_from), evidence
    if expected.get("conflict"):
        shown = {a.upstream for a in pair.alternatives} | {c.upstream for c in pair.candidates}
        assert set(expected["alternatives"]) & shown, evidence
    if expected["upstream"] is None:
        assert pair.rule in ("registration", "none"), evidence


@pytest.mark.slow
@needs_snapshots
def test_the_registry_names_the_counterpart_and_the_other_platforms(ascend: dict[str, Any]) -> None:
    # vllm_ascend/models/__init__.py:5 registers DeepseekV4ForCausalLM with deepseek_v4:AscendDeepseekV4ForCausalLM;
    # upstream's registry.py:94 maps it to vllm.models.deepseek_v4, whose __init__ imports it from .nvidia.model on
    # the branch an out-of-tree platform takes (:27-32) and from .amd.model / .xpu.model under is_rocm() (:17) and
    # is_xpu() (:23).
    pair = ascend["pairs"][f"{MODELS}/deepseek_v4.py"]
    assert (pair.upstream, pair.rule) == ("vllm/models/deepseek_v4/nvidia/model.py", "registry")
    others = {a.upstream: a.reason for a in pair.alternatives}
    assert {"vllm/models/deepseek_v4/amd/model.py", "vllm/models/deepseek_v4/xpu/model.py"} <= set(others)
    assert "is_rocm()" in others["vllm/models/deepseek_v4/amd/model.py"]
    cited = {(e.path, e.line) for e in pair.evidence if e.kind == "file"}
    assert ("vllm_ascend/models/__init__.py", 5) in cited and ("vllm/model_executor/models/registry.py", 94) in cited
    # deepseek_v4_mtp.py shares 3 of its 4 top-level names with model_executor/models/deepseek_mtp.py, which the
    # symbol rule would pick; the registry (DeepSeekV4MTPModel, registry.py:631) decides and the other is shown.
    mtp = ascend["pairs"][f"{MODELS}/deepseek_v4_mtp.py"]
    assert mtp.upstream == "vllm/models/deepseek_v4/nvidia/mtp.py" and "conflict" in mtp.flags
    assert "vllm/model_executor/models/deepseek_mtp.py" in {a.upstream for a in mtp.alternatives}


@pytest.mark.slow
@needs_snapshots
def test_import_sites_pair_renamed_and_split_files(ascend: dict[str, Any], gcu: dict[str, Any]) -> None:
    # minimax_m3.py:88-98 imports AscendMiniMaxM3Indexer, AscendMiniMaxM3SparseBackend, ... from .msa_m3 where its
    # counterpart nvidia/model.py:73 imports MiniMaxM3Indexer from common.indexer and :79-83 MiniMaxM3SparseBackend
    # from common.sparse_attention: msa_m3.py carries both (8 names of indexer.py, 6 of sparse_attention.py).
    msa = ascend["pairs"][f"{MODELS}/minimax_m3/msa_m3.py"]
    assert msa.upstream == f"{MINIMAX}/common/indexer.py"
    assert f"{MINIMAX}/common/sparse_attention.py" in msa.merged_from
    # vllm_gcu deepseek_v3.py:85 imports DeepseekV2MLAAttentionFusion from .deepseek_v3_fusion; its counterpart
    # (registry.py:54 DeepseekV3ForCausalLM -> deepseek_v2) defines DeepseekV2MLAAttention: the file was split out.
    fusion = gcu["pairs"]["vllm_gcu/models/deepseek_v3/deepseek_v3_fusion.py"]
    assert (fusion.upstream, fusion.rule) == ("vllm/model_executor/models/deepseek_v2.py", "import_site")
    assert ("vllm_gcu/models/deepseek_v3/deepseek_v3.py", 85) in {
        (e.path, e.line) for e in fusion.evidence if e.kind == "file"
    }


@pytest.mark.slow
@needs_snapshots
def test_interface_bases_do_not_pair_a_file(gcu: dict[str, Any]) -> None:
    # got_ocr2.py's classes extend BaseMultiModalProcessor (vllm/multimodal/processing.py) and SupportsMultiModal
    # (model_executor/models/interfaces.py): framework interfaces, not model files; GOT-OCR2 is not in 0.9.2's
    # registry, so the file is the plugin's own.
    got = gcu["pairs"]["vllm_gcu/models/got_ocr2/got_ocr2.py"]
    assert (got.upstream, got.rule) == (None, "none")
    assert not [t for t in gcu["result"].target_only if t.upstream.startswith("vllm/multimodal/")]
    # deepseek_moe_quant.py: every name carries the plugin's `Quant` prefix (QuantDeepseekMLP, ...), which stripped
    # names deepseek.py's six top-level symbols.
    quant = gcu["pairs"]["vllm_gcu/models/deepseek_moe_quant/deepseek_moe_quant.py"]
    assert (quant.upstream, quant.rule) == ("vllm/model_executor/models/deepseek.py", "renamed")


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
    # Qwen3DSparkModel with it (vllm_ascend/models/__init__.py:22), which upstream's registry.py:610 maps to
    # qwen3_dspark. The registry decides; the same base name under vllm_ascend/models/ and
    # vllm/model_executor/models/ agrees, so there is no conflict.
    dspark = pairs[f"{MODELS}/qwen3_dspark.py"]
    assert (dspark.upstream, dspark.rule, dspark.status) == (
        "vllm/model_executor/models/qwen3_dspark.py",
        "registry",
        "changed",
    )
    assert "conflict" not in dspark.flags and not dspark.alternatives


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
def test_a_copied_package_init_follows_its_members_package(ascend: dict[str, Any]) -> None:
    # vllm_ascend/models/minimax_m3/ops/__init__.py holds the license header only; its members msa_m3_triton.py
    # and msa_m3_npu.py take their kernels from upstream vllm/models/minimax_m3/common/ops/ (sparse_attn.py,
    # index_topk.py), so the package maps to common/ops/ (tests/data/real_plugins/expected_pairs.json). The path
    # rule alone flattens it to the platform branch's nvidia/ops/__init__.py, which stays as the alternative.
    ops_init = ascend["pairs"][f"{MODELS}/minimax_m3/ops/__init__.py"]
    assert (ops_init.upstream, ops_init.rule) == (f"{MINIMAX}/common/ops/__init__.py", "package")
    assert f"{MINIMAX}/nvidia/ops/__init__.py" in {a.upstream for a in ops_init.alternatives}


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
