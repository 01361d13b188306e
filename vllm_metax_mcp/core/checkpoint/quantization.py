"""A config's quantization: the method and format keys it names, and its ignore list summarised per
layer, part and module instead of hundreds of paths."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .layer_ids import compact_ids, logical_layer, split_layer_name
from .raw_config import is_int

QUANT_IGNORE_KEYS = ("modules_to_not_convert", "ignore", "ignored_layers", "exclude_modules", "ignored_modules")


@dataclass(frozen=True)
class LayerRun:
    """Consecutive layers with the same number of ignore entries."""

    layers: str
    count: int


@dataclass
class IgnoreSummary:
    key: str
    total: int
    non_layer: list[str]
    patterns: int
    by_part: dict[str, int]
    layer_ids: str
    per_layer: list[LayerRun]
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


def _block_size(value: Any) -> list[int] | None:
    return list(value) if isinstance(value, list) and all(is_int(v) for v in value) else None


def summarise_quantization(data: dict[str, Any], backbone: int, mtp: int) -> Quantization | None:
    """The quantization_config's method, format and keys, and its first ignore list (summarised)."""
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


def _runs(counts: Counter[int]) -> list[LayerRun]:
    """Consecutive layers with the same count collapse into one run."""
    runs: list[tuple[list[int], int]] = []
    for layer in sorted(counts):
        if runs and runs[-1][1] == counts[layer] and runs[-1][0][-1] == layer - 1:
            runs[-1][0].append(layer)
        else:
            runs.append(([layer], counts[layer]))
    return [LayerRun(compact_ids(ids), count) for ids, count in runs]
