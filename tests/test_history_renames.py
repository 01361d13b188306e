"""diff_model follows upstream renames across releases (git rename detection), through chains, to the file
at the target; a deletion without a rename still reads `removed`.

The upstream is a git repository of real vLLM releases (0.24.0-0.27.0 and 0.33.0 wheels, the model
directories and a few others), plus one commit on a side branch. Between those releases upstream really
renamed files, and git's rename detection (`-M`, 50% similarity) says so:

- 0.26.0: `model_executor/models/olmo2.py` became `olmo3.py` (R092) with its classes renamed
  (olmo2.py:67 `class Olmo2Attention` at 0.25.0, olmo3.py:67 `class Olmo3Attention` at 0.26.0); 0.33.0
  deleted olmo3.py. The side branch (from v0.27.0) moves olmo3.py once more: a chain of two renames.
- 0.27.0: `models/deepseek_v4/common/ops/fused_qk_rmsnorm.py` moved to `models/common/ops/` (R092). From
  0.26.0 straight to 0.33.0 (a second history without 0.27.0) the file changed too much for git's 50%:
  git sees a deletion and an addition.
- 0.26.0: `model_executor/layers/fla/` moved to `third_party/flash_linear_attention/`, its comment-only
  `__init__.py` with it.
- git also pairs unrelated small files: at 0.25.0 the empty `entrypoints/serve/disagg/__init__.py` with
  `generate/base/__init__.py` (its package went to `scale_out/token_in_token_out/`), at 0.33.0
  `transformers_utils/configs/mellum.py` (mellum.py:6 `class MellumConfig`, three code lines) with a new
  file that shares only its license header. The history rule does not follow those.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import GCU_ARCHIVE, PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_plugin_repo, build_upstream_history, default_maca_edit, git, upstream_source

from vllm_metax_mcp.tools import diff_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.slow

INCLUDE = [
    "vllm/model_executor/models/",
    "vllm/models/",
    "vllm/transformers_utils/configs/",
    "vllm/entrypoints/",
    "vllm/model_executor/layers/fla/",
    "vllm/third_party/",
]
CLASSIC = "vllm/model_executor/models"
OLMO2, OLMO3, OLMO3_TEXT = f"{CLASSIC}/olmo2.py", f"{CLASSIC}/olmo3.py", f"{CLASSIC}/olmo3_text.py"
QK_OLD, QK_NEW = "vllm/models/deepseek_v4/common/ops/fused_qk_rmsnorm.py", "vllm/models/common/ops/fused_qk_rmsnorm.py"
FLA_OLD, FLA_NEW = "vllm/model_executor/layers/fla", "vllm/third_party/flash_linear_attention"
DISAGG = "vllm/entrypoints/serve/disagg"
MELLUM = "vllm/transformers_utils/configs/mellum.py"
DIRS_PATHS = ["vllm_metax/models/"]
PLUGIN_PATHS = [
    "vllm_metax/models/",
    "vllm_metax/transformers_utils/",
    "vllm_metax/model_executor/",
    "vllm_metax/entrypoints/",
]
SUBCLASS = '''\
from vllm.model_executor.models.olmoe import OlmoeForCausalLM


class MacaOlmo2ForCausalLM(OlmoeForCausalLM):
    """MetaX: OLMo-2 served through the OLMoE implementation."""
'''


def local(upstream: str) -> str:
    """The plugin path of an upstream path (`vllm/X` -> `vllm_metax/X`)."""
    return "vllm_metax/" + upstream[len("vllm/") :]


def copy_into(plugin: Path, tree: Path, files: dict[str, str]) -> None:
    """Real upstream files of `tree` into the plugin, with the plugin's MACA edit, as one commit."""
    edit = default_maca_edit(files)
    for local, upstream in files.items():
        target = plugin / local
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(edit(local, (tree / upstream).read_text()))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", f"copies from {tree.name}")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("history-renames")
    fine = build_upstream_history(root / "vllm", ["0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.33.0"], include=INCLUDE)
    build_upstream_history(root / "vllm-coarse", ["0.26.0", "0.33.0"], include=INCLUDE)
    git(fine.path, "checkout", "-q", "-b", "side", "v0.27.0")
    moved = (fine.path / OLMO3).read_text()
    fine.add_commit({OLMO3: None, OLMO3_TEXT: moved}, "Move olmo3.py to olmo3_text.py")
    git(fine.path, "checkout", "-q", "main")
    trees = {version: upstream_source(version) for version in ("0.24.0", "0.25.0", "0.26.0")}
    # The `<name>/<name>.py` layout; the plugin's own interfaces.py, so the copy's class bases resolve locally.
    build_plugin_repo(
        root / "plugin-dirs",
        trees["0.25.0"],
        {"vllm_metax/models/olmo2/olmo2.py": OLMO2, "vllm_metax/models/interfaces.py": f"{CLASSIC}/interfaces.py"},
    )
    plugin = build_plugin_repo(
        root / "plugin",
        trees["0.26.0"],
        {"vllm_metax/models/deepseek_v4/fused_qk_rmsnorm.py": QK_OLD, local(MELLUM): MELLUM},
    )
    copy_into(
        plugin,
        trees["0.25.0"],
        {
            local(f"{FLA_OLD}/__init__.py"): f"{FLA_OLD}/__init__.py",
            local(f"{FLA_OLD}/ops/__init__.py"): f"{FLA_OLD}/ops/__init__.py",
        },
    )
    copy_into(plugin, trees["0.24.0"], {local(f"{DISAGG}/__init__.py"): f"{DISAGG}/__init__.py"})
    (plugin / "vllm_metax/models/olmo2.py").write_text(SUBCLASS)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "olmo2 through olmoe")
    state = tmp_path_factory.mktemp("history-renames-state")
    return {"root": root, "state": state, "results": {}}


def pairs(ws: dict[str, Any], plugin: str, target: str, upstream: str = "vllm") -> dict[str, Any]:
    """diff_model's pairs by local path (one run per plugin, upstream and target)."""
    key = (plugin, target, upstream)
    if key not in ws["results"]:
        runtime = Runtime.create([str(ws["root"])], mode="review", state_dir=str(ws["state"]))
        env = ToolEnv(runtime=runtime, tool="diff_model")
        paths = DIRS_PATHS if plugin == "plugin-dirs" else PLUGIN_PATHS
        arguments = {"plugin_repo": plugin, "upstream": upstream, "target": target, "paths": paths, "limit": 500}
        result = anyio.run(lambda: invoke(tool.SPEC, arguments, env))
        ws["results"][key] = {p.local: p for p in result.pairs}
    return ws["results"][key]


def sha(ws: dict[str, Any], revision: str, repo: str = "vllm") -> str:
    return git(ws["root"] / repo, "rev-parse", f"{revision}^{{commit}}").strip()


def git_renames(ws: dict[str, Any], revision: str, repo: str = "vllm") -> dict[str, str]:
    """What git's own rename detection (`-M`, 50%) says the commit renamed: source -> destination."""
    listed = git(ws["root"] / repo, "diff-tree", "-r", "-M", "--name-status", revision)
    return {fields[1]: fields[2] for line in listed.splitlines() if (fields := line.split("\t"))[0].startswith("R")}


def notes(pair: Any) -> list[str]:
    return [e.text for e in pair.evidence if e.kind == "note"]


def commits(pair: Any) -> list[str]:
    return [e.sha for e in pair.evidence if e.kind == "commit"]


def renamed(source: str, destination: str, commit: str) -> str:
    return f"{source} was renamed to {destination} in {commit[:12]}"


def test_a_file_upstream_renamed_pairs_with_the_renamed_file(workspace: dict[str, Any]) -> None:
    assert git_renames(workspace, "v0.26.0")[OLMO2] == OLMO3
    release = sha(workspace, "v0.26.0")
    for target in ("v0.26.0", "v0.27.0"):
        found = pairs(workspace, "plugin-dirs", target)
        # `<package>/models/olmo2/` is no upstream family: olmo2/olmo2.py is expected at the flat olmo2.py, which
        # upstream renamed; its classes were renamed too, so no symbol rule finds olmo3.py.
        pair = found["vllm_metax/models/olmo2/olmo2.py"]
        assert (pair.upstream, pair.rule, pair.status, pair.flags) == (OLMO3, "history", "changed", ["moved"])
        assert pair.confidence == 0.8 and pair.stats is not None and pair.stats.added > 0
        assert [e.kind for e in pair.evidence] == ["file", "commit", "note"]
        assert pair.evidence[0].path == OLMO3
        assert commits(pair) == [release] and notes(pair) == [renamed(OLMO2, OLMO3, release)]
        # the package's __init__.py is not expected at a flat model file
        init = found["vllm_metax/models/olmo2/__init__.py"]
        assert (init.upstream, init.rule, init.status) == (None, "none", "local_only")


def test_a_rename_chain_is_followed_to_the_file_at_the_target(workspace: dict[str, Any]) -> None:
    assert git_renames(workspace, "side") == {OLMO3: OLMO3_TEXT}
    first, second = sha(workspace, "v0.26.0"), sha(workspace, "side")
    pair = pairs(workspace, "plugin-dirs", "side")["vllm_metax/models/olmo2/olmo2.py"]
    assert (pair.upstream, pair.rule, pair.status, pair.flags) == (OLMO3_TEXT, "history", "changed", ["moved"])
    assert commits(pair) == [first, second]
    assert notes(pair) == [renamed(OLMO2, OLMO3, first), renamed(OLMO3, OLMO3_TEXT, second)]


def test_a_rename_then_a_deletion_reads_removed(workspace: dict[str, Any]) -> None:
    assert OLMO3 not in git_renames(workspace, "v0.33.0")
    first, deleted = sha(workspace, "v0.26.0"), sha(workspace, "v0.33.0")
    pair = pairs(workspace, "plugin-dirs", "v0.33.0")["vllm_metax/models/olmo2/olmo2.py"]
    assert (pair.upstream, pair.rule, pair.status, pair.flags) == (OLMO3, "history", "removed", [])
    assert pair.stats is None and pair.confidence == 0.8
    assert commits(pair) == [first, deleted]
    assert notes(pair) == [renamed(OLMO2, OLMO3, first), f"{OLMO3} was deleted upstream in {deleted[:12]}"]
    # a history that never had olmo2.py has nothing to say
    coarse = pairs(workspace, "plugin-dirs", "v0.33.0", upstream="vllm-coarse")["vllm_metax/models/olmo2/olmo2.py"]
    assert (coarse.upstream, coarse.rule, coarse.status) == (None, "none", "local_only")


def test_a_symbol_pair_the_rename_agrees_with_gets_it_as_evidence(workspace: dict[str, Any]) -> None:
    assert git_renames(workspace, "v0.27.0")[QK_OLD] == QK_NEW
    release = sha(workspace, "v0.27.0")
    for target in ("v0.27.0", "v0.33.0", "side"):
        # fused_q_kv_rmsnorm is defined at fused_qk_rmsnorm.py:57 (0.26.0) and :195 at its new place (0.33.0)
        pair = pairs(workspace, "plugin", target)["vllm_metax/models/deepseek_v4/fused_qk_rmsnorm.py"]
        assert (pair.upstream, pair.rule, pair.status, pair.flags) == (QK_NEW, "renamed", "changed", ["moved"])
        assert commits(pair) == [release] and notes(pair)[-1] == renamed(QK_OLD, QK_NEW, release)


def test_a_rename_under_the_similarity_threshold_reads_as_a_deletion(workspace: dict[str, Any]) -> None:
    # straight from 0.26.0 to 0.33.0 the file grew from 96 to 224 lines: git sees no rename
    listed = git(workspace["root"] / "vllm-coarse", "diff-tree", "-r", "-M", "--name-status", "v0.33.0")
    assert f"D\t{QK_OLD}" in listed.splitlines() and f"A\t{QK_NEW}" in listed.splitlines()
    release = sha(workspace, "v0.33.0", repo="vllm-coarse")
    pair = pairs(workspace, "plugin", "v0.33.0", upstream="vllm-coarse")[
        "vllm_metax/models/deepseek_v4/fused_qk_rmsnorm.py"
    ]
    assert (pair.upstream, pair.rule, pair.flags) == (QK_NEW, "renamed", ["moved"])
    assert commits(pair) == [release] and notes(pair)[-1] == f"{QK_OLD} was deleted upstream in {release[:12]}"


def test_a_rename_to_another_file_than_the_pair_is_a_conflict(workspace: dict[str, Any]) -> None:
    first = sha(workspace, "v0.26.0")
    # olmo2.py:4 MacaOlmo2ForCausalLM extends OlmoeForCausalLM (olmoe.py:340 at 0.26.0); upstream's olmo2.py
    # became olmo3.py: both are shown, the class base decides
    pair = pairs(workspace, "plugin", "v0.26.0")["vllm_metax/models/olmo2.py"]
    assert (pair.upstream, pair.rule, pair.status) == (f"{CLASSIC}/olmoe.py", "subclass", "changed")
    assert pair.flags == ["conflict"] and pair.confidence == 0.5
    assert [(a.upstream, a.reason) for a in pair.alternatives] == [(OLMO3, renamed(OLMO2, OLMO3, first))]
    assert commits(pair) == []
    chained = pairs(workspace, "plugin", "side")["vllm_metax/models/olmo2.py"]
    assert [a.upstream for a in chained.alternatives] == [OLMO3_TEXT] and chained.flags == ["conflict"]
    # once upstream deleted olmo3.py nothing disagrees: the history is evidence, as for any moved pair
    ended = pairs(workspace, "plugin", "v0.33.0")["vllm_metax/models/olmo2.py"]
    assert (ended.upstream, ended.rule, ended.flags, ended.alternatives) == (
        f"{CLASSIC}/olmoe.py",
        "subclass",
        ["moved"],
        [],
    )
    assert commits(ended) == [first, sha(workspace, "v0.33.0")]


def test_git_renames_of_files_that_share_no_code_are_not_followed(workspace: dict[str, Any]) -> None:
    at_025, at_033 = git_renames(workspace, "v0.25.0"), git_renames(workspace, "v0.33.0")
    siblings = "vllm/entrypoints/scale_out/token_in_token_out"
    assert at_025[f"{DISAGG}/api_router.py"] == f"{siblings}/api_router.py"
    assert posixpath.dirname(at_025[f"{DISAGG}/__init__.py"]) != siblings
    assert MELLUM in at_033
    disagg = pairs(workspace, "plugin", "v0.25.0")[local(f"{DISAGG}/__init__.py")]
    assert (disagg.upstream, disagg.rule, disagg.status) == (f"{DISAGG}/__init__.py", "history", "removed")
    assert notes(disagg) == [f"{DISAGG}/__init__.py was deleted upstream in {sha(workspace, 'v0.25.0')[:12]}"]
    mellum = pairs(workspace, "plugin", "v0.33.0")[local(MELLUM)]
    assert (mellum.upstream, mellum.rule, mellum.status) == (MELLUM, "history", "removed")
    assert notes(mellum) == [f"{MELLUM} was deleted upstream in {sha(workspace, 'v0.33.0')[:12]}"]


def test_a_package_marker_follows_its_package(workspace: dict[str, Any]) -> None:
    moved = git_renames(workspace, "v0.26.0")
    assert moved[f"{FLA_OLD}/__init__.py"] == f"{FLA_NEW}/__init__.py"
    assert moved[f"{FLA_OLD}/ops/chunk.py"] == f"{FLA_NEW}/ops/chunk.py"
    release = sha(workspace, "v0.26.0")
    found = pairs(workspace, "plugin", "v0.26.0")
    # fla/__init__.py is comments only (0.25.0 lines 1-8): it moves because its package moved with it;
    # fla/ops/__init__.py (its imports and __all__) moves by its own lines
    for inner in ("__init__.py", "ops/__init__.py"):
        pair = found[local(f"{FLA_OLD}/{inner}")]
        expected = f"{FLA_NEW}/{inner}"
        assert (pair.upstream, pair.rule, pair.status, pair.flags) == (expected, "history", "changed", ["moved"])
        assert notes(pair) == [renamed(f"{FLA_OLD}/{inner}", expected, release)]


@needs_snapshots
def test_a_real_plugin_in_the_name_name_layout_gets_its_flat_counterparts_history(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """vllm-gcu keeps `models/mixtral_quant/mixtral_quant.py`, forked from the 0.9.2 it pins; upstream 0.24.0
    deleted `model_executor/models/mixtral_quant.py` (no rename: git lists it as deleted)."""
    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("history-gcu")
    upstream = build_upstream_history(root / "vllm", ["0.9.2", "0.24.0"], include=[f"{CLASSIC}/", "vllm/models/"])
    assert f"D\t{CLASSIC}/mixtral_quant.py" in git(upstream.path, "diff-tree", "-r", "-M", "--name-status", "v0.24.0")
    repo = snapshot_repo(PLUGINS / GCU_ARCHIVE, root)
    runtime = Runtime.create([str(root)], mode="review", state_dir=str(tmp_path_factory.mktemp("history-gcu-state")))
    env = ToolEnv(runtime=runtime, tool="diff_model")
    arguments = {"plugin_repo": str(repo), "upstream": "vllm", "target": "v0.24.0", "paths": ["vllm_gcu/models/"]}
    result = anyio.run(lambda: invoke(tool.SPEC, {**arguments, "limit": 500}, env))
    histories = {p.local: notes(p)[-1] for p in result.pairs if "moved" in p.flags or p.rule == "history"}
    release = upstream.rev_parse("v0.24.0")
    assert histories == {
        "vllm_gcu/models/mixtral_quant/mixtral_quant.py": f"{CLASSIC}/mixtral_quant.py was deleted upstream in "
        f"{release[:12]}"
    }
