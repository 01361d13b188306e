"""Tiny Llama / Qwen2 checkpoints built from scratch for tests that start a real vLLM server.

Everything is made here, with no download: a byte-level BPE tokenizer trained with `tokenizers`
on a small corpus, a chat template, a config.json and (optionally) random weights written as a
plain safetensors file (the format is a little-endian u64 header length, a JSON header and the
raw tensor bytes; no numpy or torch needed in the test process).

Sizes respect the CPU build's limits: its attention rejects head_dim 16, so the default is
hidden 128 with 4 heads (head_dim 32).
"""

from __future__ import annotations

import json
import random
import struct
from array import array
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}</s>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model answers every request with tokens, not with meaning.",
    "vLLM serves models through an OpenAI compatible server.",
    "MetaX accelerators run MACA kernels; the CPU build runs the same Python paths.",
    "Hello world, hello model, hello server. Paris is the capital of France.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Letters: a b c d e f g h i j k.",
]


def write_tokenizer(directory: Path, vocab_size: int) -> int:
    """Train a byte-level BPE tokenizer on the corpus; returns the vocabulary size it reached."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "</s>",
                "model_max_length": 512,
                "add_bos_token": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"})
    )
    return tokenizer.get_vocab_size()


def tiny_config(
    arch: str = "llama", hidden: int = 128, heads: int = 4, kv_heads: int = 2, layers: int = 2, vocab: int = 384
) -> dict[str, Any]:
    common = {
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if arch == "llama":
        return {
            **common,
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }
    if arch == "qwen2":
        return {
            **common,
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "use_sliding_window": False,
            "sliding_window": None,
        }
    raise ValueError(arch)


def weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Llama-style checkpoint (Qwen2 adds q/k/v biases)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        shapes.update(
            {
                f"{p}.input_layernorm.weight": (h,),
                f"{p}.post_attention_layernorm.weight": (h,),
                f"{p}.self_attn.q_proj.weight": (q, h),
                f"{p}.self_attn.k_proj.weight": (kv, h),
                f"{p}.self_attn.v_proj.weight": (kv, h),
                f"{p}.self_attn.o_proj.weight": (h, q),
                f"{p}.mlp.gate_proj.weight": (i, h),
                f"{p}.mlp.up_proj.weight": (i, h),
                f"{p}.mlp.down_proj.weight": (h, i),
            }
        )
        if config["model_type"] == "qwen2":
            shapes.update(
                {
                    f"{p}.self_attn.q_proj.bias": (q,),
                    f"{p}.self_attn.k_proj.bias": (kv,),
                    f"{p}.self_attn.v_proj.bias": (kv,),
                }
            )
    return shapes


def write_safetensors(path: Path, config: dict[str, Any], seed: int = 0, std: float = 0.1) -> None:
    """Random F32 weights (norms are ones): logits spread wide enough that greedy decoding has
    no near ties, so two correct implementations pick the same tokens."""
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, shape in sorted(weight_shapes(config).items()):
        count = 1
        for dim in shape:
            count *= dim
        if name.endswith("norm.weight"):
            values = array("f", [1.0]) * count
        else:
            values = array("f", (rng.gauss(0.0, std) for _ in range(count)))
        data = values.tobytes()  # little-endian on every platform these tests run on
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for blob in blobs:
            handle.write(blob)


def build_model(directory: Path, arch: str = "llama", weights: bool = False, **config_overrides: Any) -> Path:
    """A model directory vLLM and transformers both load (weights=False: for --load-format dummy)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = tiny_config(arch, **config_overrides)
    reached = write_tokenizer(directory, config["vocab_size"])
    assert reached <= config["vocab_size"], (reached, config["vocab_size"])
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False})
    )
    if weights:
        write_safetensors(directory / "model.safetensors", config)
    return directory
