"""Tool `inspect_config`: the true layer layout of a checkpoint, raw and as the target vLLM constructs it."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from ..core.checkpoint.construct import ConstructedView
from ..core.checkpoint.cross_check import CheckpointReport
from ..core.checkpoint.inspection import Inspection, InspectRequest, inspect_checkpoint
from ..core.checkpoint.layout import Layout
from ..core.foundation.errors import ErrorCode, ToolFailure, bad_input
from ..core.foundation.policy import Effect, Mode
from ..core.foundation.results import canonical, inputs_fingerprint, paginate
from ..core.sources.subjects import SubjectKind
from .arguments import Finding, SubjectArgs, finding_out, plugin_access
from .spec import ToolEnv, ToolOutput, ToolSpec

LAYERS_DEFAULT, LAYERS_MAX = 128, 2048
DIFFERENCES_DEFAULT, DIFFERENCES_MAX = 25, 1000
MAX_OVERRIDES_CHARS = 8000
FIELD_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]{0,99}$"


# `construct` (the name for the switch) shadows pydantic's deprecated BaseModel.construct;
# the field is only ever read as an attribute of an instance, where the field value wins.
warnings.filterwarnings("ignore", message='Field name "construct" in "InspectConfigInput"', category=UserWarning)


class InspectConfigInput(SubjectArgs):
    subject: SubjectKind = Field(
        default=SubjectKind.INSTALLED,
        description="Plugin code the construction imports and the consumer search reads: installed (what the recorded "
        "interpreter imports; default), or worktree / index / revision / directory, put first on the path.",
    )
    model: str = Field(
        description="Checkpoint directory (relative to the first --root), or a Hugging Face repo id read from the "
        "local cache."
    )
    model_revision: str | None = Field(
        default=None, description="Branch, tag or commit of a repo id (local cache only)."
    )
    hf_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="As vllm serve --hf-overrides: flat keys update the config, dict values merge.",
    )
    speculative: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9_\-]{1,40}$",
        description="Speculative method to build the draft config for (e.g. mtp).",
    )
    num_speculative_tokens: int = Field(default=1, ge=1, le=16)
    construct: bool = Field(  # type: ignore[assignment]  # shadows BaseModel.construct (see above)
        default=True, description="Build the config in the target interpreter (vLLM and transformers)."
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow the checkpoint's auto_map code to run during construction."
    )
    python: str | None = Field(
        default=None, description="Interpreter for the construction instead of the record's (edit mode only)."
    )
    consumers_of: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="Config fields whose reading code to list (upstream, installed vLLM, plugin).",
    )
    page: Literal["layers", "differences"] = Field(
        default="layers", description="Which list cursor and limit page; the other shows its first entries."
    )
    cursor: str | None = None
    limit: int | None = Field(
        default=None,
        description=f"Page size (layers: default {LAYERS_DEFAULT}, max {LAYERS_MAX}; "
        f"differences: default {DIFFERENCES_DEFAULT}, max {DIFFERENCES_MAX}).",
    )

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
    name: str | None = Field(
        default=None, description="Module prefix in the checkpoint when it is not {checkpoint.backbone_prefix}.{id}."
    )
    kinds: list[str] = Field(
        default_factory=list,
        description="From the config (see rules): dense/moe, attn:<kind>, mla, indexer, compress:<r>, route:<kind>, "
        "kv:shared; dense without an expert-count key, attn:full (or sliding with a global sliding_window) without a "
        "per-layer attention key; "
        "MTP rows only from arrays that cover them.",
    )
    tensors: list[str] | None = Field(
        default=None, description="From tensor names: moe, dense, attn, linear, indexer, compressor, hash, mtp_head."
    )


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
    scale_dtypes: dict[str, int] = Field(default_factory=dict, description="Dtypes of scale tensors in the checkpoint.")
    keys: list[str] = Field(default_factory=list)
    ignore: IgnoreOut | None = None


class CheckpointOut(BaseModel):
    findings: list[Finding] = Field(
        default_factory=list, description="Disagreements between config, index and shard headers."
    )
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
    ranks: list[int] = Field(
        default_factory=list, description="Rank numbers in shard names: a pre-partitioned checkpoint."
    )


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
    findings: list[Finding] = Field(
        default_factory=list, description="Config and construction disagreements; checkpoint ones are under checkpoint."
    )
    model: str = ""
    backbone_layers: int | None = None
    mtp_layers: int | None = Field(
        default=None, description="Declared MTP/draft layers; null when the config has no MTP key."
    )
    mtp_key: str | None = None
    mtp_naming: str | None = Field(
        default=None,
        description="How the checkpoint names MTP layers (model.layers.{L+i}, mtp.{i}, ...); null without tensors.",
    )
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
    if args.page == "differences" and not args.construct:
        raise bad_input("page=differences needs construct=true.")


def _request(args: InspectConfigInput) -> InspectRequest:
    speculative = (
        {"method": args.speculative, "num_speculative_tokens": args.num_speculative_tokens}
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
    ignore = None
    if quant.ignore is not None:
        i = quant.ignore
        ignore = IgnoreOut(
            key=i.key,
            total=i.total,
            non_layer=i.non_layer,
            patterns=i.patterns,
            by_part=i.by_part,
            layer_ids=i.layer_ids,
            per_layer=[{"layers": run.layers, "count": run.count} for run in i.per_layer],
            by_module=i.by_module,
            beyond_declared=i.beyond_declared,
        )
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


def _constructed(
    built: ConstructedView, probe_id: str | None, differences: list[DifferenceOut], total: int
) -> ConstructedOut:
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
        differences=differences,
        differences_total=total,
        errors=built.errors,
        probe_id=probe_id,
    )


@dataclass
class _Pages:
    layers: list[LayerRow]
    layers_total: int
    constructed: ConstructedOut | None
    next_cursor: str | None
    gaps: list[str]


def _pages(
    args: InspectConfigInput, rows: list[LayerRow], built: ConstructedView | None, probe_id: str | None
) -> _Pages:
    """`page` names the list cursor and limit apply to; the other list shows its first page."""
    fingerprint = inputs_fingerprint("inspect_config", args.model_dump(mode="json"))

    def page(items: list[Any], name: str, default: int, maximum: int) -> Any:
        mine = args.page == name
        return paginate(
            items,
            cursor=args.cursor if mine else None,
            limit=args.limit if mine else None,
            fingerprint=fingerprint,
            default_limit=default,
            max_limit=maximum,
        )

    layers = page(rows, "layers", LAYERS_DEFAULT, LAYERS_MAX)
    result = _Pages(layers.items, layers.total, None, layers.next_cursor if args.page == "layers" else None, [])
    if built is None:
        return result
    differences = page(
        [DifferenceOut(**vars(d)) for d in built.differences], "differences", DIFFERENCES_DEFAULT, DIFFERENCES_MAX
    )
    result.constructed = _constructed(built, probe_id, differences.items, differences.total)
    if args.page == "differences":
        result.next_cursor = differences.next_cursor
    elif differences.next_cursor:
        result.gaps.append(
            f"{differences.total - len(differences.items)} more constructed differences: call again with "
            "page=differences."
        )
    return result


def _output(inspection: Inspection, pages: _Pages) -> InspectConfigOutput:
    layout, report = inspection.layout, inspection.report
    return InspectConfigOutput(
        findings=[finding_out(f) for f in inspection.findings],
        model=inspection.location.label,
        backbone_layers=layout.backbone_layers,
        mtp_layers=layout.mtp_layers,
        mtp_key=layout.mtp_key,
        mtp_naming=report.mtp_naming if report else None,
        submodels=[Submodel(**vars(s), primary=s.name == layout.primary) for s in layout.submodels],
        layers=pages.layers,
        layers_total=pages.layers_total,
        arrays=[ArrayOut(name=a.name, length=a.length, covers=a.covers, distinct=a.distinct) for a in layout.arrays],
        id_lists=[
            IdListOut(name=i.name, ids=i.ids, base=i.base, evidence=i.evidence, meaning=i.meaning)
            for i in layout.id_lists
        ],
        rules=[RuleOut(**vars(r)) for r in layout.rules],
        quantization=_quantization(layout, report),
        checkpoint=_checkpoint(report) if report else None,
        constructed=pages.constructed,
        consumers=[
            ConsumersOut(field=c.field, total=c.total, locations=[Location(**vars(loc)) for loc in c.locations])
            for c in inspection.consumers
        ],
        evidence_gaps=[*inspection.gaps, *pages.gaps],
        next_cursor=pages.next_cursor,
    )


def inspect_config(args: InspectConfigInput, env: ToolEnv) -> InspectConfigOutput:
    """Inspect a checkpoint's true layer layout: backbone and MTP/draft counts, a per-layer table
    (dense/MoE, attention kind, routing, sharing), layer-indexed arrays and layer-id lists (with
    their 0/1 base decided from tensor names or consumer code), periodic rules expanded per layer,
    and quantization with ignore lists summarised. With safetensors present it cross-checks the
    index and shard headers (never tensor data). With construct (default) it builds the config in the
    recorded interpreter the way `vllm serve` does — plugins, hf_overrides, speculative rewrite — and
    lists field-by-field differences. Unknowns are listed in evidence_gaps, never filled with defaults.
    """
    _check(args, env)
    plugin = plugin_access(args, env)
    inspection = inspect_checkpoint(_request(args), plugin, env.policy, env.store, env.interpreters)
    pages = _pages(args, _rows(inspection.layout, inspection.report), inspection.built, inspection.probe_id)
    return _output(inspection, pages)


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
