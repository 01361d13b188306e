"""audit_commits on a real vendor plugin: vllm-ascend at 7662ec925a ("main2main vllm v0.26.0") audited
over v0.26.0..v0.27.0 of an upstream history built from the real release trees.

The audit pairs each plugin file at the target and walks its counterpart's history from its base, so
the upstream files it lists per plugin file must be the counterparts the pairing's evidence decides
(tests/data/real_plugins/expected_pairs.json): a file whose counterpart changed between the two
releases has the release commit in its range, a file whose counterpart is byte-identical in both
trees has none. What changed was read with `diff` of the two release trees (evidence per file below).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import workbench
from test_real_plugins import ARCHIVE, EXPECTED, PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_upstream_history

from vllm_metax_mcp.tools import audit_commits as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

SNAPSHOT = "vllm-ascend-7662ec925a"
MODELS = "vllm_ascend/models"
DEEPSEEK = "vllm/models/deepseek_v4"
MINIMAX = "vllm/models/minimax_m3"
HISTORY_BUILD_S = 30.0
"""Two release commits of ~2,200 files each are staged straight from the cached trees (about 3 s here)."""

CHANGED = {
    # 0.26.0 -> 0.27.0 of the counterpart, as `diff vllm-0.26.0/<path> vllm-0.27.0/<path>` shows it:
    f"{MODELS}/deepseek_v4.py": f"{DEEPSEEK}/nvidia/model.py",  # :30 FusedMoE -> FusedMoEFactory
    f"{MODELS}/deepseek_v4_dspark.py": f"{DEEPSEEK}/nvidia/dspark.py",  # :18 adds `import vllm.envs as envs`
    f"{MODELS}/deepseek_v4_mtp.py": f"{DEEPSEEK}/nvidia/mtp.py",  # :21 adds `import vllm.envs as envs`
    f"{MODELS}/minimax_m3/minimax_m3.py": f"{MINIMAX}/nvidia/model.py",  # :34 FusedMoE -> FusedMoEFactory
    f"{MODELS}/minimax_m3/minimax_m3_vl.py": f"{MINIMAX}/nvidia/model.py",  # :82 select_main_impl_cls renamed
    f"{MODELS}/minimax_m3/msa_m3.py": f"{MINIMAX}/common/indexer.py",  # :427-429 adds buf_htk, :447 out=buf_htk
    f"{MODELS}/qwen3_dspark.py": "vllm/model_executor/models/qwen3_dspark.py",  # :27 drops VocabParallelEmbedding
}
UNCHANGED = {
    # `cmp` finds these counterparts byte-identical in vllm-0.26.0/ and vllm-0.27.0/:
    f"{MODELS}/llama_eagle3_vwn.py": "vllm/model_executor/models/llama_eagle3.py",
    f"{MODELS}/minimax_m3/__init__.py": f"{MINIMAX}/__init__.py",
    f"{MODELS}/minimax_m3/ops/__init__.py": f"{MINIMAX}/common/ops/__init__.py",
    f"{MODELS}/minimax_m3/ops/msa_m3_npu.py": f"{MINIMAX}/common/ops/sparse_attn.py",
    f"{MODELS}/minimax_m3/ops/msa_m3_triton.py": f"{MINIMAX}/common/ops/sparse_attn.py",
}
MERGED = f"{MINIMAX}/common/sparse_attention.py"
"""msa_m3.py also carries it (expected_pairs.json merged_from); 0.27.0 changes it too (:333 adds the
msa_decode_backend parameter, :370-372 should_use_msa_decode)."""


def audit(root: Path, upstream: Path, state: Path, repo: Path, action: str) -> Any:
    runtime = Runtime.create([str(root)], mode="review", state_dir=str(state))
    env = ToolEnv(runtime=runtime, tool="audit_commits")
    arguments = {
        "action": action,
        "upstream": str(upstream),
        "target": "v0.27.0",
        "plugin_repo": str(repo),
        "paths": [f"{MODELS}/"],
        "releases": ["v0.26.0"],
        "limit": 50,
    }
    return anyio.run(lambda: invoke(tool.SPEC, arguments, env))


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    """Commit 1 the real 0.26.0 tree (tag v0.26.0), commit 2 the real 0.27.0 tree (tag v0.27.0); the
    plugin's models audited over v0.26.0..v0.27.0 (status: every file; list: the release commit)."""
    root = tmp_path_factory.mktemp("real-audit")
    started = time.perf_counter()
    sources = {"0.26.0": upstream_026, "0.27.0": workbench.upstream_source("0.27.0")}
    history = build_upstream_history(root / "vllm", list(sources), sources=sources)
    built = time.perf_counter() - started
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / ARCHIVE, root)
    state = tmp_path_factory.mktemp("real-audit-state")  # review mode writes nothing inside the root
    return {
        "built_s": built,
        "release": history.rev_parse("v0.27.0"),
        "status": audit(root, history.path, state, repo, "status"),
        "list": audit(root, history.path, state, repo, "list"),
    }


@pytest.mark.slow
@needs_snapshots
def test_each_file_audits_the_counterpart_its_evidence_decides(audited: dict[str, Any]) -> None:
    assert audited["built_s"] < HISTORY_BUILD_S
    files = {f.local: f for f in audited["status"].files}
    assert set(files) == set(EXPECTED[SNAPSHOT]["files"])
    for local, expected in EXPECTED[SNAPSHOT]["files"].items():
        accepted = [expected["upstream"], *expected.get("acceptable", [])]
        assert files[local].upstream in accepted, (local, expected.get("evidence", ""))
    for local, counterpart in {**CHANGED, **UNCHANGED}.items():
        assert (files[local].upstream, files[local].base) == (counterpart, "v0.26.0"), local
    assert (files[f"{MODELS}/deepseek_v4.py"].rule, files[f"{MODELS}/minimax_m3/ops/__init__.py"].rule) == (
        "registry",
        "package",
    )


@pytest.mark.slow
@needs_snapshots
def test_the_release_commit_lists_the_changed_counterparts_only(audited: dict[str, Any]) -> None:
    files = {f.local: f for f in audited["status"].files}
    for local in CHANGED:
        assert files[local].commits == 1, local
    for local in UNCHANGED:
        assert files[local].commits == 0, local
    (commit,) = audited["list"].commits
    assert commit.sha == audited["release"] and commit.subject == "Release v0.27.0"
    assert set(CHANGED) <= set(commit.local_files) and not set(UNCHANGED) & set(commit.local_files)
    assert set(CHANGED.values()) <= set(commit.files.mapped)
    assert not set(UNCHANGED.values()) & set(commit.files.mapped)
    listed = {f.local: f.upstream for f in audited["list"].files}
    assert {local: listed.get(local) for local in CHANGED} == CHANGED


@pytest.mark.slow
@needs_snapshots
def test_a_merged_file_is_audited_with_its_counterpart(audited: dict[str, Any]) -> None:
    (commit,) = audited["list"].commits
    assert MERGED in commit.files.mapped
