"""diff_model II on real vLLM releases (0.24.0-0.27.0 wheels): closest release per file, and the matrix.

The plugin copies real upstream files from different releases: classic models from 0.24.0,
0.25.0 and 0.26.0, a verbatim 0.25.0 file that 0.27.0 still ships unchanged, and the DeepSeek V4
family with its root files from 0.26.0 but its platform (`nvidia/`) files from 0.24.0 — a
family whose platform files lag two releases. MACA edits plant one case per matrix class: an
`mx_` op and a registered `torch.ops` op, an `is_out_of_tree()` guard, `has_device_capability(90)`
and `is_cuda_alike()` guards (the second answered by the plugin's platform class), a BF16 branch in
place of an FP8 one, import swaps, and untouched functions the target changed or removed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from workbench import (
    build_plugin_repo,
    build_upstream_history,
    default_maca_edit,
    git,
    require_free_disk,
    upstream_source,
)

from vllm_metax_mcp.core.compare.model_diff import DEFAULT_LIMITS
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.tools import diff_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.slow

VERSIONS = ["0.24.0", "0.25.0", "0.26.0", "0.27.0"]
RELEASES = [f"v{v}" for v in VERSIONS]
TARGET = "v0.27.0"
INCLUDE = ["vllm/models/", "vllm/model_executor/models/"]
V4 = "vllm/models/deepseek_v4"
PKG = "vllm_metax/models/deepseek_v4"
CLASSIC = "vllm/model_executor/models"
SOURCES = {  # plugin path -> (release copied, upstream path)
    "vllm_metax/models/qwen3_moe.py": ("0.24.0", f"{CLASSIC}/qwen3_moe.py"),
    "vllm_metax/models/glm4_moe.py": ("0.25.0", f"{CLASSIC}/glm4_moe.py"),
    "vllm_metax/models/llama.py": ("0.25.0", f"{CLASSIC}/llama.py"),
    "vllm_metax/models/deepseek_v2.py": ("0.26.0", f"{CLASSIC}/deepseek_v2.py"),
    f"{PKG}/attention.py": ("0.26.0", f"{V4}/attention.py"),
    f"{PKG}/compressor.py": ("0.26.0", f"{V4}/compressor.py"),
    f"{PKG}/sparse_mla.py": ("0.26.0", f"{V4}/sparse_mla.py"),
    f"{PKG}/model.py": ("0.24.0", f"{V4}/nvidia/model.py"),
    f"{PKG}/flashinfer_sparse.py": ("0.24.0", f"{V4}/nvidia/flashinfer_sparse.py"),
}
VERBATIM = {"vllm_metax/models/llama.py"}
MLP_FORWARD = "    def forward(self, x):\n        gate_up, _ = self.gate_up_proj(x)\n"
EDITS = {  # plugin path -> [(upstream text, MACA text)], each upstream text found exactly once
    "vllm_metax/models/qwen3_moe.py": [
        ("import torch\n", "import torch\n\nfrom vllm_metax import _custom_ops as mx_ops\n"),
        ("        out = self.act_fn(gate_up)\n", "        out = mx_ops.mx_silu_and_mul(gate_up)\n"),
    ],
    "vllm_metax/models/glm4_moe.py": [
        ("import torch\n", "import torch\n\nfrom vllm.platforms import current_platform\n"),
        (
            MLP_FORWARD,
            MLP_FORWARD.replace(
                "\n", "\n        if current_platform.is_out_of_tree():\n            x = x.contiguous()\n", 1
            ),
        ),
        (
            "        router_logits = self.gate(hidden_states.to(dtype=torch.float32))\n",
            (
                "        # MetaX: the MACA router kernel keeps fp32 logits internally\n"
                "        router_logits = torch.ops._maca_C.fused_router(hidden_states)\n"
            ),
        ),
    ],
    "vllm_metax/models/deepseek_v2.py": [
        (
            MLP_FORWARD,
            MLP_FORWARD.replace(
                "\n", "\n        if current_platform.has_device_capability(90):\n            x = x.contiguous()\n", 1
            ),
        ),
        (
            "    if scale <= 1:\n        return 1.0\n",
            "    if scale <= 1 or not current_platform.is_cuda_alike():\n        return 1.0\n",
        ),
    ],
    f"{PKG}/attention.py": [
        (
            '    if kv_cache_dtype.startswith("fp8"):\n        return kv_cache_dtype, torch.float8_e4m3fn\n',
            '    if kv_cache_dtype.startswith("bf16"):\n        return kv_cache_dtype, torch.bfloat16\n',
        ),
    ],
}
CUSTOM_OPS = '''\
"""MACA custom ops (workbench copy)."""

import torch
from torch.library import Library

maca_lib = Library("_maca_C", "FRAGMENT")
maca_lib.define("fused_router(Tensor hidden_states) -> Tensor")


def mx_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return torch.ops._maca_C.fused_router(x)
'''
SUBCLASS_PATH = "vllm_metax/models/maca_state_cache.py"
SUBCLASS = """\
from __future__ import annotations

from vllm.models.deepseek_v4.compressor import CompressorBackend, CompressorStateCache


class MacaCompressorStateCache(CompressorStateCache):
    def get_attn_backend(self) -> type[AttentionBackend]:
        return CompressorBackend

    def maca_block_size(self) -> int:
        return self.block_size
"""
PLATFORM = '''\
"""MACA platform stub; the workbench plugin is never run on MetaX hardware."""


class MacaPlatform:
    device_name = "maca"

    def is_cuda_alike(self) -> bool:
        return True
'''


def maca_edits(local: str, text: str) -> str:
    """The planted edits, then what the plugin does to every copy: relative imports of a classic
    model made absolute (the copy no longer lives beside them), copied modules swapped, marker block."""
    if local in VERBATIM:
        return text
    for old, new in EDITS.get(local, []):
        assert text.count(old) == 1, (local, old)
        text = text.replace(old, new)
    if SOURCES[local][1].startswith(CLASSIC):
        text = re.sub(r"^(\s*)from \.(?=\w)", rf"\1from {CLASSIC.replace('/', '.')}.", text, flags=re.MULTILINE)
    return default_maca_edit({k: v for k, (_, v) in SOURCES.items()})(local, text)


def _copy_models(version: str, dest: Path) -> Path:
    """A release directory holding only the model packages (what the tests pair against)."""
    tree = upstream_source(version)
    for prefix in INCLUDE:
        shutil.copytree(tree / prefix, dest / prefix, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("releases")
    require_free_disk(root, 1.0)
    trees = {v: upstream_source(v) for v in VERSIONS}
    history = build_upstream_history(root / "vllm", VERSIONS, include=INCLUDE)
    staging = root / "staging"
    files = {local: upstream.replace("vllm/", f"v{version}/vllm/", 1) for local, (version, upstream) in SOURCES.items()}
    for local, staged in files.items():
        (staging / staged).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trees[SOURCES[local][0]] / SOURCES[local][1], staging / staged)
    plugin = build_plugin_repo(
        root / "plugin",
        staging,
        files,
        edits=maca_edits,
        registrations={"DeepseekV4ForCausalLM": "vllm_metax.models.deepseek_v4:DeepseekV4ForCausalLM"},
    )
    (plugin / PKG / "__init__.py").write_text("from .model import DeepseekV4ForCausalLM\n")
    (plugin / "vllm_metax/_custom_ops.py").write_text(CUSTOM_OPS)
    (plugin / "vllm_metax/platform.py").write_text(PLATFORM)
    (plugin / SUBCLASS_PATH).write_text(SUBCLASS)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "MACA ops, platform answers")
    return {"root": root, "plugin": plugin, "history": history, "state": root / "state", "trees": trees}


def page(ws: dict[str, Any], **arguments: Any) -> Any:
    """One page, as a call with these arguments answers it (within the result budget)."""
    runtime = Runtime.create([str(ws["root"])], state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="diff_model")
    defaults = {
        "plugin_repo": "plugin",
        "upstream": "vllm",
        "target": TARGET,
        "releases": RELEASES,
        "mapping_overrides": {f"{PKG}/__init__.py": None},  # the plugin's own package init
    }
    output = anyio.run(lambda: invoke(tool.SPEC, {**defaults, **arguments}, env))
    assert len(text_of(output)) <= RESULT_BUDGET
    return output


def run(ws: dict[str, Any], **arguments: Any) -> Any:
    """Every page as one result: the pairs (or matrix rows) of all pages, the rest from the first."""
    first = output = page(ws, **arguments)
    listed = "matrix" if arguments.get("detail") == "matrix" else "pairs"
    found = list(getattr(first, listed))
    while output.next_cursor:
        output = page(ws, **arguments, cursor=output.next_cursor)
        found += getattr(output, listed)
    return first.model_copy(update={listed: found, "next_cursor": None})


@pytest.fixture(scope="module")
def by_release(workspace: dict[str, Any]) -> Any:
    return run(workspace, detail="releases", limit=500)


@pytest.fixture(scope="module")
def matrix(workspace: dict[str, Any], by_release: Any) -> Any:
    return run(workspace, detail="matrix", limit=tool.MAX_ROWS)


def rows(result: Any) -> dict[tuple[str, str], Any]:
    return {(row.local, row.symbol): row for row in result.matrix}


def blob_lines(ws: dict[str, Any], sha: str) -> list[str]:
    """The lines of a blob, from whichever repository has it (plugin or upstream history)."""
    for repo in (ws["plugin"], ws["history"].path):
        found = subprocess.run(["git", "cat-file", "-p", sha], cwd=repo, capture_output=True, check=False)
        if found.returncode == 0:
            return found.stdout.decode().splitlines()
    raise AssertionError(f"blob {sha} is in neither repository")


def cited(ws: dict[str, Any], row: Any) -> list[tuple[str, str]]:
    """(path, line text) of every file evidence item of a row, read from the blob it names."""
    return [(e.path, blob_lines(ws, e.rev)[e.line - 1]) for e in row.evidence if e.kind == "file"]


CLOSEST = {
    "vllm_metax/models/qwen3_moe.py": "v0.24.0",
    "vllm_metax/models/glm4_moe.py": "v0.25.0",
    "vllm_metax/models/llama.py": "v0.27.0",  # 0.25.0 = 0.26.0 = 0.27.0: the newest of equals
    "vllm_metax/models/deepseek_v2.py": "v0.26.0",
    f"{PKG}/attention.py": "v0.26.0",  # 0.25.0 = 0.26.0
    f"{PKG}/compressor.py": "v0.26.0",
    f"{PKG}/sparse_mla.py": "v0.26.0",
    f"{PKG}/model.py": "v0.24.0",
    f"{PKG}/flashinfer_sparse.py": "v0.24.0",
}


def test_each_file_gets_the_release_it_was_copied_from(workspace: dict[str, Any], by_release: Any) -> None:
    pairs = {p.local: p for p in by_release.pairs}
    assert {local: pairs[local].closest_release for local in CLOSEST} == CLOSEST
    assert [(r.label, r.commit) for r in by_release.releases] == [
        (t, workspace["history"].rev_parse(t)) for t in RELEASES
    ]
    for local in CLOSEST:
        counts = pairs[local].per_release
        assert list(counts) == RELEASES and min(counts.values()) == counts[CLOSEST[local]], local
    assert pairs["vllm_metax/models/llama.py"].per_release["v0.25.0"] == 0
    assert pairs["vllm_metax/models/llama.py"].per_release["v0.24.0"] > 0
    # the local-only and overridden files have no counterpart in any release
    for local in ("vllm_metax/models/__init__.py", f"{PKG}/__init__.py"):
        assert (pairs[local].closest_release, set(pairs[local].per_release.values())) == (None, {None})


def test_the_counts_agree_with_git_at_the_closest_release(workspace: dict[str, Any], by_release: Any) -> None:
    pairs = {p.local: p for p in by_release.pairs}
    for local, (version, upstream) in SOURCES.items():
        numstat = subprocess.run(
            [
                "git",
                "diff",
                "--no-index",
                "--numstat",
                str(workspace["trees"][version] / upstream),
                str(workspace["plugin"] / local),
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        expected = int(numstat[0]) + int(numstat[1]) if numstat else 0
        assert pairs[local].per_release[f"v{version}"] == expected, local


def test_a_family_whose_platform_files_lag_is_summarised_as_such(by_release: Any) -> None:
    family = next(f for f in by_release.families if f.family == f"{PKG}/")
    assert family.newest == "v0.26.0"
    assert family.files == {"v0.24.0": 2, "v0.26.0": 3}
    # model.py defines the registered DeepseekV4ForCausalLM (registry rule), flashinfer_sparse.py follows the
    # platform branch; both lag at v0.24.0.
    assert family.by_rule == {"platform_branch": ["v0.24.0"], "registry": ["v0.24.0"], "same_path": ["v0.26.0"]}
    assert family.lagging == [f"{PKG}/flashinfer_sparse.py", f"{PKG}/model.py"]
    assert [f.family for f in by_release.families] == [f"{PKG}/"]  # flat classic models form no family


def test_matrix_classifies_each_planted_difference_with_evidence_at_real_lines(
    workspace: dict[str, Any], matrix: Any
) -> None:
    found = rows(matrix)
    qwen, glm, ds2 = (f"vllm_metax/models/{m}.py" for m in ("qwen3_moe", "glm4_moe", "deepseek_v2"))
    expected = {  # (local, symbol) -> (class, a cited line of this file contains this text)
        (qwen, "Qwen3MoeMLP.forward"): ("maca_kernel", qwen, "mx_ops.mx_silu_and_mul(gate_up)"),
        (glm, "Glm4MoE.forward"): ("maca_kernel", glm, "torch.ops._maca_C.fused_router(hidden_states)"),
        (glm, "Glm4MoeMLP.forward"): ("platform_predicate", glm, "current_platform.is_out_of_tree()"),
        (ds2, "DeepseekV2MLP.forward"): ("capability_predicate", ds2, "current_platform.has_device_capability(90)"),
        (ds2, "yarn_get_mscale"): ("capability_predicate", ds2, "current_platform.is_cuda_alike()"),
        (f"{PKG}/attention.py", "_resolve_dsv4_kv_cache_dtype"): (
            "dtype_path",
            f"{PKG}/attention.py",
            "torch.bfloat16",
        ),
        (f"{PKG}/model.py", "import:DeepseekV4Attention"): (
            "import_swap",
            f"{PKG}/model.py",
            "from vllm_metax.models.deepseek_v4.attention import",
        ),
        ("vllm_metax/models/llama.py", "*"): ("obsolete_override", f"{CLASSIC}/llama.py", "# SPDX-License-Identifier"),
        (qwen, "Qwen3MoeModel.get_expert_mapping"): (
            "obsolete_override",
            f"{CLASSIC}/qwen3_moe.py",
            "def get_expert_mapping",
        ),
        (SUBCLASS_PATH, "MacaCompressorStateCache.get_attn_backend"): (
            "obsolete_override",
            f"{V4}/compressor.py",
            "def get_attn_backend",
        ),
        (SUBCLASS_PATH, "MacaCompressorStateCache.maca_block_size"): (
            "unverified",
            SUBCLASS_PATH,
            "def maca_block_size",
        ),
        (qwen, "Qwen3MoeModel.load_weights"): ("upstream_change", f"{CLASSIC}/qwen3_moe.py", "def load_weights"),
    }
    for key, (cls, path, text) in expected.items():
        row = found[key]
        assert row.proposed_class == cls and row.rationale.startswith("proposal: "), (key, row)
        assert any(text in line for where, line in cited(workspace, row) if where == path), (key, cited(workspace, row))
    # the MACA edits sit in symbols 0.27.0 left alone; the untouched load_weights is upstream's change
    assert found[("vllm_metax/models/qwen3_moe.py", "Qwen3MoeMLP.forward")].upstream_changed is False
    untouched = found[("vllm_metax/models/qwen3_moe.py", "Qwen3MoeModel.load_weights")]
    assert (untouched.base, untouched.upstream_changed, untouched.change) == ("v0.24.0", True, "changed")
    assert {path for path, _ in cited(workspace, untouched)} == {f"{CLASSIC}/qwen3_moe.py"}
    assert all("def load_weights" in line for _, line in cited(workspace, untouched))


def test_matrix_evidence_names_the_registration_the_platform_answer_and_both_dtype_sides(
    workspace: dict[str, Any], matrix: Any
) -> None:
    found = rows(matrix)
    router = cited(workspace, found[("vllm_metax/models/glm4_moe.py", "Glm4MoE.forward")])
    assert ("vllm_metax/_custom_ops.py", 'maca_lib.define("fused_router(Tensor hidden_states) -> Tensor")') in router
    comment = "# MetaX: the MACA router kernel keeps fp32 logits internally"
    line = (workspace["plugin"] / "vllm_metax/models/glm4_moe.py").read_text().splitlines().index(
        f"        {comment}"
    ) + 1
    assert found[("vllm_metax/models/glm4_moe.py", "Glm4MoE.forward")].leads == [
        f"vllm_metax/models/glm4_moe.py:{line}: {comment}"
    ]
    mx = found[("vllm_metax/models/qwen3_moe.py", "Qwen3MoeMLP.forward")]
    assert "from vllm_metax import _custom_ops as mx_ops" in [line for _, line in cited(workspace, mx)]
    answered = found[("vllm_metax/models/deepseek_v2.py", "yarn_get_mscale")]
    assert ("vllm_metax/platform.py", "        return True") in cited(workspace, answered)
    assert "vllm_metax.platform:MacaPlatform returns True" in answered.rationale
    unanswered = found[("vllm_metax/models/deepseek_v2.py", "DeepseekV2MLP.forward")]
    assert "needs MACA evidence" in unanswered.rationale
    guard = found[("vllm_metax/models/glm4_moe.py", "Glm4MoeMLP.forward")]
    assert "answers True" in guard.rationale
    dtype = found[(f"{PKG}/attention.py", "_resolve_dsv4_kv_cache_dtype")]
    sides = cited(workspace, dtype)
    assert (f"{V4}/attention.py", '    if kv_cache_dtype.startswith("fp8"):') in sides
    assert (f"{PKG}/attention.py", "        return kv_cache_dtype, torch.bfloat16") in sides
    base = next(e for e in dtype.evidence if e.kind == "file" and e.path == f"{V4}/attention.py")
    assert base.rev == git(workspace["history"].path, "rev-parse", f"v0.26.0:{V4}/attention.py").strip()


def test_every_row_is_keyed_once_and_every_file_evidence_points_at_a_line(
    workspace: dict[str, Any], matrix: Any
) -> None:
    keys = [(row.local, row.symbol) for row in matrix.matrix]
    assert len(keys) == len(set(keys)) == matrix.total and keys == sorted(keys)
    assert sum(matrix.matrix_counts.values()) == matrix.total
    assert set(matrix.matrix_counts) == {
        "capability_predicate",
        "dtype_path",
        "import_swap",
        "maca_kernel",
        "obsolete_override",
        "platform_predicate",
        "unverified",
        "upstream_change",
    }
    for row in matrix.matrix:
        assert any(e.kind != "note" for e in row.evidence), row
        for evidence in (e for e in row.evidence if e.kind == "file"):
            assert 1 <= evidence.line <= len(blob_lines(workspace, evidence.rev)), (row.local, row.symbol, evidence)
    # the plugin's marker block is added code no rule explains: unverified, its comment quoted as a lead only
    marker = rows(matrix)[("vllm_metax/models/qwen3_moe.py", "MACA_KEEP_BF16")]
    assert marker.proposed_class == "unverified" and marker.leads[0].startswith("vllm_metax/models/qwen3_moe.py:")
    assert "# MetaX:" in marker.leads[0]


def test_matrix_pages_stay_small_and_concatenate(workspace: dict[str, Any], matrix: Any) -> None:
    first = page(workspace, detail="matrix")  # page() checks the result budget
    assert len(first.matrix) <= DEFAULT_LIMITS["matrix"] and first.next_cursor and first.total == matrix.total
    second = page(workspace, detail="matrix", cursor=first.next_cursor)
    assert [r.model_dump() for r in first.matrix + second.matrix] == [
        r.model_dump() for r in matrix.matrix[: 2 * len(first.matrix)]
    ]
    one = run(workspace, detail="matrix", file=f"{PKG}/attention.py", limit=tool.MAX_ROWS)
    assert {r.local for r in one.matrix} == {f"{PKG}/attention.py"}
    summary = page(workspace, detail="releases")
    assert summary.families and summary.pairs


def test_without_releases_the_target_is_the_base(workspace: dict[str, Any]) -> None:
    result = run(workspace, detail="matrix", releases=[], file="vllm_metax/models/qwen3_moe.py", limit=tool.MAX_ROWS)
    found = rows(result)
    assert all(row.base is None and row.upstream_changed is None for row in result.matrix)
    assert "upstream_change" not in result.matrix_counts
    assert found[("vllm_metax/models/qwen3_moe.py", "Qwen3MoeMLP.forward")].proposed_class == "maca_kernel"
    assert result.unknowns[0].startswith("No releases")


def test_release_directories_work_like_tags(workspace: dict[str, Any]) -> None:
    root = workspace["root"]
    for version in ("0.24.0", "0.25.0"):
        if not (root / f"dir-{version}").exists():
            _copy_models(version, root / f"dir-{version}")
    result = run(workspace, detail="releases", releases=["dir-0.24.0", "dir-0.25.0"], limit=500)
    pairs = {p.local: p for p in result.pairs}
    assert pairs["vllm_metax/models/qwen3_moe.py"].closest_release == "dir-0.24.0"
    assert pairs["vllm_metax/models/glm4_moe.py"].closest_release == "dir-0.25.0"
    assert [(r.label, r.commit) for r in result.releases] == [("dir-0.24.0", None), ("dir-0.25.0", None)]


def test_a_second_run_over_the_releases_parses_nothing(workspace: dict[str, Any], by_release: Any) -> None:
    again = run(workspace, detail="releases", limit=500)
    assert again.parsed == 0 and again.cache_hits > 0
    assert [p.model_dump() for p in again.pairs] == [p.model_dump() for p in by_release.pairs]


@pytest.mark.parametrize(
    ("arguments", "code", "words"),
    [
        ({"detail": "releases", "releases": []}, "bad_input", "detail=releases needs releases"),
        ({"releases": ["v0.24.0", "v0.24.0"]}, "bad_input", "twice"),
        ({"releases": ["v9.9.9"]}, "bad_input", "neither a revision"),
        ({"releases": ["../outside"]}, "outside_roots", "outside the server's roots"),
        ({"detail": "summary", "file": f"{PKG}/model.py"}, "bad_input", "only used with detail=diff or detail=matrix"),
    ],
)
def test_bad_release_inputs_are_refused_clearly(
    workspace: dict[str, Any], arguments: dict[str, Any], code: str, words: str
) -> None:
    with pytest.raises(Exception) as refused:
        run(workspace, **arguments)
    assert refused.value.code.value == code and words in refused.value.message
