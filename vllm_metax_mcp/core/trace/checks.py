"""The second pass of a dependency trace: dispatch and overrides, kernels against the installed
binaries, and defects of the plugin code on the model's path.

"The model" is the package of the registered plugin module (`entry.Model`). A plugin module
outside the model whose own imports fail is a `pending_upgrade` boundary, not a defect of the
model; modules that hold patches, registries or selected attention backends are boundaries owned
by their own workflows, walked deeper only on request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..code.activity import mark_active
from ..code.build_files import build_facts
from ..code.codebase import Codebase, Ref
from ..code.module_index import ModuleIndex, module_name
from ..code.op_scanners import RegistrationKind, native_registrations, python_facts, python_registrations
from ..code.overrides import (
    Override,
    Overrides,
    Patch,
    Target,
    mark_reached,
    same_path_overrides,
)
from ..foundation.errors import ToolFailure
from ..foundation.policy import Policy
from ..foundation.progress import phase
from ..foundation.state import StateStore
from ..sources.environment import EnvironmentRecord, check_interpreter
from ..sources.interpreters import Interpreters
from ..sources.subjects import Subject
from .base_init import skipped_base_init
from .build_ops import attach_build, precompiled_text
from .defects import Defect, ImportProblem, import_defects, import_problems, op_defects, override_defects
from .entry import Model
from .inherited import Inherited, base_codebase, inherited_behaviour
from .kernels import KernelLaunch, OpRow, kernel_launches, op_rows, probe_ops
from .loading import ConfigRewrite, WeightLoading, config_rewrites, weight_loading
from .revisions import UpstreamHistory
from .signatures import call_drift, kernel_drift, override_drift
from .walk import Boundary, Walk

PENDING_SHOWN = 3
UNKNOWNS_SHOWN = 3
ALL_KINDS: tuple[RegistrationKind, ...] = ("def", "impl", "fake")
"""Op registrations a trace reads: definitions, kernels per dispatch key and fake (meta) kernels."""


@dataclass(frozen=True)
class ProbeTarget:
    """The interpreter ops are probed in, or why there is none (an evidence gap)."""

    python: Path | None
    identity: str | None = None
    gap: str | None = None


def probe_target(
    python: str | None, policy: Policy, interpreters: Interpreters, record: EnvironmentRecord | None, enabled: bool
) -> ProbeTarget:
    """The environment record's interpreter; an explicit one only in edit mode. Either passes the
    interpreter policy (core/sources/interpreters.py): a recorded one the operator did not allow is a gap."""
    if not enabled:
        return ProbeTarget(None, gap="Ops were not probed (probe_ops=false): installed is unknown for every op.")
    if python:
        return ProbeTarget(check_interpreter(python, policy, interpreters, "override").path)
    if not record or not record.python:
        return ProbeTarget(
            None,
            gap="No environment record with an interpreter: ops were not probed (run environment action=establish).",
        )
    try:
        return ProbeTarget(check_interpreter(record.python, policy, interpreters, "record").path, record.probe_id)
    except ToolFailure as failure:
        return ProbeTarget(None, gap=f"The recorded interpreter cannot run ({failure.message}): ops were not probed.")


@dataclass
class Findings:
    overrides: list[Override] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    ops: list[OpRow] = field(default_factory=list)
    kernels: list[KernelLaunch] = field(default_factory=list)
    defects: list[Defect] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    """Plugin modules the walk stopped at: pending upgrades and modules other workflows own."""
    config_rewrites: list[ConfigRewrite] = field(default_factory=list)
    weight_loading: list[WeightLoading] = field(default_factory=list)
    inherited: list[Inherited] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    probe_id: str | None = None


def owned_modules(found: Overrides, model: set[str]) -> dict[str, str]:
    """Modules the walk records as boundaries of another workflow (never the model's own)."""
    replaced: dict[str, list[Target]] = {}
    for override in found.overrides:
        for target in override.replaces:
            replaced.setdefault(override.name.split(":")[0], []).append(target)
    for patch in found.patches:
        replaced.setdefault(patch.module, []).append(patch.target)
    stop = {}
    for module, workflow in found.owned.items():
        if module in model:
            continue
        targets = sorted({_state(t) for t in replaced.get(module, [])})
        shown = ", ".join(targets[:4]) + (f", … {len(targets) - 4} more" if len(targets) > 4 else "")
        stop[module] = (
            f"owned by the {workflow} workflow"
            + (f" (replaces {shown})" if targets else "")
            + "; walked deeper with follow_owned"
        )
    return stop


def _state(target: Target) -> str:
    if target.exists is False:
        return f"{target.symbol} (gone at target)"
    return f"{target.symbol} (changed)" if target.changed else target.symbol


def _pending(code: Codebase, module: str, problems: list[ImportProblem]) -> Boundary:
    shown = "; ".join(f"`{p.written}` ({p.outcome.value})" for p in problems[:PENDING_SHOWN])
    more = f"; … {len(problems) - PENDING_SHOWN} more" if len(problems) > PENDING_SHOWN else ""
    return Boundary(
        module,
        "plugin",
        f"a plugin module outside the model whose own upgrade is pending: {shown}{more}",
        "pending_upgrade",
        code.module(module).path,
        [code.evidence(module, p.line) for p in problems[:PENDING_SHOWN]],
    )


def check_path(
    store: StateStore,
    code: Codebase,
    walk: Walk,
    found: Overrides,
    stop: dict[str, str],
    model: Model,
    base: ModuleIndex | None,
    history: UpstreamHistory | None,
    plugin_packages: frozenset[str],
    probe: ProbeTarget,
    base_tree: Subject | None = None,
) -> Findings:
    """Overrides on the path, import, init, signature and op defects of the plugin modules walked,
    kernels, ops against the probe, config rewrites and weight loading."""
    findings = Findings(unknowns=list(found.unknowns))
    reached = walk.names()
    members = model.members(code)
    mark_reached(found, reached)
    findings.overrides = found.overrides + same_path_overrides(code, base, reached, plugin_packages)
    findings.patches = found.patches
    with phase("deciding which overrides are active", 0.22):
        findings.unknowns += mark_active(code, found)
    walked = [
        r.name for r in walk.rows if ":" not in r.name and r.branch != "not_taken" and code.get(r.name) is not None
    ]
    plugin_walked = [m for m in walked if code.module(m).side == "plugin" and m not in stop]
    checked = _imports(code, plugin_walked, members, base, history, plugin_packages, findings)
    for module in checked:
        findings.defects += (
            skipped_base_init(code, module) + call_drift(code, base, module) + override_drift(code, base, module)
        )
    findings.inherited = inherited_behaviour(code, base_codebase(code, base, base_tree), checked)
    with phase("finding kernel launches", 0.11):
        findings.kernels = kernel_launches(code, checked, base)
    findings.defects += kernel_drift(code, findings.kernels, set(checked))
    with phase("checking ops", 0.53):
        _ops(store, code, walked, checked, probe, findings)
    module_of = {m.path: m.name for m in code.index.modules.values() if m.side == "plugin"}
    findings.defects += override_defects(code, findings.overrides, findings.patches, module_of)
    findings.boundaries += [
        Boundary(r.name, "plugin", stop[r.name], "owned", r.file) for r in walk.rows if r.name in stop and r.depth > 0
    ]
    with phase("finding config rewrites", 0.09):
        findings.config_rewrites = config_rewrites(
            store, code, module_name(model.registry_path or ""), model.upstream_module
        )
    symbols = [r.name.partition(":") for r in walk.rows if ":" in r.name and r.branch != "not_taken"]
    findings.weight_loading = weight_loading(code, [*model.classes, *(Ref(m, (c,)) for m, _, c in symbols)])
    findings.defects.sort(key=lambda d: (d.kind, d.file, d.line))
    return findings


def _imports(
    code: Codebase,
    modules: list[str],
    members: set[str],
    base: ModuleIndex | None,
    history: UpstreamHistory | None,
    plugin_packages: frozenset[str],
    findings: Findings,
) -> list[str]:
    """Import defects of the model; pending-upgrade boundaries elsewhere. Returns the modules to check further."""
    checked: list[str] = []
    model_problems: list[ImportProblem] = []
    for module in modules:
        problems = import_problems(code, module, findings.unknowns, base)
        if module in members:
            model_problems += problems
        elif problems:
            findings.boundaries.append(_pending(code, module, problems))
            continue
        checked.append(module)
    findings.defects += import_defects(code, model_problems, base, history, plugin_packages)
    return checked


def _ops(
    store: StateStore, code: Codebase, walked: list[str], checked: list[str], probe: ProbeTarget, findings: Findings
) -> None:
    facts = python_facts(store, code)
    registered, unknowns = python_registrations(code, facts, ALL_KINDS)
    if unknowns:
        shown = "; ".join(unknowns[:UNKNOWNS_SHOWN]) + (
            f"; … {len(unknowns) - UNKNOWNS_SHOWN} more" if len(unknowns) > UNKNOWNS_SHOWN else ""
        )
        findings.unknowns.append(f"{len(unknowns)} Python op registration(s) not decidable statically: {shown}")
    findings.ops = op_rows(code, facts, walked, native_registrations(store, code, ALL_KINDS) + registered)
    _build(code, findings)
    if probe.gap:
        findings.unknowns.append(probe.gap)
    elif probe.python is not None and findings.ops:
        outcome = probe_ops(probe.python, store, findings.ops, sorted(code.first_party), probe.identity)
        findings.probe_id = outcome.probe_id
        findings.unknowns += outcome.gaps
    plugin_paths = {code.module(m).path: m for m in checked}
    findings.defects += op_defects(code, findings.ops, plugin_paths, findings.probe_id)


def _build(code: Codebase, findings: Findings) -> None:
    """The plugin build's extensions behind each op; a precompiled package is the boundary of the
    ops it provides, and an extension whose sources the tree lacks leaves its ops unknown."""
    plugin = code.subjects["plugin"]
    build = build_facts(plugin)
    findings.unknowns += build.gaps
    attach_build(findings.ops, build)
    present = plugin.entries()
    for extension in {e.where: e for row in findings.ops for e in row.built_by}.values():
        absent = [s for s in extension.sources if s not in present and not any(p.startswith(f"{s}/") for p in present)]
        if absent:
            findings.unknowns.append(
                f"{extension.module} ({extension.where}) compiles {', '.join(absent)}, which this tree lacks: "
                f"the ops it registers are not known from source (the probe decides installed)"
            )
    for source in {p.where: p for row in findings.ops for p in row.precompiled}.values():
        ops = [row.op for row in findings.ops if source in row.precompiled]
        findings.boundaries.append(
            Boundary(
                source.package,
                "binary",
                f"precompiled kernels: {precompiled_text(source)}; provides torch.ops.{ops[0].partition('.')[0]} "
                f"({len(ops)} op(s) on the path) instead of compiling them",
                "precompiled",
                source.where.rpartition(":")[0],
            )
        )
