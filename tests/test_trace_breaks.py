"""Breaks at the target, with the way forward: for every upstream import or module attribute the
plugin uses that resolves at base and not at the target, the release where it broke and where the
name went, with file:line evidence on both sides.

Real trees: vLLM 0.26.0, a 0.27.0rc1 made of 0.26.0 plus the one 0.27.0 change that moved
`vllm/multimodal/evs.py` to `vllm/multimodal/video_prune/`, 0.27.0 and 0.33.0 as tagged commits,
traced with a plugin module that imports names which really moved between those releases (found by
diffing the trees' top-level definitions; each is named where it is asserted) and with the real
vllm-ascend 7662ec925a snapshot. Synthetic trees cover what the real releases do not show: a name
that now resolves to a submodule, a function replaced by a class, a break in no release yet, and
a series of release directories.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_plugin_repo, build_upstream_history, git, upstream_source

from vllm_metax_mcp.core.code.codebase import Outcome
from vllm_metax_mcp.core.code.module_index import RecordCache
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.core.trace.defects import ImportProblem
from vllm_metax_mcp.core.trace.moves import similar
from vllm_metax_mcp.core.trace.revisions import ReleaseSeries
from vllm_metax_mcp.tools import trace_dependency as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv


def trace(root: Path, state: Path, **arguments: Any) -> Any:
    runtime = Runtime.create([str(root)], mode="edit", state_dir=str(state))
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    defaults = {"section": "defects", "limit": 1000, "probe_ops": False}
    return anyio.run(lambda: invoke(tool.SPEC, {**defaults, **arguments}, env))


def by_line(result: Any, path: str) -> dict[int, list[Any]]:
    """Import and attribute defects of one file by line (one line may import several lost names)."""
    found: dict[int, list[Any]] = {}
    for d in result.defects:
        if d.file == path and d.kind in ("breaks_at_target", "unresolved_import"):
            found.setdefault(d.line, []).append(d)
    return found


def one(found: dict[int, list[Any]], line: int, symbol: str | None = None) -> Any:
    (defect,) = [d for d in found.get(line, []) if symbol is None or d.symbol == symbol]
    return defect


def cited(defect: Any) -> set[tuple[str, int]]:
    return {(e.path, e.line) for e in defect.evidence if e.kind == "file"}


# -- synthetic upstream: what the real releases do not show ----------------------------------

TINY_V1 = {
    "vllm/__init__.py": "",
    "vllm/helpers/__init__.py": "def rotary(x):\n    return x\n\n\ndef get_cache_manager():\n    return None\n",
    "vllm/layers.py": "class Linear:\n    pass\n\n\nclass Dropout:\n    pass\n",
}
TINY_V11 = {
    "vllm/__init__.py": "",
    # 1.1: `rotary` becomes a submodule the package no longer binds; get_cache_manager() becomes a class
    "vllm/helpers/__init__.py": "class CacheManager:\n    pass\n",
    "vllm/helpers/rotary.py": "def apply(x):\n    return x\n",
    "vllm/layers.py": "class Linear:\n    pass\n\n\nclass Dropout:\n    pass\n",
}
TINY_MODEL = """\
import vllm.layers as layers
from vllm.helpers import get_cache_manager, rotary


class TinyForCausalLM:
    def __init__(self):
        self.cache = get_cache_manager()
        self.linear = layers.Linear()
        if hasattr(layers, "Dropout"):
            layers.Dropout()
        try:
            layers.Dropout()
        except AttributeError:
            pass
        self.rotary = rotary(1)
"""
HELPERS_IMPORT = "from vllm_metax.models.tiny_helpers import helper  # noqa: E402\n"
HELPERS_LINE = TINY_MODEL.count("\n") + 1


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tiny")
    sources = {
        "1.0.0": _tree(root / "src-1.0.0", TINY_V1),
        "1.1.0rc1": _tree(root / "src-1.1.0rc1", TINY_V11),
        "1.1.0": _tree(root / "src-1.1.0", {**TINY_V11, "vllm/version.py": "VERSION = '1.1.0'\n"}),
    }
    history = build_upstream_history(root / "vllm", list(sources), sources=sources)
    # after 1.1.0, untagged: Linear leaves vllm/layers.py for vllm/linear.py, Dropout goes
    history.add_commit({"vllm/layers.py": "WIDTH = 1\n", "vllm/linear.py": "class Linear:\n    pass\n"}, "move Linear")
    plugin = build_plugin_repo(
        root / "plugin", root, {}, registrations={"TinyForCausalLM": "vllm_metax.models.tiny:TinyForCausalLM"}
    )
    (plugin / "vllm_metax/models/tiny.py").write_text(TINY_MODEL + HELPERS_IMPORT)
    (plugin / "vllm_metax/models/tiny_helpers.py").write_text("def helper():\n    return 1\n")
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "tiny model")
    # the plugin's own move, its importer left behind: the stale import names this commit
    git(plugin, "mv", "vllm_metax/models/tiny_helpers.py", "vllm_metax/models/tiny_utils.py")
    git(plugin, "commit", "-qm", "rename the tiny helpers")
    moved = git(plugin, "rev-parse", "HEAD").strip()
    return {"root": root, "sources": sources, "state": tmp_path_factory.mktemp("tiny-state"), "moved": moved}


def tiny_trace(ws: dict[str, Any], target: str) -> dict[int, list[Any]]:
    """The tiny model's defects at `target` (traced once per target)."""
    if target in ws:
        return ws[target]  # type: ignore[no-any-return]
    result = trace(
        ws["root"],
        ws["state"],
        plugin_repo="plugin",
        upstream="vllm",
        base="v1.0.0",
        target=target,
        arch="TinyForCausalLM",
    )
    ws[target] = by_line(result, "vllm_metax/models/tiny.py")
    return ws[target]  # type: ignore[no-any-return]


def test_a_name_that_now_resolves_to_a_submodule_breaks_with_its_release(tiny: dict[str, Any]) -> None:
    found = tiny_trace(tiny, "v1.1.0")
    # tiny.py:2 `from vllm.helpers import rotary`: 1.0.0 helpers/__init__.py:1 defines it; 1.1.0rc1 adds
    # helpers/rotary.py and the package binds `rotary` no more, so the import yields the module
    rotary = one(found, 2, "vllm.helpers:rotary")
    assert rotary.kind == "breaks_at_target" and rotary.symbol == "vllm.helpers:rotary"
    assert rotary.release == "v1.1.0rc1"
    assert "to a submodule" in rotary.detail and "final release v1.1.0" in rotary.detail
    assert "vllm.helpers.rotary (vllm/helpers/rotary.py:1)" in rotary.detail
    assert {("vllm_metax/models/tiny.py", 2), ("vllm/helpers/__init__.py", 1), ("vllm/helpers/rotary.py", 1)} <= cited(
        rotary
    )
    assert any(e.kind == "commit" for e in rotary.evidence)


def test_a_function_replaced_by_a_class_is_named_as_the_rename(tiny: dict[str, Any]) -> None:
    found = tiny_trace(tiny, "v1.1.0")
    # tiny.py:2 `get_cache_manager` (1.0.0 helpers/__init__.py:5) is gone in 1.1.0rc1, whose package gained
    # `class CacheManager` (helpers/__init__.py:1): the words of the old name, less the verb
    renamed = one(found, 2, "vllm.helpers:get_cache_manager")
    assert renamed.kind == "breaks_at_target" and renamed.release == "v1.1.0rc1"
    assert "renamed to: class `vllm.helpers:CacheManager` (vllm/helpers/__init__.py:1)" in renamed.detail
    assert ("vllm/helpers/__init__.py", 5) in cited(renamed)
    assert similar("get_foo", "FooGetter") and similar("FusedMoE", "FusedMoEFactory") and not similar("norm", "Linear")


def test_a_module_attribute_that_broke_after_the_last_release_is_in_no_release_yet(tiny: dict[str, Any]) -> None:
    found = tiny_trace(tiny, "main")
    # tiny.py:8 `layers.Linear()`: vllm/layers.py:1 at 1.0.0; the untagged commit after 1.1.0 moved it to
    # vllm/linear.py:1. tiny.py:10 (under hasattr) and :12 (under except AttributeError) use Dropout
    # (layers.py:5 at base, gone at the target) where the plugin expects it may be missing: not reported.
    linear = one(found, 8)
    assert linear.kind == "breaks_at_target" and linear.symbol == "vllm.layers:Linear"
    assert linear.release is None and "in no release tag yet" in linear.detail
    assert (
        "`layers.Linear`" in linear.detail
        and "now defined in: class `vllm.linear:Linear` (vllm/linear.py:1)" in linear.detail
    )
    assert {("vllm/layers.py", 1), ("vllm/linear.py", 1)} <= cited(linear)
    assert 10 not in found and 12 not in found


def test_a_stale_plugin_import_names_the_plugin_commit_that_moved_its_module(tiny: dict[str, Any]) -> None:
    # tiny.py's last line imports vllm_metax.models.tiny_helpers; the fixture's last plugin commit
    # moved that file to tiny_utils.py and left the import as it was
    stale = one(tiny_trace(tiny, "v1.1.0"), HELPERS_LINE)
    assert stale.kind == "unresolved_import"
    assert f"plugin commit {tiny['moved'][:12]} ('rename the tiny helpers')" in stale.detail
    assert "moved it to vllm_metax/models/tiny_utils.py" in stale.detail
    assert [e.sha for e in stale.evidence if e.kind == "commit"] == [tiny["moved"]]


def test_release_directories_name_the_first_release_where_it_fails(tiny: dict[str, Any], tmp_path: Path) -> None:
    sources = tiny["sources"]
    cache = RecordCache(StateStore(tmp_path))
    series = ReleaseSeries([(label, DirectorySubject(path)) for label, path in sources.items()], cache)
    moved = ImportProblem("vllm_metax.models.tiny", 2, "vllm.helpers", "get_cache_manager", Outcome.MISSING_NAME)
    found = series.first_break(moved.holds)
    assert found is not None and found.release == "1.1.0rc1"
    assert "resolves in 1.0.0" in found.text
    base = series.base_evidence("vllm/helpers/__init__.py", 5)
    assert base.kind == "file" and base.rev == DirectorySubject(sources["1.0.0"]).sha("vllm/helpers/__init__.py")
    stays = ImportProblem("vllm_metax.models.tiny", 1, "vllm.layers", "Linear", Outcome.MISSING_NAME)
    assert series.first_break(stays.holds) is None


# -- real releases ---------------------------------------------------------------------------

BREAKS = "vllm_metax/models/breaks.py"
BREAKS_MODEL = """\
import vllm.model_executor.layers.fused_moe.layer as moe_layer
import vllm.v1.attention.ops.common as attn_common
from vllm.model_executor.layers import batch_invariant, fused_moe
from vllm.model_executor.layers.fused_moe import FusedMoE, FusedMoEConfig
from vllm.model_executor.models.kimi_linear import KimiMoE
from vllm.multimodal.evs import compute_mrope_for_media, compute_retention_mask
from vllm.transformers_utils.configs.deepseek_v4 import DeepseekV4Config


class BreaksForCausalLM:
    def __init__(self, config: DeepseekV4Config, moe: FusedMoEConfig):
        self.experts = moe_layer.FusedMoE(moe)
        self.shared = fused_moe.FusedMoE(moe)
        self.other = FusedMoE(moe)
        self.kimi = KimiMoE(config)
        batch_invariant.init_batch_invariance()

    def forward(self, x):
        x = attn_common.correct_attn_out(x)
        keep = compute_retention_mask(x)
        return compute_mrope_for_media(keep), moe_layer.FusedMoE
"""


def _rc_tree(root: Path) -> Path:
    """0.26.0 with only 0.27.0's move of vllm/multimodal/evs.py to vllm/multimodal/video_prune/."""
    shutil.copytree(upstream_source("0.26.0") / "vllm", root / "vllm")
    (root / "vllm/multimodal/evs.py").unlink()
    shutil.copytree(upstream_source("0.27.0") / "vllm/multimodal/video_prune", root / "vllm/multimodal/video_prune")
    return root


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("breaks")
    rc = _rc_tree(tmp_path_factory.mktemp("rc"))
    history = build_upstream_history(
        root / "vllm", ["0.26.0", "0.27.0rc1", "0.27.0", "0.33.0"], include=["vllm/"], sources={"0.27.0rc1": rc}
    )
    plugin = build_plugin_repo(
        root / "plugin",
        upstream_026,
        {},
        registrations={"BreaksForCausalLM": "vllm_metax.models.breaks:BreaksForCausalLM"},
    )
    (plugin / BREAKS).write_text(BREAKS_MODEL)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "a model on names that moved")
    state = tmp_path_factory.mktemp("breaks-state")
    result = trace(
        root, state, plugin_repo="plugin", upstream="vllm", base="v0.26.0", target="v0.33.0", arch="BreaksForCausalLM"
    )
    shas = {tag: history.rev_parse(tag) for tag in history.tags}
    return {"root": root, "state": state, "result": result, "found": by_line(result, BREAKS), "shas": shas}


def commits(defect: Any) -> list[str]:
    return [e.sha for e in defect.evidence if e.kind == "commit"]


@pytest.mark.slow
def test_a_moved_module_breaks_in_the_pre_release_that_moved_it(real: dict[str, Any]) -> None:
    # breaks.py:6 imports compute_retention_mask and compute_mrope_for_media from vllm.multimodal.evs
    # (0.26.0 evs.py:38, :95); 0.27.0rc1 moved the file to vllm/multimodal/video_prune/evs.py (:38, :95).
    # vidcom2.py:33 also defines a compute_retention_mask: listed second, since video_prune.evs defines
    # both names the plugin takes from the lost module and shares its basename.
    lost = real["found"][6]
    assert len(lost) == 2 and {d.release for d in lost} == {"v0.27.0rc1"}
    mask = next(d for d in lost if d.symbol == "vllm.multimodal.evs:compute_retention_mask")
    assert commits(mask) == [real["shas"]["v0.27.0rc1"]]
    assert "final release v0.27.0" in mask.detail
    assert "defined in several target modules, best first" in mask.detail
    assert mask.detail.index("video_prune.evs:compute_retention_mask") < mask.detail.index("vidcom2")
    assert {
        ("vllm/multimodal/evs.py", 38),
        ("vllm/multimodal/video_prune/evs.py", 38),
        ("vllm/multimodal/video_prune/vidcom2.py", 33),
    } <= cited(mask)
    # vidcom2.py defines no compute_mrope_for_media: the lost name itself decides who is a candidate
    media = one(real["found"], 6, "vllm.multimodal.evs:compute_mrope_for_media")
    assert media.detail.endswith(
        "now defined in: function `vllm.multimodal.video_prune.evs:compute_mrope_for_media` "
        "(vllm/multimodal/video_prune/evs.py:95)"
    )


@pytest.mark.slow
def test_a_renamed_function_and_its_attribute_uses(real: dict[str, Any]) -> None:
    # 0.26.0 fused_moe/layer.py:100 `def FusedMoE(`, re-exported by fused_moe/__init__.py:22; 0.27.0 renamed it
    # `def FusedMoEFactory(` (0.33.0 layer.py:92) and the package exports that name instead
    found = real["found"]
    imported, through_module, through_package = one(found, 4), one(found, 12), one(found, 13)
    for defect in (imported, through_module, through_package):
        assert defect.kind == "breaks_at_target" and defect.release == "v0.27.0", defect.detail
        assert commits(defect) == [real["shas"]["v0.27.0"]]
        assert "renamed to: function `vllm.model_executor.layers.fused_moe.layer:FusedMoEFactory`" in defect.detail
        assert {
            ("vllm/model_executor/layers/fused_moe/layer.py", 100),
            ("vllm/model_executor/layers/fused_moe/layer.py", 92),
        } <= cited(defect)
    assert imported.symbol == "vllm.model_executor.layers.fused_moe:FusedMoE"
    # breaks.py:12 and :21 use moe_layer.FusedMoE: one defect at the first use, counting both
    assert "`moe_layer.FusedMoE` (2 uses)" in through_module.detail
    assert through_module.symbol == "vllm.model_executor.layers.fused_moe.layer:FusedMoE"
    assert "`fused_moe.FusedMoE`" in through_package.detail and 21 not in found
    # FusedMoEConfig (breaks.py:4) is still defined in fused_moe/config.py at 0.33.0: no defect
    assert not any(d.symbol.endswith(":FusedMoEConfig") for ds in found.values() for d in ds)


@pytest.mark.slow
def test_ambiguous_moves_list_every_candidate(real: dict[str, Any]) -> None:
    # breaks.py:5 KimiMoE: 0.26.0 model_executor/models/kimi_linear.py:104; 0.27.0 removed the module and
    # 0.33.0 defines KimiMoE in vllm/models/kimi_k3/amd/linear.py:198 and nvidia/model.py:363 alike
    kimi = one(real["found"], 5)
    assert kimi.release == "v0.27.0" and "defined in several target modules" in kimi.detail
    assert {("vllm/models/kimi_k3/amd/linear.py", 198), ("vllm/models/kimi_k3/nvidia/model.py", 363)} <= cited(kimi)


@pytest.mark.slow
def test_breaks_of_the_later_release_with_where_the_name_went(real: dict[str, Any]) -> None:
    found = real["found"]
    # breaks.py:3 batch_invariant: 0.26.0 vllm/model_executor/layers/batch_invariant.py; 0.33.0 moved the
    # module to vllm/model_executor/determinism/batch_invariant.py (init_batch_invariance :984 -> :1433)
    module = one(found, 3, "vllm.model_executor.layers:batch_invariant")
    assert module.release == "v0.33.0" and commits(module) == [real["shas"]["v0.33.0"]]
    assert "`vllm.model_executor.determinism.batch_invariant`" in module.detail
    # breaks.py:19 attn_common.correct_attn_out: 0.26.0 vllm/v1/attention/ops/common.py:111, 0.33.0 dcp.py:376
    correct = one(found, 19)
    assert correct.release == "v0.33.0" and "`attn_common.correct_attn_out`" in correct.detail
    assert {("vllm/v1/attention/ops/common.py", 111), ("vllm/v1/attention/ops/dcp.py", 376)} <= cited(correct)
    # breaks.py:7 DeepseekV4Config: 0.26.0 transformers_utils/configs/deepseek_v4.py:8; 0.33.0 deleted it and
    # vllm/models/deepseek_v4/common/mm_preprocess.py:30 imports it `from transformers`
    config = one(found, 7)
    assert config.release == "v0.33.0"
    assert (
        "upstream imports it from `transformers` (vllm/models/deepseek_v4/common/mm_preprocess.py:30)" in config.detail
    )
    assert ("vllm/transformers_utils/configs/deepseek_v4.py", 8) in cited(config)


@pytest.mark.slow
def test_every_break_names_file_line_release_and_evidence(real: dict[str, Any]) -> None:
    breaks = [d for d in real["result"].defects if d.kind == "breaks_at_target"]
    assert len(breaks) == 9
    for defect in breaks:
        assert defect.file == BREAKS and defect.line > 0 and defect.release, defect.detail
        assert commits(defect) and len(cited(defect)) >= 2, defect.detail


@pytest.mark.slow
@needs_snapshots
def test_the_real_plugin_breaks_with_their_releases(real: dict[str, Any], tmp_path: Path) -> None:
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / "vllm-ascend-7662ec925a.tar.gz", real["root"] / "ascend")
    result = trace(
        real["root"],
        real["state"],
        plugin_repo=str(repo.relative_to(real["root"])),
        upstream="vllm",
        base="v0.26.0",
        target="v0.33.0",
        arch="DeepseekV4ForCausalLM",
    )
    found = by_line(result, "vllm_ascend/models/deepseek_v4.py")
    # deepseek_v4.py:47 `from vllm.model_executor.layers.fused_moe import FusedMoE`: renamed in 0.27.0
    fused = one(found, 47)
    assert fused.release == "v0.27.0" and "FusedMoEFactory" in fused.detail
    # deepseek_v4.py:77 `from vllm.transformers_utils.configs.deepseek_v4 import DeepseekV4Config`: gone in
    # 0.33.0, where upstream imports the config from transformers
    config = one(found, 77)
    assert config.release == "v0.33.0" and "`transformers`" in config.detail
