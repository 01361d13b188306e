"""The raw layer layout of a checkpoint's `config.json`, decided from the keys it holds.

Nothing here knows model names: depth, MTP count, layer-indexed arrays, layer-id lists and
periodic rules are recognised by their keys and values, and each per-layer kind records the
rule it came from. Where the file does not say something, the answer is "undetermined", never a
config-class default.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundation.errors import bad_input, not_found
from ..foundation.policy import FileTooLarge, Policy
from ..foundation.safe_load import load_json_bounded

CONFIG_NAME = "config.json"
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_LAYERS = 4096
MAX_MTP_LAYERS = 64

DEPTH_KEYS = ("num_hidden_layers", "num_layers", "n_layers", "n_layer", "depth")
MTP_COUNT_KEYS = (
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "num_mtp_layers",
    "n_mtp_layers",
    "num_mtp_modules",
)
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts", "n_experts")
QUANT_IGNORE_KEYS = ("modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules", "ignored_modules")
ID_LIST_SUFFIXES = ("layers", "layer_ids", "layer_idx", "layer_indices", "layer_list")
NOT_ARRAYS = ("architectures",)
#: Words in an id list's name and what a listed layer then is (checked against tensor names).
ID_LIST_MEANINGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("mlp_only", "dense"), "dense"),
    (("moe", "sparse", "expert"), "moe"),
    (("full_attn", "full_attention", "global"), "full"),
    (("kda", "linear", "mamba", "ssm", "gdn"), "linear"),
    (("sliding", "swa", "local"), "sliding"),
    (("hash",), "hash"),
)
#: How each rule the kind builder reads relates to layer ids, and which kinds it decides: what a
#: depth trim must keep true. `below`: layers with id < value; `from_end`: the last `value` layers;
#: `period`: a modulus over ids (a trim refits it).
RULE_FORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "first_k_dense_replace": ("below", ("dense", "moe")),
    "moe_layer_freq": ("period", ("dense", "moe")),
    "decoder_sparse_step": ("period", ("dense", "moe")),
    "full_attention_interval": ("period", ("attn:",)),
    "sliding_window_pattern": ("period", ("attn:",)),
    "max_window_layers": ("below", ("attn:",)),
    "num_hash_layers": ("below", ("route:",)),
    "num_kv_shared_layers": ("from_end", ("kv:",)),
}
#: The kinds an id list of each meaning decides.
MEANING_KINDS: dict[str, tuple[str, ...]] = {
    "dense": ("dense", "moe"),
    "moe": ("dense", "moe"),
    "full": ("attn:",),
    "linear": ("attn:",),
    "sliding": ("attn:",),
    "hash": ("route:",),
}


# -- reading -----------------------------------------------------------------------------------


def load_config(directory: Path, policy: Policy) -> dict[str, Any]:
    """The parsed `config.json` of a model directory, or an error that says what is wrong. It is read
    through the policy: a config.json (or hub-cache snapshot link) leading outside the readable places
    is refused with outside_roots, whether or not its target exists."""
    path = directory / CONFIG_NAME
    if not path.is_file() and not path.is_symlink():
        raise not_found(
            f"No {CONFIG_NAME} in the model directory; pass the directory that holds the checkpoint's {CONFIG_NAME}."
        )
    policy.readable(path)
    if not path.is_file():
        raise not_found(f"{CONFIG_NAME} in the model directory is a dangling link; restore the file it points to.")
    try:
        data = load_json_bounded(policy.read_bytes(path, max_bytes=MAX_CONFIG_BYTES), CONFIG_NAME)
    except FileTooLarge as exc:
        raise bad_input(
            f"{CONFIG_NAME} is {exc.size} bytes, more than a config can reasonably be; check the file."
        ) from None
    except json.JSONDecodeError as exc:
        raise bad_input(
            f"{CONFIG_NAME} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix the file."
        ) from None
    except UnicodeDecodeError:
        raise bad_input(f"{CONFIG_NAME} is not UTF-8 text; fix the file.") from None
    if not isinstance(data, dict):
        raise bad_input(f"{CONFIG_NAME} holds a JSON {type(data).__name__}, not an object; fix the file.")
    return data


# -- small helpers -----------------------------------------------------------------------------


def compact_ids(ids: list[int] | set[int]) -> str:
    """`0-2`, `3,7,...,47`, `0,1,43`: a short, exact rendering of a set of layer ids."""
    values = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i + 1
        if j < len(values):
            step = values[j] - values[i]
            while j + 1 < len(values) and values[j + 1] - values[j] == step:
                j += 1
            run = j - i + 1
            if step == 1 and run >= 3:
                parts.append(f"{values[i]}-{values[j]}")
                i = j + 1
                continue
            if step > 1 and run >= 4:
                parts.append(f"{values[i]},{values[i] + step},...,{values[j]}")
                i = j + 1
                continue
        parts.append(str(values[i]))
        i += 1
    return ",".join(parts)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_key(data: dict[str, Any], key: str, limit: int) -> int | None:
    """An integer count from the config, or None when absent; absurd values are refused."""
    if key not in data or data[key] is None:
        return None
    value = data[key]
    if not _is_int(value) or not 0 <= value <= limit:
        raise bad_input(f"config.json: {key} is {value!r}; it must be an integer between 0 and {limit}. Fix the file.")
    return value


def parse_id_list(value: Any) -> list[int] | None:
    """A list of ints, or a comma-separated string of ints; None when it is neither."""
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",") if p.strip()]
        if not all(re.fullmatch(r"-?\d+", p) for p in items):
            return None
        return [int(p) for p in items]
    if isinstance(value, list) and all(_is_int(v) for v in value):
        return list(value)
    return None


def split_layer_name(name: str) -> tuple[str, int, str] | None:
    """`model.layers.3.mlp.gate` -> (`model.layers`, 3, `mlp.gate`): prefix, first numeric component, rest."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:index]), int(part), ".".join(parts[index + 1 :])
    return None


def is_mtp_prefix(prefix: str) -> bool:
    """A module path that names multi-token-prediction modules (`mtp`, `model.mtp.layers`)."""
    return any(part == "mtp" or part.startswith("mtp_") for part in prefix.split("."))


# -- the layout model --------------------------------------------------------------------------


@dataclass
class Submodel:
    name: str
    model_type: str | None
    layers: int | None
    depth_key: str | None
    mtp_layers: int | None = None


@dataclass
class ArrayInfo:
    name: str
    length: int
    covers: str
    distinct: int
    values: list[Any] = field(repr=False, default_factory=list)


@dataclass
class IdList:
    name: str
    ids: list[int]
    meaning: str | None
    base: int | None = None
    evidence: str = ""


@dataclass
class Rule:
    name: str
    value: Any
    active: bool
    layers: str
    meaning: str


@dataclass
class IgnoreSummary:
    key: str
    total: int
    non_layer: list[str]
    patterns: int
    by_part: dict[str, int]
    layer_ids: str
    per_layer: list[tuple[str, int]]
    by_module: dict[str, int]
    beyond_declared: list[int]
    entries: list[str] = field(default_factory=list, repr=False)


@dataclass
class Quantization:
    method: str | None
    fmt: str | None
    block_size: list[int] | None
    activation_scheme: str | None
    scale_fmt: str | None
    keys: list[str]
    ignore: IgnoreSummary | None = None


@dataclass
class Layout:
    """Everything the raw file says about layers, with how each conclusion was reached."""

    submodels: list[Submodel]
    primary: str
    backbone_layers: int | None
    mtp_layers: int | None
    mtp_key: str | None
    arrays: list[ArrayInfo]
    id_lists: list[IdList]
    rules: list[Rule]
    kinds: dict[int, list[str]]
    quantization: Quantization | None
    findings: list[tuple[str, str, str]]
    gaps: list[str]
    index_topk_layers_undetermined: bool = False


# -- submodels ---------------------------------------------------------------------------------


def _depth(data: dict[str, Any]) -> tuple[int | None, str | None]:
    for key in DEPTH_KEYS:
        if key in data and data[key] is not None:
            return _int_key(data, key, MAX_LAYERS), key
    return None, None


def _mtp(data: dict[str, Any]) -> tuple[int | None, str | None]:
    for key in MTP_COUNT_KEYS:
        if key in data and data[key] is not None:
            return _int_key(data, key, MAX_MTP_LAYERS), key
    return None, None


def _sub_configs(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Nested configs (text_config, vision_config, ...): dict values that carry a depth or a model_type."""
    found = []
    for key, value in data.items():
        if key == "quantization_config" or not isinstance(value, dict):
            continue
        if "model_type" in value or any(k in value for k in DEPTH_KEYS):
            found.append((key, value))
    return found


def find_submodels(data: dict[str, Any]) -> tuple[list[Submodel], str, dict[str, Any]]:
    """Every submodel with its own depth, and the primary (decoder) one the layer table describes."""
    depth, key = _depth(data)
    mtp, _ = _mtp(data)
    top = Submodel("", data.get("model_type"), depth, key, mtp)
    subs = []
    for name, sub in _sub_configs(data):
        sub_depth, sub_key = _depth(sub)
        subs.append((Submodel(name, sub.get("model_type"), sub_depth, sub_key, _mtp(sub)[0]), sub))
    if depth is not None or not subs:
        return [top, *(s for s, _ in subs)], "", data
    decoders = [(s, d) for s, d in subs if s.layers is not None and "vocab_size" in d]
    primary, primary_data = (decoders or [(s, d) for s, d in subs if s.layers is not None] or [subs[0]])[0]
    return [top, *(s for s, _ in subs)], primary.name, primary_data


# -- arrays and id lists -----------------------------------------------------------------------


def _candidates(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """Top-level keys plus one nested level of plain dicts (not sub-configs, not quantization)."""
    subs = {name for name, _ in _sub_configs(data)}
    found: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            if key in subs or key == "quantization_config":
                continue
            found.extend((f"{key}.{k}", v) for k, v in value.items())
        else:
            found.append((key, value))
    return found


def _id_list_meaning(name: str) -> str | None:
    leaf = name.rsplit(".", 1)[-1].lower()
    for words, meaning in ID_LIST_MEANINGS:
        if any(w in leaf for w in words):
            return meaning
    return None


def _looks_like_id_list(name: str, value: Any, lengths: set[int]) -> list[int] | None:
    leaf = name.rsplit(".", 1)[-1].lower()
    if not leaf.endswith(ID_LIST_SUFFIXES) or leaf in DEPTH_KEYS or leaf in MTP_COUNT_KEYS:
        return None
    ids = parse_id_list(value)
    if ids is None:
        return None
    if isinstance(value, list) and len(ids) in lengths and set(ids) <= {0, 1} and len(ids) > 2:
        return None  # a 0/1 mask with one entry per layer is an array, not a list of ids
    return ids


def _covers(length: int, backbone: int, mtp: int) -> str:
    if length == backbone:
        return "backbone"
    if mtp and length == backbone + mtp:
        return "backbone+mtp"
    return "mismatch"


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(not isinstance(v, (list, dict)) for v in value)


def find_arrays_and_id_lists(
    data: dict[str, Any], backbone: int, mtp: int
) -> tuple[list[ArrayInfo], list[IdList], list[tuple[str, str, str]]]:
    """Layer-indexed arrays (one entry per layer) and layer-id lists, with length findings."""
    arrays: list[ArrayInfo] = []
    id_lists: list[IdList] = []
    findings: list[tuple[str, str, str]] = []
    lengths = {backbone, backbone + mtp}
    for name, value in _candidates(data):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in NOT_ARRAYS or leaf.endswith(("token_id", "token_ids")):
            continue
        ids = _looks_like_id_list(name, value, lengths)
        if ids is not None:
            id_lists.append(IdList(name, ids, _id_list_meaning(name)))
            continue
        per_layer_name = "layer" in leaf.lower() or "pattern" in leaf.lower()
        if _scalar_list(value) and backbone >= 2 and (len(value) in lengths or per_layer_name) or isinstance(value, str) and per_layer_name and len(value) in lengths and backbone >= 2 and " " not in value:
            arrays.append(_array(name, list(value), backbone, mtp, findings))
    return arrays, id_lists, findings


def _array(name: str, values: list[Any], backbone: int, mtp: int, findings: list[tuple[str, str, str]]) -> ArrayInfo:
    covers = _covers(len(values), backbone, mtp)
    if covers == "mismatch":
        findings.append(
            (
                "warning",
                "array_length_mismatch",
                f"{name} has {len(values)} entries but the config declares {backbone} backbone + {mtp} MTP layers; "
                "check which layers its consumer indexes before trimming.",
            )
        )
    distinct = len({json.dumps(v, sort_keys=True) for v in values})
    return ArrayInfo(name, len(values), covers, distinct, values)


# -- per-layer kinds ---------------------------------------------------------------------------


def _short_attention(value: Any) -> str:
    text = str(value)
    return "attn:" + (text[: -len("_attention")] if text.endswith("_attention") else text)


def _expert_key(data: dict[str, Any]) -> str | None:
    """The key that gives this config routed experts (a positive count), if any."""
    for key in EXPERT_COUNT_KEYS:
        value = data.get(key)
        if _is_int(value) and value > 0:
            return key
    return None


class _KindBuilder:
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
            k = _int_key(self.data, "first_k_dense_replace", MAX_LAYERS) or 0
            freq = _int_key(self.data, "moe_layer_freq", MAX_LAYERS) if "moe_layer_freq" in self.data else None
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
            step = _int_key(self.data, "decoder_sparse_step", MAX_LAYERS) or 1
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
            n = _int_key(self.data, "full_attention_interval", MAX_LAYERS) or 1
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
            p = _int_key(self.data, "sliding_window_pattern", MAX_LAYERS) or 1
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
            w = _int_key(self.data, "max_window_layers", MAX_LAYERS) or 0
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
                if _is_int(value) and value > 0:
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
        h = _int_key(self.data, "num_hash_layers", MAX_LAYERS) or 0
        hashed = [i for i in range(min(h, self.backbone))]
        self.rule(
            "num_hash_layers", True, hashed, "hash-routed experts where id < num_hash_layers; learned routing elsewhere"
        )
        for i in range(self.backbone):
            self.add(i, "route:hash" if i < h else "route:learned")

    def sharing(self) -> None:
        if "num_kv_shared_layers" not in self.data:
            return
        n = _int_key(self.data, "num_kv_shared_layers", MAX_LAYERS) or 0
        shared = list(range(max(0, self.backbone - n), self.backbone))
        self.rule("num_kv_shared_layers", True, shared, "these last layers reuse the KV cache of an earlier layer")
        for i in shared:
            self.add(i, "kv:shared")


# -- quantization ------------------------------------------------------------------------------


def _block_size(value: Any) -> list[int] | None:
    return list(value) if isinstance(value, list) and all(_is_int(v) for v in value) else None


def summarise_quantization(data: dict[str, Any], backbone: int, mtp: int) -> Quantization | None:
    quant = data.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    ignore = None
    for key in QUANT_IGNORE_KEYS:
        entries = quant.get(key)
        if isinstance(entries, list) and all(isinstance(e, str) for e in entries):
            ignore = summarise_ignore(key, entries, backbone, mtp)
            break
    return Quantization(
        method=quant.get("quant_method") if isinstance(quant.get("quant_method"), str) else None,
        fmt=quant.get("fmt") if isinstance(quant.get("fmt"), str) else None,
        block_size=_block_size(quant.get("weight_block_size")),
        activation_scheme=quant.get("activation_scheme") if isinstance(quant.get("activation_scheme"), str) else None,
        scale_fmt=quant.get("scale_fmt") if isinstance(quant.get("scale_fmt"), str) else None,
        keys=sorted(quant),
        ignore=ignore,
    )


def logical_layer(prefix: str, index: int, backbone: int) -> tuple[str, int]:
    """(part, logical id) of a numbered module path: `*layers.N` keeps N, `mtp.*` i becomes L+i, the rest is other."""
    if is_mtp_prefix(prefix):
        return "mtp", backbone + index
    if prefix.endswith("layers"):
        return "layers", index
    return "other", index


def summarise_ignore(key: str, entries: list[str], backbone: int, mtp: int) -> IgnoreSummary:
    """Counts per layer, per part and per module instead of hundreds of paths."""
    per_layer: Counter[int] = Counter()
    by_module: Counter[str] = Counter()
    by_part: Counter[str] = Counter()
    non_layer: list[str] = []
    patterns = 0
    for entry in entries:
        if entry.startswith("re:"):
            patterns += 1
            continue
        parsed = split_layer_name(entry)
        if parsed is None:
            non_layer.append(entry)
            by_part["non_layer"] += 1
            continue
        prefix, index, rest = parsed
        part, layer = logical_layer(prefix, index, backbone)
        if part == "other":
            non_layer.append(entry)
            by_part["non_layer"] += 1
            continue
        per_layer[layer] += 1
        by_module[rest or "(layer)"] += 1
        by_part["backbone" if layer < backbone else "mtp" if layer < backbone + mtp else "beyond_declared"] += 1
    return IgnoreSummary(
        key=key,
        total=len(entries),
        non_layer=non_layer[:20],
        patterns=patterns,
        by_part=dict(by_part),
        layer_ids=compact_ids(list(per_layer)),
        per_layer=_runs(per_layer),
        by_module=dict(by_module.most_common(30)),
        beyond_declared=sorted(i for i in per_layer if i >= backbone + mtp),
        entries=list(entries),
    )


def _runs(counts: Counter[int]) -> list[tuple[str, int]]:
    """Consecutive layers with the same count collapse into one `(ids, count)` entry."""
    runs: list[tuple[list[int], int]] = []
    for layer in sorted(counts):
        if runs and runs[-1][1] == counts[layer] and runs[-1][0][-1] == layer - 1:
            runs[-1][0].append(layer)
        else:
            runs.append(([layer], counts[layer]))
    return [(compact_ids(ids), count) for ids, count in runs]


# -- id-list bases -----------------------------------------------------------------------------


def base_from_range(item: IdList, backbone: int, mtp: int) -> tuple[int | None, str]:
    """What the values alone prove: an id 0 cannot be 1-based, an id L+M cannot be 0-based."""
    if not item.ids:
        return None, "empty: it names no layer, so no base applies"
    total = backbone + mtp
    if min(item.ids) < 0 or max(item.ids) > total:
        return None, f"ids outside 0..{total}: not layer ids of this config"
    if 0 in item.ids:
        return 0, "contains id 0, which a 1-based list cannot hold"
    if max(item.ids) == total:
        return 1, f"contains id {total} (= {backbone} backbone + {mtp} MTP layers), out of range for 0-based ids"
    return None, "the values fit both 0- and 1-based numbering"


# -- the whole layout --------------------------------------------------------------------------


def _build_kinds(
    part: dict[str, Any], backbone: int, mtp: int, arrays: list[ArrayInfo], id_lists: list[IdList]
) -> _KindBuilder:
    builder = _KindBuilder(part, backbone, mtp, arrays)
    builder.mlp(id_lists)
    builder.attention(id_lists)
    builder.routing()
    builder.sharing()
    return builder


def analyse(data: dict[str, Any]) -> Layout:
    """The raw layout: submodels, depth, MTP, arrays, id lists, rules, kinds and quantization."""
    submodels, primary, part = find_submodels(data)
    backbone, _ = _depth(part)
    mtp, mtp_key = _mtp(part)
    if mtp is None and part is not data:
        mtp, mtp_key = _mtp(data)
    gaps: list[str] = []
    if backbone is None:
        gaps.append(f"No layer-count key ({', '.join(DEPTH_KEYS)}) in the config: the layer table is empty.")
    if mtp is None:
        gaps.append(
            f"No MTP count key ({', '.join(MTP_COUNT_KEYS)}) in the config: MTP/draft layers, if any, "
            "are known only from checkpoint tensor names or the consumer code."
        )
    depth, extra = backbone or 0, mtp or 0
    arrays, id_lists, findings = find_arrays_and_id_lists(part, depth, extra)
    for item in id_lists:
        item.base, item.evidence = base_from_range(item, depth, extra)
    builder = _build_kinds(part, depth, extra, arrays, id_lists)
    quantization = summarise_quantization(part if "quantization_config" in part else data, depth, extra)
    if quantization and quantization.ignore and quantization.ignore.beyond_declared:
        findings.append(
            (
                "warning",
                "ignore_entry_beyond_layers",
                f"{quantization.ignore.key} names layers {compact_ids(quantization.ignore.beyond_declared)}, beyond the declared "
                f"{depth} + {extra} layers: a trimmed config kept entries for layers it no longer has.",
            )
        )
    return Layout(
        submodels=submodels,
        primary=primary,
        backbone_layers=backbone,
        mtp_layers=mtp,
        mtp_key=mtp_key,
        arrays=arrays,
        id_lists=id_lists,
        rules=builder.rules,
        kinds=builder.kinds,
        quantization=quantization,
        findings=findings,
        gaps=gaps + builder.gaps,
        index_topk_layers_undetermined=builder.indexer_undetermined,
    )


def id_list_gaps(layout: Layout) -> list[str]:
    """Id lists whose base no evidence decided (computed last: tensors and code may decide it)."""
    return [
        f"{item.name}: base (0 or 1) undetermined ({item.evidence}); tensor names or consumer code must decide it."
        for item in layout.id_lists
        if item.ids and item.base is None
    ]


def rebuild_kinds(data: dict[str, Any], layout: Layout) -> None:
    """Recompute per-layer kinds after id-list bases were decided from tensors or code."""
    part = find_submodels(data)[2]
    builder = _build_kinds(part, layout.backbone_layers or 0, layout.mtp_layers or 0, layout.arrays, layout.id_lists)
    layout.kinds = builder.kinds
    layout.rules = builder.rules
