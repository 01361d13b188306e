"""diff_model on real upstream vLLM trees (0.26.0 and 0.33.0 wheels) and a MACA-like plugin built from them.

The plugin copies real upstream files with the edits the real plugin makes: imports swapped to
`vllm_metax.*`, a class renamed `Maca*`, an FP8 branch deleted, `deepseek_v4/nvidia/` and
`common/ops/` flattened, a file renamed (`_fp8` dropped), a subclassing file, a kernel named like
upstream `torch.py` whose content is upstream `aiter.py`, a registration module, a local-only
helper and a file that does not parse. Between the two releases upstream moved two of the copied
files and deleted a classic model, and added a `cpu/` platform branch.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from workbench import build_plugin_repo, build_upstream_history, default_maca_edit, git

from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.compare.affixes import VendorAffixes
from vllm_metax_mcp.core.compare.family import SubdirKind, family_layout
from vllm_metax_mcp.core.compare.model_diff import DEFAULT_LIMITS
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.tools import diff_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.slow

V4 = "vllm/models/deepseek_v4"
PKG = "vllm_metax/models/deepseek_v4"
KERNELS = "vllm_metax/model_executor/kernels"
PATHS = ["vllm_metax/models/", f"{KERNELS}/"]
COPIES = {
    f"{PKG}/model.py": f"{V4}/nvidia/model.py",
    f"{PKG}/mtp.py": f"{V4}/nvidia/mtp.py",
    f"{PKG}/attention.py": f"{V4}/attention.py",
    f"{PKG}/prepare_megamoe.py": f"{V4}/nvidia/ops/prepare_megamoe.py",
    f"{PKG}/cache_utils.py": f"{V4}/common/ops/cache_utils.py",
    f"{PKG}/fused_qk_rmsnorm.py": f"{V4}/common/ops/fused_qk_rmsnorm.py",
    f"{PKG}/fused_inv_rope_quant.py": f"{V4}/common/ops/fused_inv_rope_fp8_quant.py",
    "vllm_metax/models/deepseek_v2.py": "vllm/model_executor/models/deepseek_v2.py",
    "vllm_metax/models/phi.py": "vllm/model_executor/models/phi.py",
    f"{KERNELS}/mhc/torch.py": "vllm/model_executor/kernels/mhc/aiter.py",
}
VERBATIM = {f"{PKG}/cache_utils.py", f"{PKG}/fused_qk_rmsnorm.py", f"{KERNELS}/mhc/torch.py"}
FP8_BRANCH = '    if kv_cache_dtype.startswith("fp8"):\n        return kv_cache_dtype, torch.float8_e4m3fn\n'
SUBCLASS = """\
from vllm.models.deepseek_v4.compressor import DeepseekCompressor


class MacaDeepseekCompressor(DeepseekCompressor):
    def forward(self, *args, **kwargs):
        # MetaX: the MACA compressor keeps the BF16 path
        return super().forward(*args, **kwargs)

    def maca_warmup(self):
        return None
"""


def maca_edits(local: str, text: str) -> str:
    if local in VERBATIM:
        return text
    text = default_maca_edit(COPIES)(local, text)
    if local == f"{PKG}/model.py":
        text = re.sub(r"\bDeepseekV4MLP\b", "MacaDeepseekV4MLP", text)
        text = text.replace(
            "from vllm.model_executor.layers.layernorm import", "from vllm_metax.model_executor.layers.layernorm import"
        )
    if local == f"{PKG}/attention.py":
        assert FP8_BRANCH in text
        text = text.replace(FP8_BRANCH, "")
    return text


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path, upstream_033: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("diffmodel")
    history = build_upstream_history(root / "vllm", ["0.26.0", "0.33.0"], include=["vllm/"])
    plugin = build_plugin_repo(
        root / "plugin",
        upstream_026,
        COPIES,
        edits=maca_edits,
        registrations={
            "DeepseekV4ForCausalLM": "vllm_metax.models.deepseek_v4:DeepseekV4ForCausalLM",
            "DeepseekV2ForCausalLM": "vllm_metax.models.deepseek_v2:DeepseekV2ForCausalLM",
        },
    )
    (plugin / PKG / "__init__.py").write_text(
        "from .model import DeepseekV4ForCausalLM\nfrom .mtp import DeepSeekV4MTP\n"
    )
    (plugin / PKG / "maca_compressor.py").write_text(SUBCLASS)
    (plugin / PKG / "maca_utils.py").write_text("def maca_device_count() -> int:\n    return 1\n")
    broken = (upstream_026 / V4 / "sparse_mla.py").read_text().replace("def ", "def (", 1)
    (plugin / PKG / "sparse_mla.py").write_text(broken)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "MACA subclass, helper and a broken copy")
    return {
        "root": root,
        "plugin": plugin,
        "history": history,
        "state": tmp_path_factory.mktemp("diffmodel-state"),
        "026": upstream_026,
    }


def page(ws: dict[str, Any], mode: str = "edit", **arguments: Any) -> Any:
    """One page, as a call with these arguments answers it."""
    runtime = Runtime.create([str(ws["root"])], mode=mode, state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="diff_model")
    defaults = {"plugin_repo": "plugin", "upstream": "vllm", "target": "v0.26.0", "paths": PATHS, "limit": 500}
    output = anyio.run(lambda: invoke(tool.SPEC, {**defaults, **arguments}, env))
    assert len(text_of(output)) <= RESULT_BUDGET
    return output


def run(ws: dict[str, Any], mode: str = "edit", **arguments: Any) -> Any:
    """Every page of a pair listing as one result (pairs of all pages, the rest from the first page);
    other details: one page."""
    first = output = page(ws, mode, **arguments)
    if arguments.get("detail", "summary") not in ("summary", "symbols", "releases"):
        return first
    pairs = list(first.pairs)
    while output.next_cursor:
        output = page(ws, mode, **arguments, cursor=output.next_cursor)
        pairs += output.pairs
    return first.model_copy(update={"pairs": pairs, "next_cursor": None})


@pytest.fixture(scope="module")
def at_026(workspace: dict[str, Any]) -> Any:
    return run(workspace, detail="symbols")


@pytest.fixture(scope="module")
def at_033(workspace: dict[str, Any]) -> Any:
    return run(workspace, detail="symbols", target="v0.33.0")


def by_local(result: Any) -> dict[str, Any]:
    return {pair.local: pair for pair in result.pairs}


def table(result: Any) -> dict[str, tuple[str | None, str, str]]:
    return {p.local: (p.upstream, p.rule, p.status) for p in result.pairs}


def blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


PAIRING_026 = {
    f"{KERNELS}/__init__.py": ("vllm/model_executor/kernels/__init__.py", "same_path", "identical"),
    f"{KERNELS}/mhc/__init__.py": ("vllm/model_executor/kernels/mhc/__init__.py", "same_path", "changed"),
    f"{KERNELS}/mhc/torch.py": ("vllm/model_executor/kernels/mhc/torch.py", "same_path", "changed"),
    "vllm_metax/models/__init__.py": (None, "registration", "local_only"),
    # The plugin registers DeepseekV2ForCausalLM from vllm_metax.models.deepseek_v2 (the workspace's
    # registrations), which upstream's registry.py maps to deepseek_v2: the registry decides, the path agrees.
    "vllm_metax/models/deepseek_v2.py": ("vllm/model_executor/models/deepseek_v2.py", "registry", "changed"),
    "vllm_metax/models/phi.py": ("vllm/model_executor/models/phi.py", "same_path", "changed"),
    f"{PKG}/__init__.py": (f"{V4}/__init__.py", "same_path", "changed"),
    f"{PKG}/attention.py": (f"{V4}/attention.py", "same_path", "changed"),
    f"{PKG}/cache_utils.py": (f"{V4}/common/ops/cache_utils.py", "shared_dir", "identical"),
    f"{PKG}/fused_inv_rope_quant.py": (f"{V4}/common/ops/fused_inv_rope_fp8_quant.py", "renamed", "changed"),
    f"{PKG}/fused_qk_rmsnorm.py": (f"{V4}/common/ops/fused_qk_rmsnorm.py", "shared_dir", "identical"),
    f"{PKG}/maca_compressor.py": (f"{V4}/compressor.py", "subclass", "changed"),
    f"{PKG}/maca_utils.py": (None, "none", "local_only"),
    # DeepseekV4ForCausalLM is registered from vllm_metax.models.deepseek_v4 (re-exported from .model); upstream's
    # registry maps it to vllm.models.deepseek_v4, whose dispatch takes .nvidia.model for an out-of-tree platform.
    f"{PKG}/model.py": (f"{V4}/nvidia/model.py", "registry", "changed"),
    f"{PKG}/mtp.py": (f"{V4}/nvidia/mtp.py", "platform_branch", "changed"),
    f"{PKG}/prepare_megamoe.py": (f"{V4}/nvidia/ops/prepare_megamoe.py", "platform_branch", "changed"),
    f"{PKG}/sparse_mla.py": (f"{V4}/sparse_mla.py", "same_path", "changed"),
}


def test_every_plugin_file_is_paired_by_its_rule_at_026(at_026: Any) -> None:
    assert table(at_026) == PAIRING_026
    assert at_026.counts == {"changed": 12, "identical": 3, "local_only": 2, "target_only": 321}
    assert at_026.total == len(PAIRING_026) and at_026.next_cursor is None
    assert at_026.upstream_target.startswith("v0.26.0 (")


def test_pairing_at_033_follows_moves_and_deletions_and_ignores_the_new_cpu_branch(
    workspace: dict[str, Any], at_033: Any
) -> None:
    release = workspace["history"].rev_parse("v0.33.0")
    expected = {
        **PAIRING_026,
        f"{PKG}/cache_utils.py": (f"{V4}/common/ops/cache_utils.py", "shared_dir", "changed"),
        f"{PKG}/fused_qk_rmsnorm.py": ("vllm/models/common/ops/fused_qk_rmsnorm.py", "renamed", "changed"),
        f"{PKG}/prepare_megamoe.py": (
            "vllm/model_executor/layers/fused_moe/prepare_megamoe.py",
            "upstream_original",
            "changed",
        ),
        "vllm_metax/models/phi.py": ("vllm/model_executor/models/phi.py", "history", "removed"),
    }
    assert table(at_033) == expected
    # 400: the renamed fused_qk_rmsnorm.py reaches into vllm/models/common/, whose __init__.py is listed too.
    assert at_033.counts == {"changed": 13, "identical": 1, "local_only": 2, "removed": 1, "target_only": 400}
    pairs = by_local(at_033)
    for moved, old in ((f"{PKG}/fused_qk_rmsnorm.py", "common/ops"), (f"{PKG}/prepare_megamoe.py", "nvidia/ops")):
        assert pairs[moved].flags == ["moved"]
        commits = [e for e in pairs[moved].evidence if e.kind == "commit"]
        assert [c.sha for c in commits] == [release]
        assert any(e.kind == "note" and f"{V4}/{old}/" in e.text for e in pairs[moved].evidence)
    removed = pairs["vllm_metax/models/phi.py"]
    assert removed.stats is None and removed.symbols is None and removed.confidence == 0.8
    assert [e.sha for e in removed.evidence if e.kind == "commit"] == [release]


def _dispatch_line(init: Path, subdir: str) -> int:
    """The first import of `.subdir` after the final `else:` of the family dispatch."""
    lines = init.read_text().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("else:"))
    return next(i + 1 for i, line in enumerate(lines) if i > start and f"from .{subdir}" in line)


@pytest.mark.parametrize("target", ["v0.26.0", "v0.33.0"])
def test_platform_branch_evidence_cites_the_dispatch_line(
    workspace: dict[str, Any], at_026: Any, at_033: Any, upstream_033: Path, target: str
) -> None:
    result, tree = (at_026, workspace["026"]) if target == "v0.26.0" else (at_033, upstream_033)
    init = tree / V4 / "__init__.py"
    mtp = by_local(result)[f"{PKG}/mtp.py"]
    file_evidence, note = mtp.evidence
    assert (file_evidence.path, file_evidence.line) == (f"{V4}/__init__.py", _dispatch_line(init, "nvidia"))
    assert file_evidence.rev == blob(init.read_bytes())
    assert "taken branch" in note.text and "not (current_platform.is_rocm())" in note.text
    assert ("is_cpu()" in note.text) is (target == "v0.33.0")
    assert note.text.endswith("nvidia/mtp.py flattened to mtp.py")
    # model.py defines the registered DeepseekV4ForCausalLM: the registry decides, and its evidence follows the
    # same dispatch (the import of the class from .nvidia.model) to the file; the path rule agrees.
    model = by_local(result)[f"{PKG}/model.py"]
    assert (model.upstream, model.rule, model.flags) == (f"{V4}/nvidia/model.py", "registry", [])
    cited = [(e.path, e.line) for e in model.evidence if e.kind == "file"]
    assert (f"{V4}/__init__.py", _dispatch_line(init, "nvidia.model")) in cited


def test_shared_directory_is_decided_by_imports_on_the_taken_path(at_026: Any, at_033: Any) -> None:
    old = by_local(at_026)[f"{PKG}/cache_utils.py"].evidence
    assert (old[0].path, old[0].line) == (f"{V4}/attention.py", 25)  # 0.26: the dispatch never names common/
    assert old[1].text == "common/ is imported on the taken path; common/ops/cache_utils.py flattened to cache_utils.py"
    new = by_local(at_033)[f"{PKG}/cache_utils.py"].evidence
    assert new[0].path == f"{V4}/__init__.py"  # 0.33: both the taken and another branch import common/
    assert "and by another platform's branch" in new[1].text


def test_line_statistics_are_exact_and_agree_with_git(workspace: dict[str, Any], at_026: Any) -> None:
    expected = {
        f"{KERNELS}/__init__.py": (0, 0, 0),
        f"{KERNELS}/mhc/__init__.py": (0, 29, 1),
        f"{KERNELS}/mhc/torch.py": (91, 59, 7),
        "vllm_metax/models/deepseek_v2.py": (4, 0, 1),
        "vllm_metax/models/phi.py": (4, 0, 1),
        f"{PKG}/__init__.py": (2, 39, 1),
        f"{PKG}/attention.py": (4, 2, 2),
        f"{PKG}/cache_utils.py": (0, 0, 0),
        f"{PKG}/fused_inv_rope_quant.py": (4, 0, 1),
        f"{PKG}/fused_qk_rmsnorm.py": (0, 0, 0),
        f"{PKG}/maca_compressor.py": (7, 436, 3),
        f"{PKG}/model.py": (9, 5, 6),
        f"{PKG}/mtp.py": (5, 1, 2),
        f"{PKG}/prepare_megamoe.py": (4, 0, 1),
        f"{PKG}/sparse_mla.py": (1, 1, 1),
    }
    stats = {p.local: (p.stats.added, p.stats.removed, p.stats.hunks) for p in at_026.pairs if p.stats}
    assert stats == expected
    # the MACA edits are small: git's own zero-context diff counts the same lines and hunks
    copies = sorted(set(expected) - {f"{KERNELS}/mhc/torch.py", f"{PKG}/maca_compressor.py"})
    for local in copies:
        upstream = workspace["026"] / by_local(at_026)[local].upstream
        diff = subprocess.run(
            ["git", "diff", "--no-index", "--no-color", "-U0", str(upstream), str(workspace["plugin"] / local)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.splitlines()
        added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
        removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
        assert (added, removed, sum(1 for line in diff if line.startswith("@@"))) == expected[local], local


def test_symbol_diff_reports_renames_the_deleted_fp8_branch_and_import_swaps(at_026: Any) -> None:
    pairs = by_local(at_026)
    model = pairs[f"{PKG}/model.py"].symbols
    assert (model.added, model.removed, model.changed) == (["MACA_KEEP_BF16"], [], ["DeepseekV4MoE.__init__"])
    assert [(r.local, r.upstream, r.how, r.similarity) for r in model.renamed] == [
        ("MacaDeepseekV4MLP", "DeepseekV4MLP", "vendor_affix", 1.0)
    ]
    assert model.signatures == [] and model.bases == []
    swaps = {(s.name, s.local_module, s.upstream_module, s.paired) for s in pairs[f"{PKG}/model.py"].import_swaps}
    assert swaps == {
        ("DeepseekV4Attention", "vllm_metax.models.deepseek_v4.attention", "vllm.models.deepseek_v4.attention", True),
        ("RMSNorm", "vllm_metax.model_executor.layers.layernorm", "vllm.model_executor.layers.layernorm", False),
        (
            "prepare_megamoe_inputs",
            "vllm_metax.models.deepseek_v4.prepare_megamoe",
            "vllm.models.deepseek_v4.nvidia.ops.prepare_megamoe",
            True,
        ),
    }
    attention = pairs[f"{PKG}/attention.py"].symbols
    assert (attention.added, attention.removed, attention.changed) == (
        ["MACA_KEEP_BF16"],
        [],
        ["_resolve_dsv4_kv_cache_dtype"],
    )
    # relative imports follow the flattened copy: `.model` is the plugin's model.py, upstream's nvidia/model.py
    mtp_swaps = {(s.name, s.local_module, s.paired) for s in pairs[f"{PKG}/mtp.py"].import_swaps}
    assert ("DeepseekV4DecoderLayer", "vllm_metax.models.deepseek_v4.model", True) in mtp_swaps
    renamed = pairs[f"{PKG}/fused_inv_rope_quant.py"].symbols
    assert (renamed.added, renamed.removed, renamed.changed, renamed.renamed) == (["MACA_KEEP_BF16"], [], [], [])
    # a verbatim copy: all 13 top-level symbols of upstream common/ops/cache_utils.py (from
    # quantize_and_insert_k_kernel at :28 to _build_flashinfer_mixed_sparse_indices_kernel at :809) are unchanged
    assert pairs[f"{PKG}/cache_utils.py"].symbols.model_dump() == {
        "added": [],
        "removed": [],
        "changed": [],
        "renamed": [],
        "signatures": [],
        "bases": [],
        "unchanged": 13,
    }


def test_subclassing_file_is_diffed_against_the_class_it_extends(at_026: Any) -> None:
    pair = by_local(at_026)[f"{PKG}/maca_compressor.py"]
    local_class, upstream_class, note = pair.evidence
    assert (local_class.path, local_class.line) == (f"{PKG}/maca_compressor.py", 4)
    assert upstream_class.path == f"{V4}/compressor.py"
    assert note.text == "MacaDeepseekCompressor extends vllm.models.deepseek_v4.compressor:DeepseekCompressor"
    symbols = pair.symbols
    assert [(r.local, r.upstream, r.how) for r in symbols.renamed] == [
        ("MacaDeepseekCompressor", "DeepseekCompressor", "subclass")
    ]
    assert symbols.changed == ["MacaDeepseekCompressor.forward"]
    assert symbols.added == ["MacaDeepseekCompressor.maca_warmup"]
    assert symbols.removed == []  # inherited, not removed
    assert [(s.symbol, s.local) for s in symbols.signatures] == [
        ("MacaDeepseekCompressor.forward", "(self, *args, **kwargs)")
    ]


def test_content_similarity_raises_flags_but_never_decides(at_026: Any, at_033: Any) -> None:
    # A name-only twin: the same path as upstream kernels/mhc/torch.py, none of its names (the symbol diff below
    # removes both of them), the content of aiter.py (all 4 of its names).
    twin = by_local(at_026)[f"{KERNELS}/mhc/torch.py"]
    assert (twin.upstream, twin.rule, twin.flags, twin.confidence) == (
        "vllm/model_executor/kernels/mhc/torch.py",
        "same_path",
        ["name_only", "content_matches_other"],
        0.45,
    )
    assert [(c.upstream, c.similarity, c.shared_symbols) for c in twin.candidates] == [
        ("vllm/model_executor/kernels/mhc/torch.py", 0.4, 0),
        ("vllm/model_executor/kernels/mhc/aiter.py", 1.0, 4),
    ]
    assert twin.symbols.removed == ["mhc_post_torch", "mhc_pre_torch"]
    # real upstream drift: by 0.33 the v4 copy of cache_utils reads more like deepseek_v41's; the dispatch still decides
    drifted = by_local(at_033)[f"{PKG}/cache_utils.py"]
    assert (drifted.rule, drifted.upstream, drifted.flags) == (
        "shared_dir",
        f"{V4}/common/ops/cache_utils.py",
        ["content_matches_other"],
    )
    assert [(c.upstream, c.similarity) for c in drifted.candidates] == [
        (f"{V4}/common/ops/cache_utils.py", 0.6),
        ("vllm/models/deepseek_v41/common/ops/cache_utils.py", 0.71),
    ]
    assert all(not p.flags for p in at_026.pairs if p.local not in (twin.local, f"{PKG}/sparse_mla.py"))


def test_target_only_lists_the_mapped_directories_and_other_platforms_as_such(at_026: Any, at_033: Any) -> None:
    # Each file is listed with where it lies and why no plugin file pairs with it; a file a compared plugin file
    # imports as it is keeps its own entry, with the importer (e.g. vllm_metax/models/deepseek_v4/model.py:21 imports
    # kernels/mhc/tilelang.py, model.py:69 and :73 nvidia/flashinfer_sparse.py and flashmla.py).
    listed = [(t.upstream, t.kind, t.reason, t.files, t.guard) for t in at_026.target_only]
    assert listed == [
        ("vllm/model_executor/kernels/mhc/aiter.py", "directory", "not_ported", 1, None),
        ("vllm/model_executor/kernels/mhc/tilelang.py", "directory", "imported_by_local", 1, None),
        ("vllm/model_executor/kernels/mhc/tilelang_kernels.py", "directory", "not_ported", 1, None),
        ("vllm/model_executor/kernels/mhc/triton.py", "directory", "not_ported", 1, None),
        ("vllm/model_executor/models/", "directory", "not_ported", 285, None),
        ("vllm/model_executor/models/deepseek_mtp.py", "directory", "imported_by_local", 1, None),
        ("vllm/model_executor/models/interfaces.py", "directory", "imported_by_local", 1, None),
        ("vllm/model_executor/models/utils.py", "directory", "imported_by_local", 1, None),
        (f"{V4}/quant_config.py", "family", "not_ported", 1, None),
        (f"{V4}/amd/", "other_platform", "other_platform", 5, "current_platform.is_rocm()"),
        (f"{V4}/common/__init__.py", "shared", "not_ported", 1, None),
        (f"{V4}/common/rope.py", "shared", "imported_by_local", 1, None),
        (f"{V4}/common/ops/__init__.py", "shared", "imported_by_local", 1, None),
        (f"{V4}/common/ops/fused_compress_quant_cache.py", "shared", "not_ported", 1, None),
        (f"{V4}/common/ops/fused_indexer_q.py", "shared", "not_ported", 1, None),
        (f"{V4}/common/ops/fused_mtp_input_rmsnorm.py", "shared", "imported_by_local", 1, None),
        (f"{V4}/common/ops/save_partial_states.py", "shared", "not_ported", 1, None),
        (f"{V4}/nvidia/__init__.py", "branch", "not_ported", 1, None),
        (f"{V4}/nvidia/dspark.py", "branch", "not_ported", 1, None),
        (f"{V4}/nvidia/flashinfer_sparse.py", "branch", "imported_by_local", 1, None),
        (f"{V4}/nvidia/flashmla.py", "branch", "imported_by_local", 1, None),
        (f"{V4}/nvidia/ops/__init__.py", "branch", "not_ported", 1, None),
        (f"{V4}/nvidia/ops/dequant_gather_k_cutedsl.py", "branch", "imported_by_local", 1, None),
        (f"{V4}/nvidia/ops/fused_indexer_q_cutedsl.py", "branch", "not_ported", 1, None),
        (f"{V4}/nvidia/ops/o_proj.py", "branch", "not_ported", 1, None),
        (f"{V4}/nvidia/ops/sparse_attn_compress_cutedsl.py", "branch", "not_ported", 1, None),
        (
            f"{V4}/xpu/",
            "other_platform",
            "other_platform",
            7,
            "not (current_platform.is_rocm()) and current_platform.is_xpu()",
        ),
    ]
    by = {t.upstream: t.by for t in at_026.target_only}
    assert by["vllm/model_executor/kernels/mhc/tilelang.py"] == "vllm_metax/models/deepseek_v4/model.py:21 (+1 file)"
    assert by[f"{V4}/nvidia/flashmla.py"] == "vllm_metax/models/deepseek_v4/model.py:73"
    later = {t.upstream: t for t in at_033.target_only}
    assert later[f"{V4}/cpu/"].kind == "other_platform" and later[f"{V4}/cpu/"].files == 8
    assert later[f"{V4}/cpu/"].guard.endswith("current_platform.is_cpu()")
    assert later[f"{V4}/common/vl_model.py"].kind == "shared" and later[f"{V4}/nvidia/vl_model.py"].kind == "branch"
    assert f"{V4}/nvidia/model.py" not in later


def test_mapping_overrides_win_over_every_rule(workspace: dict[str, Any]) -> None:
    overrides = {
        f"{PKG}/model.py": f"{V4}/amd/model.py",
        f"{PKG}/attention.py": None,
        f"{PKG}/maca_utils.py": f"{V4}/no_such_file.py",
    }
    pairs = by_local(run(workspace, mapping_overrides=overrides))
    assert table_subset(pairs, overrides) == {
        f"{PKG}/model.py": (f"{V4}/amd/model.py", "override", "changed", 0.7),
        f"{PKG}/attention.py": (None, "override", "local_only", 1.0),
        f"{PKG}/maca_utils.py": (f"{V4}/no_such_file.py", "override", "removed", 1.0),
    }
    # the caller decides; content still says which upstream file the copy really follows
    assert pairs[f"{PKG}/model.py"].flags == ["content_matches_other"]
    assert pairs[f"{PKG}/model.py"].candidates[-1].upstream == f"{V4}/nvidia/model.py"
    with pytest.raises(Exception) as refused:
        run(workspace, mapping_overrides={f"{PKG}/nope.py": None})
    assert refused.value.code.value == "bad_input" and "not a Python file under paths" in refused.value.message


def table_subset(pairs: dict[str, Any], keys: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {k: (pairs[k].upstream, pairs[k].rule, pairs[k].status, pairs[k].confidence) for k in keys}


def test_malformed_python_is_reported_per_file_on_either_side(
    workspace: dict[str, Any], at_026: Any, tmp_path: Path
) -> None:
    broken_local = by_local(at_026)[f"{PKG}/sparse_mla.py"]
    assert broken_local.flags == ["parse_error"] and broken_local.error.startswith("local: SyntaxError")
    assert broken_local.symbols is None and broken_local.stats.added == 1
    assert at_026.parse_errors == [f"{PKG}/sparse_mla.py: SyntaxError: invalid syntax (line 53)"]
    # an upstream directory (no history) with one real file broken
    upstream = workspace["root"] / "broken_upstream"
    shutil.copytree(workspace["026"] / V4, upstream / V4)
    mtp = upstream / V4 / "nvidia/mtp.py"
    mtp.write_text(mtp.read_text().replace("class ", "class (", 1))
    result = run(workspace, upstream="broken_upstream", target=None, detail="symbols")
    pairs = by_local(result)
    assert pairs[f"{PKG}/mtp.py"].error.startswith("upstream: SyntaxError")
    assert pairs[f"{PKG}/mtp.py"].flags == ["parse_error"] and pairs[f"{PKG}/mtp.py"].symbols is None
    assert pairs[f"{PKG}/model.py"].rule == "platform_branch" and pairs[f"{PKG}/model.py"].symbols is not None
    assert [e.split(":")[0] for e in result.parse_errors] == [f"{V4}/nvidia/mtp.py", f"{PKG}/sparse_mla.py"]
    assert result.upstream_target == "directory (no revision)"
    assert any("directory without history" in u for u in result.unknowns)
    assert pairs["vllm_metax/models/phi.py"].status == "local_only"


def test_diff_detail_pages_one_unified_diff(workspace: dict[str, Any]) -> None:
    full = run(workspace, detail="diff", file=f"{PKG}/attention.py")
    lines = full.diff.splitlines()
    assert lines[:2] == [f"--- a/{V4}/attention.py", f"+++ b/{PKG}/attention.py"]
    assert '-    if kv_cache_dtype.startswith("fp8"):' in lines
    assert full.total == len(lines) and full.next_cursor is None
    assert [p.local for p in full.pairs] == [f"{PKG}/attention.py"] and full.pairs[0].symbols is not None
    assert full.target_only == []  # about the whole comparison, not this file
    first = run(workspace, detail="diff", file=f"{PKG}/attention.py", limit=10)
    second = run(workspace, detail="diff", file=f"{PKG}/attention.py", limit=10, cursor=first.next_cursor)
    assert (first.diff + second.diff).splitlines() == lines[:20]
    assert first.next_step.arguments["cursor"] == first.next_cursor
    assert second.pairs == []  # the pair and its symbols: first page only
    by_upstream = run(workspace, detail="diff", file=f"{V4}/attention.py")
    assert by_upstream.diff == full.diff
    for file, code in ((f"{PKG}/maca_utils.py", "bad_input"), (f"{PKG}/nope.py", "not_found")):
        with pytest.raises(Exception) as refused:
            run(workspace, detail="diff", file=file)
        assert refused.value.code.value == code
    with pytest.raises(Exception) as refused:
        run(workspace, detail="diff")
    assert refused.value.code.value == "bad_input"


def test_pairs_are_paged_with_cursors_bound_to_the_inputs(workspace: dict[str, Any]) -> None:
    first = page(workspace, limit=6)
    second = page(workspace, limit=6, cursor=first.next_cursor)
    assert len(first.pairs) == 6 and first.total == len(PAIRING_026)
    assert [p.local for p in first.pairs + second.pairs] == sorted(PAIRING_026)[:12]
    with pytest.raises(Exception) as refused:
        page(workspace, limit=6, cursor=first.next_cursor, target="v0.33.0")
    assert refused.value.code.value == "bad_input"


def test_default_results_stay_small(workspace: dict[str, Any]) -> None:
    for detail in ("summary", "symbols"):
        result = page(workspace, target="v0.33.0", limit=None, detail=detail)  # page() checks the budget
        assert result.next_cursor or result.total <= DEFAULT_LIMITS[detail]
        changed = next(p.local for p in result.pairs if p.status == "changed")
        assert result.next_step.arguments == {
            "plugin_repo": "plugin",
            "upstream": "vllm",
            "target": "v0.33.0",
            "paths": PATHS,
            "detail": "diff",
            "file": changed,
        }
    diff = page(workspace, target="v0.33.0", limit=None, detail="diff", file=f"{PKG}/model.py")
    assert bool(diff.next_cursor) == (len(diff.diff.splitlines()) < diff.total)


def test_a_revision_subject_compares_that_snapshot(workspace: dict[str, Any]) -> None:
    first_commit = run(workspace, subject="revision", revision="HEAD~1")
    assert set(table(first_commit)) == set(PAIRING_026) - {
        f"{PKG}/maca_compressor.py",
        f"{PKG}/maca_utils.py",
        f"{PKG}/sparse_mla.py",
    }
    assert first_commit.subject.startswith("revision ")
    assert by_local(first_commit)[f"{PKG}/__init__.py"].status == "changed"


def test_review_mode_leaves_the_repositories_byte_identical(workspace: dict[str, Any]) -> None:
    def snapshot(top: Path) -> dict[str, bytes]:
        return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}

    before = {name: snapshot(workspace["root"] / name) for name in ("plugin", "vllm")}
    run(workspace, mode="review", detail="symbols")
    run(workspace, mode="review", detail="diff", file=f"{PKG}/model.py", subject="index")
    assert {name: snapshot(workspace["root"] / name) for name in ("plugin", "vllm")} == before


def test_a_second_run_parses_nothing(workspace: dict[str, Any], at_026: Any) -> None:
    again = run(workspace, detail="symbols")
    # modules are read only when the pairing looks into them, so hits count those, not the whole tree
    assert again.parsed == 0 and 0 < again.cache_hits < again.modules_indexed
    assert [p.model_dump() for p in again.pairs] == [p.model_dump() for p in at_026.pairs]


@pytest.mark.parametrize(
    ("version", "family", "kinds"),
    [
        (
            "0.26.0",
            "deepseek_v4",
            {"amd": "other_platform", "common": "shared", "nvidia": "branch", "xpu": "other_platform"},
        ),
        (
            "0.33.0",
            "deepseek_v4",
            {
                "amd": "other_platform",
                "common": "shared",
                "cpu": "other_platform",
                "nvidia": "branch",
                "xpu": "other_platform",
            },
        ),
        # `if TYPE_CHECKING or not is_rocm(): nvidia else: amd`
        ("0.26.0", "minimax_m3", {"amd": "other_platform", "common": "shared", "nvidia": "branch"}),
        # platforms dispatched lazily in a module __getattr__; TYPE_CHECKING imports say nothing
        ("0.33.0", "inkling", {"amd": "other_platform", "common": "shared", "nvidia": "branch"}),
        # `if is_cuda(): nvidia elif is_rocm(): amd else: classic deepseek_v2` — an out-of-tree platform uses neither
        ("0.33.0", "deepseek_v32", {"amd": "other_platform", "common": "shared", "nvidia": "other_platform"}),
    ],
)
def test_family_layout_from_real_dispatch_code(
    tmp_path: Path, upstream_026: Path, upstream_033: Path, version: str, family: str, kinds: dict[str, str]
) -> None:
    tree = upstream_026 if version == "0.26.0" else upstream_033
    subject = DirectorySubject(tree)
    root = f"vllm/models/{family}"
    index = ModuleIndex()
    index.add_tree("upstream", subject, RecordCache(StateStore(tmp_path / "state")), [root + "/"])
    layout = family_layout(index, root, [p for p in subject.list(root + "/") if p.endswith(".py")])
    assert {name: kind.value for name, kind in layout.kinds.items()} == kinds
    for name, kind in layout.kinds.items():
        if kind is not SubdirKind.UNREFERENCED:
            cited = (tree / layout.evidence[name].path).read_text().splitlines()[layout.evidence[name].line - 1]
            assert f".{name}" in cited or f"{family}.{name}" in cited, (name, cited)


def test_maca_prefix_is_dropped_only_before_a_name() -> None:
    maca = VendorAffixes()
    assert maca.upstream_name("MacaDeepseekV4MLP") == "DeepseekV4MLP"
    assert maca.upstream_name("Macaroni") == "Macaroni" and maca.upstream_name("Maca") == "Maca"
