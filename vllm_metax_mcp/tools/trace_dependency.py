"""Tool `trace_dependency`: the visited dependency inventory of a model, or the consumers of a symbol."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..core.errors import bad_input, not_found
from ..core.policy import Effect
from ..core.pyindex import ModuleIndex, RecordCache
from ..core.registration import Registration, plugin_registrations, upstream_registrations
from ..core.results import inputs_fingerprint, paginate
from ..core.subjects import Subject
from ..core.trace import Row, Walk, consumers, walk_dependencies
from .base import ToolEnv, ToolOutput, ToolSpec
from .common import UpstreamArgs, open_plugin_repo, open_plugin_subject, open_upstream

DEFAULT_LIMIT = 60
MAX_LIMIT = 1000
MAX_ROWS = 20000


class TraceInput(UpstreamArgs):
    arch: str | None = Field(default=None, description="Architecture name as in config.json, e.g. DeepseekV4ForCausalLM.")
    symbol: str | None = Field(default=None, description="module or module:Name — the start for direction=consumers.")
    direction: Literal["dependencies", "consumers"] = "dependencies"
    base: str | None = Field(default=None, description="Upstream base revision: rows then carry upstream_delta (base -> target).")
    depth: int = Field(default=4, ge=1, le=50, description="Import hops from the registered classes.")
    platform_answers: dict[str, bool] = Field(
        default_factory=dict,
        description="Answers for platform predicates (default: every is_* is False, as for an out-of-tree platform).",
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
    branch: str = Field(description="taken, conditional, lazy, or not_taken (another platform's branch: recorded, not followed).")
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


class TraceOutput(ToolOutput):
    entry: Entry = Field(default_factory=Entry)
    inventory: list[InventoryRow] = Field(default_factory=list)
    total: int = 0
    next_cursor: str | None = None
    inactive: list[str] = Field(default_factory=list, description="Plugin files of the model's package nothing reaches.")
    boundaries: list[Boundary] = Field(default_factory=list)
    unknowns: list[str] = Field(default_factory=list)
    parse_errors: list[str] = Field(default_factory=list)
    modules_indexed: int = 0
    cache_hits: int = 0
    parsed: int = 0


def _build_index(plugin: Subject, upstream: Subject, cache: RecordCache) -> ModuleIndex:
    index = ModuleIndex()
    index.add_tree("plugin", plugin, cache)
    index.add_tree("upstream", upstream, cache, ["vllm/"])
    return index


def _plugin_packages(index: ModuleIndex) -> frozenset[str]:
    return frozenset(m.name for m in index.modules.values() if m.side == "plugin" and "." not in m.name and m.is_package)


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


def _annotate(rows: list[Row], index: ModuleIndex, base_index: ModuleIndex | None, plugin_packages: frozenset[str]) -> None:
    for row in rows:
        module, _, symbol = row.name.partition(":")
        if row.side == "plugin":
            row.upstream_counterpart = _counterpart(row.name, index, plugin_packages)
            if row.upstream_counterpart:
                row.metax_difference = _describe_difference(
                    _definition_hashes(index, module), _definition_hashes(index, row.upstream_counterpart.split(":")[0]), symbol or None
                )
        upstream_module = module if row.side == "upstream" else (row.upstream_counterpart or "").split(":")[0]
        if base_index is not None and upstream_module:
            row.upstream_delta = _delta(
                _definition_hashes(base_index, upstream_module), _definition_hashes(index, upstream_module), symbol or None
            )


def _entry(args: TraceInput, plugin: Subject, upstream: Subject) -> tuple[Entry, list[tuple[str, str | None]], list[str]]:
    entry = Entry(arch=args.arch)
    starts: list[tuple[str, str | None]] = []
    unknowns: list[str] = []
    local = [r for r in plugin_registrations(plugin) if r.arch == args.arch]
    if local:
        reg = local[0]
        entry.plugin, entry.plugin_registration = f"{reg.module}:{reg.symbol}", _where(reg)
        starts.append((reg.module, reg.symbol))
        if len(local) > 1:
            unknowns.append(f"{args.arch} is registered {len(local)} times in the plugin; the first ({_where(reg)}) was traced.")
    else:
        unknowns.append(f"No register_model call for {args.arch} in the plugin subject: only the upstream side was traced.")
    remote = upstream_registrations(upstream, args.arch or "")
    if remote:
        reg = remote[0]
        entry.upstream, entry.upstream_registration = f"{reg.module}:{reg.symbol}", _where(reg)
        starts.append((reg.module, reg.symbol))
    else:
        unknowns.append(f"{args.arch} is not in the upstream registry tables at the target: a new or removed architecture?")
    if not starts:
        raise not_found(f"{args.arch} is registered neither in the plugin nor upstream; check the architecture name in config.json.")
    return entry, starts, unknowns


def _inactive(index: ModuleIndex, entry: Entry, reached: set[str]) -> list[str]:
    """Plugin modules inside the registered model's own package that the walk never reached."""
    if not entry.plugin:
        return []
    module = entry.plugin.split(":")[0]
    indexed = index.get(module)
    if indexed is None or not indexed.is_package:
        return []
    return sorted(m.path for name, m in index.modules.items() if name.startswith(module + ".") and name not in reached)


def trace_dependency(args: TraceInput, env: ToolEnv) -> TraceOutput:
    """Walk a model's dependencies from its registration (plugin and upstream) through imports,
    re-exports and class bases, keeping the platform branch an out-of-tree platform takes, down to
    stdlib / third-party / compiled boundaries; or (direction=consumers) list who uses a symbol.

    Rows are paged; plugin rows carry their upstream counterpart and MetaX difference, and with
    `base` every row carries the upstream delta between base and target.
    """
    if args.direction == "dependencies" and not args.arch:
        raise bad_input("direction=dependencies needs arch (the architecture name from config.json).")
    if args.direction == "consumers" and not args.symbol:
        raise bad_input("direction=consumers needs symbol (module or module:Name).")
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, _ = open_upstream(args, env, repo)
    cache = RecordCache(env.store, args.platform_answers)
    index = _build_index(plugin, upstream, cache)
    plugin_packages = _plugin_packages(index)
    output = TraceOutput()
    if args.direction == "consumers":
        module, _, symbol = (args.symbol or "").partition(":")
        walk: Walk = consumers(index, module, symbol or None, args.depth, MAX_ROWS)
    else:
        output.entry, starts, output.unknowns = _entry(args, plugin, upstream)
        walk = walk_dependencies(index, starts, frozenset({"vllm"}) | plugin_packages, args.depth, MAX_ROWS)
        output.inactive = _inactive(index, output.entry, walk.names())
    base_index = None
    if args.base:
        base_subject, _ = open_upstream(args, env, repo, revision=args.base)
        base_index = ModuleIndex()
        base_index.add_tree("upstream", base_subject, cache, ["vllm/"])
    _annotate(walk.rows, index, base_index, plugin_packages)
    if walk.truncated:
        output.unknowns.append(f"The walk stopped at {MAX_ROWS} rows; narrow it with depth.")
    boundaries: dict[str, Boundary] = {}
    for row in walk.rows:
        if row.boundary and row.side in ("third_party", "binary", "stdlib", "missing"):
            package = row.name.split(":")[0] if row.side in ("binary", "missing") else row.name.split(".")[0]
            boundaries.setdefault(package, Boundary(package=package, side=row.side, reason=row.boundary))
    output.boundaries = sorted(boundaries.values(), key=lambda b: (b.side, b.package))
    output.parse_errors = sorted(f"{m.path}: {m.record.error}" for m in index.modules.values() if m.record.error)
    page = paginate(
        [InventoryRow(**vars(r)) for r in walk.rows],
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=inputs_fingerprint("trace_dependency", args.model_dump(mode="json")),
        default_limit=DEFAULT_LIMIT,
        max_limit=MAX_LIMIT,
    )
    output.inventory, output.total, output.next_cursor = page.items, page.total, page.next_cursor
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
