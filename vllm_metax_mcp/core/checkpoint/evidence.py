"""What the checkpoint tools read: the checkpoint itself (config, index, shard headers), the plugin
repository's environment record with the interpreter it names, and the source trees whose code reads
config fields. inspect_config builds on these steps; plan_trim and trim_model take the whole
`checkpoint_evidence`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundation.errors import ToolFailure
from ..foundation.policy import Policy
from ..foundation.state import StateStore
from ..sources.environment import EnvironmentRecord, RuntimeLocation, check_interpreter, load_record
from ..sources.git import Repository, open_repository
from ..sources.hub import ModelLocation, locate_model
from ..sources.interpreters import Interpreters
from ..sources.subjects import RevisionSubject, Subject, SubjectKind
from .consumers import SourceTree, directory_tree, subject_tree
from .cross_check import CheckpointReport
from .findings import Finding
from .id_bases import cross_check_with_bases
from .id_lists import id_list_gaps
from .layout import Layout, analyse
from .raw_config import load_config
from .safetensors_headers import CheckpointFiles, scan_checkpoint


@dataclass(frozen=True)
class PluginAccess:
    """How the calling tool opens the plugin repository and the subject its arguments name (the tools'
    shared argument helpers do the opening), so core needs no tool arguments."""

    subject: SubjectKind
    open_repo: Callable[[], Repository | None]
    open_subject: Callable[[Repository | None, RuntimeLocation | None], Subject]


@dataclass
class TargetEnvironment:
    """The plugin repository, its environment record (if any) and the interpreter a construction runs in."""

    repo: Repository | None = None
    record: EnvironmentRecord | None = None
    python: Path | None = None
    gaps: list[str] = field(default_factory=list)

    @property
    def runtime(self) -> RuntimeLocation | None:
        return self.record.runtime if self.record else None

    def open_subject(self, plugin: PluginAccess) -> Subject:
        return plugin.open_subject(self.repo, self.runtime)


def target_environment(
    plugin: PluginAccess, policy: Policy, store: StateStore, *, note_unusable_repo: bool = True
) -> TargetEnvironment:
    """The record of the plugin repository, when it opens and has one; its site directories become readable."""
    target = TargetEnvironment()
    try:
        target.repo = plugin.open_repo()
    except ToolFailure as failure:
        if note_unusable_repo:
            target.gaps.append(f"No environment record: plugin_repo is not usable ({failure.message})")
    if target.repo is not None:
        target.record = load_record(store, target.repo)
    if target.record:
        target.record.grant_reads(policy)
    return target


def choose_interpreter(
    target: TargetEnvironment, python: str | None, policy: Policy, interpreters: Interpreters
) -> None:
    """An explicit python (the tool allows it in edit mode only), else the record's; a recorded one that
    cannot run is a gap, not a failure."""
    if python:
        target.python = check_interpreter(python, policy, interpreters, "override").path
    elif target.record:
        try:
            target.python = check_interpreter(target.record.python, policy, interpreters, "record").path
        except ToolFailure as failure:
            target.gaps.append(
                f"The recorded interpreter cannot run ({failure.message}); run environment action=establish again."
            )


# -- the checkpoint ------------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """The model directory as read: where it is, its raw config and layout, its safetensors (if any)."""

    location: ModelLocation
    raw: dict[str, Any]
    layout: Layout
    files: CheckpointFiles | None


def read_checkpoint(policy: Policy, model: str, model_revision: str | None) -> Checkpoint:
    """The model directory becomes a protected path (nothing may be written into it); its config is analysed
    and its index and shard headers read (never tensor data)."""
    location = locate_model(policy, model, model_revision)
    policy.protect(location.path)
    raw = load_config(location.path, policy)
    return Checkpoint(location, raw, analyse(raw), scan_checkpoint(location.path, policy))


def checkpoint_gaps(files: CheckpointFiles | None) -> list[str]:
    if files is None:
        return [
            "No safetensors index or shards in the model directory: layer ids with weights, MTP naming and dtypes "
            "are unverified."
        ]
    if files.missing_shards and len(files.missing_shards) == len(files.shard_names):
        return [
            "Only the index is present (no shard files): names come from its weight_map; dtypes and shapes are unknown."
        ]
    return []


# -- the code that reads config fields -----------------------------------------------------------


def _source_trees(
    plugin: PluginAccess, policy: Policy, target: TargetEnvironment
) -> tuple[list[SourceTree], list[str]]:
    """Upstream vLLM (record), the installed vLLM (probe) and the plugin subject, as far as known."""
    trees: list[SourceTree] = []
    gaps: list[str] = []
    upstream = target.record.upstream if target.record else None
    try:
        if upstream and upstream.kind == "git":
            repo = open_repository(upstream.path, policy)
            trees.append(subject_tree("upstream", RevisionSubject(repo, upstream.commit), "vllm/"))
        elif upstream:
            trees.append(directory_tree("upstream", policy.readable(upstream.path), "vllm"))
    except ToolFailure as failure:
        gaps.append(f"Upstream source not searched: {failure.message}")
    installed_vllm = target.record.probe.package_dir("vllm") if target.record else None
    if installed_vllm:
        package = policy.readable(installed_vllm)
        trees.append(directory_tree("installed_vllm", package.parent, package.name))
    try:
        trees.append(subject_tree("plugin", target.open_subject(plugin), "vllm_metax/"))
    except ToolFailure as failure:
        gaps.append(f"Plugin code not searched: {failure.message}")
    if not trees:
        gaps.append("No source tree is known (no environment record): consumer code was not searched.")
    return trees, gaps


def code_trees(plugin: PluginAccess, policy: Policy, target: TargetEnvironment) -> tuple[list[SourceTree], list[str]]:
    """The source trees consumer code is searched in; none (and a gap) without an environment record."""
    if not target.record:
        return [], ["No environment record: consumer code (upstream, installed vLLM, plugin) was not searched."]
    return _source_trees(plugin, policy, target)


# -- everything plan_trim and trim_model build on ------------------------------------------------


@dataclass
class CheckpointEvidence:
    """The layout inspect_config derives, for the tools that build on it (plan_trim, trim_model)."""

    location: ModelLocation
    raw: dict[str, Any]
    layout: Layout
    files: CheckpointFiles | None
    report: CheckpointReport | None
    trees: list[SourceTree]
    record: EnvironmentRecord | None
    findings: list[Finding]
    gaps: list[str]


def checkpoint_evidence(
    plugin: PluginAccess, policy: Policy, store: StateStore, model: str, model_revision: str | None
) -> CheckpointEvidence:
    """The raw layout cross-checked against the checkpoint's tensor names, id-list bases decided from
    tensors or (with an environment record) consumer code, and the source trees that were searched.
    The model directory becomes a protected path: nothing may be written into it."""
    checkpoint = read_checkpoint(policy, model, model_revision)
    layout = checkpoint.layout
    target = target_environment(plugin, policy, store)
    trees, tree_gaps = code_trees(plugin, policy, target)
    report, findings = cross_check_with_bases(layout, checkpoint.raw, checkpoint.files, trees, None)
    gaps = [
        *layout.gaps,
        *checkpoint_gaps(checkpoint.files),
        *target.gaps,
        *tree_gaps,
        *id_list_gaps(layout.id_lists),
    ]
    return CheckpointEvidence(
        checkpoint.location, checkpoint.raw, layout, checkpoint.files, report, trees, target.record, findings, gaps
    )
