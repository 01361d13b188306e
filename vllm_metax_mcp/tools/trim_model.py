"""Tool `trim_model`: write a depth-trimmed model directory — dummy (config and assets) or real weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.checkpoint.safetensors_headers import PREFERRED_INDEX
from ..core.foundation.atomic import scratch_prefix, staged_directory
from ..core.foundation.errors import bad_input
from ..core.foundation.jobs import JobHandle, Scratch
from ..core.foundation.policy import Effect, Policy, is_within
from ..core.target.extract import file_sha256
from ..core.trim.assets import (
    IMAGE_NAME,
    MANIFEST_NAME,
    STATEMENT,
    copy_assets,
    tiny_png,
)
from ..core.trim.cases import FILE_NAME, dump_smoke_cases, write_smoke_cases
from ..core.trim.config_rewrite import dump_config
from ..core.trim.plan import Plan, Source, make_plan
from ..core.trim.real import (
    check_disk,
    readable_source,
    refuse_narrowing,
    submodel_maps,
)
from ..core.trim.weight_map import Layers, WeightMap, assign_shards, map_tensors
from .inspect_config import CheckpointEvidence
from .plan_trim import (
    PlanTrimInput,
    PlanTrimOutput,
    gather,
    plan_output,
    root_relative,
    trim_request,
)
from .spec import JobInfo, ToolEnv, ToolSpec

MANIFEST_FORMAT = "vllm-metax-mcp/trim-manifest/1"
PLAN_FIELDS = {
    "kept_layers",
    "mtp_kept",
    "layer_map",
    "coverage",
    "submodels",
    "uncovered",
    "config_changes",
    "budgets",
    "parallel",
    "notes",
}
HEADER_ALLOWANCE_BYTES = 256
"""Per tensor, for the output headers in the disk estimate."""
EXAMPLES_SHOWN = 10
REAL_TRIM_JOB = "vllm_metax_mcp.core.trim.real:run_job"


class TrimModelInput(PlanTrimInput):
    output: str = Field(
        description="New directory under an output root (never inside the source checkpoint or a protected path)."
    )
    output_mode: Literal["dummy", "real"] = Field(
        default="dummy",
        description="dummy: config, tokenizer/processor assets and smoke cases for --load-format dummy (no weights). "
        "real: a self-contained safetensors checkpoint of the retained tensors, renamed by the layer map, copied as raw "
        "bytes, verified, with a proven extract.py; runs as a job.",
    )
    overwrite: bool = Field(
        default=False,
        description="Replace an earlier output of this server (a directory with its trim_manifest.json or export marker "
        "that the server's state directory recorded writing, holding no git repository and no file a repository tracks, "
        "not a read root, output root or protected path) — only once the new one is complete.",
    )
    max_shard_bytes: int = Field(
        default=5_000_000_000,
        ge=1,
        description="real: the largest output shard (a bigger tensor gets a shard of its own).",
    )
    max_disk_bytes: int | None = Field(
        default=None,
        ge=0,
        description="real: refuse before writing when the output plus its reproduction check would need more (a quota).",
    )


class WeightsOut(BaseModel):
    tensors: int
    bytes: int
    renamed: int
    dropped: int
    shards: list[str]
    rules: list[str] = Field(description="How names were mapped.")
    examples: list[str] = Field(default_factory=list, description="First renames, old -> new.")


class VerifiedOut(BaseModel):
    tensors: int
    bytes: int


class TrimModelOutput(PlanTrimOutput):
    output: str = Field(default="", description="The written directory, as given.")
    output_mode: str = ""
    files: list[str] = Field(default_factory=list, description="Files written (relative to output).")
    manifest: str = Field(default="", description="The trim manifest, relative to the first root.")
    manifest_sha256: str = ""
    weights: WeightsOut | None = Field(default=None, description="real: the retained tensors and how they were named.")
    verified: VerifiedOut | None = Field(
        default=None, description="real: tensors and bytes reopened and compared byte for byte with the source."
    )
    script_reproduced: bool | None = Field(
        default=None, description="real: the shipped extract.py, run alone, recreated identical files."
    )
    load_validated: bool | None = Field(
        default=None, description="real: always false here; run validate_with (a non-dummy load) to validate it."
    )
    validate_with: dict[str, Any] | None = Field(
        default=None, description="real: the run_smoke_test call that validates the load."
    )
    job: JobInfo | None = Field(
        default=None, description="real: set while the copy still runs; poll it with the jobs tool."
    )


def _manifest(
    args: TrimModelInput, planned: PlanTrimOutput, source_hashes: dict[str, str], written: dict[str, str]
) -> dict[str, Any]:
    """Source and its hashes, the request, the plan, layer map, coverage, uncovered paths, and what the trim proves."""
    plan = planned.model_dump(mode="json", include=PLAN_FIELDS)
    return {
        "format": MANIFEST_FORMAT,
        "output_mode": args.output_mode,
        "statement": STATEMENT,
        "source": {"model": planned.model, "backbone_layers": planned.backbone_layers, "sha256": source_hashes},
        "request": args.model_dump(mode="json", exclude={"output", "overwrite", "cursor", "limit"}),
        "plan": plan,
        "smoke_cases": FILE_NAME,
        "files": written,
    }


def _source_hashes(plan: Plan, directory: Path, policy: Policy) -> dict[str, str]:
    names = ["config.json", *plan.assets.copy, *([PREFERRED_INDEX] if (directory / PREFERRED_INDEX).is_file() else [])]
    return {name: file_sha256(policy.readable(directory / name)) for name in names}


def _write_dummy(
    args: TrimModelInput, env: ToolEnv, source: Source, plan: Plan, planned: PlanTrimOutput, target: Path
) -> TrimModelOutput:
    source_hashes = _source_hashes(plan, source.directory, env.policy)
    with staged_directory(
        target, replace=args.overwrite, shown=env.policy.display(args.output), policy=env.policy
    ) as staging:
        (staging / "config.json").write_bytes(dump_config(plan.config))
        written = {"config.json": file_sha256(staging / "config.json")}
        written |= copy_assets(source.directory, plan.assets.copy, staging, env.policy)
        write_smoke_cases(staging / FILE_NAME, plan.cases)
        written[FILE_NAME] = file_sha256(staging / FILE_NAME)
        if plan.image:
            (staging / IMAGE_NAME).write_bytes(tiny_png())
            written[IMAGE_NAME] = file_sha256(staging / IMAGE_NAME)
        manifest = json.dumps(_manifest(args, planned, source_hashes, written), indent=2, ensure_ascii=False) + "\n"
        (staging / MANIFEST_NAME).write_text(manifest)
    manifest_path = target / MANIFEST_NAME
    return TrimModelOutput(
        **dict(planned),
        output=args.output,
        output_mode=args.output_mode,
        files=sorted([*written, MANIFEST_NAME]),
        manifest=root_relative(manifest_path, [*env.policy.output_roots, *env.policy.roots]),
        manifest_sha256=file_sha256(manifest_path),
    )


def _weights_out(weights: WeightMap, shards: dict[str, Any]) -> WeightsOut:
    renamed = weights.renamed
    return WeightsOut(
        tensors=len(weights.moves),
        bytes=weights.nbytes,
        renamed=len(renamed),
        dropped=len(weights.dropped),
        shards=sorted(shards),
        rules=weights.rules,
        examples=[f"{m.source} -> {m.target}" for m in renamed[:EXAMPLES_SHOWN]],
    )


def _validate_with(target: Path, env: ToolEnv, args: TrimModelInput) -> dict[str, Any]:
    inside = any(is_within(target, root) for root in env.policy.roots)
    arguments: dict[str, Any] = {
        "model": root_relative(target, env.policy.roots) if inside else args.output,
        "load_format": "safetensors",
    }
    if "plugin_repo" in args.model_fields_set:
        arguments["plugin_repo"] = args.plugin_repo
    note = "" if inside else " The output is outside the read roots: serve with it under --root to smoke-test it."
    return {
        "tool": "run_smoke_test",
        "arguments": arguments,
        "why": "a non-dummy load on a real vLLM server validates the checkpoint; its evidence records this manifest's "
        "sha256." + note,
    }


def real_trim_spec(
    args: TrimModelInput, env: ToolEnv, evidence: CheckpointEvidence, source: Source, plan: Plan, target: Path
) -> dict[str, Any]:
    """Every check that can refuse before a byte is written, and the plain-JSON plan of the copy job."""
    if target.exists() and not args.overwrite:
        raise bad_input(f"{args.output} already exists; choose a new output directory or pass overwrite=true.")
    refuse_narrowing(plan)
    files = readable_source(source)
    prefix = source.report.backbone_prefix if source.report else None
    others = submodel_maps(plan, source, files, prefix or "")
    planned = PlanTrimOutput(**plan_output(args, env, evidence, plan))
    backbone = plan.backbone
    layers = Layers(backbone, source.layout.mtp_layers or 0, plan.layer_map, plan.selection.kept_mtp, others)
    weights = map_tensors(files, prefix, layers)
    shards = assign_shards(weights.moves, args.max_shard_bytes)
    assets = {name: str(env.policy.readable(source.directory / name)) for name in plan.assets.copy}
    config_text = dump_config(plan.config).decode()
    plan.cases.serve.load_format = "safetensors"
    smoke_text = dump_smoke_cases(plan.cases)
    checkpoint = weights.nbytes + HEADER_ALLOWANCE_BYTES * len(weights.moves)
    check_disk(
        target,
        2 * (checkpoint + len(config_text) + sum(Path(p).stat().st_size for p in assets.values())),
        args.max_disk_bytes,
    )
    weights_out = _weights_out(weights, shards)
    validate_with = _validate_with(target, env, args)
    source_paths = {shard: str(env.policy.readable(source.directory / shard)) for shard in files.shard_names}
    manifest_path = target / MANIFEST_NAME
    output = TrimModelOutput(
        **dict(planned),
        output=args.output,
        output_mode="real",
        manifest=root_relative(manifest_path, [*env.policy.output_roots, *env.policy.roots]),
        weights=weights_out,
        validate_with=validate_with,
    )
    spec = {
        "source_dir": str(source.directory),
        "source_paths": source_paths,
        "target": str(target),
        "shown": env.policy.display(args.output),
        "overwrite": args.overwrite,
        "policy": env.policy.to_spec(),  # the worker applies the overwrite rule again right before its swap
        "config": config_text,
        "assets": assets,
        "asset_sha256": {name: file_sha256(Path(path)) for name, path in assets.items()},
        "shards": {
            shard: [[m.target, m.shard, m.source, m.dtype, list(m.shape), m.nbytes] for m in moves]
            for shard, moves in shards.items()
        },
        "source_error_codes": sorted(
            {code for severity, code, _ in (source.report.findings if source.report else []) if severity == "error"}
        ),
        "extra_files": {FILE_NAME: smoke_text},
        "image": plan.image,
        "manifest_name": MANIFEST_NAME,
        "manifest": _manifest(args, planned, _source_hashes(plan, source.directory, env.policy), {}),
        "manifest_weights": {
            "tensors": len(weights.moves),
            "bytes": weights.nbytes,
            "renamed": {m.source: m.target for m in weights.renamed},
            "dropped": len(weights.dropped),
            "rules": weights.rules,
            "source_shards": {shard: Path(path).stat().st_size for shard, path in source_paths.items()},
        },
        "validate_with": validate_with,
        "output": output.model_dump(mode="json", exclude={"result_id", "job"}),
    }
    return spec


def trim_model(args: TrimModelInput, env: ToolEnv) -> TrimModelOutput | JobHandle:
    """Write a depth-trimmed model: the plan of plan_trim applied to the raw config.json (depth, per-layer
    arrays with their MTP tail, layer-id lists in their own base, threshold and periodic rules, MTP count,
    quantization ignore lists renumbered), one copy of each tokenizer / generation / chat-template /
    processor asset, `trim_manifest.json` (source hashes, plan, layer map, coverage, uncovered paths) and
    `smoke_cases.yaml` for run_smoke_test. The directory appears whole or not at all, only under an output
    root and never inside the source checkpoint.

    output_mode="dummy" writes no weights (for --load-format dummy). output_mode="real" runs as a job: the
    source is checked first (every shard present, every header consistent, not a per-rank partition, disk
    space), the retained tensors are copied as raw bytes under names mapped by the layer map (MTP layers
    after the backbone follow it), every output tensor is compared byte for byte with its source, the
    output is cross-checked against the reduced config, and a standalone `extract.py` is shipped and proven
    by running it once. The result says load_validated=false and gives the run_smoke_test call that
    validates the load.
    """
    evidence, source = gather(args, env)
    target = env.policy.writable(args.output, overwrite=args.overwrite)
    plan = make_plan(source, trim_request(args))
    if args.output_mode == "real":
        spec = real_trim_spec(args, env, evidence, source, plan, target)
        return env.jobs.start(
            env.tool, REAL_TRIM_JOB, spec, scratch=[Scratch(str(target.parent), scratch_prefix(target, "{job}"), target.name)]
        )
    return _write_dummy(args, env, source, plan, PlanTrimOutput(**plan_output(args, env, evidence, plan)), target)


SPEC = ToolSpec(
    name="trim_model",
    effect=Effect.WRITES,
    run=trim_model,
    input_model=TrimModelInput,
    output_model=TrimModelOutput,
    title="Write a depth-trimmed model (dummy or real weights)",
    idempotent=False,
    destructive=True,
    cpu_heavy=True,
)
