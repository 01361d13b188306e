"""Layer-indexed arrays (one entry per layer) and layer-id lists in a config, recognised by their keys
and values, with what the values alone say about an id list's base."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .findings import Finding
from .raw_config import DEPTH_KEYS, MTP_COUNT_KEYS, is_int, sub_configs

ArrayCoverage = Literal["backbone", "backbone+mtp", "mismatch"]

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
#: The kinds an id list of each meaning decides.
MEANING_KINDS: dict[str, tuple[str, ...]] = {
    "dense": ("dense", "moe"),
    "moe": ("dense", "moe"),
    "full": ("attn:",),
    "linear": ("attn:",),
    "sliding": ("attn:",),
    "hash": ("route:",),
}


@dataclass
class ArrayInfo:
    name: str
    length: int
    covers: ArrayCoverage
    distinct: int
    values: list[Any] = field(repr=False, default_factory=list)


@dataclass
class IdList:
    name: str
    ids: list[int]
    meaning: str | None
    base: int | None = None
    evidence: str = ""


def parse_id_list(value: Any) -> list[int] | None:
    """A list of ints, or a comma-separated string of ints; None when it is neither."""
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",") if p.strip()]
        if not all(re.fullmatch(r"-?\d+", p) for p in items):
            return None
        return [int(p) for p in items]
    if isinstance(value, list) and all(is_int(v) for v in value):
        return list(value)
    return None


def _candidates(data: dict[str, Any]) -> list[tuple[str, Any]]:
    """Top-level keys plus one nested level of plain dicts (not sub-configs, not quantization)."""
    subs = {name for name, _ in sub_configs(data)}
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


def _covers(length: int, backbone: int, mtp: int) -> ArrayCoverage:
    if length == backbone:
        return "backbone"
    if mtp and length == backbone + mtp:
        return "backbone+mtp"
    return "mismatch"


def _scalar_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(not isinstance(v, (list, dict)) for v in value)


def _is_layer_array(leaf: str, value: Any, backbone: int, lengths: set[int]) -> bool:
    """A list with one entry per layer (or named per layer), or a per-layer pattern string (`"SSL..."`)."""
    if backbone < 2:
        return False
    per_layer_name = "layer" in leaf.lower() or "pattern" in leaf.lower()
    if _scalar_list(value):
        return len(value) in lengths or per_layer_name
    return isinstance(value, str) and per_layer_name and len(value) in lengths and " " not in value


def find_arrays_and_id_lists(
    data: dict[str, Any], backbone: int, mtp: int
) -> tuple[list[ArrayInfo], list[IdList], list[Finding]]:
    """Layer-indexed arrays (one entry per layer) and layer-id lists, with length findings."""
    arrays: list[ArrayInfo] = []
    id_lists: list[IdList] = []
    findings: list[Finding] = []
    lengths = {backbone, backbone + mtp}
    for name, value in _candidates(data):
        leaf = name.rsplit(".", 1)[-1]
        if leaf in NOT_ARRAYS or leaf.endswith(("token_id", "token_ids")):
            continue
        ids = _looks_like_id_list(name, value, lengths)
        if ids is not None:
            id_lists.append(IdList(name, ids, _id_list_meaning(name)))
        elif _is_layer_array(leaf, value, backbone, lengths):
            arrays.append(_array(name, list(value), backbone, mtp, findings))
    return arrays, id_lists, findings


def _array(name: str, values: list[Any], backbone: int, mtp: int, findings: list[Finding]) -> ArrayInfo:
    covers = _covers(len(values), backbone, mtp)
    if covers == "mismatch":
        findings.append(
            Finding(
                "warning",
                "array_length_mismatch",
                f"{name} has {len(values)} entries but the config declares {backbone} backbone + {mtp} MTP layers; "
                "check which layers its consumer indexes before trimming.",
            )
        )
    distinct = len({json.dumps(v, sort_keys=True) for v in values})
    return ArrayInfo(name, len(values), covers, distinct, values)


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


def id_list_gaps(id_lists: list[IdList]) -> list[str]:
    """Id lists whose base no evidence decided (computed last: tensors and code may decide it)."""
    return [
        f"{item.name}: base (0 or 1) undetermined ({item.evidence}); tensor names or consumer code must decide it."
        for item in id_lists
        if item.ids and item.base is None
    ]
