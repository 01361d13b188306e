"""Which layers a depth trim keeps: every distinct path, covered by the fewest backbone layers.

A *path* is anything that makes a layer run different code: a kind the config decides (dense or
MoE, attention kind, compression ratio, routing, KV sharing), a value of a per-layer array,
membership in a layer-id list, or a module that only some layers' tensors hold. Paths held by the
same layers are one target. Layers with the same targets are interchangeable, so the plan keeps
one layer per needed signature (the first of each), chosen by an exact minimum cover — never
"the first N layers".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from ..checkpoint.cross_check import CheckpointReport
from ..checkpoint.kinds import RULE_FORMS
from ..checkpoint.layer_ids import split_layer_name
from ..checkpoint.layout import Layout
from ..checkpoint.safetensors_headers import CheckpointFiles
from ..foundation.errors import bad_input

EXACT_SIGNATURES = 18
"""Above this many distinct layer signatures the cover is found greedily (still complete)."""
MAX_CANDIDATES = 200
MODULE_DEPTH = 2


@dataclass
class Target:
    """One distinct path: its names (the first is the target's name), the layers that have it, and why."""

    names: list[str]
    layers: list[int]
    source: str

    @property
    def name(self) -> str:
        return self.names[0]


@dataclass
class Paths:
    """Every target of a decoder and, per backbone layer, the targets it has."""

    backbone: int
    targets: list[Target]
    per_layer: dict[int, frozenset[str]] = field(default_factory=dict)

    def find(self, name: str) -> Target | None:
        return next((t for t in self.targets if name in t.names), None)

    def distinct(self) -> list[Target]:
        """Targets that only some layers have: losing every such layer loses the path."""
        return [t for t in self.targets if len(t.layers) < self.backbone]


# -- what makes layers different ---------------------------------------------------------------


def _kind_source(kind: str, layout: Layout) -> str:
    rules = [
        f"{r.name}={json.dumps(r.value)}"
        for r in layout.rules
        if r.active and any(kind.startswith(c) for c in RULE_FORMS.get(r.name, ("", ()))[1])
    ]
    lists = [i.name for i in layout.id_lists if i.ids and i.base is not None and i.meaning and kind.endswith(i.meaning)]
    arrays = [a.name for a in layout.arrays if a.distinct > 1 and _array_decides(a.name, kind)]
    found = rules + lists + arrays
    return "config: " + ", ".join(found) if found else "config"


def _array_decides(array: str, kind: str) -> bool:
    """The arrays the kind builder reads kinds from (checkpoint.kinds: layer_types, *compress_ratios)."""
    return (kind.startswith("attn:") and array == "layer_types") or (
        kind.startswith("compress:") and array.endswith("compress_ratios")
    )


def _feature_map(
    layout: Layout, report: CheckpointReport | None, files: CheckpointFiles | None
) -> dict[str, tuple[set[int], str]]:
    """Feature name -> (backbone layers having it, where it comes from); insertion order is display order."""
    backbone = layout.backbone_layers or 0
    features: dict[str, tuple[set[int], str]] = {}

    def add(name: str, layer: int, source: str) -> None:
        features.setdefault(name, (set(), source))[0].add(layer)

    for layer in range(backbone):
        for kind in layout.kinds.get(layer, []):
            add(kind, layer, _kind_source(kind, layout))
    for array in layout.arrays:
        if array.covers != "mismatch" and array.distinct > 1:
            for layer in range(backbone):
                add(f"{array.name}={json.dumps(array.values[layer])}", layer, f"per-layer array {array.name}")
    for item in layout.id_lists:
        if not item.ids or item.base is None or item.meaning is not None:
            continue  # a list with a meaning already shows in the kinds
        listed = {i - item.base for i in item.ids if 0 <= i - item.base < backbone}
        for layer in range(backbone):
            inside = layer in listed
            if listed and (inside or len(listed) < backbone):
                add(
                    f"{'in' if inside else 'not-in'}:{item.name}",
                    layer,
                    f"layer-id list {item.name} ({item.base}-based)",
                )
    for module, layers in _modules(layout, report, files).items():
        if len(layers) < backbone:
            for layer in layers:
                add(f"module:{module}", layer, "tensor names")
    return features


def _modules(layout: Layout, report: CheckpointReport | None, files: CheckpointFiles | None) -> dict[str, set[int]]:
    """Module paths (numbers dropped, first two parts) under each backbone layer's tensors."""
    if report is None or files is None or report.backbone_prefix is None:
        return {}
    backbone = layout.backbone_layers or 0
    found: dict[str, set[int]] = {}
    for name in files.tensors:
        parsed = split_layer_name(name)
        if parsed is None or parsed[0] != report.backbone_prefix or parsed[1] >= backbone:
            continue
        parts = [p for p in parsed[2].split(".") if not p.isdigit()][:MODULE_DEPTH]
        if parts:
            found.setdefault(".".join(parts), set()).add(parsed[1])
    return found


def layer_paths(layout: Layout, report: CheckpointReport | None = None, files: CheckpointFiles | None = None) -> Paths:
    """Targets (features merged by identical layer sets) and each layer's target names."""
    backbone = layout.backbone_layers or 0
    grouped: dict[frozenset[int], Target] = {}
    for name, (layers, source) in _feature_map(layout, report, files).items():
        key = frozenset(layers)
        if key in grouped:
            grouped[key].names.append(name)
        else:
            grouped[key] = Target([name], sorted(layers), source)
    targets = list(grouped.values())
    per_layer = {i: frozenset(t.name for t in targets if i in t.layers) for i in range(backbone)}
    return Paths(backbone, targets, per_layer)


# -- choosing layers ---------------------------------------------------------------------------


def _signatures(paths: Paths, required: set[str]) -> list[tuple[int, frozenset[str]]]:
    """(first layer, required targets it has) per distinct signature, in layer order."""
    seen: dict[frozenset[str], int] = {}
    for layer in range(paths.backbone):
        signature = paths.per_layer[layer] & required
        seen.setdefault(signature, layer)
    return [(layer, signature) for signature, layer in seen.items()]


def candidate_selections(paths: Paths, required: set[str]) -> Iterator[list[int]]:
    """Layer sets covering `required`, fewest layers first, then by earliest layers.

    Exact for up to EXACT_SIGNATURES signatures; beyond that one greedy cover is offered.
    """
    signatures = _signatures(paths, required)
    if not required:
        yield [signatures[0][0]] if signatures else []
        return
    if len(signatures) > EXACT_SIGNATURES:
        yield _greedy(signatures, required)
        return
    produced = 0
    for size in range(1, len(signatures) + 1):
        for combo in combinations(signatures, size):
            if frozenset().union(*(s for _, s in combo)) >= required:
                yield sorted(layer for layer, _ in combo)
                produced += 1
                if produced >= MAX_CANDIDATES:
                    return


def _greedy(signatures: list[tuple[int, frozenset[str]]], required: set[str]) -> list[int]:
    chosen: list[int] = []
    missing = set(required)
    while missing:
        layer, signature = max(signatures, key=lambda s: (len(s[1] & missing), -s[0]))
        chosen.append(layer)
        missing -= signature
    return sorted(chosen)


def pad_for_stages(selection: list[int], backbone: int, stages: int) -> list[int]:
    """At least one layer per pipeline stage: the earliest unkept layers are added."""
    kept = list(selection)
    for layer in range(backbone):
        if len(kept) >= stages:
            break
        if layer not in kept:
            kept.append(layer)
    return sorted(kept)


def covered_by(paths: Paths, layers: list[int]) -> set[str]:
    return set().union(*(paths.per_layer[i] for i in layers)) if layers else set()


def resolve_names(paths: Paths, names: list[str], what: str) -> set[str]:
    """Target names (or aliases) a caller gave, as target names; unknown ones are refused with the choices."""
    resolved: set[str] = set()
    for name in names:
        target = paths.find(name)
        if target is None:
            choices = ", ".join(t.name for t in paths.targets[:40])
            raise bad_input(f"{what}: {name!r} is no path of this model; its paths are: {choices}.")
        resolved.add(target.name)
    return resolved


# -- requests that reach a path ----------------------------------------------------------------


def length_threshold(kind: str, part: dict[str, Any]) -> tuple[int, str] | None:
    """(tokens, why) a prompt must exceed before this kind behaves differently from full attention."""
    if kind == "attn:sliding" and isinstance(part.get("sliding_window"), int):
        return part["sliding_window"], f"sliding_window {part['sliding_window']}"
    match = re.fullmatch(r"compress:(\d+)", kind)
    if match:
        return int(match.group(1)), f"compression ratio {match.group(1)} (one compressed block)"
    if kind == "indexer" and isinstance(part.get("index_topk"), int):
        return part["index_topk"], f"index_topk {part['index_topk']} (sparse selection)"
    return None


def thresholds(paths: Paths, part: dict[str, Any], kept: list[int]) -> dict[str, tuple[int, str]]:
    """Length thresholds of the kept paths, by path name (a target's name or one of its other names)."""
    found: dict[str, tuple[int, str]] = {}
    for target in paths.targets:
        if set(target.layers) & set(kept):
            found.update({name: limit for name in target.names if (limit := length_threshold(name, part))})
    return found


# -- pipeline stages ---------------------------------------------------------------------------


def pp_partitions(layers: int, stages: int) -> list[int]:
    """Layers per stage as vLLM's get_pp_indices splits them (VLLM_PP_LAYER_PARTITION overrides it)."""
    base = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        base[-i] += 1
    return base


def stage_layers(kept: list[int], stages: int) -> list[list[int]]:
    """Original ids of the kept layers on each pipeline stage."""
    out: list[list[int]] = []
    start = 0
    for count in pp_partitions(len(kept), stages):
        out.append(kept[start : start + count])
        start += count
    return out


def mtp_indices(layout: Layout, report: CheckpointReport | None) -> list[int]:
    """MTP layer indices i (layer L+i) the config declares, else those the tensors show."""
    if layout.mtp_layers:
        return list(range(layout.mtp_layers))
    if report and report.mtp_layers_found:
        return list(range(report.mtp_layers_found))
    return []
