"""Why an upstream file of a mapped directory has no local counterpart (issue 20, mechanism 6).

Real plugins: vllm-ascend at 7662ec925a against upstream 0.26.0 and vllm-gcu at 7b5aaca941 against
0.9.2 (the expected reasons are tests/data/real_plugins/expected_pairs.json `target_only_expected`,
read from the plugins' code; each importer line is cited below). Synthetic git repositories: the
base release (`new_at_target`) and how entries collapse by (directory, kind, reason).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_real_plugins import MINIMAX, MODELS, PLUGINS, call, needs_snapshots, snapshot_repo
from workbench import git, upstream_source

from vllm_metax_mcp.core.code.module_index import RecordCache
from vllm_metax_mcp.core.compare.inputs import pairing_inputs
from vllm_metax_mcp.core.compare.pairing import build_trees, pair_files
from vllm_metax_mcp.core.compare.pairing_context import PairingContext
from vllm_metax_mcp.core.compare.pairs import Pairing, TargetOnly
from vllm_metax_mcp.core.compare.releases import closest_releases, resolve_releases
from vllm_metax_mcp.core.compare.target_only import local_imports, with_new_at_target
from vllm_metax_mcp.core.compare.textdiff import StatsCache
from vllm_metax_mcp.core.sources.git import open_repository
from vllm_metax_mcp.core.sources.subjects import RevisionSubject
from vllm_metax_mcp.tools.spec import Runtime

V4 = "vllm/models/deepseek_v4"
CLASSIC = "vllm/model_executor/models"
GCU = "vllm_gcu/models"


def _reasons(result: Any, reason: str) -> dict[str, str | None]:
    return {t.upstream: t.by for t in result.target_only if t.reason == reason}


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> Any:
    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("ascend")
    repo = snapshot_repo(PLUGINS / "vllm-ascend-7662ec925a.tar.gz", root)
    # The two model files whose pairs map the family directories and would otherwise claim interfaces.py, given
    # as the caller's overrides (their counterparts in expected_pairs.json), so the reasons below do not depend on
    # the pairing rules.
    overrides = {
        f"{MODELS}/deepseek_v4.py": f"{V4}/nvidia/model.py",
        f"{MODELS}/minimax_m3/minimax_m3_vl.py": f"{MINIMAX}/nvidia/model.py",
    }
    state = tmp_path_factory.mktemp("ascend-state")
    return call(root, upstream_026, state, plugin_repo=str(repo), paths=[f"{MODELS}/"], mapping_overrides=overrides)


@pytest.mark.slow
@needs_snapshots
def test_ascend_files_the_plugin_imports_as_they_are(ascend: Any) -> None:
    assert _reasons(ascend, "imported_by_local") == {
        # vllm_ascend/models/deepseek_v4.py:73 `from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache`
        # and :74 `from vllm.models.deepseek_v4.compressor import CompressorStateCache`
        f"{V4}/attention.py": f"{MODELS}/deepseek_v4.py:73",
        f"{V4}/compressor.py": f"{MODELS}/deepseek_v4.py:74",
        # deepseek_v4.py:59, deepseek_v4_mtp.py:20, minimax_m3/minimax_m3.py:65, minimax_m3_vl.py:29
        f"{CLASSIC}/interfaces.py": f"{MODELS}/deepseek_v4.py:59 (+3 files)",
        # deepseek_v4.py:66, deepseek_v4_dspark.py:34, deepseek_v4_mtp.py:21, llama_eagle3_vwn.py:21,
        # minimax_m3/minimax_m3.py:71, minimax_m3_vl.py:36
        f"{CLASSIC}/utils.py": f"{MODELS}/deepseek_v4.py:66 (+5 files)",
        # minimax_m3_vl.py:37 `from vllm.model_executor.models.vision import run_dp_sharded_mrope_vision_model`
        f"{CLASSIC}/vision.py": f"{MODELS}/minimax_m3/minimax_m3_vl.py:37",
        # minimax_m3_vl.py:46-63 `_load_vllm_minimax_m3_common_module(module_name)` loads
        # `Path(vllm.__file__).resolve().parent / "models" / "minimax_m3" / "common" / f"{module_name}.py"` with
        # import_from_path; it is called with "mm_preprocess" at :66 and "vision_tower" at :95.
        f"{MINIMAX}/common/mm_preprocess.py": f"{MODELS}/minimax_m3/minimax_m3_vl.py:66",
        f"{MINIMAX}/common/vision_tower.py": f"{MODELS}/minimax_m3/minimax_m3_vl.py:95",
    }
    imported = [t for t in ascend.target_only if t.reason == "imported_by_local"]
    assert all(t.files == 1 and not t.upstream.endswith("/") for t in imported)
    assert not any("computed at run time" in u for u in ascend.unknowns)


@pytest.mark.slow
@needs_snapshots
def test_ascend_other_platforms_and_the_family_a_flat_file_reaches(ascend: Any) -> None:
    # vllm_ascend/models/deepseek_v4.py is a flat file, not a family directory: the deepseek_v4 family is mapped
    # because its pair reaches into it. Its dispatch imports `.amd` under `current_platform.is_rocm()`
    # (vllm/models/deepseek_v4/__init__.py:17) and `.xpu` under `is_xpu()` (:23); minimax_m3's takes `.amd` only in
    # the else of `TYPE_CHECKING or not current_platform.is_rocm()` (vllm/models/minimax_m3/__init__.py:16, :22).
    other = {t.upstream: (t.kind, t.files, t.guard) for t in ascend.target_only if t.reason == "other_platform"}
    assert other == {
        f"{V4}/amd/": ("other_platform", 5, "current_platform.is_rocm()"),
        f"{V4}/xpu/": ("other_platform", 7, "not (current_platform.is_rocm()) and current_platform.is_xpu()"),
        f"{MINIMAX}/amd/": ("other_platform", 10, "not (TYPE_CHECKING or not current_platform.is_rocm())"),
    }
    listed = {t.upstream: t for t in ascend.target_only}
    # MiniMaxM3MTP is in the registry (registry.py:632) but the plugin registers no MTP model: not ported.
    assert (listed[f"{MINIMAX}/nvidia/mtp.py"].kind, listed[f"{MINIMAX}/nvidia/mtp.py"].reason) == (
        "branch",
        "not_ported",
    )
    # No release named: no file is claimed to be new at the target.
    assert {t.reason for t in ascend.target_only} == {"imported_by_local", "other_platform", "not_ported"}
    # A file whose code a local file carries (a pair's merged_from) is not target-only.
    merged = {m for p in ascend.pairs for m in p.merged_from}
    assert not merged & {t.upstream for t in ascend.target_only}


@pytest.mark.slow
@needs_snapshots
def test_gcu_files_the_plugin_imports_as_they_are(tmp_path: Path) -> None:
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / "vllm-gcu-7b5aaca941.tar.gz", tmp_path / "root")
    upstream = upstream_source("0.9.2")
    result = call(tmp_path / "root", upstream, tmp_path / "state", plugin_repo=str(repo), paths=[f"{GCU}/"])
    gcu = GCU
    assert _reasons(result, "imported_by_local") == {
        # roberta/roberta.py:15 `from vllm.model_executor.models.bert import BertEmbeddingModel, BertModel`
        f"{CLASSIC}/bert.py": f"{gcu}/roberta/roberta.py:15",
        # 9 files import it, the first deepseek_moe_quant/deepseek_moe_quant.py:42
        f"{CLASSIC}/interfaces.py": f"{gcu}/deepseek_moe_quant/deepseek_moe_quant.py:42 (+8 files)",
        # glm4/glm4.py:46 `from vllm.model_executor.models.llama import LlamaMLP as Glm4MLP` (an alias)
        f"{CLASSIC}/llama.py": f"{gcu}/glm4/glm4.py:46",
        # got_ocr2/got_ocr2.py:42 and qwen2_5_vl/qwen2_5_vl.py:55 `from ...module_mapping import MultiModelKeys`
        f"{CLASSIC}/module_mapping.py": f"{gcu}/got_ocr2/got_ocr2.py:42 (+1 file)",
        # got_ocr2/got_ocr2.py:58 and qwen3/qwen3.py:48 `from vllm.model_executor.models.qwen2 import Qwen2MLP as ...`
        f"{CLASSIC}/qwen2.py": f"{gcu}/got_ocr2/got_ocr2.py:58 (+1 file)",
        # qwen2_5_vl/qwen2_5_vl.py:64 `... import Qwen2VLDummyInputsBuilder as Qwen2_5_VLDummyInputsBuilder`
        f"{CLASSIC}/qwen2_vl.py": f"{gcu}/qwen2_5_vl/qwen2_5_vl.py:64",
        # 10 files import it, the first deepseek_moe_quant/deepseek_moe_quant.py:46
        f"{CLASSIC}/utils.py": f"{gcu}/deepseek_moe_quant/deepseek_moe_quant.py:46 (+9 files)",
    }


# -- synthetic: the base release and the collapse by reason ---------------------------------------------------

LLAMA = """\
from vllm.model_executor.models.utils import helper


class LlamaModel:
    def forward(self, x):
        return helper(x)
"""
LLAMA_V2 = (
    LLAMA
    + """
    def warmup(self):
        return None
"""
)
PLUGIN_LLAMA = """\
import importlib
import os

from vllm.model_executor.models.utils import helper
from vllm.utils.import_utils import import_from_path

OLD = importlib.import_module("vllm.model_executor.models." + "old_0")
EXTRA = import_from_path("extra", os.environ["EXTRA_MODEL"])


class LlamaModel:
    def forward(self, x):
        # MetaX: the MACA path
        return helper(x)
"""


def _write(top: Path, files: dict[str, str], message: str, tag: str | None = None) -> None:
    for path, text in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_text(text)
    if not (top / ".git").exists():
        git(top, "init", "-q")
    git(top, "add", "-A")
    git(top, "commit", "-qm", message)
    if tag:
        git(top, "tag", tag)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Upstream v1: llama.py, utils.py and ten old_*.py; v2 changes llama.py and adds nine new_*.py.
    The plugin copies llama.py of v1 and loads old_0 by a literal name and another module by a path from
    the environment."""
    root = tmp_path_factory.mktemp("base-release")
    common = {"vllm/__init__.py": "", "vllm/model_executor/__init__.py": "", f"{CLASSIC}/__init__.py": ""}
    old = {f"{CLASSIC}/old_{i}.py": f"class Old{i}:\n    pass\n" for i in range(10)}
    utils = {f"{CLASSIC}/utils.py": "def helper(x):\n    return x\n"}
    _write(root / "repos" / "vllm", {**common, **old, **utils, f"{CLASSIC}/llama.py": LLAMA}, "v1", "v1")
    new = {f"{CLASSIC}/new_{i}.py": f"class New{i}:\n    pass\n" for i in range(9)}
    _write(root / "repos" / "vllm", {**new, f"{CLASSIC}/llama.py": LLAMA_V2}, "v2", "v2")
    _write(
        root / "repos" / "plugin", {"vllm_metax/__init__.py": "", "vllm_metax/models/llama.py": PLUGIN_LLAMA}, "plugin"
    )
    return root


def _compare(root: Path, releases: list[str]) -> tuple[Pairing, list[TargetOnly], list[str]]:
    """Pair the plugin with v2, and the target-only list once the `releases` are measured."""
    runtime = Runtime.create([str(root / "repos")], mode="review", state_dir=str(root / "state"))
    policy, store = runtime.policy, runtime.store
    plugin = RevisionSubject(open_repository(root / "repos" / "plugin", policy), "HEAD")
    repo = open_repository(root / "repos" / "vllm", policy)
    inputs = pairing_inputs(plugin, ["vllm_metax/models/"], {})
    cache = RecordCache(store)
    trees = build_trees(plugin, RevisionSubject(repo, "v2"), cache, inputs.package, inputs.prefixes)
    pairing = pair_files(trees, inputs)
    unknowns = local_imports(PairingContext(trees, trees.local.read_many(inputs.local_files), {})).unknowns
    found = resolve_releases(policy, releases, repo)
    closest = closest_releases(plugin, found, cache, StatsCache(store), inputs)
    return pairing, with_new_at_target(pairing.target_only, pairing.pairs, found, closest), unknowns


def _listed(entries: list[TargetOnly]) -> list[tuple[str, str, int, str | None]]:
    return [(t.upstream, t.reason, t.files, t.by) for t in entries]


def test_files_absent_at_the_base_release_are_new_at_the_target(workspace: Path) -> None:
    pairing, marked, unknowns = _compare(workspace, ["v1", "v2"])
    assert [(p.local, p.upstream) for p in pairing.pairs] == [("vllm_metax/models/llama.py", f"{CLASSIC}/llama.py")]
    imported = [
        (f"{CLASSIC}/old_0.py", "imported_by_local", 1, "vllm_metax/models/llama.py:7"),  # import_module, a literal
        (f"{CLASSIC}/utils.py", "imported_by_local", 1, "vllm_metax/models/llama.py:4"),
    ]
    # Without the releases nothing is new: one entry for the 19 files nothing imports, each imported file apart.
    assert _listed(pairing.target_only) == [(f"{CLASSIC}/", "not_ported", 19, None), *imported]
    # llama.py differs least from v1 (v2 added warmup()): v1 is the directory's base. The nine new_*.py are
    # absent there, a directory entry of their own beside the ten files that are only not ported.
    assert _listed(marked) == [
        (f"{CLASSIC}/", "new_at_target", 9, "v1"),
        (f"{CLASSIC}/", "not_ported", 10, None),
        *imported,
    ]
    assert marked[0].members == tuple(f"{CLASSIC}/new_{i}.py" for i in range(9))
    assert marked[1].members == (f"{CLASSIC}/__init__.py", *(f"{CLASSIC}/old_{i}.py" for i in range(1, 10)))
    # The load by a path from the environment is said, not guessed.
    assert unknowns == [
        "vllm_metax/models/llama.py:8 loads a module with import_from_path() by a path computed at run time: the "
        "upstream file it loads, if any, is not marked imported_by_local."
    ]


def test_a_base_at_the_target_claims_nothing_new(workspace: Path) -> None:
    # Measured against v2 only, llama.py's base is the target itself: every target-only file exists there.
    pairing, marked, _ = _compare(workspace, ["v2"])
    assert marked == pairing.target_only
