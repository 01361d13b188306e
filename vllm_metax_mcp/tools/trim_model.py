"""Tool `trim_model`: write a depth-trimmed model directory — dummy (config and assets) or real weights."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.checkpoint.evidence import CheckpointEvidence, checkpoint_evidence
from ..core.foundation.atomic import scratch_prefix
from ..core.foundation.jobs import JobHandle, Scratch
from ..core.foundation.policy import Effect
from ..core.trim.output import (
    ManifestHead,
    TrimTarget,
    manifest_document,
    manifest_label,
    source_hashes,
    validate_with,
    write_dummy,
)
from ..core.trim.plan import Plan, Source, make_plan
from ..core.trim.real import real_trim_job
from ..core.trim.real_checks import CheckedTrim, check_real_trim
from ..core.trim.report import plan_context
from .arguments import PlanTrimInput, PlanTrimOutput, plan_trim_output, plugin_access
from .spec import JobInfo, ToolEnv, ToolSpec

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
"""The fields of the plan that go into the manifest."""
EXAMPLES_SHOWN = 10
REAL_TRIM_JOB = "vllm_metax_mcp.core.trim.real:run_job"


class TrimModelInput(PlanTrimInput):
    output: str = Field(
        description="New directory under an output root (never inside the source checkpoint or a protected path)."
    )
    output_mode: Literal["dummy", "real"] = Field(
        default="dummy",
        description="dummy: config, tokenizer/processor assets and smoke cases for --load-format dummy (no "
        "weights). real: a self-contained safetensors checkpoint of the retained tensors, renamed by the layer map, "
        "copied as raw bytes, verified, with a proven extract.py; runs as a job.",
    )
    overwrite: bool = Field(
        default=False,
        description="Replace an earlier output of this server (a directory with its trim_manifest.json or export "
        "marker that the server's state directory recorded writing, holding no git repository and no file a "
        "repository tracks, not a read root, output root or protected path) — only once the new one is complete.",
    )
    max_shard_bytes: int = Field(
        default=5_000_000_000,
        ge=1,
        description="real: the largest output shard (a bigger tensor gets a shard of its own).",
    )
    max_disk_bytes: int | None = Field(
        default=None,
        ge=0,
        description="real: refuse before writing when the output plus its reproduction check would need more (a "
        "quota).",
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


def _planned(args: TrimModelInput, env: ToolEnv, evidence: CheckpointEvidence, plan: Plan) -> PlanTrimOutput:
    return plan_trim_output(plan, plan_context(evidence, plan, env.policy, args.plugin_repo))


def _manifest_head(args: TrimModelInput, planned: PlanTrimOutput) -> ManifestHead:
    return ManifestHead(
        output_mode=args.output_mode,
        model=planned.model,
        backbone_layers=planned.backbone_layers,
        request=args.model_dump(mode="json", exclude={"output", "overwrite", "cursor", "limit"}),
        plan=planned.model_dump(mode="json", include=PLAN_FIELDS),
    )


def _weights_out(checked: CheckedTrim) -> WeightsOut:
    weights = checked.weights
    renamed = weights.renamed
    return WeightsOut(
        tensors=len(weights.moves),
        bytes=weights.nbytes,
        renamed=len(renamed),
        dropped=len(weights.dropped),
        shards=sorted(checked.shards),
        rules=weights.rules,
        examples=[f"{m.source} -> {m.target}" for m in renamed[:EXAMPLES_SHOWN]],
    )


def _start_real(
    args: TrimModelInput, env: ToolEnv, evidence: CheckpointEvidence, source: Source, plan: Plan, target: TrimTarget
) -> JobHandle:
    """Every check that can refuse runs here, before a byte is written; the copy itself runs as a job."""
    checked = check_real_trim(source, plan, target, args.max_shard_bytes, args.max_disk_bytes, env.policy)
    planned = _planned(args, env, evidence, plan)
    call = validate_with(target, env.policy, args.plugin_repo if "plugin_repo" in args.model_fields_set else None)
    output = TrimModelOutput(
        **dict(planned),
        output=args.output,
        output_mode="real",
        manifest=manifest_label(target.path, env.policy),
        weights=_weights_out(checked),
        validate_with=call,
    )
    manifest = manifest_document(_manifest_head(args, planned), source_hashes(plan, source.directory, env.policy), {})
    job = real_trim_job(
        checked,
        source,
        plan,
        target,
        env.policy,
        manifest,
        call,
        output.model_dump(mode="json", exclude={"result_id", "job"}),
    )
    scratch = Scratch(str(target.path.parent), scratch_prefix(target.path, "{job}"), target.path.name)
    return env.jobs.start(env.tool, REAL_TRIM_JOB, job, scratch=[scratch])


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
    evidence = checkpoint_evidence(plugin_access(args, env), env.policy, env.store, args.model, args.model_revision)
    source = Source.of(evidence, env.policy)
    path = env.policy.writable(args.output, overwrite=args.overwrite)
    target = TrimTarget(path, args.output, env.policy.display(args.output), args.overwrite)
    plan = make_plan(source, args.trim_request())
    if args.output_mode == "real":
        return _start_real(args, env, evidence, source, plan, target)
    planned = _planned(args, env, evidence, plan)
    written = write_dummy(source, plan, target, _manifest_head(args, planned), env.policy)
    return TrimModelOutput(
        **dict(planned),
        output=args.output,
        output_mode=args.output_mode,
        files=written.files,
        manifest=manifest_label(path, env.policy),
        manifest_sha256=written.manifest_sha256,
    )


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
