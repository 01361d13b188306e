"""Tool `inspect_config`: the true layer layout of a checkpoint, raw and as the target vLLM constructs it."""

from __future__ import annotations

import re
import warnings
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from typing_extensions import Self

from ..core.checkpoint.construct import ConstructedView
from ..core.checkpoint.cross_check import CheckpointReport
from ..core.checkpoint.inspection import Inspection, InspectRequest, inspect_checkpoint
from ..core.checkpoint.layout import Layout
from ..core.foundation.errors import ErrorCode, ToolFailure
from ..core.foundation.policy import Effect, Mode
from ..core.foundation.results import SizeBudget, canonical, inputs_fingerprint, paginate
from ..core.sources.subjects import SubjectKind
from .arguments import Finding, SubjectArgs, finding_out, given_arguments, plugin_access
from .output import rows_budget, size_of
from .spec import NextCall, ToolEnv, ToolOutput, ToolSpec

LAYERS_DEFAULT, DIFFERENCES_DEFAULT, LIMIT_MAX = 128, 25, 1000
MAX_OVERRIDES_CHARS = 8000
FIELD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]{0,99}$"
CONSTRUCTION_ONLY = ("hf_overrides", "speculative", "num_speculative_tokens", "trust_remote_code", "python")
SPECULATIVE_PATTERN, SPECULATIVE_MAX, CONSUMERS_MAX = r"^[a-z0-9_\-]{1,40}$", 16, 8


# `construct` (the name for the switch) shadows pydantic's deprecated BaseModel.construct;
# the field is only ever read as an attribute of an instance, where the field value wins.
warnings.filterwarnings("ignore", message='Field name "construct" in "InspectConfigInput"', category=UserWarning)


class InspectConfigInput(SubjectArgs):
    subject: SubjectKind = SubjectKind.INSTALLED
    model: str = Field(description="Checkpoint dir or cached HF repo id.")
    model_revision: str | None = None
    hf_overrides: dict[str, Any] = Field(default_factory=dict, description="As --hf-overrides.")
    speculative: str | None = Field(default=None, description="Draft method, e.g. mtp.")
    num_speculative_tokens: int | None = None
    construct: bool = Field(  # type: ignore[assignment]  # shadows BaseModel.construct (see above)
        default=True, description="As vllm serve builds it."
    )
    trust_remote_code: bool = False
    python: str | None = Field(default=None, description="Edit mode.")
    consumers_of: list[str] = Field(default_factory=list, description="Fields to find readers of.")
    page: Literal["layers", "differences"] = Field(default="layers", description="What cursor/limit page.")
    cursor: str | None = None
    limit: int | None = Field(default=None, ge=1, le=LIMIT_MAX)

    @model_validator(mode="after")
    def _construction_fields_need_construct(self) -> Self:
        """Settings only the construction reads are a mistake without it, not a silent no-op."""
        if not self.construct:
            given = [name for name in CONSTRUCTION_ONLY if getattr(self, name)]
            if given or self.page == "differences":
                raise ValueError(f"{', '.join(given) or 'page=differences'} needs construct=true")
        if self.num_speculative_tokens is not None and not self.speculative:
            raise ValueError("num_speculative_tokens needs speculative")
        if not 1 <= (self.num_speculative_tokens or 1) <= SPECULATIVE_MAX or len(self.consumers_of) > CONSUMERS_MAX:
            raise ValueError(f"num_speculative_tokens is 1 to {SPECULATIVE_MAX}; consumers_of at most {CONSUMERS_MAX}")
        if self.speculative and not re.match(SPECULATIVE_PATTERN, self.speculative):
            raise ValueError(f"speculative must match {SPECULATIVE_PATTERN}")
        return self

    @field_validator("consumers_of")
    @classmethod
    def _field_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.match(FIELD_PATTERN, name):
                raise ValueError(f"{name!r} is not a config field name")
        return names

    @field_validator("hf_overrides")
    @classmethod
    def _overrides_size(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        if len(canonical(overrides)) > MAX_OVERRIDES_CHARS:
            raise ValueError(f"hf_overrides is longer than {MAX_OVERRIDES_CHARS} characters")
        return overrides


class Submodel(BaseModel):
    name: str = Field(description="Key of the sub-config; empty for the top level.")
    model_type: str | None = None
    layers: int | None = None
    depth_key: str | None = None
    mtp_layers: int | None = None
    primary: bool = Field(default=False, description="The decoder whose layers the layer table describes.")


class LayerRow(BaseModel):
    id: int = Field(description="Zero-based checkpoint layer id; MTP layer i is num_hidden_layers + i.")
    part: Literal["backbone", "mtp", "undeclared"]
    name: str | None = Field(default=None, description="Module prefix when not {backbone_prefix}.{id}.")
    kinds: list[str] = Field(default_factory=list, description="From the config: dense/moe, attn:<kind>, mla, ...")
    tensors: list[str] | None = Field(default=None, description="From tensor names: moe, dense, attn, linear, ...")


class ArrayOut(BaseModel):
    name: str
    length: int
    covers: str = Field(description="backbone, backbone+mtp, or mismatch.")
    distinct: int


class IdListOut(BaseModel):
    name: str
    ids: list[int]
    base: int | None = Field(description="0 or 1; null when no evidence decides it.")
    evidence: str
    meaning: str | None = None


class RuleOut(BaseModel):
    name: str
    value: Any = None
    active: bool
    layers: str
    meaning: str


class IgnoreOut(BaseModel):
    key: str
    total: int
    non_layer: list[str]
    patterns: int
    by_part: dict[str, int]
    layer_ids: str
    per_layer: list[dict[str, Any]] = Field(description="Runs of layers with the same number of entries.")
    by_module: dict[str, int]
    beyond_declared: list[int]


class QuantizationOut(BaseModel):
    method: str | None = None
    fmt: str | None = None
    block_size: list[int] | None = None
    activation_scheme: str | None = None
    scale_fmt: str | None = None
    scale_dtypes: dict[str, int] = Field(default_factory=dict, description="Dtypes of scale tensors.")
    keys: list[str] = Field(default_factory=list)
    ignore: IgnoreOut | None = None


class CheckpointOut(BaseModel):
    findings: list[Finding] = Field(default_factory=list, description="Config, index and header disagreements.")
    index_file: str | None = None
    shards: int = 0
    shards_read: int = 0
    shard_names: list[str] = Field(default_factory=list, description="As the index gives them (first 8).")
    tensors: int = 0
    backbone_prefix: str | None = None
    present_layer_ids: list[int] = Field(default_factory=list)
    mtp_layers_found: int = 0
    mtp_weights_present: bool | None = None
    dtypes_by_part: dict[str, dict[str, int]] = Field(default_factory=dict)
    ranks: list[int] = Field(default_factory=list, description="Rank numbers in shard names (pre-partitioned).")


class PluginOut(BaseModel):
    name: str
    group: str
    value: str
    state: str


class DifferenceOut(BaseModel):
    config: Literal["target", "draft", "transformers"]
    field: str
    change: Literal["added", "removed", "changed", "truncated", "extended", "transformed"]
    raw: str | None = None
    constructed: str | None = None


class ConstructedOut(BaseModel):
    status: Literal["complete", "partial", "failed"]
    config_class: str | None = None
    model_type: str | None = None
    architectures: list[str] | None = None
    model_class: str | None = Field(default=None, description="Where vLLM's registry resolves the architecture.")
    total_layers: int | None = None
    platform: str | None = None
    device_name: str | None = None
    plugins: list[PluginOut] = Field(default_factory=list)
    plugins_filter: Any = None
    transformers_class: str | None = None
    draft: dict[str, Any] | None = None
    differences: list[DifferenceOut] = Field(default_factory=list)
    differences_total: int = 0
    errors: dict[str, str] = Field(default_factory=dict)
    probe_id: str | None = None


class Location(BaseModel):
    tree: str
    path: str
    line: int
    text: str


class ConsumersOut(BaseModel):
    field: str
    total: int
    locations: list[Location]


class InspectConfigOutput(ToolOutput):
    findings: list[Finding] = Field(default_factory=list, description="Config and construction disagreements.")
    model: str = ""
    backbone_layers: int | None = None
    mtp_layers: int | None = Field(default=None, description="Declared MTP layers; null: no MTP key.")
    mtp_key: str | None = None
    mtp_naming: str | None = Field(default=None, description="How tensors name MTP layers (model.layers.{L+i}, ...).")
    submodels: list[Submodel] = Field(default_factory=list)
    layers: list[LayerRow] = Field(default_factory=list)
    layers_total: int = 0
    arrays: list[ArrayOut] = Field(default_factory=list)
    id_lists: list[IdListOut] = Field(default_factory=list)
    rules: list[RuleOut] = Field(default_factory=list)
    quantization: QuantizationOut | None = None
    checkpoint: CheckpointOut | None = None
    constructed: ConstructedOut | None = None
    consumers: list[ConsumersOut] = Field(default_factory=list)
    evidence_gaps: list[str] = Field(default_factory=list)
    next_cursor: str | None = Field(default=None, description="Next page of the list named by `page`.")


# -- arguments ---------------------------------------------------------------------------------


def _check(args: InspectConfigInput, env: ToolEnv) -> None:
    if args.python and env.policy.mode is not Mode.EDIT:
        raise ToolFailure(
            ErrorCode.REVIEW_MODE,
            "python is accepted only in edit mode; in review mode the environment record's interpreter is used "
            "(environment action=establish).",
        )


def _request(args: InspectConfigInput) -> InspectRequest:
    speculative = (
        {"method": args.speculative, "num_speculative_tokens": args.num_speculative_tokens or 1}
        if args.speculative
        else None
    )
    return InspectRequest(
        model=args.model,
        model_revision=args.model_revision,
        construct=args.construct,
        python=args.python,
        trust_remote_code=args.trust_remote_code,
        hf_overrides=args.hf_overrides,
        speculative=speculative,
        consumers_of=args.consumers_of,
    )


# -- output assembly ---------------------------------------------------------------------------


def _name(layer: int, report: CheckpointReport | None) -> str | None:
    """Only names that do not follow `{backbone_prefix}.{id}` are spelled out."""
    if report is None:
        return None
    name = report.names.get(layer)
    return None if name == f"{report.backbone_prefix}.{layer}" else name


def _rows(layout: Layout, report: CheckpointReport | None) -> list[LayerRow]:
    backbone, declared = layout.backbone_layers or 0, layout.mtp_layers or 0
    ids = set(range(backbone + declared)) | set(report.present_layer_ids if report else [])
    undeclared = set(report.undeclared_ids if report else [])
    rows = []
    for layer in sorted(ids):
        part: Literal["backbone", "mtp", "undeclared"] = (
            "undeclared" if layer in undeclared else "backbone" if layer < backbone else "mtp"
        )
        rows.append(
            LayerRow(
                id=layer,
                part=part,
                name=_name(layer, report),
                kinds=layout.kinds.get(layer, []),
                tensors=report.markers.get(layer, []) if report else None,
            )
        )
    return rows


def _quantization(layout: Layout, report: CheckpointReport | None) -> QuantizationOut | None:
    quant = layout.quantization
    if quant is None:
        return None
    i = quant.ignore
    runs = [{"layers": run.layers, "count": run.count} for run in i.per_layer] if i else []
    ignore = IgnoreOut(**{k: v for k, v in vars(i).items() if k != "entries"} | {"per_layer": runs}) if i else None
    return QuantizationOut(
        method=quant.method,
        fmt=quant.fmt,
        block_size=quant.block_size,
        activation_scheme=quant.activation_scheme,
        scale_fmt=quant.scale_fmt,
        scale_dtypes=report.scale_dtypes if report else {},
        keys=quant.keys,
        ignore=ignore,
    )


def _checkpoint(report: CheckpointReport) -> CheckpointOut:
    return CheckpointOut(
        findings=[finding_out(f) for f in report.findings],
        index_file=report.index_file,
        shards=report.shard_count,
        shards_read=report.shards_read,
        shard_names=report.shard_names[:8],
        tensors=report.tensor_count,
        backbone_prefix=report.backbone_prefix,
        present_layer_ids=report.present_layer_ids,
        mtp_layers_found=report.mtp_layers_found,
        mtp_weights_present=report.mtp_weights_present,
        dtypes_by_part=report.dtypes_by_part,
        ranks=report.ranks,
    )


def _constructed(built: ConstructedView, probe_id: str | None) -> ConstructedOut:
    return ConstructedOut(
        status=built.status,
        config_class=built.config_class,
        model_type=built.model_type,
        architectures=built.architectures,
        model_class=built.model_class,
        total_layers=built.total_layers,
        platform=built.platform,
        device_name=built.device_name,
        plugins=[PluginOut(**p) for p in built.plugins],
        plugins_filter=built.plugins_filter,
        transformers_class=built.transformers_class,
        draft=built.draft,
        differences_total=len(built.differences),
        errors=built.errors,
        probe_id=probe_id,
    )


LATER_PAGES: dict[str, Any] = dict.fromkeys(
    ("findings", "submodels", "arrays", "id_lists", "rules", "consumers", "evidence_gaps"), []
)
LATER_PAGES |= dict.fromkeys(("quantization", "checkpoint", "mtp_naming", "mtp_key"), None)
"""Blocks every page would repeat: sent on the first page only."""
CURSOR_PROBE = "c" * 64


def _pages(
    args: InspectConfigInput, output: InspectConfigOutput, rows: list[LayerRow], differences: list[DifferenceOut]
) -> InspectConfigOutput:
    """`page` names the list cursor and limit apply to, paged by size; the first page also shows the other
    list's first entries (what fits in half the room) and the blocks every page shares."""
    fingerprint = inputs_fingerprint("inspect_config", args.model_dump(mode="json"))
    other = "differences" if args.page == "layers" else "layers"
    lists: dict[str, list[Any]] = {"layers": rows, "differences": differences}
    defaults = {"layers": LAYERS_DEFAULT, "differences": DIFFERENCES_DEFAULT}
    if args.cursor:
        kept = ConstructedOut(status=output.constructed.status) if output.constructed else None
        output = output.model_copy(update=LATER_PAGES | {"constructed": kept})
    else:
        shown = _page(lists[other], None, None, defaults[other], fingerprint, _room(output, args, half=True))
        output = _fill(output, other, shown.items, len(lists[other]))
        if shown.next_cursor and lists[other]:
            output.evidence_gaps.append(
                f"{shown.total - len(shown.items)} more {_label(other)}: call again with page={other}."
            )
    page = _page(lists[args.page], args.cursor, args.limit, defaults[args.page], fingerprint, _room(output, args))
    output = _fill(output, args.page, page.items, page.total)
    output.next_cursor = page.next_cursor
    output.next_step = _next_step(args, output, other)
    return output


def _label(name: str) -> str:
    return "constructed differences" if name == "differences" else "layer rows"


def _page(items: list[Any], cursor: str | None, limit: int | None, default: int, fingerprint: str, room: int) -> Any:
    budget = SizeBudget(size_of=size_of, chars=room)
    return paginate(
        items,
        cursor=cursor,
        limit=limit,
        fingerprint=fingerprint,
        default_limit=default,
        max_limit=LIMIT_MAX,
        budget=budget,
    )


def _fill(output: InspectConfigOutput, name: str, items: list[Any], total: int) -> InspectConfigOutput:
    if name == "layers":
        return output.model_copy(update={"layers": items, "layers_total": total})
    if output.constructed is None:
        return output
    constructed = output.constructed.model_copy(update={"differences": items, "differences_total": total})
    return output.model_copy(update={"constructed": constructed})


def _room(output: InspectConfigOutput, args: InspectConfigInput, half: bool = False) -> int:
    """What a page's rows may take once the rest is sent, with the longest cursor and next_step it can get."""
    probe = output.model_copy(update={"next_cursor": CURSOR_PROBE, "next_step": _call(args, "", cursor=CURSOR_PROBE)})
    chars = rows_budget(probe).chars
    return max(chars // 2 if half else chars, 1)


def _call(args: InspectConfigInput, why: str, **changed: Any) -> NextCall:
    arguments = {k: v for k, v in given_arguments(args, **changed).items() if v is not None}
    return NextCall(tool="inspect_config", arguments=arguments, why=why)


def _next_step(args: InspectConfigInput, output: InspectConfigOutput, other: str) -> NextCall:
    """The next page, else the other list when its first page was cut, else the trim plan."""
    if output.next_cursor:
        return _call(args, f"more {_label(args.page)}", cursor=output.next_cursor)
    shown = (
        len(output.layers) if other == "layers" else len(output.constructed.differences) if output.constructed else 0
    )
    total = (
        output.layers_total if other == "layers" else output.constructed.differences_total if output.constructed else 0
    )
    if not args.cursor and shown < total:
        return _call(args, f"the rest of the {_label(other)}", page=other, cursor=None, limit=None)
    keep = {"plugin_repo", "subject", "revision", "directory", "model", "model_revision"}
    arguments = {k: v for k, v in args.model_dump(mode="json", exclude_unset=True).items() if k in keep}
    return NextCall(
        tool="plan_trim",
        arguments={"model": args.model, **arguments},
        why="plan a depth trim keeping every distinct path",
    )


def _output(inspection: Inspection) -> InspectConfigOutput:
    """Everything but the paged rows."""
    layout, report, built = inspection.layout, inspection.report, inspection.built
    return InspectConfigOutput(
        findings=[finding_out(f) for f in inspection.findings],
        model=inspection.location.label,
        backbone_layers=layout.backbone_layers,
        mtp_layers=layout.mtp_layers,
        mtp_key=layout.mtp_key,
        mtp_naming=report.mtp_naming if report else None,
        submodels=[Submodel(**vars(s), primary=s.name == layout.primary) for s in layout.submodels],
        arrays=[ArrayOut(name=a.name, length=a.length, covers=a.covers, distinct=a.distinct) for a in layout.arrays],
        id_lists=[
            IdListOut(name=i.name, ids=i.ids, base=i.base, evidence=i.evidence, meaning=i.meaning)
            for i in layout.id_lists
        ],
        rules=[RuleOut(**vars(r)) for r in layout.rules],
        quantization=_quantization(layout, report),
        checkpoint=_checkpoint(report) if report else None,
        constructed=_constructed(built, inspection.probe_id) if built else None,
        consumers=[
            ConsumersOut(field=c.field, total=c.total, locations=[Location(**vars(loc)) for loc in c.locations])
            for c in inspection.consumers
        ],
        evidence_gaps=list(inspection.gaps),
    )


def inspect_config(args: InspectConfigInput, env: ToolEnv) -> InspectConfigOutput:
    """A checkpoint's true layer layout (per-layer kinds, arrays, id lists, rules, quantization; headers
    cross-checked); construct adds the config vLLM builds and its differences. next_step: plan_trim."""
    _check(args, env)
    plugin = plugin_access(args, env)
    inspection = inspect_checkpoint(_request(args), plugin, env.policy, env.store, env.interpreters)
    differences = [DifferenceOut(**vars(d)) for d in inspection.built.differences] if inspection.built else []
    return _pages(args, _output(inspection), _rows(inspection.layout, inspection.report), differences)


SPEC = ToolSpec(
    name="inspect_config",
    effect=Effect.READS,
    run=inspect_config,
    input_model=InspectConfigInput,
    output_model=InspectConfigOutput,
    title="Inspect a checkpoint's layer layout",
    idempotent=True,
    cpu_heavy=True,
)
