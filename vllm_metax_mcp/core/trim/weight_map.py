"""Which source tensors a real-weight trim keeps, under which names, in which output shard.

The layer map of the plan renames tensors the way it renumbers the config: backbone layers
`{prefix}.{old}.*` become `{prefix}.{new}.*`; MTP layers stored after the backbone
(`{prefix}.{L+i}.*`) follow the retained backbone (`{prefix}.{n+j}.*`); MTP modules under their
own prefix (`mtp.{i}.*`) are renumbered among the kept MTP layers; names with no layer number
(embeddings, final norm, head, lookup tables) are kept as they are. The backbone prefix comes
from the checkpoint's names (the numbered prefix covering 0..L-1), never from a model family.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..checkpoint.layer_ids import compact_ids, is_mtp_prefix, split_layer_name
from ..checkpoint.safetensors_headers import CheckpointFiles
from ..foundation.errors import bad_input

SHARD_NAME = "model-{number:05d}-of-{count:05d}.safetensors"


@dataclass(frozen=True)
class Move:
    """One retained tensor: where its bytes are in the source and the name it gets."""

    target: str
    source: str
    shard: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    def row(self) -> list[Any]:
        """As the shipped extract.py's plan lists it: [target, source shard, source name, dtype, shape, nbytes]."""
        return [self.target, self.shard, self.source, self.dtype, list(self.shape), self.nbytes]


@dataclass
class WeightMap:
    moves: list[Move]
    dropped: list[str]
    rules: list[str] = field(default_factory=list)

    @property
    def renamed(self) -> list[Move]:
        return [m for m in self.moves if m.target != m.source]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.moves)


@dataclass(frozen=True)
class Layers:
    """The numbering a trim applies: backbone size, declared MTP count, the plan's maps."""

    backbone: int
    mtp_declared: int
    layer_map: dict[int, int]
    """Original -> new id for kept backbone layers and kept MTP layers (L+i -> n+j)."""
    kept_mtp: tuple[int, ...]
    other: dict[str, dict[int, int]] = field(default_factory=dict)
    """Other numbered prefixes trimmed by their own depth (a submodel's layers): old -> new."""


def numbered_prefixes(files: CheckpointFiles) -> dict[str, set[int]]:
    found: dict[str, set[int]] = defaultdict(set)
    for name in files.tensors:
        parsed = split_layer_name(name)
        if parsed:
            found[parsed[0]].add(parsed[1])
    return found


def submodel_prefix(files: CheckpointFiles, backbone_prefix: str, layers: int) -> str | None:
    """The one numbered prefix (not the backbone's, not MTP) whose ids are exactly 0..layers-1; None when
    no prefix or several fit, since the tensor names are then no evidence of which layers belong to it."""
    fits = [
        prefix
        for prefix, ids in numbered_prefixes(files).items()
        if prefix != backbone_prefix and not is_mtp_prefix(prefix) and ids == set(range(layers))
    ]
    return fits[0] if len(fits) == 1 else None


class _Renamer:
    def __init__(self, prefix: str, layers: Layers) -> None:
        self.prefix = prefix
        self.layers = layers
        self.mtp_position = {old: new for new, old in enumerate(layers.kept_mtp)}
        self.undeclared: dict[str, set[int]] = defaultdict(set)

    def __call__(self, name: str) -> str | None:
        """The new name, or None when the tensor belongs to a dropped layer."""
        layers = self.layers
        parsed = split_layer_name(name)
        if parsed is None:
            mtp_module = is_mtp_prefix(name.rsplit(".", 1)[0])
            return None if mtp_module and layers.mtp_declared and not layers.kept_mtp else name
        prefix, index, rest = parsed
        if prefix == self.prefix:
            if index in layers.layer_map:
                return _join(prefix, layers.layer_map[index], rest)
            if index < layers.backbone + layers.mtp_declared:
                return None
            self.undeclared[prefix].add(index)
            return None
        if is_mtp_prefix(prefix):
            if not layers.mtp_declared:
                return name  # the config declares no MTP count: the consumer decides, the trim leaves them unchanged
            if index in self.mtp_position:
                return _join(prefix, self.mtp_position[index], rest)
            if index < layers.mtp_declared:
                return None
            self.undeclared[prefix].add(index)
            return None
        if prefix in layers.other:
            mapping = layers.other[prefix]
            return _join(prefix, mapping[index], rest) if index in mapping else None
        return name


def _join(prefix: str, index: int, rest: str) -> str:
    return f"{prefix}.{index}" + (f".{rest}" if rest else "")


def map_tensors(files: CheckpointFiles, backbone_prefix: str | None, layers: Layers) -> WeightMap:
    """Every tensor of the source kept (renamed) or dropped; refuses layer ids the config does not declare
    and names that would collide."""
    if backbone_prefix is None:
        raise bad_input(
            "no tensor name carries a layer number, so no tensor can be told to belong to a layer: the checkpoint "
            "cannot be trimmed by depth."
        )
    rename = _Renamer(backbone_prefix, layers)
    moves: list[Move] = []
    dropped: list[str] = []
    for name, tensor in files.tensors.items():
        if tensor.dtype is None or tensor.shape is None or tensor.nbytes is None:
            raise bad_input(
                f"tensor {name} has no header entry (its shard was not read); every shard must be readable."
            )
        target = rename(name)
        if target is None:
            dropped.append(name)
        else:
            moves.append(Move(target, name, tensor.shard, tensor.dtype, tensor.shape, tensor.nbytes))
    if rename.undeclared:
        where = "; ".join(f"{p}.{{{compact_ids(ids)}}}" for p, ids in sorted(rename.undeclared.items()))
        raise bad_input(
            f"tensors exist for layer ids the config does not declare ({where}; config.json: {layers.backbone} "
            f"layers + {layers.mtp_declared} MTP): which layer they are is unknown. Fix the config's layer or MTP "
            "count (see inspect_config's findings) before a real-weight trim."
        )
    _refuse_collisions(moves)
    order = {shard: number for number, shard in enumerate(files.shard_names)}
    moves.sort(key=lambda m: (order.get(m.shard, len(order)), files.tensors[m.source].offset or 0))
    return WeightMap(moves, sorted(dropped), _rules(backbone_prefix, layers))


def _refuse_collisions(moves: list[Move]) -> None:
    seen: dict[str, str] = {}
    for move in moves:
        if move.target in seen:
            raise bad_input(
                f"tensors {seen[move.target]} and {move.source} would both be named {move.target} in the trimmed "
                "checkpoint; the layer map cannot be applied to these names."
            )
        seen[move.target] = move.source


def _rules(prefix: str, layers: Layers) -> list[str]:
    rules = [f"{prefix}.{{old}}.* -> {prefix}.{{new}}.* for kept backbone layers"]
    mtp = {old: new for old, new in layers.layer_map.items() if old >= layers.backbone}
    if mtp:
        pairs = ", ".join(f"{old}->{new}" for old, new in sorted(mtp.items()))
        rules.append(
            f"MTP layers after the backbone follow it ({pairs}); MTP modules under their own prefix keep theirs"
        )
    elif layers.mtp_declared:
        rules.append("MTP layers dropped (keep_mtp=0)")
    rules += [f"{p}.{{old}}.* -> {p}.{{new}}.* (trimmed by its own depth)" for p in sorted(layers.other)]
    rules.append("names without a layer number (embeddings, norms, heads, lookup tables) are kept as they are")
    return rules


def assign_shards(moves: list[Move], max_shard_bytes: int) -> dict[str, list[Move]]:
    """Consecutive moves into output shards of at most max_shard_bytes (a larger tensor gets its own)."""
    groups: list[list[Move]] = [[]]
    size = 0
    for move in moves:
        if groups[-1] and size + move.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(move)
        size += move.nbytes
    count = len(groups)
    return {SHARD_NAME.format(number=i + 1, count=count): group for i, group in enumerate(groups) if group}
