"""The real-weight trim in the call: every check that can refuse before a byte is written, and what the
copy job then copies (tensors by their new names, per output shard; assets; the reduced config)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint.safetensors_headers import CheckpointFiles
from ..foundation.errors import bad_input
from ..foundation.policy import Policy
from ..target.extract import INDEX_NAME
from .assets import IMAGE_NAME, MANIFEST_NAME
from .cases import FILE_NAME, dump_smoke_cases
from .config_rewrite import dump_config
from .output import TrimTarget
from .plan import Plan, Source, keep_submodel_whole
from .weight_map import Layers, Move, WeightMap, assign_shards, map_tensors, submodel_prefix

OTHER_WEIGHT_FORMATS = (".bin", ".pt", ".pth", ".gguf", ".ckpt", ".msgpack", ".h5")
HEADER_ALLOWANCE_BYTES = 256
"""Per tensor, for the output headers in the disk estimate."""
SCRIPT_NAME = "extract.py"
WRITTEN_NAMES = frozenset({SCRIPT_NAME, MANIFEST_NAME, FILE_NAME, IMAGE_NAME, INDEX_NAME, "config.json"})
"""Files a real-weight trim writes itself: no source asset may take one of these names."""


def readable_source(source: Source) -> CheckpointFiles:
    """The source checkpoint is complete and every header parses; refuses with every problem found."""
    files = source.files
    if files is None:
        others = sorted(p.name for p in source.directory.iterdir() if p.suffix in OTHER_WEIGHT_FORMATS)
        found = f" (found {', '.join(others[:3])})" if others else ""
        raise bad_input(
            f"the source holds no safetensors checkpoint{found}: real-weight trims copy safetensors tensors byte for "
            "byte. Convert the checkpoint to safetensors first, or use output_mode=dummy."
        )
    if files.ranks:
        raise bad_input(
            f"the source is pre-partitioned per rank (shard names carry ranks {files.ranks[:8]}): its files are rank "
            "partitions, not storage shards. Trimming it needs re-sharding for the new TP (merging the rank slices), "
            "which this tool does not do; trim a non-partitioned checkpoint."
        )
    problems = [p.message for p in files.problems if p.severity == "error"]
    if files.missing_shards:
        problems.insert(0, f"shard(s) named by the index are missing: {', '.join(files.missing_shards[:5])}.")
    if problems:
        raise bad_input(
            "the source checkpoint is not readable as a whole, so nothing is written: "
            + " ".join(problems[:5])
            + " Repair or re-download the source, then trim again."
        )
    return files


def submodel_maps(plan: Plan, source: Source, files: CheckpointFiles, prefix: str) -> dict[str, dict[int, int]]:
    """For each submodel trimmed by its own depth, the tensor prefix that holds its layers; a submodel whose
    layers no unique prefix holds is kept whole (its config restored), since its tensors cannot be told apart."""
    maps: dict[str, dict[int, int]] = {}
    for sub in list(plan.submodels):
        if sub.kept == list(range(sub.layers)):
            continue
        found = submodel_prefix(files, prefix, sub.layers)
        if found is None:
            keep_submodel_whole(
                plan,
                source.raw,
                sub.name,
                f"no single tensor prefix holds exactly its {sub.layers} layers, so its tensors cannot be renamed",
            )
            continue
        maps[found] = {old: new for new, old in enumerate(sub.kept)}
    return maps


def refuse_narrowing(plan: Plan) -> None:
    narrowed = [c.field for c in plan.changes if c.reason.startswith("narrowed")]
    if narrowed:
        raise bad_input(
            f"allow_narrowing changed {', '.join(narrowed)}: the retained tensors would no longer match the config. "
            "A real-weight trim copies tensors unchanged; trim by depth only (drop allow_narrowing), or use "
            "output_mode=dummy."
        )


def check_disk(target: Path, need: int, quota: int | None) -> None:
    existing = target
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    limit = min(free, quota) if quota is not None else free
    if need > limit:
        where = f"max_disk_bytes {quota}" if limit != free else f"{free} bytes free at the output"
        raise bad_input(
            f"the trim needs {need} bytes (the trimmed checkpoint, written once) but "
            f"{where} allows {limit}; nothing was written. Free space, choose another output root, or keep fewer "
            "layers (plan_trim budgets.disk_bytes_real gives the checkpoint alone).",
        )


@dataclass
class CheckedTrim:
    """What a real-weight trim copies, computed and checked in the call."""

    files: CheckpointFiles
    weights: WeightMap
    shards: dict[str, list[Move]]
    assets: dict[str, str]
    """Asset name -> its resolved source path (checked through the policy)."""
    source_paths: dict[str, str]
    """Source shard -> its resolved path."""
    config_text: str
    smoke_text: str


def check_real_trim(
    source: Source, plan: Plan, target: TrimTarget, max_shard_bytes: int, max_disk_bytes: int | None, policy: Policy
) -> CheckedTrim:
    """Every refusal before the job: an existing output, narrowing, an incomplete source, undeclared layer ids,
    colliding names, disk space. Submodels whose tensors cannot be told apart are kept whole in the plan."""
    if target.path.exists() and not target.replace:
        raise bad_input(f"{target.given} already exists; choose a new output directory or pass overwrite=true.")
    refuse_narrowing(plan)
    files = readable_source(source)
    prefix = source.report.backbone_prefix if source.report else None
    others = submodel_maps(plan, source, files, prefix or "")
    layers = Layers(plan.backbone, source.layout.mtp_layers or 0, plan.layer_map, plan.selection.kept_mtp, others)
    weights = map_tensors(files, prefix, layers)
    shards = assign_shards(weights.moves, max_shard_bytes)
    clashes = sorted(WRITTEN_NAMES.intersection(plan.assets.copy))
    if clashes:
        raise bad_input(
            f"the source's {', '.join(clashes)} would replace a file the trim writes (an auto_map module of that "
            "name?); nothing was written. Rename it in a copy of the source."
        )
    assets = {name: str(policy.readable(source.directory / name)) for name in plan.assets.copy}
    config_text = dump_config(plan.config).decode()
    plan.cases.serve.load_format = "safetensors"
    smoke_text = dump_smoke_cases(plan.cases)
    checkpoint = weights.nbytes + HEADER_ALLOWANCE_BYTES * len(weights.moves)
    check_disk(
        target.path,
        checkpoint + len(config_text) + sum(Path(p).stat().st_size for p in assets.values()),
        max_disk_bytes,
    )
    source_paths = {shard: str(policy.readable(source.directory / shard)) for shard in files.shard_names}
    return CheckedTrim(files, weights, shards, assets, source_paths, config_text, smoke_text)
