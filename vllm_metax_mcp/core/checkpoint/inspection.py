"""inspect_config's workflow: the checkpoint read and cross-checked, the config constructed in the target
interpreter (with the plugin subject first on the path), id-list bases decided, and the code that reads
the asked fields; every unknown is a gap, never a default."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..foundation.errors import ToolFailure
from ..foundation.policy import Policy
from ..foundation.state import StateStore
from ..sources.hub import ModelLocation
from ..sources.interpreters import Interpreters
from ..sources.subjects import SubjectKind
from .construct import ConstructedView, ConstructRequest, constructed_findings, run_construct, view
from .consumers import Location, SourceTree, find_consumers
from .cross_check import CheckpointReport
from .evidence import (
    Checkpoint,
    PluginAccess,
    TargetEnvironment,
    checkpoint_gaps,
    choose_interpreter,
    code_trees,
    read_checkpoint,
    target_environment,
)
from .findings import Finding, ordered_findings
from .id_bases import cross_check_with_bases
from .id_lists import id_list_gaps
from .layout import Layout

CONSUMERS_PER_FIELD = 15


@dataclass(frozen=True)
class InspectRequest:
    """What an inspect_config call asks for, in core terms."""

    model: str
    model_revision: str | None
    construct: bool
    python: str | None
    trust_remote_code: bool
    hf_overrides: dict[str, Any]
    speculative: dict[str, Any] | None
    """`{"method": ..., "num_speculative_tokens": ...}` for the draft config, as vllm serve takes it."""
    consumers_of: list[str]


@dataclass(frozen=True)
class FieldConsumers:
    field: str
    total: int
    locations: list[Location]


@dataclass
class Inspection:
    """The whole answer before paging: layout, checkpoint report, constructed view, consumers, findings, gaps."""

    location: ModelLocation
    layout: Layout
    report: CheckpointReport | None
    built: ConstructedView | None
    probe_id: str | None
    consumers: list[FieldConsumers]
    findings: list[Finding]
    gaps: list[str]


@dataclass(frozen=True)
class _Construction:
    built: ConstructedView | None = None
    probe_id: str | None = None
    gaps: tuple[str, ...] = ()


def _plugin_path(plugin: PluginAccess, store: StateStore, target: TargetEnvironment, stack: ExitStack) -> list[Path]:
    """A non-installed subject's vllm_metax/ exported to a scratch directory that goes first on the path."""
    if plugin.subject is SubjectKind.INSTALLED:
        return []
    subject = target.open_subject(plugin)
    scratch = store.path("scratch")
    scratch.mkdir(parents=True, exist_ok=True)
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plugin-", dir=scratch)))
    subject.export(directory, "vllm_metax/")
    return [directory]


def _construction_gaps(request: InspectRequest, raw: dict[str, Any], built: ConstructedView) -> list[str]:
    gaps = [
        f"Construction stage {stage} failed in the target interpreter: {error}" for stage, error in built.errors.items()
    ]
    if not any(p["value"].startswith("vllm_metax") for p in built.plugins) and "vllm" not in built.errors:
        gaps.append(
            "No vllm_metax entry point is installed in the target interpreter: the plugin's platform and config "
            "patches took no part."
        )
    if raw.get("auto_map") and not request.trust_remote_code:
        gaps.append(
            "config.json names remote code (auto_map) that was not executed (trust_remote_code=false); the library "
            "classes were used."
        )
    return gaps


def _construct(
    request: InspectRequest,
    plugin: PluginAccess,
    store: StateStore,
    policy: Policy,
    target: TargetEnvironment,
    checkpoint: Checkpoint,
) -> _Construction:
    """The config built in the target interpreter the way `vllm serve` builds it, or why it was not."""
    if not request.construct:
        return _Construction(
            gaps=("Construction not requested (construct=false): the config class vLLM loads is not verified.",)
        )
    if target.python is None:
        return _Construction(
            gaps=(
                "No interpreter to construct the config in: run environment action=establish (or pass python in "
                "edit mode); the config class vLLM loads is not verified.",
            )
        )
    location = checkpoint.location
    try:
        policy.readable_entries(location.path)  # the target interpreter reads the directory; links are not followed
    except ToolFailure as failure:
        return _Construction(gaps=(f"Construction not run: {failure.message}",))
    construct = ConstructRequest(location.path, request.trust_remote_code, request.hf_overrides, request.speculative)
    with ExitStack() as stack:
        pythonpath = _plugin_path(plugin, store, target, stack)
        probe_id, report = run_construct(target.python, store, construct, pythonpath)
    built = view(checkpoint.raw, report, str(location.path), location.label)
    return _Construction(built, probe_id, tuple(_construction_gaps(request, checkpoint.raw, built)))


def _consumers(names: list[str], trees: list[SourceTree]) -> list[FieldConsumers]:
    found = []
    for name in names:
        locations, total = find_consumers(trees, name.rsplit(".", 1)[-1], CONSUMERS_PER_FIELD)
        found.append(FieldConsumers(name, total, locations))
    return found


def inspect_checkpoint(
    request: InspectRequest, plugin: PluginAccess, policy: Policy, store: StateStore, interpreters: Interpreters
) -> Inspection:
    """The layout, cross-checked and constructed as asked; the environment record is read only when the
    construction or a consumer search needs it."""
    checkpoint = read_checkpoint(policy, request.model, request.model_revision)
    layout = checkpoint.layout
    need_code = bool(request.consumers_of) or any(i.ids for i in layout.id_lists)
    target = TargetEnvironment()
    if request.construct or need_code:
        target = target_environment(plugin, policy, store, note_unusable_repo=not request.python)
        choose_interpreter(target, request.python, policy, interpreters)
    construction = _construct(request, plugin, store, policy, target, checkpoint)
    built = construction.built
    trees, tree_gaps = code_trees(plugin, policy, target) if need_code else ([], [])
    report, base_findings = cross_check_with_bases(
        layout, checkpoint.raw, checkpoint.files, trees, built.model_class if built else None
    )
    findings = [*layout.findings, *base_findings, *(constructed_findings(layout, built) if built else [])]
    gaps = [
        *layout.gaps,
        *checkpoint_gaps(checkpoint.files),
        *target.gaps,
        *construction.gaps,
        *tree_gaps,
        *id_list_gaps(layout.id_lists),
    ]
    return Inspection(
        location=checkpoint.location,
        layout=layout,
        report=report,
        built=built,
        probe_id=construction.probe_id,
        consumers=_consumers(request.consumers_of, trees) if request.consumers_of else [],
        findings=ordered_findings(findings),
        gaps=gaps,
    )
