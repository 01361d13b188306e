"""What the parallel sizes mean for a trim: which widths divide by TP (depth changes none of them), FP8
block limits per rank, expert counts against EP, and what each pipeline stage holds."""

from __future__ import annotations

from typing import Any

from ..checkpoint.layer_ids import compact_ids
from ..checkpoint.layout import Layout
from .budget import Parallel
from .selection import stage_layers

TP_KEYS = (
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "index_n_heads",
)
BLOCK_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def tp_notes(
    part: dict[str, Any], raw: dict[str, Any], parallel: Parallel, experts: tuple[str, int, list[int]] | None
) -> list[str]:
    notes = [
        "Depth does not change TP limits: every kept layer keeps its widths, so the trim supports exactly the TP "
        "sizes the original does; the layer count need not divide by TP or PP."
    ]
    tp = parallel.tp
    quant = part.get("quantization_config") or raw.get("quantization_config") or {}
    block = quant.get("weight_block_size") if isinstance(quant, dict) else None
    dividing = []
    for key in TP_KEYS:
        value = part.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            continue
        if key == "num_key_value_heads" and value < tp:
            notes.append(
                f"num_key_value_heads {value} < tp {tp}: each KV head is replicated on {tp // value} ranks "
                "(vLLM allows it)."
            )
        elif value % tp:
            notes.append(
                f"{key} {value} does not divide by tp {tp}: vLLM refuses this TP size for the original and the "
                "trim alike."
            )
        else:
            dividing.append(f"{key} {value}")
        if key in BLOCK_KEYS and isinstance(block, list) and block and value % tp == 0 and (value // tp) % block[0]:
            notes.append(
                f"{key} {value} / tp {tp} = {value // tp} per rank is not a multiple of the FP8 block {block[0]}: "
                "block-FP8 linear layers refuse it."
            )
    if dividing and tp > 1:
        notes.append(f"divide by tp {tp}: {', '.join(dividing)}.")
    if experts and parallel.ep > 1:
        key, count, _ = experts
        notes.append(
            f"{key} {count} {'divides' if count % parallel.ep == 0 else 'does not divide'} by ep {parallel.ep}."
        )
    return notes


def stage_notes(kept: list[int], parallel: Parallel, layout: Layout) -> list[str]:
    """What each pipeline stage holds, and how vLLM's expert parallelism is reached."""
    notes = []
    if parallel.pp > 1:
        for stage, layers in enumerate(stage_layers(kept, parallel.pp)):
            kinds = sorted({k for i in layers for k in layout.kinds.get(i, [])})
            notes.append(f"pp stage {stage}: original layers {compact_ids(layers)} ({', '.join(kinds)}).")
    if parallel.ep > 1:
        notes.append("vLLM's expert-parallel size is TP x DP: serve with --enable-expert-parallel (run_smoke_test ep).")
    return notes
