"""Tool `plan_trim`: which layers a depth trim keeps, what they cover, how to reach it, what it costs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..core.checkpoint.consumers import SourceTree, find_consumers
from ..core.checkpoint.layout import compact_ids
from ..core.foundation.errors import ToolFailure
from ..core.foundation.policy import Effect, Policy, is_within
from ..core.sources.hub import ModelLocation
from ..core.sources.subjects import SubjectKind
from ..core.trim.assets import related_examples
from ..core.trim.budget import Parallel
from ..core.trim.plan import Plan, Source, TrimRequest, make_plan
from .arguments import SubjectArgs
from .inspect_config import CheckpointEvidence, Finding, checkpoint_evidence
from .spec import ToolEnv, ToolOutput, ToolSpec

READERS_PER_FIELD = 3
EXAMPLES_DIR = "tools/batched_test/models"


class PlanTrimInput(SubjectArgs):
    subject: SubjectKind = Field(
        default=SubjectKind.INSTALLED,
        description="Plugin code searched for the readers of each changed field (with an environment record): installed "
        "(default), or worktree / index / revision / directory.",
    )
    model: str = Field(
        description="Source checkpoint directory (relative to the first --root), or a Hugging Face repo id from the local cache."
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
        description="Permit fewer routed experts when the kept layers' parameters alone do not fit (never narrower dimensions).",
    )


class CoverageRow(BaseModel):
    target: str = Field(
        description="A distinct path: a layer kind, array value (name=value), id-list membership (in:/not-in:) or module:."
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
        description="Where the field's name appears in consumer code (tree path:line, first three); [] means no reader was found "
        "(descriptive); null means no environment record, so nothing was searched.",
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


# -- building blocks shared with trim_model ----------------------------------------------------


def trim_request(args: PlanTrimInput) -> TrimRequest:
    return TrimRequest(
        targets=args.targets,
        layers=args.layers,
        keep_mtp=args.keep_mtp,
        allow_drop=args.allow_drop,
        parallel=Parallel(args.tp, args.pp, args.ep),
        max_model_len=args.max_model_len,
        device_gb=args.device_memory_gb,
        allow_narrowing=args.allow_narrowing,
    )


def root_relative(path: Path, roots: list[Path]) -> str:
    """A path relative to the first root holding it (its name when none does): never an absolute internal path."""
    for root in roots:
        if is_within(path, root):
            return path.relative_to(root).as_posix()
    return path.name


def model_label(location: ModelLocation, env: ToolEnv) -> str:
    """The model as a root-relative path, or repo@commit for the hub cache."""
    return root_relative(location.path, env.policy.roots) if location.source == "directory" else location.label


def _transformers_configs(record: dict[str, Any] | None, policy: Policy) -> SourceTree | None:
    """transformers' configuration modules (where a config class reads its keys), from the record's probe;
    each read through the policy (its site directory is readable; a file linking elsewhere is skipped)."""
    module = ((record or {}).get("probe") or {}).get("modules", {}).get("transformers") or {}
    dirs = module.get("package_dirs") or []
    if not dirs:
        return None
    top = Path(dirs[0])
    files = [top / "configuration_utils.py", *sorted((top / "models").glob("*/configuration_*.py"))]
    found: list[tuple[str, bytes]] = []
    for path in files:
        if not path.is_file():
            continue
        try:
            found.append((f"transformers/{path.relative_to(top).as_posix()}", policy.read_bytes(path)))
        except ToolFailure:
            continue
    return SourceTree("installed_transformers", tuple(found))


def _readers(field: str, trees: list[SourceTree]) -> list[str] | None:
    if not trees:
        return None
    locations, _ = find_consumers(trees, field.rsplit(".", 1)[-1], READERS_PER_FIELD)
    return [f"{loc.tree} {loc.path}:{loc.line}" for loc in locations]


def gather(args: PlanTrimInput, env: ToolEnv) -> tuple[CheckpointEvidence, Source]:
    evidence = checkpoint_evidence(args, env, args.model, args.model_revision)
    source = Source(evidence.location.path, evidence.raw, evidence.layout, evidence.report, evidence.files, env.policy)
    return evidence, source


def _examples(args: PlanTrimInput, env: ToolEnv, raw: dict[str, Any]) -> list[str]:
    try:
        models = env.policy.readable(Path(args.plugin_repo) / EXAMPLES_DIR)
    except ToolFailure:  # outside the roots: no examples to list
        return []
    return [f"{EXAMPLES_DIR}/{name}" for name in related_examples(models, raw, env.policy)]


def _budgets(plan: Plan) -> BudgetsOut:
    stages = [StageOut(stage=i, **vars(s)) for i, s in enumerate(plan.budget.stages)]
    return BudgetsOut(**{**vars(plan.budget), "stages": stages}, disk_bytes_dummy=plan.dummy_disk_bytes)


def plan_output(args: PlanTrimInput, env: ToolEnv, evidence: CheckpointEvidence, plan: Plan) -> dict[str, Any]:
    """The fields of PlanTrimOutput (trim_model's output extends them)."""
    trees = list(evidence.trees)
    extra = _transformers_configs(evidence.record, env.policy) if trees else None
    trees += [extra] if extra else []
    backbone = plan.backbone
    gaps = list(evidence.gaps)
    if not trees:
        gaps.append("No consumer code searched (no environment record): read_by is null for every changed field.")
    return {
        "model": model_label(evidence.location, env),
        "backbone_layers": backbone,
        "kept_layers": list(plan.selection.kept),
        "mtp_kept": [backbone + i for i in plan.selection.kept_mtp],
        "coverage": [
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
        "layer_map": plan.layer_map,
        "submodels": [SubmodelOut(**vars(s)) for s in plan.submodels],
        "uncovered": plan.uncovered,
        "config_changes": [ConfigChangeOut(**vars(c), read_by=_readers(c.field, trees)) for c in plan.changes],
        "budgets": _budgets(plan),
        "parallel": plan.parallel_notes,
        "smoke_cases": [f"{c.name} ({c.kind}) -> {c.covers}" for c in plan.cases.cases],
        "examples": _examples(args, env, evidence.raw),
        "notes": plan.notes + [f"asset skipped: {name} ({why})" for name, why in plan.assets.skipped[:10]],
        "findings": [Finding(severity=s, code=c, message=m) for s, c, m in evidence.findings],  # type: ignore[arg-type]
        "evidence_gaps": gaps,
    }


def plan_trim(args: PlanTrimInput, env: ToolEnv) -> PlanTrimOutput:
    """Plan a depth trim of a checkpoint without writing anything: the fewest backbone layers that keep
    every distinct path (dense/MoE, each attention kind, compression ratio, routing, KV sharing, per-layer
    array values, id-list membership, modules only some layers' tensors hold) — not the first N — with the
    coverage table (path -> retained layers -> why -> the request that triggers it), the original->new
    layer map (MTP renamed to follow the backbone), paths no longer covered, every config change (with
    where consumer code reads the field), TP/PP notes, and per-rank parameter/KV budgets and disk bytes.
    Explicit `layers` that drop a distinct path are refused with sizes until `allow_drop` names it.
    Widths, head/LoRA dimensions, expert counts and quantization stay as they are. trim_model writes it.
    """
    evidence, source = gather(args, env)
    plan = make_plan(source, trim_request(args))
    return PlanTrimOutput(**plan_output(args, env, evidence, plan))


SPEC = ToolSpec(
    name="plan_trim",
    effect=Effect.READS,
    run=plan_trim,
    input_model=PlanTrimInput,
    output_model=PlanTrimOutput,
    title="Plan a depth trim of a checkpoint",
    idempotent=True,
    cpu_heavy=True,
)
