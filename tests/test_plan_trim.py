"""plan_trim on every real config: the fewest layers that keep each distinct path, the rewrite proven
by re-analysis, refusals with sizes, budgets and parallel notes. Nothing here writes a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import snapshot
from mcp import Client
from test_environment import make_venv
from test_inspect_config import (
    FIXTURES,
    NORM,
    deepseek_v4_tensors,
    established_plugin,
    fixture,
    kimi_like,
    kimi_tensors,
    qwen3_next_tensors,
    write_model,
)
from workbench import git

from vllm_metax_mcp.core.checkpoint.consumers import directory_tree
from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.trim.readers import CACHE_DIR, cache_key, field_readers
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools import plan_trim as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(120)

#: Per real config: kept backbone layers (original ids) and the whole original -> new map (MTP included).
EXPECTED = {
    "v3": ([0, 3], {0: 0, 3: 1, 61: 2}),
    "v32": ([0, 3], {0: 0, 3: 1, 61: 2}),
    "v4": ([0, 2, 3], {0: 0, 2: 1, 3: 2, 43: 3}),
    "qnext": ([0, 3], {0: 0, 3: 1}),
    "q3moe": ([0], {0: 0}),
    "llama": ([0], {0: 0}),
    "glm5": ([0, 3], {0: 0, 3: 1, 78: 2}),
    "gemma3": ([0, 5], {0: 0, 5: 1}),
}


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def runtime(root: Path, mode: str = "edit") -> Runtime:
    # beside the root: a review-mode server refuses a state directory inside a read root
    return Runtime.create([str(root)], mode=mode, state_dir=str(root.parent / f"{root.name}.state"))


def plan(root: Path, arguments: dict[str, Any], rt: Runtime | None = None) -> tool.PlanTrimOutput:
    env = ToolEnv(runtime=rt or runtime(root), tool="plan_trim")
    return anyio.run(lambda: invoke(tool.SPEC, arguments, env))


def refused(root: Path, arguments: dict[str, Any], code: ErrorCode = ErrorCode.BAD_INPUT) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        plan(root, arguments)
    assert info.value.code is code, info.value.to_dict()
    assert "Traceback" not in info.value.message and str(root) not in info.value.message
    return info.value


def rows(result: tool.PlanTrimOutput) -> dict[str, tool.CoverageRow]:
    return {row.target: row for row in result.coverage}


def changes(result: tool.PlanTrimOutput) -> dict[str, tuple[str, str | None, str | None]]:
    return {c.field: (c.change, c.old, c.new) for c in result.config_changes}


def plan_fixture(tmp_path: Path, name: str, **arguments: Any) -> tool.PlanTrimOutput:
    write_model(tmp_path / name, fixture(name))
    return plan(tmp_path, {"model": name, **arguments})


# -- the layer sets of every real config ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_real_config_keeps_the_fewest_layers_covering_each_path(tmp_path: Path, name: str) -> None:
    result = plan_fixture(tmp_path, name)
    kept, layer_map = EXPECTED[name]
    assert result.kept_layers == kept and result.layer_map == layer_map
    assert result.uncovered == []
    for row in result.coverage:
        assert row.layers, f"{row.target} has no retained layer"
    assert changes(result)["num_hidden_layers"][2] == str(len(kept))
    assert result.budgets.params_bytes < result.budgets.original_params_bytes
    assert result.budgets.disk_bytes_dummy < 10_000 and result.budgets.disk_bytes_real == result.budgets.params_bytes
    assert len(result.model_dump_json()) < 20_000
    assert str(tmp_path) not in result.model_dump_json() and result.model == name


def test_deepseek_v3_one_dense_one_moe_and_the_mtp_layer_renamed_to_follow(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "v3")
    table = rows(result)
    assert (table["dense"].layers, table["dense"].available) == ([0], "0-2")
    assert (table["moe"].layers, table["moe"].available) == ([3], "3-60")
    assert "first_k_dense_replace=3" in table["dense"].reason
    mtp = table["mtp"]
    assert mtp.optional and mtp.layers == [61] and "speculative_config" in mtp.request
    assert result.mtp_kept == [61] and result.layer_map[61] == 2
    assert changes(result) == {
        "num_hidden_layers": ("set", "61", "2"),
        "first_k_dense_replace": ("recounted", "3", "1"),
    }
    assert "mtp-draft (completion) -> MTP layer (serve.speculative_config)" in result.smoke_cases
    assert result.budgets.source.startswith("estimate from config")
    assert all(c.read_by is None for c in result.config_changes)
    assert any("read_by is null" in gap for gap in result.evidence_gaps)


def test_deepseek_v4_ratios_0_4_128_hash_and_learned_routing(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "v4")
    table = rows(result)
    assert table["compress_ratios=0"].layers == [0] and table["compress_ratios=0"].available == "0,1"
    assert table["compress:4"].layers == [2] and "compress_ratios=4" in table["compress:4"].also
    assert table["compress:128"].layers == [3]
    assert table["route:hash"].layers == [0, 2] and table["route:learned"].layers == [3]
    assert "num_hash_layers=3" in table["route:hash"].reason
    assert "compression ratio 128" in table["compress:128"].request
    assert changes(result)["compress_ratios"] == ("sliced", "[44 items] [0, 0, 4, 128, 4, 128, ...]", "[0, 4, 128, 0]")
    assert changes(result)["num_hash_layers"] == ("recounted", "3", "2")
    long = next(c for c in result.smoke_cases if c.startswith("long-context"))
    assert "compress:128" in long and "attn:sliding" in long


def test_deepseek_v4_with_its_tensors_keeps_the_same_layers_and_counts_exact_bytes(tmp_path: Path) -> None:
    config = fixture("v4")
    write_model(tmp_path / "m", config, deepseek_v4_tensors(config), ["model-00001-of-00046.safetensors"])
    result = plan(tmp_path, {"model": "m"})
    assert result.kept_layers == [0, 2, 3] and result.layer_map[43] == 3
    assert result.budgets.source == "tensors (shard headers)"
    table = rows(result)
    assert "module:attn.indexer" in table["compress:4"].also  # the indexer modules sit exactly on the ratio-4 layers
    assert table["module:attn.compressor"].layers == [2, 3]


def test_qwen3_next_linear_and_full_attention_with_the_interval_refit(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "qnext")
    table = rows(result)
    assert table["attn:linear"].layers == [0] and table["attn:full"].layers == [3]
    assert changes(result)["full_attention_interval"] == ("refit", "4", "2")
    assert result.budgets.state_bytes_per_rank > 0  # the linear layer's recurrent state


def test_qwen3_next_mtp_tensors_without_an_mtp_key_are_reported_not_planned(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("qnext"), qwen3_next_tensors(), ["model-00001-of-00041.safetensors"])
    result = plan(tmp_path, {"model": "m"})
    assert result.kept_layers == [0, 3] and result.mtp_kept == []
    assert rows(result)["mtp"].available == "48" and rows(result)["mtp"].layers == []
    assert any("declares no MTP count" in u for u in result.uncovered)


def test_gemma3_sliding_and_global_layers(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "gemma3")
    table = rows(result)
    assert table["attn:sliding"].layers == [0] and table["attn:full"].layers == [5]
    assert "sliding_window 512" in table["attn:sliding"].request
    assert changes(result)["sliding_window_pattern"] == ("refit", "6", "2")


def test_glm5_ignore_list_is_filtered_and_renumbered(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "glm5")
    change = next(c for c in result.config_changes if c.field == "quantization_config.modules_to_not_convert")
    assert (change.old, change.new) == ("[712 entries]", "[32 entries]")
    assert "3 non-layer, 16 backbone and 13 MTP entries renumbered (0->0, 3->1, 78->2)" in change.reason
    assert "680 entries of dropped layers removed" in change.reason


def test_qwen3_moe_homogeneous_and_inactive_window_rule_kept_consistent(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "q3moe")
    assert changes(result)["max_window_layers"] == ("recounted", "48", "1")
    assert "mlp_only_layers" not in changes(result)  # empty: nothing to renumber


# -- choices the caller makes ----------------------------------------------------------------------


def test_explicit_layers_that_drop_a_distinct_path_are_refused_with_sizes_until_allowed(tmp_path: Path) -> None:
    write_model(tmp_path / "v4", fixture("v4"))
    failure = refused(tmp_path, {"model": "v4", "layers": [0, 3]})
    assert "drop 1 distinct path(s)" in failure.message and "compress:4 (only layers 2,4,...,42" in failure.message
    assert "keeping layer 2 adds" in failure.message and "GiB" in failure.message and "per rank" in failure.message
    assert "allow_drop=['compress:4']" in failure.message and failure.details["uncovered"] == ["compress:4"]
    result = plan(tmp_path, {"model": "v4", "layers": [0, 3], "allow_drop": ["compress:4"]})
    assert result.kept_layers == [0, 3] and result.layer_map == {0: 0, 3: 1, 43: 2}
    assert result.uncovered == ["compress:4 (original layers 2,4,...,42): dropped (allow_drop)."]


def test_a_module_only_one_layer_holds_is_a_distinct_path(tmp_path: Path) -> None:
    """Evidence from tensor names alone: an Engram-like module on layer 5 of an otherwise uniform model."""
    config = fixture("llama") | {"num_hidden_layers": 8}
    tensors = {"model.embed_tokens.weight": ("BF16", [8, 4]), "lm_head.weight": ("BF16", [8, 4])}
    for i in range(8):
        for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "input_layernorm"):
            tensors[f"model.layers.{i}.{name}.weight"] = NORM
    tensors["model.layers.5.engram.table.weight"] = ("BF16", [16, 4])
    write_model(tmp_path / "m", config, tensors, ["model.safetensors"])
    result = plan(tmp_path, {"model": "m"})
    assert result.kept_layers == [5] and rows(result)["module:engram.table"].reason.startswith("tensor names")
    failure = refused(tmp_path, {"model": "m", "layers": [0]})
    assert "module:engram.table (only layers 5; keeping layer 5 adds" in failure.message


def test_targets_choose_the_paths_to_keep(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "qnext", targets=["attn:full"])
    assert result.kept_layers == [3]
    assert changes(result)["full_attention_interval"] == ("refit", "4", "1")
    assert any(
        u.startswith("attn:linear (original layers 0-2,4-6") and "not among targets" in u for u in result.uncovered
    )
    failure = refused(tmp_path, {"model": "qnext", "targets": ["attn:sliding"]})
    assert "'attn:sliding' is no path of this model; its paths are: moe, attn:linear, attn:full" in failure.message


def test_keep_mtp_zero_drops_the_mtp_layer_and_its_array_tail(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "v4", keep_mtp=False)
    assert result.mtp_kept == [] and 43 not in result.layer_map
    assert changes(result)["compress_ratios"][2] == "[0, 4, 128]"
    assert changes(result)["num_nextn_predict_layers"] == ("set", "1", "0")
    assert any(u.startswith("MTP layer(s) 43: dropped") for u in result.uncovered)
    assert not any(c.startswith("mtp-draft") for c in result.smoke_cases)
    assert (
        "keep_mtp=2 but the config declares 1 MTP layer(s)" in refused(tmp_path, {"model": "v4", "keep_mtp": 2}).message
    )


def test_one_based_id_list_is_renumbered_in_its_own_base(tmp_path: Path) -> None:
    write_model(tmp_path / "m", kimi_like([1, 2, 3], "4"), kimi_tensors(), ["model.safetensors"])
    result = plan(tmp_path, {"model": "m"})
    assert result.kept_layers == [0, 3]
    found = changes(result)
    assert found["linear_attn_config.kda_layers"] == ("renumbered", "[1, 2, 3]", "[1]")
    assert found["linear_attn_config.full_attn_layers"] == ("renumbered", '"4"', '"2"')  # the string format is kept


def test_an_id_list_of_undetermined_base_is_refused(tmp_path: Path) -> None:
    write_model(tmp_path / "m", kimi_like([1, 2, 3], [4]))
    failure = refused(tmp_path, {"model": "m"})
    assert (
        "linear_attn_config.kda_layers lists layers [1, 2, 3] but its base (0 or 1) is undetermined" in failure.message
    )


def test_a_periodic_rule_no_value_can_express_becomes_an_explicit_list(tmp_path: Path) -> None:
    config = fixture("q3moe") | {"num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [0]}
    write_model(tmp_path / "m", config)
    result = plan(tmp_path, {"model": "m", "layers": [1, 2, 3]})  # MoE, dense, MoE: no step marks that
    found = changes(result)
    assert found["decoder_sparse_step"] == ("refit", "2", "1")
    assert found["mlp_only_layers"][2] == "[1]"


def test_a_field_that_looks_like_layer_ids_is_refused(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("llama") | {"skip_block_indexes": [3, 7]})
    failure = refused(tmp_path, {"model": "m"})
    assert failure.message.startswith("skip_block_indexes = [3, 7] looks like layer ids")


def test_a_submodel_is_trimmed_by_its_own_depth(tmp_path: Path) -> None:
    config = {
        "model_type": "toy_vl",
        "text_config": fixture("gemma3") | {"num_hidden_layers": 12},
        "vision_config": {"model_type": "toy_vision", "depth": 4, "hidden_size": 64},
    }
    write_model(tmp_path / "m", config)
    result = plan(tmp_path, {"model": "m"})
    assert result.kept_layers == [0, 5]
    assert changes(result)["text_config.num_hidden_layers"] == ("set", "12", "2")
    assert changes(result)["vision_config.depth"] == ("set", "4", "1")
    [vision] = result.submodels
    assert (vision.name, vision.layers, vision.kept) == ("vision_config", 4, [0])
    assert rows(result)["vision_config"].request == "image case (an image input)"
    assert any(c.startswith("image (image)") for c in result.smoke_cases)


# -- budgets and parallelism -----------------------------------------------------------------------


def test_a_plan_that_does_not_fit_recommends_context_then_concurrency_then_experts(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "v3", device_memory_gb=16)
    budgets = result.budgets
    assert budgets.fits is False and budgets.params_bytes_per_rank > budgets.usable_bytes
    recommendations = budgets.recommendations
    assert recommendations[0].startswith("lower concurrency and cache budget: serve with --max-num-seqs 1")
    assert recommendations[1].startswith("parameters alone need")
    assert recommendations[2] == (
        "with allow_narrowing=true: n_routed_experts 256 -> 112 fits (routing over 256 experts is then not exercised)."
    )
    assert "n_routed_experts" not in changes(result)
    narrowed = plan(tmp_path, {"model": "v3", "device_memory_gb": 16, "allow_narrowing": True})
    assert narrowed.budgets.fits is True and narrowed.kept_layers == [0, 3]
    assert changes(narrowed)["n_routed_experts"] == ("set", "256", "112")
    assert any(u.startswith("n_routed_experts: original 256, narrowed to 112") for u in narrowed.uncovered)


def test_a_long_context_that_does_not_fit_recommends_a_shorter_one(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "llama", device_memory_gb=3, max_model_len=131072)
    assert result.budgets.fits is False and result.budgets.kv_cache_bytes_per_rank == 131072 * 4096
    assert result.budgets.recommendations[0].startswith("shorter context: max_model_len ")


def test_tp_notes_and_pipeline_stages(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "v3", tp=32, pp=3)
    assert result.kept_layers == [0, 1, 3]  # one layer per stage: the earliest unkept layer joins
    assert changes(result)["first_k_dense_replace"] == ("recounted", "3", "2")
    assert [s.layers for s in result.budgets.stages] == [[0], [1], [3, 61]]
    assert result.parallel[0].startswith("Depth does not change TP limits")
    assert any(
        "moe_intermediate_size 2048 / tp 32 = 64 per rank is not a multiple of the FP8 block 128" in n
        for n in result.parallel
    )
    assert any(n.startswith("pp stage 2: original layers 3 (attn:full, mla, moe)") for n in result.notes)
    q3 = plan_fixture(tmp_path, "q3moe", tp=8)
    assert any(n.startswith("num_key_value_heads 4 < tp 8: each KV head is replicated on 2 ranks") for n in q3.parallel)


# -- served read-only -----------------------------------------------------------------------------


def test_served_read_only_in_review_mode_and_writes_nothing(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("gemma3"))
    before = snapshot(tmp_path / "m")
    assert tool.SPEC in ALL_TOOLS

    async def run() -> Any:
        server = build_server(runtime(tmp_path, mode="review"))
        async with Client(server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            called = await client.call_tool("plan_trim", {"model": "m"})
            return listed, called

    listed, called = anyio.run(run)
    assert listed["plan_trim"].annotations.read_only_hint is True and listed["plan_trim"].output_schema is not None
    assert "trim_model" not in listed
    assert not called.is_error and called.structured_content["kept_layers"] == [0, 5]
    assert snapshot(tmp_path / "m") == before


# -- consumer code (real vLLM CPU build) ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_changed_fields_name_their_readers_in_the_recorded_environment(tmp_path: Path, vllm_cpu_python: Path) -> None:
    rt = established_plugin(tmp_path, vllm_cpu_python)
    write_model(tmp_path / "v4", fixture("v4"))
    result = plan(tmp_path, {"model": "v4", "plugin_repo": "plugin"}, rt)
    readers = {c.field: c.read_by for c in result.config_changes}
    assert any(r.startswith("installed_vllm vllm/models/deepseek_v4/") for r in readers["num_hash_layers"])
    assert any(r.startswith("installed_vllm vllm/") for r in readers["compress_ratios"])
    assert not any("read_by is null" in gap for gap in result.evidence_gaps)
    assert str(tmp_path) not in result.model_dump_json()
    # the second call reads the search from the state directory and answers the same
    assert len(rt.store.list(CACHE_DIR)) == 1
    assert plan(tmp_path, {"model": "v4", "plugin_repo": "plugin"}, rt) == result
    assert len(rt.store.list(CACHE_DIR)) == 1


# -- the reader search, cached by content -----------------------------------------------------------

A_READER = "def f(config):\n    return config.first_k_dense_replace\n"
B_READER = '"""first_k_dense_replace, named in a docstring only."""\nKEYS = ["n_routed_experts"]\n'


def test_the_reader_search_is_kept_by_the_trees_content(tmp_path: Path) -> None:
    """Cold, warm and uncached searches agree; a new field is the only one searched; any change of the
    bytes, the files or the label is another key; an unreadable entry is searched again."""
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg/a.py").write_text(A_READER)
    (code / "pkg/b.py").write_text(B_READER)
    store = StateStore(tmp_path / "state")
    fields = ["first_k_dense_replace", "text_config.n_routed_experts", "n_routed_experts"]
    expected = {
        "first_k_dense_replace": ["t pkg/a.py:2"],
        "text_config.n_routed_experts": ["t pkg/b.py:2"],
        "n_routed_experts": ["t pkg/b.py:2"],
    }

    def search(label: str = "t", names: list[str] = fields) -> tuple[dict[str, list[str]], int]:
        found = field_readers(store, [directory_tree(label, code, "pkg")], names)
        return found.readers, found.searched

    uncached = field_readers(None, [directory_tree("t", code, "pkg")], fields)
    assert (uncached.readers, uncached.searched) == (expected, 2)
    assert search() == (expected, 2) and search() == (expected, 0)
    assert search(names=[*fields, "num_hidden_layers"]) == ({**expected, "num_hidden_layers": []}, 1)
    assert search("other") == ({name: [f"other {r[0][2:]}"] for name, r in expected.items()}, 2)

    (code / "pkg/a.py").write_text("\n" + A_READER)  # the same reads one line lower
    assert search() == ({**expected, "first_k_dense_replace": ["t pkg/a.py:3"]}, 2)
    (code / "pkg/c.py").write_text("x = 1\n")  # a file that reads nothing still changes the key
    assert search()[1] == 2
    (code / "pkg/c.py").unlink()
    (code / "pkg/a.py").write_text(A_READER)  # back to the first content: its entry answers again
    assert search() == (expected, 0)

    key = cache_key([directory_tree("t", code, "pkg")])
    store.path(f"{CACHE_DIR}/{key}.json").write_text("{not json")
    assert search() == (expected, 2) and search() == (expected, 0)


def test_a_second_plan_with_a_record_reads_the_cached_readers_and_an_edit_invalidates_them(tmp_path: Path) -> None:
    """The whole tool with a real record (a bare interpreter): the second call answers from the state
    directory (an entry changed there shows in its answer), and editing the plugin's code answers anew."""
    rt = established_plugin(tmp_path, make_venv(tmp_path.parent / f"{tmp_path.name}.venv"))
    models = tmp_path / "plugin/vllm_metax/models"
    models.mkdir()
    (models / "v4.py").write_text(
        "class Model:\n    def __init__(self, config):\n        self.n = config.num_hash_layers\n"
    )
    git(tmp_path / "plugin", "add", "-A")
    git(tmp_path / "plugin", "commit", "-qm", "a model")
    write_model(tmp_path / "v4", fixture("v4"))
    arguments = {"model": "v4", "plugin_repo": "plugin", "subject": "worktree"}

    def read_by(result: tool.PlanTrimOutput) -> list[str] | None:
        return next(c.read_by for c in result.config_changes if c.field == "num_hash_layers")

    cold = plan(tmp_path, arguments, rt)
    assert read_by(cold) == ["plugin vllm_metax/models/v4.py:3"]
    assert plan(tmp_path, arguments, rt) == cold
    [entry] = rt.store.list(CACHE_DIR)
    document = rt.store.read(f"{CACHE_DIR}/{entry}")
    rt.store.write(f"{CACHE_DIR}/{entry}", {**document, "readers": {**document["readers"], "num_hash_layers": []}})
    assert read_by(plan(tmp_path, arguments, rt)) == []  # the answer came from the state directory

    (models / "v4.py").write_text(
        "class Model:\n    def __init__(self, config):\n\n        self.n = config.num_hash_layers\n"
    )
    edited = plan(tmp_path, arguments, rt)
    assert read_by(edited) == ["plugin vllm_metax/models/v4.py:4"] and len(rt.store.list(CACHE_DIR)) == 2
    assert edited.model_dump(exclude={"config_changes", "result_id"}) == cold.model_dump(
        exclude={"config_changes", "result_id"}
    )


def test_related_trimmed_examples_of_the_plugin_are_listed(tmp_path: Path) -> None:
    models = tmp_path / "plugin" / "tools" / "batched_test" / "models"
    write_model(models / "ds-tiny", {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"})
    write_model(models / "llama-tiny", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    result = plan_fixture(tmp_path, "v3", plugin_repo="plugin")
    assert result.examples == ["tools/batched_test/models/ds-tiny"]


def test_a_context_too_short_for_a_window_says_what_is_not_reached(tmp_path: Path) -> None:
    result = plan_fixture(tmp_path, "gemma3", max_model_len=256)
    assert result.budgets.max_model_len == 256 and not any(c.startswith("long-context") for c in result.smoke_cases)
    assert "attn:sliding: needs a prompt past sliding_window 512, more than max_model_len allows" in result.uncovered[0]
    assert "max_model_len is too short" in rows(result)["attn:sliding"].request
