"""Arguments many tools share: which repository, which subject of it; and the models the checkpoint tools
share (a finding; plan_trim's arguments and output, which trim_model's extend)."""

from __future__ import annotations

import itertools
import os
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, model_validator
from typing_extensions import Self

from ..core.checkpoint import findings
from ..core.checkpoint.evidence import PluginAccess
from ..core.checkpoint.layer_ids import compact_ids
from ..core.foundation.errors import bad_input, not_found
from ..core.foundation.results import RESULT_BUDGET
from ..core.sources.environment import RuntimeLocation, UpstreamMapping, load_record, resolve_upstream
from ..core.sources.git import Repository, open_repository
from ..core.sources.subjects import (
    RevisionSubject,
    Subject,
    SubjectKind,
    SubjectRequest,
    open_subject,
)
from ..core.trim.budget import Parallel
from ..core.trim.plan import Plan, TrimRequest
from ..core.trim.report import EXAMPLES_DIR, PlanContext
from .output import size_of
from .spec import ToolEnv, ToolOutput


class SubjectArgs(BaseModel):
    plugin_repo: str = Field(default=".", description="vLLM-MetaX repo.")
    subject: SubjectKind = SubjectKind.WORKTREE
    revision: str | None = None
    directory: str | None = None

    @model_validator(mode="after")
    def _subject_fields_used(self) -> Self:
        """A revision or directory the chosen subject would ignore is a mistake, not a default."""
        for name, kind in (("revision", SubjectKind.REVISION), ("directory", SubjectKind.DIRECTORY)):
            if getattr(self, name) is not None and self.subject is not kind:
                raise ValueError(f"{name} is read only with subject={kind.value} (subject is {self.subject.value})")
        return self


def open_plugin_repo(args: SubjectArgs, env: ToolEnv) -> Repository | None:
    if args.subject is SubjectKind.DIRECTORY:
        return None
    return open_repository(args.plugin_repo, env.policy)


def open_plugin_subject(
    args: SubjectArgs, env: ToolEnv, repo: Repository | None, installed: RuntimeLocation | None = None
) -> Subject:
    """The subject a call names; `installed` comes from the given runtime (or the stored environment record)."""
    origin = None
    if args.subject is SubjectKind.INSTALLED:
        if installed is None and repo is not None:
            record = load_record(env.store, repo)
            installed = record.runtime if record else None
        if installed is not None:
            origin = installed.package_dir
            installed.grant_reads(env.policy)
    request = SubjectRequest(args.subject, path=args.directory, revision=args.revision, installed_origin=origin)
    return open_subject(env.policy, request, repo)


class UpstreamArgs(SubjectArgs):
    upstream: str | None = Field(default=None, description="vLLM repo or dir (default: recorded).")
    target: str | None = Field(default=None, description="Its revision (default: recorded).")


def open_upstream(
    args: UpstreamArgs, env: ToolEnv, repo: Repository | None, revision: str | None = None
) -> tuple[Subject, UpstreamMapping]:
    """The upstream tree at the target (or at another `revision` of it), from the call's overrides or the record."""
    if args.upstream:
        mapping = resolve_upstream(env.policy, args.upstream, args.target)
    else:
        record = load_record(env.store, repo) if repo else None
        if not record or not record.upstream:
            raise not_found("No upstream: pass upstream (and target), or record one with environment action=establish.")
        mapping = record.upstream
        env.policy.readable(mapping.path)
        env.policy.protect(mapping.path)
        if args.target and args.target != mapping.target:  # another release of the recorded upstream
            mapping = resolve_upstream(env.policy, mapping.path, args.target)
    if mapping.kind == "directory":
        if revision:
            raise bad_input("The upstream is a plain directory: it has no revisions to compare (base/target).")
        return open_subject(env.policy, SubjectRequest(SubjectKind.DIRECTORY, path=mapping.path), None), mapping
    upstream_repo = open_repository(mapping.path, env.policy)
    return RevisionSubject(upstream_repo, revision or mapping.commit), mapping


def plugin_access(args: SubjectArgs, env: ToolEnv) -> PluginAccess:
    """The plugin repository and subject a call names, opened when the checkpoint workflow asks for them."""
    return PluginAccess(
        args.subject,
        lambda: open_plugin_repo(args, env),
        lambda repo, installed: open_plugin_subject(args, env, repo, installed),
    )


# -- the checkpoint tools (inspect_config, plan_trim, trim_model) ---------------------------------


class Finding(BaseModel):
    severity: Literal["error", "warning", "info"]
    code: str
    message: str


def finding_out(finding: findings.Finding) -> Finding:
    return Finding(severity=finding.severity, code=finding.code, message=finding.message)


SIZE_MAX: dict[str, float] = {
    "targets": 64,
    "layers": 4096,
    "allow_drop": 64,
    "keep_mtp": 64,
    "tp": 1024,
    "pp": 256,
    "ep": 4096,
    "max_model_len": 16 * 1024 * 1024,
    "device_memory_gb": 100_000,
}


class PlanTrimInput(SubjectArgs):
    subject: SubjectKind = SubjectKind.INSTALLED
    model: str = Field(description="Checkpoint dir or cached HF repo id.")
    model_revision: str | None = None
    targets: list[str] = Field(default_factory=list, description="Paths to cover.")
    layers: list[int] | None = Field(default=None, description="Backbone layers to keep.")
    keep_mtp: int | None = Field(default=None, ge=0)
    allow_drop: list[str] = Field(default_factory=list, description="Paths to lose.")
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    ep: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=16)
    device_memory_gb: float | None = Field(default=None, gt=0)
    allow_narrowing: bool = Field(default=False, description="Fewer experts to fit.")

    @model_validator(mode="after")
    def _sizes_and_narrowing(self) -> Self:
        """Bounds kept out of the schema (it is read on every tools/list), checked before any work all the same."""
        for name, most in SIZE_MAX.items():
            value = getattr(self, name) or 0
            if (len(value) if isinstance(value, list) else value) > most:
                raise ValueError(f"{name} is at most {most}{' long' if isinstance(value, list) else ''}")
        if self.allow_narrowing and self.device_memory_gb is None:
            raise ValueError("allow_narrowing needs device_memory_gb: experts narrow only to fit a device")
        return self

    def trim_request(self) -> TrimRequest:
        return TrimRequest(
            targets=self.targets,
            layers=self.layers,
            keep_mtp=self.keep_mtp,
            allow_drop=self.allow_drop,
            parallel=Parallel(self.tp or 1, self.pp or 1, self.ep or 1),
            max_model_len=self.max_model_len,
            device_gb=self.device_memory_gb,
            allow_narrowing=self.allow_narrowing,
        )


class CoverageRow(BaseModel):
    target: str = Field(description="A distinct path: kind, array name=value, in:/not-in: id list, module:.")
    also: list[str] = Field(default_factory=list, description="Other names of the same layer set.")
    layers: list[int] = Field(description="Retained original layers that have it.")
    available: str = Field(description="Every original layer that has it.")
    reason: str
    request: str = Field(description="The request or serve setting that exercises it.")
    optional: bool = Field(default=False, description="MTP/draft or submodel coverage.")


class ConfigChangeOut(BaseModel):
    field: str
    change: str
    old: str | None = None
    new: str | None = None
    reason: str
    read_by: list[str] | None = Field(
        default=None, description="Consumer code reading it (first three); null: nothing searched."
    )


class StageOut(BaseModel):
    stage: int
    layers: list[int] = Field(description="Original ids (MTP layers run beside the last stage).")
    params_bytes_per_rank: int
    kv_cache_bytes_per_rank: int


class BudgetsOut(BaseModel):
    source: str = Field(description="tensors (shard headers), or an estimate from config widths.")
    params_bytes: int
    original_params_bytes: int
    params_bytes_per_rank: int = Field(description="The most loaded rank.")
    kv_bytes_per_token_per_rank: int
    kv_cache_bytes_per_rank: int = Field(description="One max_model_len sequence, most loaded stage.")
    state_bytes_per_rank: int = Field(description="Recurrent (linear-attention) state of one sequence.")
    max_model_len: int
    stages: list[StageOut]
    device_bytes: int | None = None
    usable_bytes: int | None = Field(default=None, description="0.9 of the device.")
    fits: bool | None = None
    disk_bytes_dummy: int
    disk_bytes_real: int
    recommendations: list[str] = Field(default_factory=list, description="In order, when it does not fit.")


class SubmodelOut(BaseModel):
    name: str
    depth_key: str
    layers: int
    kept: list[int]
    note: str


class PlanTrimOutput(ToolOutput):
    model: str = ""
    backbone_layers: int = 0
    kept_layers: list[int] = Field(default_factory=list, description="Retained backbone layers (original ids).")
    mtp_kept: list[int] = Field(default_factory=list, description="Retained MTP layers (original ids L+i).")
    coverage: list[CoverageRow] = Field(default_factory=list)
    layer_map: dict[int, int] = Field(default_factory=dict, description="Original layer id -> new id.")
    submodels: list[SubmodelOut] = Field(default_factory=list)
    uncovered: list[str] = Field(default_factory=list, description="Paths no longer covered, and why.")
    config_changes: list[ConfigChangeOut] = Field(default_factory=list)
    budgets: BudgetsOut | None = None
    parallel: list[str] = Field(default_factory=list, description="TP/EP notes.")
    smoke_cases: list[str] = Field(default_factory=list, description="Cases a trim writes: name (kind) -> covers.")
    examples: list[str] = Field(default_factory=list, description=f"Related examples in the plugin's {EXAMPLES_DIR}.")
    notes: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list, description="Config/checkpoint disagreements.")
    evidence_gaps: list[str] = Field(default_factory=list)
    truncated: dict[str, int] = Field(
        default_factory=dict, description="Lists cut to fit: name -> full length (all in trim_manifest.json)."
    )


PLAN_LISTS = ("coverage", "config_changes", "layer_map", "kept_layers", "smoke_cases", "notes", "parallel", "uncovered")
"""The lists of a plan that grow with the model, cut in this order when a result would exceed RESULT_BUDGET."""
TRUNCATION_RESERVE = 400
"""Room kept for `truncated` itself."""

Fitted = TypeVar("Fitted", bound=PlanTrimOutput)


def fit_plan(output: Fitted) -> Fitted:
    """The output within RESULT_BUDGET: the first growing list that makes it too big is cut to what fits (a list
    that cannot fit even empty is emptied), then the stages' layer lists; a next_step echoing a long `layers`
    says to pass them instead. `truncated` gives each cut list's full length."""
    chars = RESULT_BUDGET - TRUNCATION_RESERVE
    cut: dict[str, int] = {}
    step = output.next_step
    if step and size_of(step) > RESULT_BUDGET // 4 and "layers" in step.arguments:  # the caller has the list
        why = f"{step.why}; pass this call's layers ({len(step.arguments['layers'])} ids) as layers"
        arguments = {k: v for k, v in step.arguments.items() if k != "layers"}
        output = output.model_copy(update={"next_step": step.model_copy(update={"arguments": arguments, "why": why})})
    for name in PLAN_LISTS:
        if size_of(output) <= chars:
            break
        total = len(getattr(output, name))
        low, high = 0, total
        while low < high:  # the longest prefix that fits
            middle = (low + high + 1) // 2
            low, high = (middle, high) if size_of(_prefix(output, name, middle)) <= chars else (low, middle - 1)
        output = _prefix(output, name, low)
        if low < total:
            cut[name] = total
    if size_of(output) > chars and output.budgets:
        stages = [stage.model_copy(update={"layers": []}) for stage in output.budgets.stages]
        cut["budgets.stages.layers"] = sum(len(stage.layers) for stage in output.budgets.stages)
        output = output.model_copy(update={"budgets": output.budgets.model_copy(update={"stages": stages})})
    return output.model_copy(update={"truncated": cut}) if cut else output


def _prefix(output: Fitted, name: str, count: int) -> Fitted:
    value = getattr(output, name)
    kept = dict(list(value.items())[:count]) if isinstance(value, dict) else list(value)[:count]
    return output.model_copy(update={name: kept})


def given_arguments(args: BaseModel, **changed: Any) -> dict[str, Any]:
    """The arguments a call was given (as JSON), with `changed` applied: the base of a next_step."""
    return {**args.model_dump(mode="json", exclude_unset=True), **changed}


def fresh_output(env: ToolEnv, model: str) -> str:
    """A directory name under the first output root that does not exist yet, as a call would spell it."""
    root = env.policy.output_roots[0]
    stem = f"{PurePosixPath(model).name or 'model'}-trim"
    name = next(f"{stem}{n or ''}" for n in itertools.count() if not (root / f"{stem}{n or ''}").exists())
    return os.path.relpath(root / name, env.policy.base())


def plan_trim_output(plan: Plan, context: PlanContext) -> PlanTrimOutput:
    """The plan as plan_trim shows it (trim_model's output extends it)."""
    backbone = plan.backbone
    return PlanTrimOutput(
        model=context.model,
        backbone_layers=backbone,
        kept_layers=list(plan.selection.kept),
        mtp_kept=[backbone + i for i in plan.selection.kept_mtp],
        coverage=[
            CoverageRow(
                target=c.target,
                also=c.aliases,
                layers=c.kept,
                available=compact_ids(c.available),
                reason=c.reason,
                request=c.request,
                optional=c.optional,
            )
            for c in plan.coverage
        ],
        layer_map=plan.layer_map,
        submodels=[SubmodelOut(**vars(s)) for s in plan.submodels],
        uncovered=plan.uncovered,
        config_changes=[ConfigChangeOut(**vars(c), read_by=context.readers[c.field]) for c in plan.changes],
        budgets=BudgetsOut(
            **{**vars(plan.budget), "stages": [StageOut(stage=i, **vars(s)) for i, s in enumerate(plan.budget.stages)]},
            disk_bytes_dummy=plan.dummy_disk_bytes,
        ),
        parallel=plan.parallel_notes,
        smoke_cases=[f"{c.name} ({c.kind}) -> {c.covers}" for c in plan.cases.cases],
        examples=context.examples,
        notes=plan.notes + [f"asset skipped: {name} ({why})" for name, why in plan.assets.skipped[:10]],
        findings=[finding_out(f) for f in context.findings],
        evidence_gaps=context.gaps,
    )
