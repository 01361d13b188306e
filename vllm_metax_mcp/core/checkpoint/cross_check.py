"""Cross-check of the raw layout against the checkpoint's tensor names (headers only).

Tensor names are the evidence a config cannot give: which layer ids have weights, how MTP layers
are named, whether a layer really carries experts, an indexer or linear attention, and which
base a layer-id list uses. Every disagreement with the config becomes a finding.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from .findings import Finding, ordered_findings
from .id_lists import IdList
from .layer_ids import compact_ids, is_mtp_prefix, split_layer_name
from .layout import Layout
from .safetensors_headers import CheckpointFiles

MTP_HEAD_PARTS = frozenset({"eh_proj", "enorm", "hnorm", "shared_head", "e_proj", "h_proj"})
MLP_PARTS = frozenset({"mlp", "ffn", "feed_forward", "block_sparse_moe"})
LINEAR_PARTS = frozenset({"linear_attn", "A_log", "conv1d", "mamba"})
ATTENTION_PARTS = frozenset({"self_attn", "attn", "attention"})
SCALE_SUFFIXES = ("scale_inv", "scale", "_scale", "scales")

#: What a listed layer of an id list shows in its tensor names, by the list's meaning.
MEANING_TEST: dict[str, tuple[str, Callable[[set[str]], bool | None]]] = {
    "dense": (
        "an MLP without experts",
        lambda m: None if not m & {"moe", "dense"} else "dense" in m and "moe" not in m,
    ),
    "moe": ("experts", lambda m: None if not m & {"moe", "dense"} else "moe" in m),
    "full": (
        "attention without linear-attention weights",
        lambda m: None if not m & {"attn", "linear"} else "linear" not in m,
    ),
    "linear": ("linear-attention weights", lambda m: None if not m & {"attn", "linear"} else "linear" in m),
    "hash": ("a hash-routing table (tid2eid)", lambda m: None if "moe" not in m else "hash" in m),
}


@dataclass
class CheckpointReport:
    findings: list[Finding]
    index_file: str | None
    shard_count: int
    shard_names: list[str]
    shards_read: int
    tensor_count: int
    backbone_prefix: str | None
    present_layer_ids: list[int]
    mtp_layers_found: int
    mtp_naming: str | None
    mtp_weights_present: bool | None
    undeclared_ids: list[int]
    dtypes_by_part: dict[str, dict[str, int]]
    scale_dtypes: dict[str, int]
    ranks: list[int]
    markers: dict[int, list[str]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)


def markers_of(parts: set[str]) -> set[str]:
    """Module evidence in the names under one layer: experts, dense MLP, attention kinds, MTP head."""
    found: set[str] = set()
    if "experts" in parts:
        found.add("moe")
    elif parts & MLP_PARTS:
        found.add("dense")
    if parts & LINEAR_PARTS:
        found.add("linear")
    elif parts & ATTENTION_PARTS:
        found.add("attn")
    for word, marker in (("indexer", "indexer"), ("compressor", "compressor"), ("tid2eid", "hash")):
        if word in parts:
            found.add(marker)
    if parts & MTP_HEAD_PARTS:
        found.add("mtp_head")
    return found


def _backbone_prefix(numbered: dict[str, set[int]], backbone: int) -> str | None:
    """The numbered prefix that holds the decoder layers: covers 0..L-1 best, ends in `layers`."""
    candidates = [p for p in numbered if not is_mtp_prefix(p)]
    if not candidates:
        return None

    def score(prefix: str) -> tuple[int, int, int, int]:
        ids = numbered[prefix]
        covered = len(ids & set(range(backbone)))
        return (covered == backbone, prefix.endswith("layers"), -abs(len(ids) - backbone), covered)

    return max(candidates, key=score)


@dataclass
class _Grouped:
    numbered: dict[str, set[int]]
    per_layer: dict[tuple[str, int], set[str]]
    dtypes: dict[tuple[str, int], Counter[str]]
    unnumbered_mtp: int


def _group(files: CheckpointFiles) -> _Grouped:
    numbered: dict[str, set[int]] = defaultdict(set)
    per_layer: dict[tuple[str, int], set[str]] = defaultdict(set)
    dtypes: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    unnumbered_mtp = 0
    for name, tensor in files.tensors.items():
        parsed = split_layer_name(name)
        if parsed is None:
            key = ("mtp", -1) if is_mtp_prefix(name.rsplit(".", 1)[0]) else ("", -1)
            unnumbered_mtp += key[0] == "mtp"
        else:
            prefix, index, rest = parsed
            numbered[prefix].add(index)
            key = (prefix, index)
            per_layer[key].update(rest.split("."))
        if tensor.dtype:
            dtypes[key][tensor.dtype] += 1
    return _Grouped(numbered, per_layer, dtypes, unnumbered_mtp)


@dataclass
class _Layers:
    """What the numbered tensor names say per logical layer id (MTP layer i is backbone + i)."""

    backbone: int
    declared_mtp: int
    prefix: str | None
    markers: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    names: dict[int, str] = field(default_factory=dict)
    mtp_namings: set[str] = field(default_factory=set)
    mtp_ids: set[int] = field(default_factory=set)
    undeclared: set[int] = field(default_factory=set)

    @property
    def present(self) -> list[int]:
        backbone = self.backbone
        return sorted(i for i in self.markers if i < backbone or (i - backbone) in self.mtp_ids or i in self.undeclared)


def _scan_layers(grouped: _Grouped, prefix: str | None, backbone: int, declared_mtp: int) -> _Layers:
    found = _Layers(backbone, declared_mtp, prefix)
    for (layer_prefix, index), parts in grouped.per_layer.items():
        if layer_prefix == prefix:
            logical = index
            if index >= backbone:
                if index < backbone + declared_mtp:
                    found.mtp_namings.add(f"{prefix}.{{L+i}}")
                    found.mtp_ids.add(index - backbone)
                else:
                    found.undeclared.add(index)
        elif is_mtp_prefix(layer_prefix):
            logical = backbone + index
            found.mtp_namings.add(f"{layer_prefix}.{{i}}")
            found.mtp_ids.add(index)
        else:
            continue
        found.markers[logical] |= markers_of(parts)
        found.names[logical] = f"{layer_prefix}.{index}"
    return found


def cross_check(layout: Layout, files: CheckpointFiles) -> CheckpointReport:
    """Layer ids with tensors, MTP naming and weights, dtypes per part, and every disagreement."""
    backbone = layout.backbone_layers or 0
    declared_mtp = layout.mtp_layers or 0
    grouped = _group(files)
    prefix = _backbone_prefix(grouped.numbered, backbone)
    dtypes: dict[str, Counter[str]] = defaultdict(Counter)
    for (layer_prefix, index), dtype_counts in grouped.dtypes.items():
        part = _part_of(layer_prefix, index, prefix, backbone, declared_mtp)
        dtypes[part if part != "undeclared" else "backbone"].update(dtype_counts)
    found = _scan_layers(grouped, prefix, backbone, declared_mtp)
    found_mtp = len(found.mtp_ids)
    if grouped.unnumbered_mtp and not found.mtp_namings:
        found.mtp_namings.add("mtp.*")
    findings = [*files.problems, *_count_findings(layout, found), *_placement_findings(found)]
    findings += _kind_findings(layout, found.markers, backbone)
    findings += _ignore_findings(layout, files)
    namings = found.mtp_namings
    return CheckpointReport(
        findings=ordered_findings(findings),
        index_file=files.index_name,
        shard_count=len(files.shard_names),
        shard_names=files.shard_names,
        shards_read=files.shards_read,
        tensor_count=len(files.tensors),
        backbone_prefix=prefix,
        present_layer_ids=found.present,
        mtp_layers_found=found_mtp,
        mtp_naming=" and ".join(sorted(namings)) or None,
        mtp_weights_present=set(range(declared_mtp)) <= found.mtp_ids if declared_mtp else (True if namings else None),
        undeclared_ids=sorted(found.undeclared),
        dtypes_by_part={part: dict(counts.most_common()) for part, counts in sorted(dtypes.items())},
        scale_dtypes=_scale_dtypes(files),
        ranks=files.ranks,
        markers={i: sorted(m) for i, m in found.markers.items()},
        names=found.names,
    )


def _part_of(layer_prefix: str, index: int, prefix: str | None, backbone: int, mtp: int) -> str:
    if layer_prefix == "mtp":
        return "mtp"
    if index < 0:
        return "other"
    if layer_prefix == prefix:
        if index < backbone:
            return "backbone"
        return "mtp" if index < backbone + mtp else "undeclared"
    return "mtp" if is_mtp_prefix(layer_prefix) else "other"


def _count_findings(layout: Layout, found: _Layers) -> list[Finding]:
    """Declared layers without tensors, and MTP tensors beyond (or without) a declared count."""
    backbone, prefix = found.backbone, found.prefix
    declared_mtp, mtp_ids, namings = found.declared_mtp, found.mtp_ids, found.mtp_namings
    findings: list[Finding] = []
    missing = sorted(set(range(backbone)) - set(found.present))
    if missing and prefix is not None:
        findings.append(
            Finding(
                "error",
                "backbone_layers_missing",
                f"config declares {backbone} backbone layers but layers {compact_ids(missing)} have no tensors "
                f"under {prefix}.",
            )
        )
    absent = sorted(set(range(declared_mtp)) - mtp_ids)
    if absent:
        findings.append(
            Finding(
                "error",
                "mtp_declared_without_weights",
                f"config declares {declared_mtp} MTP layer(s) ({layout.mtp_key}) but MTP layer(s) "
                f"{compact_ids(absent)} have no tensors (neither {found.prefix or 'model.layers'}.{backbone} nor "
                "mtp.*): speculative decoding with this checkpoint cannot load them.",
            )
        )
    beyond = sorted(i for i in mtp_ids if i >= declared_mtp)
    if declared_mtp and beyond:
        findings.append(
            Finding(
                "warning",
                "mtp_weights_beyond_declaration",
                f"the checkpoint holds MTP layer(s) {compact_ids(beyond)} beyond the {declared_mtp} declared by "
                f"{layout.mtp_key}: they are never built.",
            )
        )
    if not declared_mtp and (mtp_ids or namings):
        declaration = "sets " + str(layout.mtp_key) + " to 0" if layout.mtp_layers == 0 else "has no MTP count key"
        findings.append(
            Finding(
                "warning" if layout.mtp_layers == 0 else "info",
                "mtp_weights_without_declaration",
                f"the checkpoint holds MTP tensors ({' and '.join(sorted(namings))}, {len(mtp_ids)} numbered "
                f"layer(s)) but config.json {declaration}: the consumer code decides how many are built.",
            )
        )
    return findings


def _placement_findings(found: _Layers) -> list[Finding]:
    """Tensors at layer ids the config does not declare, MTP heads inside the backbone, mixed MTP namings."""
    backbone, prefix, namings = found.backbone, found.prefix, found.mtp_namings
    findings: list[Finding] = []
    if found.undeclared:
        with_head = sorted(i for i in found.undeclared if "mtp_head" in found.markers.get(i, set()))
        detail = (
            f"; layers {compact_ids(with_head)} carry MTP-head tensors (eh_proj/enorm/hnorm/shared_head), "
            "so an MTP layer sits at the wrong id"
            if with_head
            else ""
        )
        findings.append(
            Finding(
                "error",
                "undeclared_layer_tensors",
                f"tensors exist for layer ids {compact_ids(sorted(found.undeclared))} under {prefix}, "
                f"beyond the declared {backbone} + {found.declared_mtp} layers{detail}. "
                f"vLLM looks for MTP layer i at {prefix}.{{{backbone}+i}}.",
            )
        )
    heads_in_backbone = sorted(i for i in range(backbone) if "mtp_head" in found.markers.get(i, set()))
    if heads_in_backbone:
        findings.append(
            Finding(
                "error",
                "mtp_head_in_backbone",
                f"backbone layers {compact_ids(heads_in_backbone)} carry MTP-head tensors: "
                "the declared depth counts an MTP layer as backbone.",
            )
        )
    if len(namings) > 1:
        findings.append(
            Finding(
                "warning",
                "mtp_naming_mixed",
                f"MTP tensors appear under more than one naming ({', '.join(sorted(namings))}).",
            )
        )
    return findings


MISMATCH_MESSAGES = {
    "moe_without_experts": "config makes layers {ids} MoE but their tensors hold no experts",
    "dense_with_experts": "config makes layers {ids} dense but their tensors hold experts",
    "attention_kind": "config and tensors disagree on linear vs. softmax attention for layers {ids}",
    "indexer_missing": "config gives layers {ids} a sparse-attention indexer but their tensors hold none",
    "indexer_unconfigured": "tensors of layers {ids} hold an indexer the config does not configure",
    "hash_missing": "config hash-routes layers {ids} but their tensors hold no tid2eid table",
    "hash_unconfigured": (
        "tensors of layers {ids} hold a hash-routing table (tid2eid) but the config routes them by learned gates"
    ),
    "compressor_missing": "config gives layers {ids} a KV compression ratio but their tensors hold no compressor",
    "compressor_unconfigured": (
        "tensors of layers {ids} hold a compressor but the config gives them no compression ratio"
    ),
}


def _layer_mismatches(kinds: list[str], found: set[str], indexer_open: bool) -> list[str]:
    """The ways one layer's config kinds and tensor evidence disagree."""
    wrong = []
    if found & {"moe", "dense"}:
        if "moe" in kinds and "moe" not in found:
            wrong.append("moe_without_experts")
        if "dense" in kinds and "moe" in found:
            wrong.append("dense_with_experts")
    if found & {"attn", "linear"}:
        if any(k.startswith("attn:") for k in kinds) and ("attn:linear" in kinds) != ("linear" in found):
            wrong.append("attention_kind")
        if "indexer" in kinds and "indexer" not in found:
            wrong.append("indexer_missing")
        if "indexer" in found and "indexer" not in kinds and not indexer_open:
            wrong.append("indexer_unconfigured")
        compressed = any(k.startswith("compress:") for k in kinds)
        if compressed and "compressor" not in found:
            wrong.append("compressor_missing")
        if "compressor" in found and not compressed:
            wrong.append("compressor_unconfigured")
    if "moe" in found:
        if "route:hash" in kinds and "hash" not in found:
            wrong.append("hash_missing")
        if "hash" in found and "route:hash" not in kinds:
            wrong.append("hash_unconfigured")
    return wrong


def _kind_findings(layout: Layout, markers: dict[int, set[str]], backbone: int) -> list[Finding]:
    """Config-derived kinds contradicted by the tensors of the same layer, grouped by kind."""
    buckets: dict[str, list[int]] = defaultdict(list)
    for layer in range(backbone):
        found = markers.get(layer)
        if found:
            for code in _layer_mismatches(layout.kinds.get(layer, []), found, layout.index_topk_layers_undetermined):
                buckets[code].append(layer)
    return [
        Finding(
            "error",
            "kind_mismatch",
            MISMATCH_MESSAGES[code].format(ids=compact_ids(ids)) + "; the config and the checkpoint disagree.",
        )
        for code, ids in buckets.items()
    ]


def _ignore_findings(layout: Layout, files: CheckpointFiles) -> list[Finding]:
    """Quantization ignore entries that name no module of the checkpoint (only when all shards were read)."""
    quant = layout.quantization
    if quant is None or quant.ignore is None or files.missing_shards or not files.tensors:
        return []
    unmatched = ignore_entries_without_tensors(quant.ignore.entries, set(files.tensors))
    if not unmatched:
        return []
    return [
        Finding(
            "warning",
            "ignore_entry_without_tensors",
            f"{len(unmatched)} of {quant.ignore.total} {quant.ignore.key} entries name no module of the checkpoint "
            f"(e.g. {', '.join(unmatched[:3])}); a trimmed checkpoint must filter and renumber this list.",
        )
    ]


def _scale_dtypes(files: CheckpointFiles) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for name, tensor in files.tensors.items():
        leaf = name.rsplit(".", 1)[-1]
        if tensor.dtype and leaf.endswith(SCALE_SUFFIXES):
            counts[tensor.dtype] += 1
    return dict(counts.most_common())


def ignore_entries_without_tensors(entries: list[str], tensor_names: set[str]) -> list[str]:
    """Quantization ignore entries that name no module of the checkpoint."""
    modules: set[str] = set()
    for name in tensor_names:
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            modules.add(".".join(parts[:end]))
    return [e for e in entries if not e.startswith("re:") and e not in modules]


def base_from_tensors(
    item: IdList, markers: dict[int, list[str]], backbone: int, mtp: int, other_rules: tuple[str, ...] = ()
) -> tuple[int | None, str, bool]:
    """(base, evidence, contradicted): which numbering makes the list agree with the tensors of its layers.

    With `other_rules` (active rules deciding the same kinds, such as `decoder_sparse_step` beside
    `mlp_only_layers`) an unlisted layer may have the meaning too: only the listed layers must."""
    if item.meaning not in MEANING_TEST or not item.ids:
        return None, "", False
    what, test = MEANING_TEST[item.meaning]
    evidenced = {i: verdict for i in range(backbone) if (verdict := test(set(markers.get(i, [])))) is not None}
    if not evidenced:
        return None, "", False
    fitting = []
    for base in (0, 1):
        listed = {x - base for x in item.ids}
        if any(not 0 <= i < backbone + mtp for i in listed):
            continue
        agrees = (
            (verdict for i, verdict in evidenced.items() if i in listed)
            if other_rules
            else (verdict == (i in listed) for i, verdict in evidenced.items())
        )
        if all(agrees):
            fitting.append(base)
    having = sorted(i for i, verdict in evidenced.items() if verdict)
    shown = (
        f"tensor names: layers {compact_ids(having) or 'none'} have {what} "
        f"(of {len(evidenced)} layers with such tensors"
        + (f"; {', '.join(other_rules)} may mark unlisted ones too)" if other_rules else ")")
    )
    if len(fitting) == 1:
        return fitting[0], f"{shown}; {item.name} matches them read {fitting[0]}-based", False
    if not fitting:
        return None, f"{shown}; {item.name} matches them under neither base", True
    return None, f"{shown}; both bases fit", False
