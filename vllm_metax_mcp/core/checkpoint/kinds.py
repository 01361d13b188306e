"""Per-layer kinds of a decoder (dense/MoE, attention kind, MLA, indexer, compression, routing, KV
sharing), each decided by a config rule or array and recorded with the rule behind it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .id_lists import ArrayInfo, IdList
from .layer_ids import compact_ids
from .raw_config import MAX_LAYERS, int_key, is_int

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts", "n_experts")
#: How each rule the kind builder reads relates to layer ids, and which kinds it decides: what a
#: depth trim must keep true. `below`: layers with id < value; `from_end`: the last `value` layers;
#: `period`: a modulus over ids (a trim refits it).
RuleForm = Literal["below", "period", "from_end"]
RULE_FORMS: dict[str, tuple[RuleForm, tuple[str, ...]]] = {
    "first_k_dense_replace": ("below", ("dense", "moe")),
    "moe_layer_freq": ("period", ("dense", "moe")),
    "decoder_sparse_step": ("period", ("dense", "moe")),
    "full_attention_interval": ("period", ("attn:",)),
    "sliding_window_pattern": ("period", ("attn:",)),
    "max_window_layers": ("below", ("attn:",)),
    "num_hash_layers": ("below", ("route:",)),
    "num_kv_shared_layers": ("from_end", ("kv:",)),
}


@dataclass
class Rule:
    name: str
    value: Any
    active: bool
    layers: str
    meaning: str


def _short_attention(value: Any) -> str:
    text = str(value)
    return "attn:" + (text[: -len("_attention")] if text.endswith("_attention") else text)


def _expert_key(data: dict[str, Any]) -> str | None:
    """The key that gives this config routed experts (a positive count), if any."""
    for key in EXPERT_COUNT_KEYS:
        value = data.get(key)
        if is_int(value) and value > 0:
            return key
    return None


class KindBuilder:
    """Per-layer kinds for the backbone (and arrays covering the MTP), each with the rule behind it."""

    def __init__(self, data: dict[str, Any], backbone: int, mtp: int, arrays: list[ArrayInfo]) -> None:
        self.data = data
        self.backbone = backbone
        self.mtp = mtp
        self.arrays = {a.name: a for a in arrays}
        self.kinds: dict[int, list[str]] = {i: [] for i in range(backbone + mtp)}
        self.rules: list[Rule] = []
        self.gaps: list[str] = []
        self.indexer_undetermined = False
        self._attention_lists = False

    def add(self, layer: int, kind: str) -> None:
        if layer in self.kinds and kind not in self.kinds[layer]:
            self.kinds[layer].append(kind)

    def rule(self, name: str, active: bool, layers: list[int], meaning: str) -> None:
        self.rules.append(Rule(name, self.data.get(name), active, compact_ids(layers) if layers else "", meaning))

    # -- mlp ---------------------------------------------------------------------------------

    def mlp(self, id_lists: list[IdList]) -> None:
        expert_key = _expert_key(self.data)
        backbone = range(self.backbone)
        if expert_key is None:
            for i in backbone:
                self.add(i, "dense")
            return
        dense_ids = self._ids_with_meaning(id_lists, "dense")
        if "first_k_dense_replace" in self.data:
            k = int_key(self.data, "first_k_dense_replace", MAX_LAYERS) or 0
            freq = int_key(self.data, "moe_layer_freq", MAX_LAYERS) if "moe_layer_freq" in self.data else None
            step = freq or 1
            moe = [i for i in backbone if i >= k and i % step == 0 and i not in dense_ids]
            rest = (
                "the rest MoE"
                if freq is not None
                else "the rest MoE (moe_layer_freq absent: the consumer's default step 1)"
            )
            self.rule(
                "first_k_dense_replace",
                True,
                [i for i in backbone if i < k],
                f"dense layers (id < first_k_dense_replace); {rest}",
            )
            if freq is not None:
                self.rule(
                    "moe_layer_freq", True, moe, "MoE where id >= first_k_dense_replace and id % moe_layer_freq == 0"
                )
        elif "decoder_sparse_step" in self.data:
            step = int_key(self.data, "decoder_sparse_step", MAX_LAYERS) or 1
            moe = [i for i in backbone if (i + 1) % step == 0 and i not in dense_ids]
            self.rule(
                "decoder_sparse_step",
                True,
                moe,
                "MoE where (id + 1) % decoder_sparse_step == 0 and id not in mlp_only_layers",
            )
        else:
            moe = [i for i in backbone if i not in dense_ids]
        for i in backbone:
            self.add(i, "moe" if i in moe else "dense")

    @staticmethod
    def _ids_with_meaning(id_lists: list[IdList], meaning: str) -> set[int]:
        found: set[int] = set()
        for item in id_lists:
            if item.meaning == meaning and item.base is not None:
                found.update(i - item.base for i in item.ids)
        return found

    # -- attention ---------------------------------------------------------------------------

    def attention(self, id_lists: list[IdList]) -> None:
        layer_types = self.arrays.get("layer_types")
        if layer_types is not None and layer_types.covers != "mismatch":
            for i, value in enumerate(layer_types.values):
                self.add(i, _short_attention(value))
        elif "full_attention_interval" in self.data and self.data["full_attention_interval"]:
            n = int_key(self.data, "full_attention_interval", MAX_LAYERS) or 1
            full = [i for i in range(self.backbone) if (i + 1) % n == 0]
            self.rule(
                "full_attention_interval",
                True,
                full,
                "full attention where (id + 1) % interval == 0; linear attention elsewhere",
            )
            for i in range(self.backbone):
                self.add(i, "attn:full" if i in full else "attn:linear")
        elif self.data.get("sliding_window_pattern") and self.data.get("sliding_window"):
            p = int_key(self.data, "sliding_window_pattern", MAX_LAYERS) or 1
            full = [i for i in range(self.backbone) if (i + 1) % p == 0]
            self.rule(
                "sliding_window_pattern",
                True,
                full,
                "full attention where (id + 1) % pattern == 0; sliding window elsewhere",
            )
            for i in range(self.backbone):
                self.add(i, "attn:full" if i in full else "attn:sliding")
        elif (
            self.data.get("use_sliding_window") and self.data.get("sliding_window") and "max_window_layers" in self.data
        ):
            w = int_key(self.data, "max_window_layers", MAX_LAYERS) or 0
            sliding = [i for i in range(self.backbone) if i >= w]
            self.rule("max_window_layers", True, sliding, "sliding window where id >= max_window_layers")
            for i in range(self.backbone):
                self.add(i, "attn:sliding" if i in sliding else "attn:full")
        else:
            self._id_list_attention(id_lists)
        if "max_window_layers" in self.data and not self.data.get("use_sliding_window"):
            self.rule("max_window_layers", False, [], "inactive: use_sliding_window is false or absent")
        if self.data.get("kv_lora_rank"):
            for i in range(self.backbone):
                self.add(i, "mla")
        self._compress_ratios()
        self._indexer()

    def _id_list_attention(self, id_lists: list[IdList]) -> None:
        """Listed layers get the list's kind; with any attention id list present, unlisted layers stay undetermined."""
        self._attention_lists = any(item.meaning in ("full", "linear", "sliding") for item in id_lists)
        full = self._ids_with_meaning(id_lists, "full")
        linear = self._ids_with_meaning(id_lists, "linear")
        sliding = self._ids_with_meaning(id_lists, "sliding")
        sliding_everywhere = bool(self.data.get("sliding_window")) and self.data.get("use_sliding_window") is not False
        for i in range(self.backbone):
            if i in full:
                self.add(i, "attn:full")
            elif i in linear:
                self.add(i, "attn:linear")
            elif i in sliding:
                self.add(i, "attn:sliding")
            elif not self._attention_lists:
                self.add(i, "attn:sliding" if sliding_everywhere else "attn:full")

    def _compress_ratios(self) -> None:
        for name, array in self.arrays.items():
            if not name.endswith("compress_ratios") or array.covers == "mismatch":
                continue
            for i, value in enumerate(array.values):
                if is_int(value) and value > 0:
                    self.add(i, f"compress:{value}")

    def _indexer(self) -> None:
        if not any(k in self.data for k in ("index_topk", "index_n_heads")):
            return
        varying = any(a.covers != "mismatch" and a.distinct > 1 for a in self.arrays.values())
        if varying:
            self.indexer_undetermined = True
            self.gaps.append(
                "index_topk configures a sparse-attention indexer, but attention varies per layer "
                "(a per-layer array is present): which layers carry an indexer is decided by tensor names "
                "or the consumer code, not by the config."
            )
            return
        for i in range(self.backbone):
            self.add(i, "indexer")

    # -- routing and sharing -----------------------------------------------------------------

    def routing(self) -> None:
        if "num_hash_layers" not in self.data:
            return
        h = int_key(self.data, "num_hash_layers", MAX_LAYERS) or 0
        hashed = [i for i in range(min(h, self.backbone))]
        self.rule(
            "num_hash_layers", True, hashed, "hash-routed experts where id < num_hash_layers; learned routing elsewhere"
        )
        for i in range(self.backbone):
            self.add(i, "route:hash" if i < h else "route:learned")

    def sharing(self) -> None:
        if "num_kv_shared_layers" not in self.data:
            return
        n = int_key(self.data, "num_kv_shared_layers", MAX_LAYERS) or 0
        shared = list(range(max(0, self.backbone - n), self.backbone))
        self.rule("num_kv_shared_layers", True, shared, "these last layers reuse the KV cache of an earlier layer")
        for i in shared:
            self.add(i, "kv:shared")


def build_kinds(
    part: dict[str, Any], backbone: int, mtp: int, arrays: list[ArrayInfo], id_lists: list[IdList]
) -> KindBuilder:
    """Every kind of every layer, in the order the tool lists them: MLP, attention, routing, sharing."""
    builder = KindBuilder(part, backbone, mtp, arrays)
    builder.mlp(id_lists)
    builder.attention(id_lists)
    builder.routing()
    builder.sharing()
    return builder
