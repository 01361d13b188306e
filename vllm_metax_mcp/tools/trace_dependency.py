"""Tool `trace_dependency`: the visited dependency inventory of a model, or the consumers of a symbol."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.audit.ledger import ledger_id, load_ledger
from ..core.code.overrides import OverrideKind, PatchHow
from ..core.foundation.errors import bad_input
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import Page, inputs_fingerprint, paginate
from ..core.sources.environment import load_record
from ..core.sources.subjects import RevisionSubject
from ..core.trace.build_ops import extension_text, precompiled_text
from ..core.trace.checks import ProbeTarget, probe_target
from ..core.trace.defects import DefectKind
from ..core.trace.inherited import InheritedKind
from ..core.trace.kernels import SchemaSource
from ..core.trace.loading import WeightLoadingKind
from ..core.trace.run import Section, Trace, TraceRequest, Trees, changes, run_trace
from ..core.trace.stability import grouped, summarise
from ..core.trace.walk import BoundaryKind, NodeKind, RowSide, Stability
from .arguments import (
    UpstreamArgs,
    open_plugin_repo,
    open_plugin_subject,
    open_upstream,
)
from .spec import ToolEnv, ToolOutput, ToolSpec

DEFAULT_LIMIT = 30
MAX_LIMIT = 1000
View = Literal["changes", "full"]


class TraceInput(UpstreamArgs):
    arch: str | None = Field(
        default=None, description="Architecture name as in config.json, e.g. DeepseekV4ForCausalLM."
    )
    symbol: str | None = Field(default=None, description="module or module:Name — the start for direction=consumers.")
    direction: Literal["dependencies", "consumers"] = "dependencies"
    base: str | None = Field(
        default=None, description="Upstream base revision: rows then carry upstream_delta (base -> target)."
    )
    depth: int = Field(default=4, ge=1, le=50, description="Import hops from the registered classes.")
    platform_answers: dict[str, bool] = Field(
        default_factory=dict,
        description="Answers for platform predicates (default: every is_* is False, as for an out-of-tree platform).",
    )
    section: Section = Field(
        default="inventory",
        description="Which list this page holds (the others are empty; `counts` gives every list's size): "
        "inventory, defects, ops, overrides, patches, kernels, config_rewrites, weight_loading or inherited.",
    )
    view: View = Field(
        default="changes",
        description="changes: the plugin's nodes and the upstream nodes whose used definitions changed between base "
        "and target (or cannot be verified), reached through plugin or changed modules; stable interfaces and "
        "components summarised in boundaries. full: every node of the walk and every boundary. "
        "direction=consumers always lists every row.",
    )
    follow_owned: bool = Field(
        default=False, description="Walk into modules owned by the patch, registry and attention-backend workflows too."
    )
    probe_ops: bool = Field(
        default=True, description="Ask the target interpreter which torch.ops its binaries provide."
    )
    python: str | None = Field(
        default=None, description="Interpreter for the op probe (edit mode only); default: the environment record's."
    )
    cursor: str | None = None
    limit: int | None = Field(default=None, description=f"Rows per page (default {DEFAULT_LIMIT}, max {MAX_LIMIT}).")


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
    branch: str = Field(
        description="taken, conditional, lazy, or not_taken (another platform's branch: recorded, not followed)."
    )
    boundary: str | None = None
    depth: int
    upstream_counterpart: str | None = None
    upstream_delta: list[str] | None = None
    metax_difference: str | None = None
    annotation: str | None = Field(default=None, description="The action recorded for the node (audit ledger).")
    importers: list[str] = Field(
        default_factory=list, description="Every module on the path that imports it; `a.b.{c,d}` is a.b.c and a.b.d."
    )
    stability: Stability | None = Field(
        default=None,
        description="Upstream and missing nodes: stable / changed (the definitions the path uses, base -> target) "
        "or unknown (no base, or not verifiable).",
    )
    stability_evidence: list[str] = Field(
        default_factory=list,
        description="Why stable (unchanged:name base_line->target_line per used definition) or unknown; a changed "
        "node's grounds are its upstream_delta (upstream nodes: only the definitions the path uses).",
    )
    kind: NodeKind = Field(
        default="import",
        description="How the module is reached: import, package_init (its __init__ runs when a submodule is "
        "imported), lazy (inside a function), dynamic (import_module/__import__ with a literal name), typing_only.",
    )


class Boundary(BaseModel):
    package: str
    side: str
    reason: str
    kind: BoundaryKind = Field(
        default="component",
        description="component: stdlib / third-party / compiled; pending_upgrade: a plugin module outside the model "
        "whose own imports fail (not a model defect); owned: a patch, registry or attention-backend module; "
        "stable_interface: an upstream module whose used definitions did not change between base and target; "
        "precompiled: a package the build takes kernels from instead of compiling them.",
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
    release: str | None = Field(
        default=None, description="breaks_at_target: the first release where it fails (null: no history says)."
    )
    evidence: list[Evidence]


class OpOut(BaseModel):
    op: str = Field(description="namespace.name as in torch.ops.<namespace>.<name>.")
    used_in: list[str] = Field(description="Up to three file:line uses on the path, plugin modules first.")
    registered_in: list[str] = Field(description="file:line (mechanism) of every source registration in either tree.")
    installed: bool | None = Field(
        description="Whether the installed binaries provide it; null: not probed or undecidable (see unknowns)."
    )
    schemas: list[str] = Field(
        description="Installed schemas, one per overload (or, unprobed, those the sources declare)."
    )
    schema_from: SchemaSource | None = None
    implemented_in: list[str] = Field(
        default_factory=list, description="file:line (mechanism kind key) of kernel (impl) and fake registrations."
    )
    built_by: list[str] = Field(
        default_factory=list,
        description="The plugin build's extension modules registering under this namespace, with the switch that "
        "gates each.",
    )
    precompiled: list[str] = Field(
        default_factory=list, description="Packages the build takes these kernels from when a switch turns it off."
    )


class TargetOut(BaseModel, from_attributes=True):
    symbol: str
    exists: bool | None = Field(
        description="Whether the target still exists at the target revision (null: not comparable)."
    )
    changed: bool | None = Field(description="Changed between base and target (null without base).")
    file: str | None = None
    line: int | None = None
    at_base: bool | None = Field(default=None, description="Whether the base defined it (null without base).")


class OverrideOut(BaseModel, from_attributes=True):
    kind: OverrideKind
    name: str
    key: str | None = Field(description="Registration key, or the selection condition of an attention backend.")
    file: str
    line: int
    replaces: list[TargetOut]
    on_path: bool
    detail: str
    bypassed_by: list[str] = Field(
        description="Plugin modules on the path that import the shadowed upstream module anyway."
    )


class PatchOut(BaseModel, from_attributes=True):
    how: PatchHow
    target: TargetOut
    replacement: str | None
    file: str
    line: int
    on_path: bool
    helper: str | None = Field(default=None, description="The plugin helper or library patcher it calls.")
    active: bool | None = Field(
        default=None, description="Reached from the plugin's entry points (null: no entry points found)."
    )
    activation: list[str] = Field(
        default_factory=list, description="file:line unit steps from the entry point to the patch."
    )
    active_if: list[str] = Field(
        default_factory=list, description="Alternative conditions it runs under; empty: always (when active)."
    )


class KernelOut(BaseModel):
    kernel: str
    file: str
    line: int
    decorators: list[str]
    required: list[str] = Field(
        description="Parameters the target kernel requires (autotune/heuristics keys excluded)."
    )
    launched_from: list[str]
    missing: dict[str, list[str]] = Field(description="Launch site -> required parameters it binds no argument to.")
    gained: list[str] = Field(description="Parameters the target kernel has and the base kernel had not (with base).")
    lost: list[str] = Field(default_factory=list, description="Parameters the base kernel had and the target lacks.")
    constexpr_changed: list[str] = Field(
        default_factory=list, description="Parameters whose constexpr annotation was added or dropped since base."
    )
    stale: dict[str, list[str]] = Field(
        default_factory=dict, description="Launch site -> keywords it passes for parameters the kernel lost."
    )
    via: dict[str, str] = Field(
        default_factory=dict, description="Launch site -> the local name chosen among several kernels it launches."
    )


class ConfigRewriteOut(BaseModel, from_attributes=True):
    file: str
    line: int
    architectures: list[str]
    guard: str | None
    model_types: list[str]


class InheritedOut(BaseModel, from_attributes=True):
    kind: InheritedKind = Field(
        description="What changed for a plugin subclass of an upstream class, between base and target (needs base)."
    )
    symbol: str = Field(description="module:Class, and .member for a member's finding.")
    file: str
    line: int
    upstream: str | None = Field(description="The upstream member (or class, for MRO kinds) at the target.")
    detail: str
    evidence: list[Evidence] = Field(description="The plugin line, the upstream line at the target, at base.")


class WeightLoadingOut(BaseModel, from_attributes=True):
    symbol: str
    kind: WeightLoadingKind
    file: str
    line: int


class TraceOutput(ToolOutput):
    entry: Entry = Field(default_factory=Entry)
    inventory: list[InventoryRow] = Field(default_factory=list)
    total: int = 0
    next_cursor: str | None = None
    inactive: list[str] = Field(
        default_factory=list, description="Plugin files of the model's package nothing reaches."
    )
    boundaries: list[Boundary] = Field(default_factory=list)
    unknowns: list[str] = Field(default_factory=list)
    parse_errors: list[str] = Field(default_factory=list)
    modules_indexed: int = 0
    cache_hits: int = 0
    parsed: int = 0
    section: str = "inventory"
    counts: dict[str, int] = Field(
        default_factory=dict,
        description="Size of every list, paged or not: inventory (every node of the walk), inventory.changes "
        "(the changes view), boundaries.<kind> (every boundary).",
    )
    defects: list[DefectRow] = Field(default_factory=list)
    ops: list[OpOut] = Field(default_factory=list)
    overrides: list[OverrideOut] = Field(default_factory=list)
    patches: list[PatchOut] = Field(default_factory=list)
    kernels: list[KernelOut] = Field(default_factory=list)
    config_rewrites: list[ConfigRewriteOut] = Field(default_factory=list)
    weight_loading: list[WeightLoadingOut] = Field(default_factory=list)
    inherited: list[InheritedOut] = Field(default_factory=list)
    probe_id: str | None = Field(default=None, description="The op probe's id (cite it as probe evidence).")


def _section_rows(section: Section, view: View, trace: Trace) -> list[BaseModel]:
    """The chosen list as output rows (only that list is converted)."""
    findings = trace.findings
    if section == "inventory":
        rows = trace.walk.rows if view == "full" else changes(trace)
        return [InventoryRow(**{**vars(r), "importers": grouped(r.importers)}) for r in rows]
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
        return [
            KernelOut(
                kernel=k.kernel.symbol,
                file=k.file,
                line=k.line,
                decorators=k.decorators,
                required=k.required,
                launched_from=k.launched_from,
                missing=k.missing,
                gained=k.gained,
                lost=k.lost,
                constexpr_changed=k.constexpr_changed,
                stale=k.stale,
                via=k.via,
            )
            for k in findings.kernels
        ]
    models: dict[str, type[BaseModel]] = {
        "overrides": OverrideOut,
        "patches": PatchOut,
        "config_rewrites": ConfigRewriteOut,
        "weight_loading": WeightLoadingOut,
        "inherited": InheritedOut,
    }
    return [models[section].model_validate(item) for item in getattr(findings, section)]


def _output(section: Section, view: View, trace: Trace, page: Page[BaseModel]) -> TraceOutput:
    boundaries = trace.boundaries if view == "full" else summarise(trace.boundaries)
    output = TraceOutput(
        section=section,
        entry=Entry(**vars(trace.entry)),
        total=page.total,
        next_cursor=page.next_cursor,
        inactive=trace.inactive,
        boundaries=[Boundary(**vars(b)) for b in boundaries],
        unknowns=trace.unknowns,
        parse_errors=trace.parse_errors,
        modules_indexed=trace.modules_indexed,
        cache_hits=trace.cache_hits,
        parsed=trace.parsed,
        counts=trace.counts,
        probe_id=trace.findings.probe_id,
    )
    setattr(output, section, page.items)
    return output


def trace_dependency(args: TraceInput, env: ToolEnv) -> TraceOutput:
    """Walk a model's dependencies from its registration (plugin and upstream) through imports,
    re-exports and class bases, keeping the platform branch an out-of-tree platform takes, down to
    stdlib / third-party / compiled boundaries; or (direction=consumers) list who uses a symbol.

    Beside the inventory: the plugin's overrides and patches (by mechanism) with the upstream
    symbol each replaces, the torch ops on the path checked against the installed binaries (a probe
    in the environment record's interpreter), JIT kernel launches, config rewrites, weight loading,
    and defects with file, line and evidence. One list is paged per call (`section`); `counts`
    gives all sizes. With `base`, rows carry the upstream delta and breaking imports the release
    where they broke, and an upstream module whose used definitions did not change is a stable
    interface boundary: the default view (`changes`) keeps the plugin's nodes and the upstream ones
    that changed, `full` every node.
    """
    if args.direction == "dependencies" and not args.arch:
        raise bad_input("direction=dependencies needs arch (the architecture name from config.json).")
    if args.direction == "consumers" and not args.symbol:
        raise bad_input("direction=consumers needs symbol (module or module:Name).")
    if args.direction == "consumers" and args.section != "inventory":
        raise bad_input("direction=consumers only has the inventory section.")
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
    trace = run_trace(env.store, Trees(plugin, upstream, base), request, probe, ledger)
    page = paginate(
        _section_rows(args.section, args.view, trace),
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=inputs_fingerprint("trace_dependency", args.model_dump(mode="json")),
        default_limit=DEFAULT_LIMIT,
        max_limit=MAX_LIMIT,
    )
    return _output(args.section, args.view, trace, page)


SPEC = ToolSpec(
    name="trace_dependency",
    effect=Effect.READS,
    run=trace_dependency,
    input_model=TraceInput,
    output_model=TraceOutput,
    title="Dependency inventory and consumers",
    cpu_heavy=True,
)
