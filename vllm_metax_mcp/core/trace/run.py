"""One trace: index the plugin subject and the upstream target (and base), walk from the
architecture's registrations (or back from a symbol to its consumers), run the checks on the
path, annotate the rows, and count every list the output can page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..code.codebase import Codebase
from ..code.module_index import ModuleIndex, RecordCache
from ..code.overrides import find_overrides, override_facts
from ..foundation.progress import phase
from ..foundation.state import StateStore
from ..sources.subjects import RevisionSubject, Subject
from .annotations import annotate, plugin_packages, recorded_annotations
from .checks import Findings, ProbeTarget, check_path, owned_modules
from .entry import TraceEntry, find_entry
from .revisions import upstream_history
from .stability import Assessment, assess
from .walk import (
    Boundary,
    Row,
    Walk,
    component_boundaries,
    consumers,
    inactive_files,
    walk_dependencies,
    walk_edges,
)

MAX_ROWS = 20000
UPSTREAM_PREFIXES = ["vllm/"]

Direction = Literal["dependencies", "consumers"]
Section = Literal[
    "summary",
    "inventory",
    "defects",
    "ops",
    "overrides",
    "patches",
    "kernels",
    "config_rewrites",
    "weight_loading",
    "inherited",
    "boundaries",
    "unknowns",
    "parse_errors",
    "inactive",
]
FINDING_SECTIONS = (
    "defects",
    "ops",
    "overrides",
    "patches",
    "kernels",
    "config_rewrites",
    "weight_loading",
    "inherited",
)
"""The sections that list findings of the checks (all but the inventory), as named on `Findings`."""
NOTE_SECTIONS = ("unknowns", "parse_errors", "inactive")
"""The sections that list plain text lines, as named on `Trace`."""
NO_BASE = (
    "No base: no upstream interface can be verified stable, so the changes view stops at the upstream "
    "modules the plugin imports; pass base, or view=full."
)


@dataclass(frozen=True)
class TraceRequest:
    direction: Direction
    arch: str | None
    symbol: str | None
    """`module` or `module:Name`, for direction=consumers."""
    depth: int
    platform_answers: dict[str, bool]
    follow_owned: bool


@dataclass(frozen=True)
class Trees:
    """The subjects a trace reads: the plugin, upstream at the target, and upstream at base."""

    plugin: Subject
    upstream: Subject
    base: Subject | None = None


@dataclass
class Trace:
    entry: TraceEntry
    walk: Walk
    findings: Findings
    inactive: list[str] = field(default_factory=list)
    """Plugin files of the model's package nothing reaches."""
    unknowns: list[str] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    assessment: Assessment | None = None
    """Stable interfaces and the `changes` view (dependencies only; a consumers walk is all one view)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Size of every section, and of the defects per kind (`defects.<kind>`)."""
    modules_indexed: int = 0
    cache_hits: int = 0
    parsed: int = 0


def _index(trees: Trees, cache: RecordCache) -> tuple[ModuleIndex, ModuleIndex | None]:
    """The plugin and upstream target indexed together (plugin modules win), and upstream at base."""
    index = ModuleIndex()
    index.add_tree("plugin", trees.plugin, cache)
    index.add_tree("upstream", trees.upstream, cache, UPSTREAM_PREFIXES)
    if trees.base is None:
        return index, None
    base_index = ModuleIndex()
    base_index.add_tree("upstream", trees.base, cache, UPSTREAM_PREFIXES)
    return index, base_index


def _dependencies(
    store: StateStore,
    trees: Trees,
    request: TraceRequest,
    index: ModuleIndex,
    base_index: ModuleIndex | None,
    packages: frozenset[str],
    cache: RecordCache,
    probe: Callable[[], ProbeTarget],
) -> Trace:
    """The walk from the registrations, and the checks on its path."""
    first_party = frozenset({"vllm"}) | packages
    found_entry = find_entry(store, request.arch, trees.plugin, trees.upstream)
    model = found_entry.model
    code = Codebase(index, {"plugin": trees.plugin, "upstream": trees.upstream}, first_party)
    model_packages = frozenset({model.plugin_module.split(".")[0]}) if model.plugin_module else packages
    with phase("finding the plugin's overrides", 0.33):
        found = find_overrides(code, override_facts(store, code, model_packages), base_index)
    stop = {} if request.follow_owned else owned_modules(found, model.members(code))
    walk = walk_dependencies(index, found_entry.starts, first_party, request.depth, MAX_ROWS, stop)
    inactive = inactive_files(index, model.plugin_module, walk.names())
    history = None
    if isinstance(trees.base, RevisionSubject) and isinstance(trees.upstream, RevisionSubject):
        history = upstream_history(trees.upstream.repo, trees.base.commit, trees.upstream.commit, cache)
    with phase("checking the path", 0.62):
        findings = check_path(
            store, code, walk, found, stop, model, base_index, history, packages, probe(), base_tree=trees.base
        )
    edges = walk_edges(index, walk, first_party, request.depth)
    assessment = assess(code, base_index, walk, edges, trees.base)
    unknowns = found_entry.unknowns + findings.unknowns
    if base_index is None:
        unknowns.append(NO_BASE)
    return Trace(found_entry.entry, walk, findings, inactive, unknowns, assessment=assessment)


def run_trace(
    store: StateStore,
    trees: Trees,
    request: TraceRequest,
    probe: Callable[[], ProbeTarget],
    ledger: Callable[[], Mapping[str, Any] | None],
) -> Trace:
    """The whole trace. `probe` is asked for the op probe's interpreter once the walk is done
    (dependencies only); `ledger` for the audit ledger whose annotations the rows carry."""
    cache = RecordCache(store, request.platform_answers)
    with phase("indexing plugin and upstream modules", 0.3):
        index, base_index = _index(trees, cache)
    packages = plugin_packages(index)
    if request.direction == "consumers":
        module, _, symbol = (request.symbol or "").partition(":")
        walk = consumers(index, module, symbol or None, request.depth, MAX_ROWS)
        trace = Trace(TraceEntry(), walk, Findings())
    else:
        with phase("tracing dependencies", 0.97):
            trace = _dependencies(store, trees, request, index, base_index, packages, cache, probe)
    annotate(trace.walk.rows, index, base_index, packages)
    recorded_annotations(trace.walk.rows, ledger())
    if trace.walk.truncated:
        trace.unknowns.append(f"The walk stopped at {MAX_ROWS} rows; narrow it with depth.")
    stable = trace.assessment.stable if trace.assessment else []
    trace.boundaries = component_boundaries(trace.walk) + sorted(
        trace.findings.boundaries + stable, key=lambda b: (b.kind, b.package)
    )
    trace.parse_errors = sorted(f"{m.path}: {m.record.error}" for m in index.loaded() if m.record.error)
    trace.counts = _counts(trace)
    trace.modules_indexed, trace.cache_hits, trace.parsed = len(index.modules), cache.hits, cache.misses
    return trace


def changes(trace: Trace) -> list[Row]:
    """The rows of the `changes` view (every row of a consumers walk)."""
    return trace.assessment.changes if trace.assessment else trace.walk.rows


def _counts(trace: Trace) -> dict[str, int]:
    """`inventory` counts every node of the walk, `inventory.changes` the default view's."""
    findings = trace.findings
    counts = {"inventory": len(trace.walk.rows), "inventory.changes": len(changes(trace))}
    counts.update({name: len(getattr(findings, name)) for name in FINDING_SECTIONS})
    counts.update({name: len(getattr(trace, name)) for name in NOTE_SECTIONS})
    counts["boundaries"] = len(trace.boundaries)
    for boundary in trace.boundaries:
        counts[f"boundaries.{boundary.kind}"] = counts.get(f"boundaries.{boundary.kind}", 0) + 1
    for defect in findings.defects:
        counts[f"defects.{defect.kind}"] = counts.get(f"defects.{defect.kind}", 0) + 1
    for item in findings.inherited:
        counts[f"inherited.{item.kind}"] = counts.get(f"inherited.{item.kind}", 0) + 1
    return counts
