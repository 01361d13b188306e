"""Arguments many tools share: which repository, which subject of it; and the models the checkpoint tools
share (a finding; plan_trim's arguments and output, which trim_model's extend)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..core.checkpoint import findings
from ..core.checkpoint.evidence import PluginAccess
from ..core.checkpoint.layer_ids import compact_ids
from ..core.foundation.errors import bad_input, not_found
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
from .spec import ToolEnv, ToolOutput


class SubjectArgs(BaseModel):
    plugin_repo: str = Field(default=".", description="The vLLM-MetaX repository (relative to the first --root).")
    subject: SubjectKind = Field(
        default=SubjectKind.WORKTREE,
        description="worktree (files on disk), index (the staged snapshot), revision, directory, or installed "
        "(where the recorded interpreter imports vllm_metax from).",
    )
    revision: str | None = Field(default=None, description="Commit, tag or branch for subject=revision.")
    directory: str | None = Field(default=None, description="Plain source directory for subject=directory.")


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
    upstream: str | None = Field(
        default=None, description="Upstream vLLM (git repository or directory); default: the environment record's."
    )
    target: str | None = Field(default=None, description="Upstream revision; default: the environment record's target.")


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


class PlanTrimInput(SubjectArgs):
    subject: SubjectKind = Field(
        default=SubjectKind.INSTALLED,
        description="Plugin code searched for the readers of each changed field (with an environment record): "
        "installed (default), or worktree / index / revision / directory.",
    )
    model: str = Field(
        description="Source checkpoint directory (relative to the first --root), or a Hugging Face repo id from the "
        "local cache."
    )
    model_revision: str | None = Field(
        default=None, description="Branch, tag or commit of a repo id (local cache only)."
    )
    targets: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Paths to cover (names from a previous plan's coverage, e.g. moe, attn:sliding, compress:128); "
        "default: every distinct path of the decoder.",
    )
    layers: list[int] | None = Field(
        default=None,
        max_length=4096,
        description="Keep exactly these backbone layers (original ids) instead of choosing.",
    )
    keep_mtp: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="MTP/draft layers to keep (the first N; true = 1, false = 0); default: all declared.",
    )
    allow_drop: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Distinct paths the caller accepts losing (a refused plan names them).",
    )
    tp: int = Field(default=1, ge=1, le=1024)
    pp: int = Field(default=1, ge=1, le=256)
    ep: int = Field(
        default=1, ge=1, le=4096, description="Expert-parallel size (vLLM: TP x DP with --enable-expert-parallel)."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=16 * 1024 * 1024, description="Context for the KV budget and the smoke cases."
    )
    device_memory_gb: float | None = Field(
        default=None, gt=0, le=100_000, description="Memory of one device, for the fit check."
    )
    allow_narrowing: bool = Field(
        default=False,
        description="Permit fewer routed experts when the kept layers' parameters alone do not fit (never narrower "
        "dimensions).",
    )

    def trim_request(self) -> TrimRequest:
        return TrimRequest(
            targets=self.targets,
            layers=self.layers,
            keep_mtp=self.keep_mtp,
            allow_drop=self.allow_drop,
            parallel=Parallel(self.tp, self.pp, self.ep),
            max_model_len=self.max_model_len,
            device_gb=self.device_memory_gb,
            allow_narrowing=self.allow_narrowing,
        )


class CoverageRow(BaseModel):
    target: str = Field(
        description="A distinct path: a layer kind, array value (name=value), id-list membership (in:/not-in:) or "
        "module:."
    )
    also: list[str] = Field(default_factory=list, description="Other names of the same layer set (first four).")
    layers: list[int] = Field(description="Retained original layers that have it.")
    available: str = Field(description="Every original layer that has it.")
    reason: str
    request: str = Field(description="The request or serve setting that triggers it (see the smoke cases).")
    optional: bool = Field(default=False, description="MTP/draft layers and submodels: separate, optional coverage.")


class ConfigChangeOut(BaseModel):
    field: str
    change: str
    old: str | None = None
    new: str | None = None
    reason: str
    read_by: list[str] | None = Field(
        default=None,
        description="Where the field's name appears in consumer code (tree path:line, first three); [] means no "
        "reader was found (descriptive); null means no environment record, so nothing was searched.",
    )


class StageOut(BaseModel):
    stage: int
    layers: list[int] = Field(description="Original ids (MTP layers L+i run beside the last stage).")
    params_bytes_per_rank: int
    kv_cache_bytes_per_rank: int


class BudgetsOut(BaseModel):
    source: str = Field(description="tensors (shard headers), or an estimate from config width keys.")
    params_bytes: int
    original_params_bytes: int
    params_bytes_per_rank: int = Field(description="The most loaded rank (TP/EP split, PP stage).")
    kv_bytes_per_token_per_rank: int
    kv_cache_bytes_per_rank: int = Field(description="One sequence of max_model_len on the most loaded stage.")
    state_bytes_per_rank: int = Field(description="Recurrent (linear-attention) state of one sequence.")
    max_model_len: int
    stages: list[StageOut]
    device_bytes: int | None = None
    usable_bytes: int | None = Field(
        default=None, description="0.9 of the device (vLLM's default gpu_memory_utilization)."
    )
    fits: bool | None = None
    disk_bytes_dummy: int = Field(description="config, tokenizer and processor assets.")
    disk_bytes_real: int = Field(
        description="The retained tensors of a real-weight trim, embeddings and lookup tables included."
    )
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
    kept_layers: list[int] = Field(default_factory=list, description="Original ids of the retained backbone layers.")
    mtp_kept: list[int] = Field(default_factory=list, description="Original ids (L+i) of the retained MTP layers.")
    coverage: list[CoverageRow] = Field(default_factory=list)
    layer_map: dict[int, int] = Field(
        default_factory=dict, description="Original layer id -> new id, MTP layers included."
    )
    submodels: list[SubmodelOut] = Field(default_factory=list)
    uncovered: list[str] = Field(default_factory=list, description="Paths no longer covered, and why.")
    config_changes: list[ConfigChangeOut] = Field(default_factory=list)
    budgets: BudgetsOut | None = None
    parallel: list[str] = Field(default_factory=list, description="TP/EP notes on the retained dimensions.")
    smoke_cases: list[str] = Field(
        default_factory=list, description="The cases a dummy trim writes: name (kind) -> covers."
    )
    examples: list[str] = Field(
        default_factory=list, description=f"Related trimmed-model examples in the plugin's {EXAMPLES_DIR}/."
    )
    notes: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(
        default_factory=list, description="Config/checkpoint disagreements found on the way."
    )
    evidence_gaps: list[str] = Field(default_factory=list)


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
