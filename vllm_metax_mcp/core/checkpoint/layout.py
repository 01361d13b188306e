"""The raw layer layout of a checkpoint's `config.json`, decided from the keys it holds.

Nothing here knows model names: depth, MTP count, layer-indexed arrays, layer-id lists and
periodic rules are recognised by their keys and values, and each per-layer kind records the
rule it came from. Where the file does not say something, the answer is "undetermined", never a
config-class default. The parts live beside this module: raw_config (reading), id_lists, kinds,
quantization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .findings import Finding
from .id_lists import ArrayInfo, IdList, base_from_range, find_arrays_and_id_lists
from .kinds import Rule, build_kinds
from .layer_ids import compact_ids
from .quantization import Quantization, summarise_quantization
from .raw_config import DEPTH_KEYS, MTP_COUNT_KEYS, Submodel, depth_of, find_submodels, mtp_count_of


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
    findings: list[Finding]
    gaps: list[str]
    index_topk_layers_undetermined: bool = False


def _count_gaps(backbone: int | None, mtp: int | None) -> list[str]:
    gaps: list[str] = []
    if backbone is None:
        gaps.append(f"No layer-count key ({', '.join(DEPTH_KEYS)}) in the config: the layer table is empty.")
    if mtp is None:
        gaps.append(
            f"No MTP count key ({', '.join(MTP_COUNT_KEYS)}) in the config: MTP/draft layers, if any, "
            "are known only from checkpoint tensor names or the consumer code."
        )
    return gaps


def analyse(data: dict[str, Any]) -> Layout:
    """The raw layout: submodels, depth, MTP, arrays, id lists, rules, kinds and quantization."""
    submodels, primary, part = find_submodels(data)
    backbone, _ = depth_of(part)
    mtp, mtp_key = mtp_count_of(part)
    if mtp is None and part is not data:
        mtp, mtp_key = mtp_count_of(data)
    depth, extra = backbone or 0, mtp or 0
    arrays, id_lists, findings = find_arrays_and_id_lists(part, depth, extra)
    for item in id_lists:
        item.base, item.evidence = base_from_range(item, depth, extra)
    builder = build_kinds(part, depth, extra, arrays, id_lists)
    quantization = summarise_quantization(part if "quantization_config" in part else data, depth, extra)
    if quantization and quantization.ignore and quantization.ignore.beyond_declared:
        findings.append(
            Finding(
                "warning",
                "ignore_entry_beyond_layers",
                f"{quantization.ignore.key} names layers {compact_ids(quantization.ignore.beyond_declared)}, "
                f"beyond the declared {depth} + {extra} layers: a trimmed config kept entries for layers it no "
                "longer has.",
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
        gaps=_count_gaps(backbone, mtp) + builder.gaps,
        index_topk_layers_undetermined=builder.indexer_undetermined,
    )


def rebuild_kinds(data: dict[str, Any], layout: Layout) -> None:
    """Recompute per-layer kinds after id-list bases were decided from tensors or code."""
    part = find_submodels(data)[2]
    builder = build_kinds(part, layout.backbone_layers or 0, layout.mtp_layers or 0, layout.arrays, layout.id_lists)
    layout.kinds = builder.kinds
    layout.rules = builder.rules
