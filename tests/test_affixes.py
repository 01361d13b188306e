"""Vendor affixes are read from the plugin's own names, never listed per vendor (core/compare/affixes.py).

The names below are real: the top-level classes of vllm_ascend/models/minimax_m3/msa_m3.py and
vllm_gcu/models/deepseek_moe_quant/deepseek_moe_quant.py (shared/fixtures/plugins/), against the
upstream names they fork (vllm/models/minimax_m3/common/indexer.py:63-526 at 0.26.0,
vllm/model_executor/models/deepseek.py at 0.9.2).
"""

from __future__ import annotations

from vllm_metax_mcp.core.compare.affixes import Affix, VendorAffixes, discover_affixes

UPSTREAM = {
    "MiniMaxM3Indexer",
    "MiniMaxM3IndexerBackend",
    "MiniMaxM3SparseBackend",
    "DeepseekMLP",
    "DeepseekAttention",
    "DeepseekVLV2ForCausalLM",
    "DeepseekV2MLAAttention",
    "yarn_get_mscale",
    "FusedMoE",
    "MoE",
}


def test_a_word_that_explains_names_in_several_files_is_an_affix() -> None:
    local = [
        ("msa_m3.py", "AscendMiniMaxM3Indexer"),
        ("msa_m3.py", "AscendMiniMaxM3IndexerBackend"),
        ("deepseek_v4.py", "AscendMiniMaxM3SparseBackend"),
    ]
    affixes = discover_affixes(local, UPSTREAM)
    assert Affix("Ascend", "prefix") in affixes.affixes
    assert [affixes.upstream_name(n) for _, n in local] == [
        "MiniMaxM3Indexer",
        "MiniMaxM3IndexerBackend",
        "MiniMaxM3SparseBackend",
    ]


def test_one_file_counts_only_when_it_renamed_most_of_its_names() -> None:
    # deepseek_moe_quant.py renames all six of its top-level names with `Quant` (QuantDeepseekMLP, ...): a whole
    # file's consistent rename.
    quant = [
        ("deepseek_moe_quant.py", f"Quant{n}") for n in ("DeepseekMLP", "DeepseekAttention", "DeepseekVLV2ForCausalLM")
    ]
    assert discover_affixes(quant, UPSTREAM).upstream_name("QuantDeepseekMLP") == "DeepseekMLP"
    # Two names of one file that has many others are that file's habit, not the vendor's.
    habit = [("scheduler.py", "RecomputeDeepseekMLP"), ("scheduler.py", "RecomputeDeepseekAttention")]
    habit += [("scheduler.py", f"helper_{i}") for i in range(6)]
    assert discover_affixes(habit, UPSTREAM).upstream_name("RecomputeDeepseekMLP") == "RecomputeDeepseekMLP"


def test_one_name_is_not_enough_unless_a_registration_proves_the_word() -> None:
    # vllm_gcu/models/deepseek_v3/deepseek_v3_fusion.py defines DeepseekV2MLAAttentionFusion, the only `Fusion`
    # name of the plugin: one name does not make `Fusion` an affix.
    fusion = discover_affixes([("deepseek_v3_fusion.py", "DeepseekV2MLAAttentionFusion")], UPSTREAM)
    assert fusion.upstream_name("DeepseekV2MLAAttentionFusion") == "DeepseekV2MLAAttentionFusion"
    # vllm_gcu/models/__init__.py:40 registers DeepseekVLV2ForCausalLM as deepseek_vl2:DeepseekVLV2ForCausalLMGCU:
    # the registration itself shows the vendor's suffix.
    proven = discover_affixes(
        [("deepseek_vl2.py", "DeepseekVLV2ForCausalLMGCU")],
        UPSTREAM,
        [("DeepseekVLV2ForCausalLM", "DeepseekVLV2ForCausalLMGCU")],
    )
    assert proven.upstream_name("DeepseekVLV2ForCausalLMGCU") == "DeepseekVLV2ForCausalLM"


def test_two_names_or_a_short_or_compound_word_are_no_affix() -> None:
    # Seen on vllm-ascend b4b04c5eb1: `install_patch` and `fused_gdn_gating_patch` (two names) would make
    # `_patch` an affix; `LayerNormFn` in two files `Fn`; `KVPoolScheduler`/`KVPoolWorker` the two words `KVPool`.
    known = UPSTREAM | {"install", "fused_gdn_gating", "LayerNorm", "Scheduler", "Worker", "Engine"}
    local = [
        ("patch_vision.py", "install_patch"),
        ("gating.py", "fused_gdn_gating_patch"),
        ("layernorm.py", "LayerNormFn"),
        ("layernorm_guard.py", "LayerNormFn"),
        ("pool_scheduler.py", "KVPoolScheduler"),
        ("pool_worker.py", "KVPoolWorker"),
        ("pool_engine.py", "KVPoolEngine"),
    ]
    affixes = discover_affixes(local, known)
    assert [affixes.upstream_name(n) for _, n in local] == [n for _, n in local]


def test_upstream_names_word_fragments_and_compound_affixes() -> None:
    known = UPSTREAM | {"Foo", "Bar", "Qwen2Model", "Model"}
    local = [("a.py", "AscendFoo"), ("b.py", "AscendBar"), ("c.py", "AscendQwen2Model"), ("d.py", "FusedMoE")]
    local += [("e.py", "AscendMiniMaxM3Indexer")]
    affixes = discover_affixes(local, known)
    # `FusedMoE` is an upstream name: it is never cut to `MoE`, even though `MoE` exists too.
    assert affixes.upstream_name("FusedMoE") == "FusedMoE"
    # The shortest affix first: `AscendQwen2Model` is a fork of `Qwen2Model`, not of `Model`.
    assert affixes.upstream_name("AscendQwen2Model") == "Qwen2Model"
    # A cut needs a word boundary: `Ascendant` does not start with the word `Ascend`.
    assert affixes.upstream_name("AscendantBackend") == "AscendantBackend"


def test_snake_case_prefixes_and_the_maca_convention() -> None:
    local = [("rope.py", "npu_yarn_get_mscale"), ("rotary.py", "npu_rope"), ("rotary.py", "npu_rope_cache")]
    affixes = discover_affixes(local, UPSTREAM | {"rope", "rope_cache"})
    assert affixes.upstream_name("npu_yarn_get_mscale") == "yarn_get_mscale"
    # `Maca`, the MetaX plugin's documented convention, holds without any other name.
    assert VendorAffixes().upstream_name("MacaDeepseekMLP") == "DeepseekMLP"
    assert VendorAffixes().forms("MacaDeepseekMLP") == ["MacaDeepseekMLP", "DeepseekMLP"]
