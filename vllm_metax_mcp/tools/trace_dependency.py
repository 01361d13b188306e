"""Tool `trace_dependency`: the visited dependency inventory of a model, or the consumers of a symbol."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..core.audit.ledger import ledger_id, load_ledger
from ..core.code.codebase import Codebase
from ..core.code.module_index import ModuleIndex, RecordCache
from ..core.code.overrides import find_overrides, override_facts
from ..core.code.registration import (
    Registration,
    plugin_registrations,
    upstream_registrations,
)
from ..core.foundation.errors import bad_input, not_found
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import inputs_fingerprint, paginate
from ..core.sources.environment import load_record
from ..core.sources.subjects import RevisionSubject, Subject
from ..core.trace.checks import Findings, Model, check_path, owned_modules, probe_target
from ..core.trace.revisions import upstream_history
from ..core.trace.walk import Row, Walk, consumers, walk_dependencies
from .arguments import (
    UpstreamArgs,
    open_plugin_repo,
    open_plugin_subject,
    open_upstream,
)
from .spec import ToolEnv, ToolOutput, ToolSpec

DEFAULT_LIMIT = 30
MAX_LIMIT = 1000
MAX_ROWS = 20000
Section = Literal["inventory", "defects", "ops", "overrides", "patches", "kernels", "config_rewrites", "weight_loading"]


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
        "inventory, defects, ops, overrides, patches, kernels, config_rewrites or weight_loading.",
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
    side: Literal["plugin", "upstream", "third_party", "binary", "stdlib", "missing"]
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
    annotation: str | None = None


class Boundary(BaseModel):
    package: str
    side: str
    reason: str
    kind: Literal["component", "pending_upgrade", "owned"] = Field(
        default="component",
        description="component: stdlib / third-party / compiled; pending_upgrade: a plugin module outside the model "
        "whose own imports fail (not a model defect); owned: a patch, registry or attention-backend module.",
    )
    file: str | None = None
    evidence: list[Evidence] = Field(default_factory=list)


class DefectRow(BaseModel):
    kind: Literal[
        "unresolved_import",
        "breaks_at_target",
        "override_target_changed",
        "skipped_base_init",
        "signature_drift",
        "op_not_found",
    ]
    file: str
    line: int
    detail: str
    symbol: str | None = None
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
    schema_from: Literal["installed", "source"] | None = None


class TargetOut(BaseModel, from_attributes=True):
    symbol: str
    exists: bool | None = Field(
        description="Whether the target still exists at the target revision (null: not comparable)."
    )
    changed: bool | None = Field(description="Changed between base and target (null without base).")
    file: str | None = None
    line: int | None = None


class OverrideOut(BaseModel, from_attributes=True):
    kind: Literal["custom_op", "quant_config", "attention_backend", "same_path"]
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
    how: Literal["assignment", "setattr", "decorator", "module_replacement"]
    target: TargetOut
    replacement: str | None
    file: str
    line: int
    on_path: bool


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


class ConfigRewriteOut(BaseModel, from_attributes=True):
    file: str
    line: int
    architectures: list[str]
    guard: str | None
    model_types: list[str]


class WeightLoadingOut(BaseModel, from_attributes=True):
    symbol: str
    kind: Literal["load_weights", "weights_mapper"]
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
    counts: dict[str, int] = Field(default_factory=dict, description="Size of every list, paged or not.")
    defects: list[DefectRow] = Field(default_factory=list)
    ops: list[OpOut] = Field(default_factory=list)
    overrides: list[OverrideOut] = Field(default_factory=list)
    patches: list[PatchOut] = Field(default_factory=list)
    kernels: list[KernelOut] = Field(default_factory=list)
    config_rewrites: list[ConfigRewriteOut] = Field(default_factory=list)
    weight_loading: list[WeightLoadingOut] = Field(default_factory=list)
    probe_id: str | None = Field(default=None, description="The op probe's id (cite it as probe evidence).")


def _build_index(plugin: Subject, upstream: Subject, cache: RecordCache) -> ModuleIndex:
    index = ModuleIndex()
    index.add_tree("plugin", plugin, cache)
    index.add_tree("upstream", upstream, cache, ["vllm/"])
    return index


def _plugin_packages(index: ModuleIndex) -> frozenset[str]:
    return frozenset(
        m.name for m in index.modules.values() if m.side == "plugin" and "." not in m.name and m.is_package
    )


def _where(registration: Registration) -> str:
    return f"{registration.path}:{registration.line}"


def _counterpart(name: str, index: ModuleIndex, plugin_packages: frozenset[str]) -> str | None:
    module, _, symbol = name.partition(":")
    top, _, rest = module.partition(".")
    if top not in plugin_packages or not rest:
        return None
    candidate = f"vllm.{rest}"
    indexed = index.get(candidate)
    if indexed is None or indexed.side != "upstream":
        return None
    return f"{candidate}:{symbol}" if symbol else candidate


def _definition_hashes(index: ModuleIndex, module: str) -> dict[str, str]:
    indexed = index.get(module)
    return {d.name: d.body_hash for d in indexed.record.definitions} if indexed else {}


def _delta(before: dict[str, str], after: dict[str, str], symbol: str | None) -> list[str]:
    names = [symbol] if symbol else sorted(set(before) | set(after))
    changes = []
    for name in names:
        if name not in before and name in after:
            changes.append(f"added:{name}")
        elif name in before and name not in after:
            changes.append(f"removed:{name}")
        elif name in before and before[name] != after[name]:
            changes.append(f"changed:{name}")
    return changes


def _describe_difference(plugin_hashes: dict[str, str], upstream_hashes: dict[str, str], symbol: str | None) -> str:
    changes = _delta(upstream_hashes, plugin_hashes, symbol)
    if not changes:
        return "identical definitions"
    shown = ", ".join(changes[:6]) + (f", … {len(changes) - 6} more" if len(changes) > 6 else "")
    return f"{len(changes)} definition(s) differ from upstream: {shown}"


def _annotate(
    rows: list[Row], index: ModuleIndex, base_index: ModuleIndex | None, plugin_packages: frozenset[str]
) -> None:
    for row in rows:
        module, _, symbol = row.name.partition(":")
        if row.side == "plugin":
            row.upstream_counterpart = _counterpart(row.name, index, plugin_packages)
            if row.upstream_counterpart:
                row.metax_difference = _describe_difference(
                    _definition_hashes(index, module),
                    _definition_hashes(index, row.upstream_counterpart.split(":")[0]),
                    symbol or None,
                )
        upstream_module = module if row.side == "upstream" else (row.upstream_counterpart or "").split(":")[0]
        if base_index is not None and upstream_module:
            row.upstream_delta = _delta(
                _definition_hashes(base_index, upstream_module),
                _definition_hashes(index, upstream_module),
                symbol or None,
            )


def _entry(
    args: TraceInput, plugin: Subject, upstream: Subject
) -> tuple[Entry, list[tuple[str, str | None]], list[str], Model]:
    entry = Entry(arch=args.arch)
    starts: list[tuple[str, str | None]] = []
    unknowns: list[str] = []
    local = [r for r in plugin_registrations(plugin) if r.arch == args.arch]
    if local:
        reg = local[0]
        entry.plugin, entry.plugin_registration = f"{reg.module}:{reg.symbol}", _where(reg)
        starts.append((reg.module, reg.symbol))
        if len(local) > 1:
            unknowns.append(
                f"{args.arch} is registered {len(local)} times in the plugin; the first ({_where(reg)}) was traced."
            )
    else:
        unknowns.append(
            f"No register_model call for {args.arch} in the plugin subject: only the upstream side was traced."
        )
    remote = upstream_registrations(upstream, args.arch or "")
    if remote:
        reg = remote[0]
        entry.upstream, entry.upstream_registration = f"{reg.module}:{reg.symbol}", _where(reg)
        starts.append((reg.module, reg.symbol))
    else:
        unknowns.append(
            f"{args.arch} is not in the upstream registry tables at the target: a new or removed architecture?"
        )
    if not starts:
        raise not_found(
            f"{args.arch} is registered neither in the plugin nor upstream; check the architecture name in config.json."
        )
    model = Model(
        local[0].module if local else None,
        local[0].path if local else None,
        remote[0].module if remote else None,
        remote[0].path if remote else None,
        tuple((m, s) for m, s in starts if s),
    )
    return entry, starts, unknowns, model


def _inactive(index: ModuleIndex, entry: Entry, reached: set[str]) -> list[str]:
    """Plugin modules inside the registered model's own package that the walk never reached."""
    if not entry.plugin:
        return []
    module = entry.plugin.split(":")[0]
    indexed = index.get(module)
    if indexed is None or not indexed.is_package:
        return []
    return sorted(m.path for name, m in index.modules.items() if name.startswith(module + ".") and name not in reached)


def _recorded_annotations(rows: list[Row], ledger: dict | None) -> None:
    """Dispositions recorded for inventory nodes with audit_commits(action=annotate)."""
    recorded = (ledger or {}).get("annotations") or {}
    for row in rows:
        note = recorded.get(row.name)
        if note:
            row.annotation = f"{note['disposition']} ({len(note.get('evidence') or [])} evidence item(s), ledger)"


def _section_rows(section: str, walk: Walk, findings: Findings) -> list[BaseModel]:
    """The chosen list as output rows (only that list is converted)."""
    if section == "inventory":
        return [InventoryRow(**vars(r)) for r in walk.rows]
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
            )
            for k in findings.kernels
        ]
    model = {
        "overrides": OverrideOut,
        "patches": PatchOut,
        "config_rewrites": ConfigRewriteOut,
        "weight_loading": WeightLoadingOut,
    }[section]
    return [model.model_validate(item) for item in getattr(findings, section)]


def _counts(walk: Walk, findings: Findings) -> dict[str, int]:
    counts = {"inventory": len(walk.rows)}
    counts.update(
        {
            name: len(getattr(findings, name))
            for name in ("defects", "ops", "overrides", "patches", "kernels", "config_rewrites", "weight_loading")
        }
    )
    for defect in findings.defects:
        counts[f"defects.{defect.kind}"] = counts.get(f"defects.{defect.kind}", 0) + 1
    return counts


def _boundaries(walk: Walk, findings: Findings) -> list[Boundary]:
    boundaries: dict[str, Boundary] = {}
    stdlib: set[str] = set()
    for row in walk.rows:
        if row.boundary and row.side == "stdlib":
            stdlib.add(row.name.split(".")[0])
        elif row.boundary and row.side in ("third_party", "binary", "missing"):
            package = row.name.split(":")[0] if row.side in ("binary", "missing") else row.name.split(".")[0]
            boundaries.setdefault(package, Boundary(package=package, side=row.side, reason=row.boundary))
    if stdlib:
        shown = ", ".join(sorted(stdlib)[:8]) + (", …" if len(stdlib) > 8 else "")
        boundaries["stdlib"] = Boundary(
            package="stdlib",
            side="stdlib",
            reason=f"standard library, {len(stdlib)} modules ({shown}): stable, not traced",
        )
    notes = [
        Boundary(package=n.module, side="plugin", reason=n.reason, kind=n.kind, file=n.file, evidence=n.evidence)  # type: ignore[arg-type]
        for n in findings.boundaries
    ]
    return sorted(boundaries.values(), key=lambda b: (b.side, b.package)) + sorted(
        notes, key=lambda b: (b.kind, b.package)
    )


def trace_dependency(args: TraceInput, env: ToolEnv) -> TraceOutput:
    """Walk a model's dependencies from its registration (plugin and upstream) through imports,
    re-exports and class bases, keeping the platform branch an out-of-tree platform takes, down to
    stdlib / third-party / compiled boundaries; or (direction=consumers) list who uses a symbol.

    Beside the inventory: the plugin's overrides and patches (by mechanism) with the upstream
    symbol each replaces, the torch ops on the path checked against the installed binaries (a probe
    in the environment record's interpreter), JIT kernel launches, config rewrites, weight loading,
    and defects with file, line and evidence. One list is paged per call (`section`); `counts`
    gives all sizes. With `base`, rows carry the upstream delta and breaking imports the release
    where they broke.
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
    cache = RecordCache(env.store, args.platform_answers)
    index = _build_index(plugin, upstream, cache)
    plugin_packages = _plugin_packages(index)
    first_party = frozenset({"vllm"}) | plugin_packages
    base_index = base_subject = None
    if args.base:
        base_subject, _ = open_upstream(args, env, repo, revision=args.base)
        base_index = ModuleIndex()
        base_index.add_tree("upstream", base_subject, cache, ["vllm/"])
    output = TraceOutput(section=args.section)
    findings = Findings()
    if args.direction == "consumers":
        module, _, symbol = (args.symbol or "").partition(":")
        walk: Walk = consumers(index, module, symbol or None, args.depth, MAX_ROWS)
    else:
        output.entry, starts, output.unknowns, model = _entry(args, plugin, upstream)
        code = Codebase(index, {"plugin": plugin, "upstream": upstream}, first_party)
        packages = frozenset({model.plugin_module.split(".")[0]}) if model.plugin_module else plugin_packages
        found = find_overrides(code, override_facts(env.store, code, packages), base_index)
        stop = {} if args.follow_owned else owned_modules(found, model.members(code))
        walk = walk_dependencies(index, starts, first_party, args.depth, MAX_ROWS, stop)
        output.inactive = _inactive(index, output.entry, walk.names())
        history = None
        if isinstance(base_subject, RevisionSubject) and isinstance(upstream, RevisionSubject):
            history = upstream_history(upstream.repo, base_subject.commit, upstream.commit, cache)
        probe = probe_target(
            args.python, env.policy, env.interpreters, load_record(env.store, repo) if repo else None, args.probe_ops
        )
        findings = check_path(env.store, code, walk, found, stop, model, base_index, history, plugin_packages, probe)
        output.unknowns += findings.unknowns
        output.probe_id = findings.probe_id
    _annotate(walk.rows, index, base_index, plugin_packages)
    if repo is not None and isinstance(upstream, RevisionSubject):
        _recorded_annotations(walk.rows, load_ledger(env.store, ledger_id(repo.key, upstream.commit)))
    if walk.truncated:
        output.unknowns.append(f"The walk stopped at {MAX_ROWS} rows; narrow it with depth.")
    output.boundaries = _boundaries(walk, findings)
    output.parse_errors = sorted(f"{m.path}: {m.record.error}" for m in index.modules.values() if m.record.error)
    page = paginate(
        _section_rows(args.section, walk, findings),
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=inputs_fingerprint("trace_dependency", args.model_dump(mode="json")),
        default_limit=DEFAULT_LIMIT,
        max_limit=MAX_LIMIT,
    )
    setattr(output, args.section, page.items)
    output.total, output.next_cursor, output.counts = page.total, page.next_cursor, _counts(walk, findings)
    output.modules_indexed, output.cache_hits, output.parsed = len(index.modules), cache.hits, cache.misses
    return output


SPEC = ToolSpec(
    name="trace_dependency",
    effect=Effect.READS,
    run=trace_dependency,
    input_model=TraceInput,
    output_model=TraceOutput,
    title="Dependency inventory and consumers",
    cpu_heavy=True,
)
