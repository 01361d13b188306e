"""Tool `trace_dependency`: the visited dependency inventory of a model, or the consumers of a symbol."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.audit.ledger import ledger_id, load_ledger
from ..core.code.overrides import OverrideKind, PatchHow
from ..core.foundation.errors import bad_input
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import SizeBudget, inputs_fingerprint, paginate
from ..core.sources.environment import load_record
from ..core.sources.subjects import RevisionSubject
from ..core.trace.build_ops import extension_text, precompiled_text
from ..core.trace.checks import ProbeTarget, probe_target
from ..core.trace.defects import DefectKind
from ..core.trace.inherited import InheritedKind
from ..core.trace.kernels import SchemaSource
from ..core.trace.loading import WeightLoadingKind
from ..core.trace.run import FINDING_SECTIONS, NOTE_SECTIONS, Section, Trace, TraceRequest, Trees, changes, run_trace
from ..core.trace.stability import grouped, summarise
from ..core.trace.walk import BoundaryKind, NodeKind, RowSide, Stability
from .arguments import (
    UpstreamArgs,
    open_plugin_repo,
    open_plugin_subject,
    open_upstream,
)
from .output import rows_budget, size_of
from .spec import NextCall, ToolEnv, ToolOutput, ToolSpec

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
View = Literal["changes", "full"]
SUMMARY_LISTS: tuple[Section, ...] = ("boundaries", "defects", "unknowns", "parse_errors", "inactive")
"""What the summary shows of each, in this order, as much as fits (boundaries: one entry per kind and side)."""
CURSOR = "c" * 64
"""Stands for a next_cursor while a page's fixed part is measured."""


class TraceInput(UpstreamArgs):
    arch: str | None = Field(default=None, description="config.json architecture.")
    symbol: str | None = Field(default=None, description="module[:Name] (consumers).")
    direction: Literal["dependencies", "consumers"] = "dependencies"
    base: str | None = Field(default=None, description="Base revision (deltas).")
    depth: int = Field(default=4, ge=1, le=50, description="Import hops.")
    platform_answers: dict[str, bool] = Field(default_factory=dict, max_length=256, description="is_* answers.")
    section: Section = Field(default="summary", description="summary, or the list to page.")
    view: View = Field(default="changes", description="inventory/boundaries: changed or all.")
    follow_owned: bool = Field(default=False, description="Enter other workflows' modules.")
    probe_ops: bool = Field(default=True, description="Probe torch.ops.")
    python: str | None = Field(default=None, description="Probe interpreter.")
    cursor: str | None = None
    limit: int | None = Field(default=None, ge=1, le=MAX_LIMIT, description="Rows a page at most.")


class Entry(BaseModel):
    arch: str | None = None
    plugin: str | None = Field(default=None, description="module:Class the plugin registers.")
    plugin_registration: str | None = Field(default=None, description="file:line of the register_model call.")
    upstream: str | None = None
    upstream_registration: str | None = None


class InventoryRow(BaseModel):
    name: str
    file: str | None
    side: RowSide
    reached_from: str | None
    guard: str | None = None
    branch: str = Field(description="taken, conditional, lazy, or not_taken (another platform's; not followed).")
    boundary: str | None = None
    depth: int
    upstream_counterpart: str | None = None
    upstream_delta: list[str] | None = None
    metax_difference: str | None = None
    annotation: str | None = Field(default=None, description="The action the audit ledger records for the node.")
    importers: list[str] = Field(
        default_factory=list, description="Every importer on the path; a.b.{c,d}: a.b.c, a.b.d."
    )
    stability: Stability | None = Field(
        default=None, description="Upstream/missing nodes: whether the used definitions changed base->target."
    )
    stability_evidence: list[str] = Field(
        default_factory=list, description="Why stable (unchanged:name base->target line) or unknown."
    )
    kind: NodeKind = Field(default="import", description="How it is reached (package_init: its __init__ runs).")


class Boundary(BaseModel):
    package: str
    side: str
    reason: str
    kind: BoundaryKind = Field(
        default="component",
        description="component (stdlib/third-party/compiled), pending_upgrade, owned, stable_interface, precompiled.",
    )
    file: str | None = None
    evidence: list[Evidence] = Field(default_factory=list)
    count: int = Field(default=1, description="Boundaries the entry stands for (a summary in view=changes).")


class DefectRow(BaseModel):
    kind: DefectKind
    file: str
    line: int
    detail: str
    symbol: str | None = None
    release: str | None = Field(default=None, description="breaks_at_target: the first release where it fails.")
    evidence: list[Evidence]


class OpOut(BaseModel):
    op: str = Field(description="namespace.name as in torch.ops.<namespace>.<name>.")
    used_in: list[str] = Field(description="Up to three file:line uses on the path, plugin modules first.")
    registered_in: list[str] = Field(description="file:line (mechanism) of every source registration.")
    installed: bool | None = Field(description="Whether the installed binaries provide it; null: not probed/unknown.")
    schemas: list[str] = Field(description="Installed schemas, one per overload (unprobed: the sources').")
    schema_from: SchemaSource | None = None
    implemented_in: list[str] = Field(default_factory=list, description="file:line (mechanism kind key) of impls.")
    built_by: list[str] = Field(default_factory=list, description="Plugin extension modules building it (switch).")
    precompiled: list[str] = Field(default_factory=list, description="Packages giving these kernels when built off.")


class TargetOut(BaseModel, from_attributes=True):
    symbol: str
    exists: bool | None = Field(description="Still exists at the target (null: not comparable).")
    changed: bool | None = Field(description="Changed between base and target (null without base).")
    file: str | None = None
    line: int | None = None
    at_base: bool | None = Field(default=None, description="Whether the base defined it (null without base).")


class OverrideOut(BaseModel, from_attributes=True):
    kind: OverrideKind
    name: str
    key: str | None = Field(description="Registration key, or an attention backend's selection condition.")
    file: str
    line: int
    replaces: list[TargetOut]
    on_path: bool
    detail: str
    bypassed_by: list[str] = Field(description="Plugin modules on the path importing the shadowed module anyway.")


class PatchOut(BaseModel, from_attributes=True):
    how: PatchHow
    target: TargetOut
    replacement: str | None
    file: str
    line: int
    on_path: bool
    helper: str | None = Field(default=None, description="The plugin helper or library patcher it calls.")
    active: bool | None = Field(default=None, description="Reached from the entry points (null: none found).")
    activation: list[str] = Field(default_factory=list, description="file:line steps from entry point to patch.")
    active_if: list[str] = Field(default_factory=list, description="Conditions it runs under; empty: always.")


class KernelOut(BaseModel):
    kernel: str
    file: str
    line: int
    decorators: list[str]
    required: list[str] = Field(description="Parameters the target kernel requires (autotune keys excluded).")
    launched_from: list[str]
    missing: dict[str, list[str]] = Field(description="Launch site -> required parameters it does not bind.")
    gained: list[str] = Field(description="Parameters the target kernel has and the base kernel had not.")
    lost: list[str] = Field(default_factory=list, description="Parameters the base kernel had, the target lacks.")
    constexpr_changed: list[str] = Field(default_factory=list, description="constexpr annotation added/dropped.")
    stale: dict[str, list[str]] = Field(default_factory=dict, description="Launch site -> keywords for lost params.")
    via: dict[str, str] = Field(default_factory=dict, description="Launch site -> the kernel chosen among several.")


class ConfigRewriteOut(BaseModel, from_attributes=True):
    file: str
    line: int
    architectures: list[str]
    guard: str | None
    model_types: list[str]


class InheritedOut(BaseModel, from_attributes=True):
    kind: InheritedKind = Field(description="What changed for a plugin subclass of an upstream class (needs base).")
    symbol: str = Field(description="module:Class, and .member for a member's finding.")
    file: str
    line: int
    upstream: str | None = Field(description="The upstream member (or class, for MRO kinds) at the target.")
    detail: str
    evidence: list[Evidence] = Field(description="The plugin line, the upstream line at target, at base.")


class WeightLoadingOut(BaseModel, from_attributes=True):
    symbol: str
    kind: WeightLoadingKind
    file: str
    line: int


class TraceOutput(ToolOutput):
    section: str = "summary"
    entry: Entry = Field(default_factory=Entry)
    counts: dict[str, int] = Field(
        default_factory=dict, description="Every list's size; inventory.changes: the changes view's."
    )
    total: int | None = Field(default=None, description="Rows of this section over all pages.")
    next_cursor: str | None = None
    defects: list[DefectRow] = Field(default_factory=list)
    unknowns: list[str] = Field(default_factory=list)
    boundaries: list[Boundary] = Field(default_factory=list)
    parse_errors: list[str] = Field(default_factory=list)
    inactive: list[str] = Field(
        default_factory=list, description="Plugin files of the model's package nothing reaches."
    )
    inventory: list[InventoryRow] = Field(default_factory=list)
    ops: list[OpOut] = Field(default_factory=list)
    overrides: list[OverrideOut] = Field(default_factory=list)
    patches: list[PatchOut] = Field(default_factory=list)
    kernels: list[KernelOut] = Field(default_factory=list)
    config_rewrites: list[ConfigRewriteOut] = Field(default_factory=list)
    weight_loading: list[WeightLoadingOut] = Field(default_factory=list)
    inherited: list[InheritedOut] = Field(default_factory=list)
    probe_id: str | None = Field(default=None, description="The op probe's id (cite it as probe evidence).")
    modules_indexed: int = 0
    cache_hits: int = 0
    parsed: int = 0


def _section_rows(section: Section, view: View, trace: Trace) -> list[Any]:
    """The chosen list as output rows (only that list is converted)."""
    findings = trace.findings
    if section == "inventory":
        rows = trace.walk.rows if view == "full" else changes(trace)
        return [InventoryRow(**{**vars(r), "importers": grouped(r.importers)}) for r in rows]
    if section == "boundaries":
        return [Boundary(**vars(b)) for b in (trace.boundaries if view == "full" else summarise(trace.boundaries))]
    if section in NOTE_SECTIONS:
        return list(getattr(trace, section))
    if section == "defects":
        return [DefectRow.model_validate(vars(d)) for d in findings.defects]
    if section == "ops":
        return [
            OpOut(
                op=r.op,
                used_in=r.used_in[:3],
                registered_in=[f"{g.where} ({g.how})" for g in r.registered_in],
                installed=r.installed,
                schemas=r.schema,
                schema_from=r.schema_from,
                implemented_in=[
                    f"{g.where} ({g.how} {g.kind}{' ' + g.dispatch_key if g.dispatch_key else ''})"
                    for g in r.implemented_in
                ],
                built_by=[extension_text(e) for e in r.built_by],
                precompiled=[precompiled_text(p) for p in r.precompiled],
            )
            for r in findings.ops
        ]
    if section == "kernels":
        return [KernelOut(**{**vars(k), "kernel": k.kernel.symbol}) for k in findings.kernels]
    models: dict[str, type[BaseModel]] = {
        "overrides": OverrideOut,
        "patches": PatchOut,
        "config_rewrites": ConfigRewriteOut,
        "weight_loading": WeightLoadingOut,
        "inherited": InheritedOut,
    }
    return [models[section].model_validate(item) for item in getattr(findings, section)]


def _row_size(row: Any) -> int:
    return size_of(row) if isinstance(row, BaseModel) else len(json.dumps(row, ensure_ascii=False))


def _base(trace: Trace, section: Section) -> TraceOutput:
    """The part of every page that is not a list: entry, counts and the index statistics."""
    return TraceOutput(
        section=section,
        entry=Entry(**vars(trace.entry)),
        modules_indexed=trace.modules_indexed,
        cache_hits=trace.cache_hits,
        parsed=trace.parsed,
        counts=trace.counts,
        probe_id=trace.findings.probe_id,
    )


def _call(args: TraceInput, why: str, **changed: Any) -> NextCall:
    """The caller's own arguments with `changed` applied: the exact call to make next."""
    given = args.model_dump(mode="json", include=args.model_fields_set) | changed
    return NextCall(tool="trace_dependency", arguments={k: v for k, v in given.items() if v is not None}, why=why)


def _fingerprint(args: TraceInput, section: Section) -> str:
    return inputs_fingerprint("trace_dependency", {**args.model_dump(mode="json"), "section": section})


def _section_page(args: TraceInput, trace: Trace, view: View) -> TraceOutput:
    """One page of a section, ended before the row that would cross the result budget."""
    rows = _section_rows(args.section, view, trace)
    output = _base(trace, args.section)
    output.total = len(rows)
    budget = rows_budget(output.model_copy(update={"next_cursor": CURSOR, "next_step": _call(args, "", cursor=CURSOR)}))
    page = paginate(
        rows,
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=_fingerprint(args, args.section),
        default_limit=DEFAULT_LIMIT,
        max_limit=MAX_LIMIT,
        budget=SizeBudget(size_of=_row_size, chars=budget.chars),
    )
    setattr(output, args.section, page.items)
    output.next_cursor = page.next_cursor
    if page.next_cursor:
        output.next_step = _call(args, f"rows {page.offset + len(page.items)}+ of {len(rows)}", cursor=page.next_cursor)
    return output


def _summary(args: TraceInput, trace: Trace) -> TraceOutput:
    """counts, then the boundaries (one entry per kind and side), defects, unknowns, parse errors and
    inactive files, as many of each as fit; next_step continues the first list cut short, else opens
    the inventory."""
    output = _base(trace, "summary")
    probe = _call(args, "x" * 80, section="parse_errors", cursor=CURSOR)
    room = rows_budget(output.model_copy(update={"next_step": probe})).chars
    cut: tuple[Section, list[Any], int] | None = None
    for name in SUMMARY_LISTS:
        rows = _summary_rows(name, trace)
        shown, room = _fit(rows, room - len(name) - 6)
        setattr(output, name, rows[:shown])
        if shown < len(rows) and cut is None:
            cut = (name, rows, shown)
    if cut:
        name, rows, shown = cut
        cursor = None
        if shown and name != "boundaries":  # the boundaries section groups them otherwise: from its start
            fingerprint = _fingerprint(args, name)
            page = paginate(rows, cursor=None, limit=shown, fingerprint=fingerprint, default_limit=1, max_limit=shown)
            cursor = page.next_cursor
        output.next_step = _call(args, f"{name}: {shown} of {len(rows)} shown", section=name, cursor=cursor)
    elif trace.counts.get("inventory.changes"):
        why = (
            f"the {trace.counts['inventory.changes']} nodes of the changes view (view=full: all {len(trace.walk.rows)})"
        )
        output.next_step = _call(args, why, section="inventory")
    return output


def _summary_rows(name: Section, trace: Trace) -> list[Any]:
    if name == "boundaries":
        return [Boundary(**vars(b)) for b in summarise(trace.boundaries, every_kind=True)]
    return _section_rows(name, "changes", trace)


def _fit(rows: list[Any], room: int) -> tuple[int, int]:
    """How many leading rows fit in `room` chars, and the room left."""
    shown = 0
    for row in rows:
        size = _row_size(row) + 1
        if size > room:
            break
        room -= size
        shown += 1
    return shown, room


def check(args: TraceInput) -> None:
    """Refuse what this combination would ignore (the argument named, and why), before any work."""
    given, consumers = args.model_fields_set, args.direction == "consumers"
    if not consumers and not args.arch:
        raise bad_input("direction=dependencies needs arch (the architecture name from config.json).")
    if consumers and not args.symbol:
        raise bad_input("direction=consumers needs symbol (module or module:Name).")
    if not consumers and args.symbol:
        raise bad_input("symbol is the start of direction=consumers; a dependencies walk starts from arch.")
    if consumers and (args.arch or args.follow_owned or args.section in (*FINDING_SECTIONS, "inactive")):
        raise bad_input(
            "direction=consumers walks back from symbol and runs no checks: arch, follow_owned and the "
            "sections of findings and inactive files do not apply."
        )
    if args.python and (consumers or not args.probe_ops):
        raise bad_input("python is the op probe's interpreter: it needs direction=dependencies and probe_ops=true.")
    if args.section == "summary" and given & {"cursor", "limit"}:
        raise bad_input("section=summary is one page sized to fit; cursor and limit page the other sections.")
    if "view" in given and (
        args.section not in ("inventory", "boundaries") or consumers and args.section != "boundaries"
    ):
        raise bad_input(
            "view chooses the rows of section=inventory and section=boundaries (consumers: boundaries only; a "
            f"consumers walk lists every row); section={args.section} is the same in either view."
        )


def trace_dependency(args: TraceInput, env: ToolEnv) -> TraceOutput:
    """A model's dependencies from its registrations, or a symbol's consumers, with path checks
    (overrides, patches, ops, kernels, defects). Summary first; then next_step.
    """
    check(args)
    return answer(args, run(args, env))


def run(args: TraceInput, env: ToolEnv) -> Trace:
    """The whole trace the call names (every page of every section is cut from it)."""
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, _ = open_upstream(args, env, repo)
    base = open_upstream(args, env, repo, revision=args.base)[0] if args.base else None

    def probe() -> ProbeTarget:
        return probe_target(
            args.python, env.policy, env.interpreters, load_record(env.store, repo) if repo else None, args.probe_ops
        )

    def ledger() -> dict[str, Any] | None:
        if repo is None or not isinstance(upstream, RevisionSubject):
            return None
        return load_ledger(env.store, ledger_id(repo.key, upstream.commit))

    request = TraceRequest(args.direction, args.arch, args.symbol, args.depth, args.platform_answers, args.follow_owned)
    return run_trace(env.store, Trees(plugin, upstream, base), request, probe, ledger)


def answer(args: TraceInput, trace: Trace) -> TraceOutput:
    """The page the call asks for: the summary, or one page of a section."""
    return _summary(args, trace) if args.section == "summary" else _section_page(args, trace, args.view)


SPEC = ToolSpec(
    name="trace_dependency",
    effect=Effect.READS,
    run=trace_dependency,
    input_model=TraceInput,
    output_model=TraceOutput,
    title="Dependency inventory and consumers",
    cpu_heavy=True,
)
