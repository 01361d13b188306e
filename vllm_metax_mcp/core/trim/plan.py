"""A depth-trim plan: the kept layers, what they cover and how to reach it, the rewritten config, budgets.

Shared by `plan_trim` (reads) and `trim_model` (writes). The layout comes from checkpoint/ (with the
checkpoint's tensor evidence when present); selection from selection; the coverage table from coverage;
the rewrite from config_rewrite; memory from budget; TP/PP notes from parallel_notes. Nothing here
writes files.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..checkpoint.cross_check import CheckpointReport
from ..checkpoint.evidence import CheckpointEvidence
from ..checkpoint.layer_ids import compact_ids
from ..checkpoint.layout import Layout, analyse
from ..checkpoint.safetensors_headers import CheckpointFiles
from ..foundation.errors import ToolFailure, bad_input
from ..foundation.policy import Policy
from .assets import (
    AssetChoice,
    CaseNeeds,
    build_cases,
    choose_assets,
    default_context,
    has_chat_template,
    long_words,
)
from .budget import (
    Budget,
    BudgetRequest,
    Costs,
    Parallel,
    budget,
    costs_from_config,
    costs_from_tensors,
    expert_choices,
    gib,
    recommendations,
)
from .cases import SmokeCases
from .config_rewrite import Change, Selection, Setting, dump_config, rewrite_config, rewrite_part
from .coverage import CoverageEntry, coverage_rows, mtp_row
from .parallel_notes import stage_notes, tp_notes
from .selection import (
    Paths,
    candidate_selections,
    covered_by,
    layer_paths,
    pad_for_stages,
    resolve_names,
    thresholds,
)

VISION_WORDS = ("vision", "visual", "image")


@dataclass(frozen=True)
class TrimRequest:
    targets: list[str]
    layers: list[int] | None
    keep_mtp: int | None
    allow_drop: list[str]
    parallel: Parallel
    max_model_len: int | None
    device_gb: float | None
    allow_narrowing: bool


@dataclass
class Source:
    """The evidence a plan is built from."""

    directory: Path
    raw: dict[str, Any]
    layout: Layout
    report: CheckpointReport | None
    files: CheckpointFiles | None
    policy: Policy
    """Every file of the source the plan reads or sizes passes it (a link out of the roots refuses)."""

    @classmethod
    def of(cls, evidence: CheckpointEvidence, policy: Policy) -> Source:
        return cls(evidence.location.path, evidence.raw, evidence.layout, evidence.report, evidence.files, policy)


@dataclass(frozen=True)
class SubmodelPlan:
    name: str
    depth_key: str
    layers: int
    kept: list[int]
    note: str


@dataclass
class Plan:
    selection: Selection
    backbone: int
    layer_map: dict[int, int]
    coverage: list[CoverageEntry]
    uncovered: list[str]
    config: dict[str, Any]
    changes: list[Change]
    budget: Budget
    parallel_notes: list[str]
    submodels: list[SubmodelPlan]
    cases: SmokeCases
    assets: AssetChoice
    dummy_disk_bytes: int
    image: bool
    notes: list[str] = field(default_factory=list)


def keep_submodel_whole(plan: Plan, raw: dict[str, Any], name: str, why: str) -> None:
    """Undo the depth trim of one submodel (its config, changes, plan and coverage row)."""
    plan.config[name] = copy.deepcopy(raw[name])
    plan.changes[:] = [c for c in plan.changes if not c.field.startswith(f"{name}.")]
    note = f"kept whole: {why}"
    plan.submodels = [
        replace(s, kept=list(range(s.layers)), note=note) if s.name == name else s for s in plan.submodels
    ]
    plan.coverage = [
        replace(c, kept=list(c.available), reason=note) if c.optional and c.target == name else c for c in plan.coverage
    ]


# -- the work in progress -------------------------------------------------------------------------


@dataclass
class _Work:
    """What the steps of one plan share."""

    source: Source
    request: TrimRequest
    part: dict[str, Any]
    depth_key: str
    paths: Paths
    required: set[str]
    allowed: set[str]
    costs: Costs
    kept_mtp: tuple[int, ...]
    selection: Selection = field(default_factory=lambda: Selection(()))
    config: dict[str, Any] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)

    @property
    def layout(self) -> Layout:
        return self.source.layout

    @property
    def kept(self) -> list[int]:
        return list(self.selection.kept)

    @property
    def prefix(self) -> str:
        return f"{self.layout.primary}." if self.layout.primary else ""

    def rewrite(self, settings: list[Setting] | None = None) -> None:
        """The trimmed config and its changes for the current selection (raises when it cannot be proven)."""
        self.config, self.changes = rewrite_config(
            self.source.raw, self.layout, self.depth_key, self.selection, settings or []
        )


def _start(source: Source, request: TrimRequest) -> _Work:
    layout = source.layout
    part = source.raw[layout.primary] if layout.primary else source.raw
    depth_key = next((s.depth_key for s in layout.submodels if s.name == layout.primary), None)
    if not layout.backbone_layers or depth_key is None:
        raise bad_input(
            "config.json declares no layer count for its decoder (num_hidden_layers or alike): there is no depth to "
            "trim."
        )
    paths = layer_paths(layout, source.report, source.files)
    wanted = resolve_names(paths, request.targets, "targets") if request.targets else {t.name for t in paths.targets}
    allowed = resolve_names(paths, request.allow_drop, "allow_drop")
    return _Work(
        source,
        request,
        part,
        depth_key,
        paths,
        wanted - allowed,
        allowed,
        _costs(source, part),
        _kept_mtp(layout, request),
    )


def _costs(source: Source, part: dict[str, Any]) -> Costs:
    """Exact per-layer bytes from shard headers when every tensor has them, else the config estimate."""
    layout = source.layout
    if source.files is not None and source.report is not None:
        exact = costs_from_tensors(source.files, source.report, layout.backbone_layers or 0)
        if exact is not None:
            return exact
    return costs_from_config(source.raw, part, layout, list(range(layout.mtp_layers or 0)))


def _kept_mtp(layout: Layout, request: TrimRequest) -> tuple[int, ...]:
    declared = list(range(layout.mtp_layers or 0))
    if request.keep_mtp is None:
        return tuple(declared)
    if request.keep_mtp > len(declared):
        raise bad_input(
            f"keep_mtp={request.keep_mtp} but the config declares {len(declared)} MTP layer(s)"
            f"{' (' + layout.mtp_key + ')' if layout.mtp_key else ''}; pass at most {len(declared)}."
        )
    return tuple(declared[: request.keep_mtp])


# -- choosing the layers ---------------------------------------------------------------------------


def _refuse_drops(work: _Work, missing: set[str], layers: list[int]) -> ToolFailure:
    """The refusal for explicit layers that lose distinct paths: each path, where it lives, what keeping it costs."""
    parts = []
    for name in sorted(missing):
        target = work.paths.find(name)
        assert target is not None
        cheapest = min(target.layers, key=lambda i: work.costs.layers[i].total if i in work.costs.layers else 0.0)
        cost = work.costs.layers.get(cheapest)
        size = f"{gib(cost.total)} ({gib(cost.per_rank(work.request.parallel))} per rank)" if cost else "size unknown"
        parts.append(f"{name} (only layers {compact_ids(target.layers)}; keeping layer {cheapest} adds {size})")
    return bad_input(
        f"layers {compact_ids(layers)} drop {len(missing)} distinct path(s) no kept layer has: {'; '.join(parts)}. "
        f"Add such a layer to layers, or pass allow_drop={sorted(missing)} to accept the lost coverage.",
        uncovered=sorted(missing),
    )


def _candidates(work: _Work) -> list[list[int]]:
    """The caller's layers (checked), or covers from fewest layers up, one layer per pipeline stage at least."""
    backbone, stages, layers = work.paths.backbone, work.request.parallel.pp, work.request.layers
    if layers is None:
        return [pad_for_stages(c, backbone, stages) for c in candidate_selections(work.paths, work.required)]
    bad = sorted(i for i in layers if not 0 <= i < backbone)
    if bad or not layers:
        raise bad_input(f"layers must name backbone layers 0..{backbone - 1}; got {bad or 'none'}.")
    chosen = sorted(set(layers))
    if len(chosen) < stages:
        raise bad_input(f"layers keeps {len(chosen)} layer(s) but pp={stages} needs one per stage.")
    missing = work.required - covered_by(work.paths, chosen)
    if missing:
        raise _refuse_drops(work, missing, chosen)
    return [chosen]


def _select(work: _Work) -> None:
    """The first candidate whose config rewrite proves out; the first refusal when none does."""
    failure: ToolFailure | None = None
    for kept in _candidates(work):
        work.selection = Selection(tuple(kept), work.kept_mtp)
        try:
            work.rewrite()
            return
        except ToolFailure as exc:
            failure = failure or exc
    assert failure is not None
    raise failure


def _submodels(source: Source, config: dict[str, Any], changes: list[Change]) -> list[SubmodelPlan]:
    """Each non-decoder submodel trimmed by its own depth to the layers covering its own paths; kept whole when
    it cannot be."""
    plans = []
    for sub in source.layout.submodels:
        data = source.raw.get(sub.name) if sub.name else None
        if (
            sub.name == source.layout.primary
            or not isinstance(data, dict)
            or not sub.layers
            or sub.layers < 2
            or not sub.depth_key
        ):
            continue
        try:
            layout = analyse(data)
            paths = layer_paths(layout)
            kept = next(candidate_selections(paths, {t.name for t in paths.targets}))
            trimmed = copy.deepcopy(data)
            sub_changes = rewrite_part(trimmed, layout, sub.depth_key, Selection(tuple(kept)), f"{sub.name}.")
        except ToolFailure as failure:
            plans.append(
                SubmodelPlan(
                    sub.name, sub.depth_key, sub.layers, list(range(sub.layers)), f"kept whole: {failure.message}"
                )
            )
            continue
        config[sub.name] = trimmed
        changes += sub_changes
        plans.append(
            SubmodelPlan(sub.name, sub.depth_key, sub.layers, kept, f"trimmed by its own depth ({sub.depth_key})")
        )
    return plans


def _budget(work: _Work, context: int, experts: tuple[str, int, list[int]] | None) -> Budget:
    """The budget; when parameters alone do not fit, the largest valid expert count that does (applied only
    with allow_narrowing, else recommended), then the recommendations in order."""
    request = work.request

    def at(scale: float) -> Budget:
        ask = BudgetRequest(
            work.kept,
            [work.paths.backbone + i for i in work.kept_mtp],
            work.layout.kinds,
            request.parallel,
            context,
            request.device_gb,
            scale,
        )
        return budget(work.costs, work.part, ask)

    planned = at(1.0)
    narrowing = None
    if (
        planned.fits is False
        and planned.usable_bytes is not None
        and planned.params_bytes_per_rank >= planned.usable_bytes
        and experts
    ):
        key, count, valid = experts
        smaller = next((n for n in valid if at(n / count).fits), None)
        if smaller is None:
            narrowing = f"no smaller {key} fits (the kept layers' other weights alone exceed the device)."
        elif request.allow_narrowing:
            work.rewrite(
                [
                    Setting(
                        f"{work.prefix}{key}",
                        smaller,
                        f"narrowed (allow_narrowing) from {count} routed experts to fit the device",
                    )
                ]
            )
            planned = at(smaller / count)
        else:
            narrowing = (
                f"with allow_narrowing=true: {key} {count} -> {smaller} fits "
                f"(routing over {count} experts is then not exercised)."
            )
    planned.recommendations = recommendations(planned, narrowing)
    if planned.fits is False:
        planned.recommendations += _drop_savings(work)
    return planned


def _drop_savings(work: _Work) -> list[str]:
    """For each distinct path, what dropping it would save (a trade-off the caller must allow)."""
    lines = []
    for target in work.paths.distinct():
        if target.name not in work.required:
            continue
        smaller = next(candidate_selections(work.paths, work.required - {target.name}), work.kept)
        removed = set(work.kept) - set(smaller)
        if len(smaller) < len(work.kept) and removed:
            saved = sum(work.costs.layers[i].per_rank(work.request.parallel) for i in removed if i in work.costs.layers)
            lines.append(
                f"dropping {target.name} (layers {compact_ids(target.layers)}) saves {gib(saved)} per rank; "
                f"needs allow_drop=['{target.name}']."
            )
    return lines


# -- the plan ------------------------------------------------------------------------------------


def make_plan(source: Source, request: TrimRequest) -> Plan:
    """Select, rewrite, budget and describe a depth trim (see the module docstring)."""
    work = _start(source, request)
    _select(work)
    assets = choose_assets(source.directory, source.policy)
    image = next(
        (
            s.name
            for s in source.layout.submodels
            if s.name != source.layout.primary and s.layers and any(w in s.name.lower() for w in VISION_WORDS)
        ),
        None,
    )
    limits = thresholds(work.paths, work.part, work.kept)
    needs = CaseNeeds(
        text_covers=[t.name for t in work.paths.targets if set(t.layers) & set(work.kept) and t.name not in limits],
        long_tokens=max((v[0] for v in limits.values()), default=None),
        long_covers=sorted(limits),
        mtp=bool(work.kept_mtp),
        chat=has_chat_template(source.directory, assets.copy, source.policy),
        image=image,
    )
    positions = work.part.get("max_position_embeddings")
    context = request.max_model_len or default_context(needs, positions if isinstance(positions, int) else None)
    words = long_words(needs, context)
    long_ok = bool(words and needs.long_tokens and words > needs.long_tokens)
    experts = expert_choices(work.part, request.parallel)
    planned = _budget(work, context, experts)
    submodels = _submodels(source, work.config, work.changes)
    config_bytes = len(dump_config(work.config))
    return Plan(
        selection=work.selection,
        backbone=work.paths.backbone,
        layer_map=work.selection.layer_map(work.paths.backbone),
        coverage=coverage_rows(work.paths, work.kept, limits, long_ok)
        + _optional_rows(source, work.kept_mtp, submodels, image),
        uncovered=_uncovered(work, limits, long_ok),
        config=work.config,
        changes=work.changes,
        budget=planned,
        parallel_notes=tp_notes(work.part, source.raw, request.parallel, experts),
        submodels=submodels,
        cases=build_cases(needs, context),
        assets=assets,
        dummy_disk_bytes=config_bytes
        + sum(source.policy.readable(source.directory / n).stat().st_size for n in assets.copy),
        image=image is not None,
        notes=stage_notes(work.kept, request.parallel, source.layout),
    )


def _uncovered(work: _Work, limits: dict[str, tuple[int, str]], long_ok: bool) -> list[str]:
    """Paths no longer covered: dropped targets, dropped or undeclared MTP layers, unreachable lengths, narrowing."""
    have = covered_by(work.paths, work.kept)
    lost = [
        f"{t.name} (original layers {compact_ids(t.layers)}): dropped "
        f"({'allow_drop' if t.name in work.allowed else 'not among targets'})."
        for t in work.paths.distinct()
        if t.name not in have
    ]
    layout, report = work.layout, work.source.report
    dropped_mtp = [work.paths.backbone + i for i in range(layout.mtp_layers or 0) if i not in work.kept_mtp]
    if dropped_mtp:
        lost.append(
            f"MTP layer(s) {compact_ids(dropped_mtp)}: dropped (keep_mtp={work.request.keep_mtp}); "
            "speculative decoding is not exercised."
        )
    if not layout.mtp_layers and report is not None and report.mtp_layers_found:
        lost.append(
            f"MTP tensors ({report.mtp_naming}) exist but config.json declares no MTP count: the consumer code "
            "decides how many are built; the trim leaves that unchanged and its smoke cases do not reach them."
        )
    if not long_ok:
        lost += [
            f"{name}: needs a prompt past {why}, more than max_model_len allows; only the short path runs."
            for name, (_, why) in limits.items()
        ]
    lost += [
        f"{c.field}: original {c.old}, narrowed to {c.new}; {c.reason}."
        for c in work.changes
        if c.reason.startswith("narrowed")
    ]
    return lost


def _optional_rows(
    source: Source, kept_mtp: tuple[int, ...], submodels: list[SubmodelPlan], image: str | None
) -> list[CoverageEntry]:
    mtp = mtp_row(source.layout, source.report, kept_mtp)
    rows = [mtp] if mtp else []
    for sub in submodels:
        request = "image case (an image input)" if sub.name == image else "no request in the smoke cases reaches it"
        rows.append(CoverageEntry(sub.name, [], sub.kept, list(range(sub.layers)), sub.note, request, optional=True))
    return rows
