"""Memory and disk budgets of a depth-trimmed model: parameters and KV cache per rank, bytes on disk.

Exact where the checkpoint's shard headers give every tensor's dtype and shape; otherwise estimated
from the config's width keys (and labelled so). A depth trim keeps each retained layer's widths, so
per-layer costs come from the original model and are summed over the kept layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..checkpoint.cross_check import CheckpointReport
from ..checkpoint.kinds import EXPERT_COUNT_KEYS
from ..checkpoint.layer_ids import is_mtp_prefix, split_layer_name
from ..checkpoint.layout import Layout
from ..checkpoint.safetensors_headers import CheckpointFiles
from .selection import pp_partitions

GIB = 1024**3
USABLE_FRACTION = 0.9
"""vLLM's default gpu_memory_utilization: the share of a device a server plans with."""
DTYPE_NAMES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "top_k")


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    pp: int = 1
    ep: int = 1


@dataclass
class Cost:
    """Bytes of a group of tensors by how ranks split them."""

    sharded: float = 0.0
    """Split over TP (attention, dense MLP, shared experts, vocabulary-parallel embeddings)."""
    experts: float = 0.0
    """Routed experts: split over EP, or over TP without EP."""
    replicated: float = 0.0
    """On every rank (norms, router gates)."""

    @property
    def total(self) -> float:
        return self.sharded + self.experts + self.replicated

    def per_rank(self, parallel: Parallel) -> float:
        expert_ranks = parallel.ep if parallel.ep > 1 else parallel.tp
        return self.sharded / parallel.tp + self.experts / expert_ranks + self.replicated

    def plus(self, other: Cost) -> Cost:
        return Cost(self.sharded + other.sharded, self.experts + other.experts, self.replicated + other.replicated)


@dataclass
class Costs:
    """Per-layer costs (logical ids; MTP layer i at L+i) and the parts outside layers."""

    source: str
    layers: dict[int, Cost]
    first: Cost
    """Embedding side, on the first pipeline stage."""
    last: Cost
    """Head and final norm, on the last pipeline stage."""

    def original_total(self) -> float:
        return sum(c.total for c in self.layers.values()) + self.first.total + self.last.total


# -- costs from tensors -------------------------------------------------------------------------


def _tensor_layer(name: str, prefix: str | None, backbone: int) -> int | None:
    """Logical layer of a tensor (MTP i -> L+i); None outside the decoder's layers."""
    parsed = split_layer_name(name)
    if parsed is None:
        return backbone if is_mtp_prefix(name.rsplit(".", 1)[0]) else None
    if parsed[0] == prefix:
        return parsed[1]
    return backbone + parsed[1] if is_mtp_prefix(parsed[0]) else None


def _bucket(name: str, shape: tuple[int, ...]) -> str:
    parts = name.split(".")
    if any(p == "experts" and i + 1 < len(parts) and parts[i + 1].isdigit() for i, p in enumerate(parts)):
        return "experts"
    return "replicated" if len(shape) <= 1 else "sharded"


def costs_from_tensors(files: CheckpointFiles, report: CheckpointReport, backbone: int) -> Costs | None:
    """Exact bytes per layer from shard headers; None when a tensor's dtype or shape is unknown (index only)."""
    layers: dict[int, Cost] = {}
    first, last = Cost(), Cost()
    for name, tensor in files.tensors.items():
        if tensor.dtype is None or tensor.shape is None or tensor.nbytes is None:
            return None
        size = tensor.nbytes
        layer = _tensor_layer(name, report.backbone_prefix, backbone)
        target = layers.setdefault(layer, Cost()) if layer is not None else first if "embed" in name else last
        bucket = _bucket(name, tensor.shape)
        setattr(target, bucket, getattr(target, bucket) + size)
    return Costs("tensors (shard headers)", layers, first, last)


# -- costs estimated from the config --------------------------------------------------------------


def _int(part: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = part.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def model_bytes(part: dict[str, Any]) -> int:
    """Bytes per element of the unquantized parts (torch_dtype / dtype; 2 when absent)."""
    for key in ("torch_dtype", "dtype"):
        if isinstance(part.get(key), str) and part[key] in DTYPE_NAMES:
            return DTYPE_NAMES[part[key]]
    return 2


def _weight_bytes(config: dict[str, Any], part: dict[str, Any]) -> tuple[float, float]:
    """(bytes per linear weight element, per routed-expert element) from the quantization config."""
    quant = part.get("quantization_config") or config.get("quantization_config") or {}
    dense = (
        1.0
        if isinstance(quant, dict) and ("fp8" in str(quant.get("quant_method")) or quant.get("fmt") == "e4m3")
        else float(model_bytes(part))
    )
    experts = 0.5 if str(part.get("expert_dtype", "")).lower() in ("fp4", "mxfp4", "nvfp4") else dense
    return dense, experts


def _attention_elements(part: dict[str, Any], kinds: list[str]) -> float:
    h, heads = _int(part, "hidden_size"), _int(part, "num_attention_heads")
    nk, dk = _int(part, "linear_num_key_heads"), _int(part, "linear_key_head_dim")
    nv, dv = _int(part, "linear_num_value_heads"), _int(part, "linear_value_head_dim")
    if "attn:linear" in kinds and nk and nv:
        conv = (2 * nk * dk + nv * dv) * _int(part, "linear_conv_kernel_dim")
        return h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + conv + nv * dv * h
    q_lora = _int(part, "q_lora_rank")
    kv_lora = _int(part, "kv_lora_rank")
    if kv_lora:
        qk = _int(part, "qk_nope_head_dim") + _int(part, "qk_rope_head_dim")
        q = h * q_lora + q_lora * heads * qk if q_lora else h * heads * qk
        kv = h * (kv_lora + _int(part, "qk_rope_head_dim")) + kv_lora * heads * (
            _int(part, "qk_nope_head_dim") + _int(part, "v_head_dim")
        )
        indexer = 0
        if "indexer" in kinds:
            n, d = _int(part, "index_n_heads"), _int(part, "index_head_dim")
            indexer = (q_lora or h) * n * d + h * d + h * n
        return q + kv + heads * _int(part, "v_head_dim") * h + indexer
    head_dim = _int(part, "head_dim") or (h // heads if heads else 0)
    kv_heads = _int(part, "num_key_value_heads") or heads
    q = h * q_lora + q_lora * heads * head_dim if q_lora else h * heads * head_dim
    return q + 2 * h * kv_heads * head_dim + heads * head_dim * h


def _layer_cost(config: dict[str, Any], part: dict[str, Any], kinds: list[str]) -> Cost:
    h = _int(part, "hidden_size")
    dense_w, expert_w = _weight_bytes(config, part)
    cost = Cost(sharded=_attention_elements(part, kinds) * dense_w, replicated=2 * h * model_bytes(part))
    experts = _int(part, *EXPERT_COUNT_KEYS)
    if "moe" in kinds and experts:
        inter = _int(part, "moe_intermediate_size", "intermediate_size")
        cost.experts += experts * 3 * h * inter * expert_w
        shared = _int(part, "shared_expert_intermediate_size") or _int(part, "n_shared_experts") * inter
        cost.sharded += shared * 3 * h * dense_w
        cost.replicated += h * experts * model_bytes(part)
    else:
        cost.sharded += 3 * h * _int(part, "intermediate_size") * dense_w
    return cost


def costs_from_config(config: dict[str, Any], part: dict[str, Any], layout: Layout, mtp: list[int]) -> Costs:
    """Estimated bytes per layer from width keys; an MTP layer counts as the last backbone layer plus its projection."""
    backbone = layout.backbone_layers or 0
    layers = {i: _layer_cost(config, part, layout.kinds.get(i, [])) for i in range(backbone)}
    h, vocab, width = _int(part, "hidden_size"), _int(part, "vocab_size"), model_bytes(part)
    for i in mtp:
        template = layers.get(backbone - 1, Cost())
        layers[backbone + i] = template.plus(Cost(sharded=2 * h * h * width))
    embedding = Cost(sharded=vocab * h * width)
    head = (
        Cost(replicated=h * width)
        if part.get("tie_word_embeddings")
        else Cost(sharded=vocab * h * width, replicated=h * width)
    )
    return Costs("estimate from config width keys (no shard headers)", layers, embedding, head)


# -- KV cache ------------------------------------------------------------------------------------


def kv_bytes_per_token(part: dict[str, Any], kinds: list[str], parallel: Parallel) -> float:
    """KV-cache bytes one token takes in one layer on one rank (0 for linear attention)."""
    width = model_bytes(part)
    if "attn:linear" in kinds:
        return 0.0
    kv_lora = _int(part, "kv_lora_rank")
    if kv_lora:
        index = _int(part, "index_head_dim") if "indexer" in kinds else 0
        return (kv_lora + _int(part, "qk_rope_head_dim") + index) * width
    heads = _int(part, "num_attention_heads")
    head_dim = _int(part, "head_dim") or (_int(part, "hidden_size") // heads if heads else 0)
    kv_heads = _int(part, "num_key_value_heads") or heads
    return 2 * max(1, math.ceil(kv_heads / parallel.tp)) * head_dim * width


def cached_tokens(part: dict[str, Any], kinds: list[str], context: int) -> float:
    """Tokens a layer keeps for one sequence: the window for sliding layers, 1/r for compressed ones."""
    window = _int(part, "sliding_window")
    tokens: float = min(context, window) if "attn:sliding" in kinds and window else context
    ratios = [int(k.split(":")[1]) for k in kinds if k.startswith("compress:")]
    if ratios:
        compressed = context / ratios[0]
        tokens = tokens + compressed if "attn:sliding" in kinds and window else compressed
    return tokens


def state_bytes(part: dict[str, Any], kinds: list[str], parallel: Parallel) -> float:
    """Recurrent state of a linear-attention layer for one sequence on one rank."""
    if "attn:linear" not in kinds:
        return 0.0
    nk, dk = _int(part, "linear_num_key_heads"), _int(part, "linear_key_head_dim")
    nv, dv = _int(part, "linear_num_value_heads"), _int(part, "linear_value_head_dim")
    conv = (2 * nk * dk + nv * dv) * max(0, _int(part, "linear_conv_kernel_dim") - 1)
    return (conv + nv * dk * dv) * model_bytes(part) / parallel.tp


# -- the budget ----------------------------------------------------------------------------------


@dataclass
class Stage:
    layers: list[int]
    params_bytes_per_rank: int
    kv_cache_bytes_per_rank: int


@dataclass
class Budget:
    source: str
    params_bytes: int
    original_params_bytes: int
    params_bytes_per_rank: int
    kv_bytes_per_token_per_rank: int
    kv_cache_bytes_per_rank: int
    state_bytes_per_rank: int
    max_model_len: int
    stages: list[Stage]
    device_bytes: int | None
    usable_bytes: int | None
    fits: bool | None
    disk_bytes_real: int
    recommendations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BudgetRequest:
    kept: list[int]
    """Original ids of the kept backbone layers."""
    mtp: list[int]
    """Logical ids (L+i) of the kept MTP layers; they run beside the last pipeline stage."""
    kinds: dict[int, list[str]]
    parallel: Parallel
    context: int
    device_gb: float | None
    expert_scale: float = 1.0
    """E'/E when experts are narrowed."""


def _scaled(cost: Cost, scale: float) -> Cost:
    return Cost(cost.sharded, cost.experts * scale, cost.replicated)


def _stage(
    costs: Costs, part: dict[str, Any], request: BudgetRequest, layers: list[int], first: bool, last: bool
) -> tuple[Stage, float, float]:
    """A stage's per-rank parameters and KV cache, its total per rank, and its KV bytes per token."""
    parallel = request.parallel
    cost = Cost()
    for layer in layers:
        cost = cost.plus(_scaled(costs.layers.get(layer, Cost()), request.expert_scale))
    cost = cost.plus(costs.first) if first else cost
    cost = cost.plus(costs.last) if last else cost
    kinds = [request.kinds.get(i, []) for i in layers]
    per_token = sum(kv_bytes_per_token(part, k, parallel) for k in kinds)
    kv = sum(kv_bytes_per_token(part, k, parallel) * cached_tokens(part, k, request.context) for k in kinds)
    params = cost.per_rank(parallel)
    return Stage(layers, int(params), int(kv)), params + kv, per_token


def budget(costs: Costs, part: dict[str, Any], request: BudgetRequest) -> Budget:
    """Per-rank parameters and KV cache for one sequence of `context` tokens, stage by stage (vLLM's split)."""
    stages: list[Stage] = []
    worst, per_token, start = 0.0, 0.0, 0
    partitions = pp_partitions(len(request.kept), request.parallel.pp)
    for index, count in enumerate(partitions):
        last = index == len(partitions) - 1
        layers = request.kept[start : start + count] + (request.mtp if last else [])
        start += count
        stage, total, token = _stage(costs, part, request, layers, index == 0, last)
        stages.append(stage)
        worst, per_token = max(worst, total), max(per_token, token)
    states = sum(state_bytes(part, request.kinds.get(i, []), request.parallel) for i in request.kept)
    kept = request.kept + request.mtp
    total = (
        sum(_scaled(costs.layers.get(i, Cost()), request.expert_scale).total for i in kept)
        + costs.first.total
        + costs.last.total
    )
    device = int(request.device_gb * GIB) if request.device_gb else None
    usable = int(device * USABLE_FRACTION) if device else None
    return Budget(
        source=costs.source,
        params_bytes=int(total),
        original_params_bytes=int(costs.original_total()),
        params_bytes_per_rank=max((s.params_bytes_per_rank for s in stages), default=0),
        kv_bytes_per_token_per_rank=int(per_token),
        kv_cache_bytes_per_rank=max((s.kv_cache_bytes_per_rank for s in stages), default=0),
        state_bytes_per_rank=int(states),
        max_model_len=request.context,
        stages=stages,
        device_bytes=device,
        usable_bytes=usable,
        fits=None if usable is None else worst + states <= usable,
        disk_bytes_real=int(total),
    )


# -- when it does not fit ---------------------------------------------------------------------------


def gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def expert_choices(part: dict[str, Any], parallel: Parallel) -> tuple[str, int, list[int]] | None:
    """(expert-count key, count, valid smaller counts, largest first): multiples of the group count and
    of EP, at least top-k, and enough experts per group for the selected groups to supply top-k."""
    key = next((k for k in EXPERT_COUNT_KEYS if _int(part, k)), None)
    if key is None:
        return None
    count, top_k = part[key], _int(part, *TOP_K_KEYS) or 1
    groups, chosen_groups = _int(part, "n_group") or 1, _int(part, "topk_group") or 1
    step = math.lcm(groups, parallel.ep if parallel.ep > 1 else 1)
    valid = [
        n
        for n in range(count - step, 0, -step)
        if n >= top_k and (groups == 1 or (n // groups >= 2 and chosen_groups * (n // groups) >= top_k))
    ]
    return key, count, valid


def recommendations(plan: Budget, narrowing: str | None) -> list[str]:
    """What to change, in order, when the plan does not fit: context, then concurrency and cache, then widths."""
    if plan.fits is not False or plan.usable_bytes is None:
        return []
    found: list[str] = []
    spare = plan.usable_bytes - plan.params_bytes_per_rank - plan.state_bytes_per_rank
    kv_token = plan.kv_bytes_per_token_per_rank
    if spare > 0 and kv_token:
        fitting = int(spare / kv_token) // 256 * 256
        found.append(
            f"shorter context: max_model_len {fitting} fits one sequence in {gib(spare)} left after parameters "
            f"({int(kv_token)} KV bytes per token per rank) instead of {plan.max_model_len}."
        )
    found.append(
        "lower concurrency and cache budget: serve with --max-num-seqs 1 and an explicit --kv-cache-memory-bytes "
        "(gpu_memory_utilization only sets a budget; too small a budget stops startup)."
    )
    if spare <= 0:
        found.append(
            f"parameters alone need {gib(plan.params_bytes_per_rank)} per rank of {gib(plan.usable_bytes)} usable: "
            "depth is already "
            "the fewest layers for the required paths; more TP/EP ranks shard the same widths."
        )
        if narrowing:
            found.append(narrowing)
    return found
