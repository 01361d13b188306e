"""Tool `trim_model`: write a depth-trimmed model directory — dummy (config and assets) or real weights."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from typing_extensions import Self

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
from .arguments import PlanTrimInput, PlanTrimOutput, fit_plan, plan_trim_output, plugin_access
from .spec import JobInfo, NextCall, ToolEnv, ToolSpec

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
MAX_SHARD_BYTES = 5_000_000_000
REAL_TRIM_JOB = "vllm_metax_mcp.core.trim.real:run_job"


class TrimModelInput(PlanTrimInput):
    output: str = Field(description="New dir in an output root.")
    output_mode: Literal["dummy", "real"] = Field(default="dummy", description="real copies weights (a job).")
    overwrite: bool = Field(default=False, description="Replace an earlier output.")
    max_shard_bytes: int | None = Field(default=None, ge=1, description="real; default 5e9.")
    max_disk_bytes: int | None = Field(default=None, ge=0, description="real.")

    @model_validator(mode="after")
    def _real_settings_need_real(self) -> Self:
        given = [name for name in ("max_shard_bytes", "max_disk_bytes") if getattr(self, name) is not None]
        if given and self.output_mode != "real":
            raise ValueError(f"{', '.join(given)} applies only to output_mode=real (a dummy trim writes no weights)")
        return self


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
    files: list[str] = Field(default_factory=list, description="Files written, relative to output.")
    manifest: str = Field(default="", description="trim_manifest.json, relative to the first root.")
    manifest_sha256: str = ""
    weights: WeightsOut | None = Field(default=None, description="real: the retained tensors and their names.")
    verified: VerifiedOut | None = Field(default=None, description="real: sha256 checked against the source's bytes.")
    script_reproduced: bool | None = Field(default=None, description="real: the shipped extract.py wrote them.")
    load_validated: bool | None = Field(default=None, description="real: false until validate_with passes.")
    validate_with: dict[str, Any] | None = Field(default=None, description="real: the run_smoke_test call to run.")
    job: JobInfo | None = Field(default=None, description="real: set while the copy runs; poll jobs.")


def _planned(args: TrimModelInput, env: ToolEnv, evidence: CheckpointEvidence, plan: Plan) -> PlanTrimOutput:
    return plan_trim_output(plan, plan_context(evidence, plan, env.policy, args.plugin_repo, env.store))


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
    checked = check_real_trim(
        source, plan, target, args.max_shard_bytes or MAX_SHARD_BYTES, args.max_disk_bytes, env.policy
    )
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
    output.next_step = NextCall(**call)
    manifest = manifest_document(_manifest_head(args, planned), source_hashes(plan, source.directory, env.policy), {})
    job = real_trim_job(
        checked,
        source,
        plan,
        target,
        env.policy,
        manifest,
        call,
        fit_plan(output).model_dump(mode="json", exclude={"result_id", "job"}),
    )
    scratch = Scratch(str(target.path.parent), scratch_prefix(target.path, "{job}"), target.path.name)
    return env.jobs.start(env.tool, REAL_TRIM_JOB, job, scratch=[scratch])


def trim_model(args: TrimModelInput, env: ToolEnv) -> TrimModelOutput | JobHandle:
    """Write plan_trim's plan as a model dir (atomic): config, assets, trim_manifest.json, smoke cases;
    real copies kept tensors byte-exact, verified. next_step: run_smoke_test."""
    evidence = checkpoint_evidence(plugin_access(args, env), env.policy, env.store, args.model, args.model_revision)
    source = Source.of(evidence, env.policy)
    path = env.policy.writable(args.output, overwrite=args.overwrite)
    target = TrimTarget(path, args.output, env.policy.display(args.output), args.overwrite)
    plan = make_plan(source, args.trim_request())
    if args.output_mode == "real":
        return _start_real(args, env, evidence, source, plan, target)
    planned = _planned(args, env, evidence, plan)
    written = write_dummy(source, plan, target, _manifest_head(args, planned), env.policy)
    output = TrimModelOutput(
        **dict(planned),
        output=args.output,
        output_mode=args.output_mode,
        files=written.files,
        manifest=manifest_label(path, env.policy),
        manifest_sha256=written.manifest_sha256,
    )
    output.next_step = _smoke_dummy(args, target, env)
    return fit_plan(output)


def _smoke_dummy(args: TrimModelInput, target: TrimTarget, env: ToolEnv) -> NextCall:
    """A dummy-weight server on the output, running the smoke cases the trim wrote."""
    call = validate_with(target, env.policy, args.plugin_repo if "plugin_repo" in args.model_fields_set else None)
    arguments = {**call["arguments"], "load_format": "dummy"}
    return NextCall(tool="run_smoke_test", arguments=arguments, why="serve it with dummy weights; run its smoke cases")


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
