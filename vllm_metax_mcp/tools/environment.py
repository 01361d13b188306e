"""Tool `environment`: probe, record and confirm what an upgrade or review runs against."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.foundation.errors import ErrorCode, ToolFailure, bad_input
from ..core.foundation.policy import Effect
from ..core.sources.environment import (
    ConfirmedBy,
    EnvironmentRecord,
    EstablishRequest,
    UpstreamMapping,
    check_interpreter,
    confirm_record,
    establish_record,
    load_record,
    resolve_upstream,
)
from ..core.sources.git import Repository
from .arguments import SubjectArgs, open_plugin_repo, open_plugin_subject
from .spec import NextCall, ToolEnv, ToolOutput, ToolSpec


class EnvironmentInput(SubjectArgs):
    action: Literal["show", "establish", "confirm"] = Field(default="show", description="establish probes.")
    upstream: str | None = None
    target: str | None = None
    python: str | None = Field(default=None, description="establish: allowed interpreter.")


class ModuleReport(BaseModel):
    version: str | None = None
    origin: str | None = None
    error: str | None = None


class Distribution(BaseModel):
    name: str
    version: str


class Plugin(BaseModel):
    name: str
    value: str


class EnvironmentOutput(ToolOutput):
    action: str
    record_exists: bool = False
    record_id: str | None = Field(
        default=None, description="Read the full record as resource vllm-metax://environments/{record_id}."
    )
    subject: str | None = None
    subject_tree_hash: str | None = None
    subject_drifted: bool | None = Field(
        default=None, description="True when the subject changed since the record was made."
    )
    upstream: dict[str, Any] | None = None
    python: str | None = None
    python_accepted: Literal["operator", "server_interpreter", "path_default", "inside_roots"] | None = Field(
        default=None,
        description="Why the server runs this interpreter: operator (serve --python), server_interpreter or "
        "path_default (the defaults without --python), inside_roots (named by a call, edit mode).",
    )
    python_version: str | None = None
    modules: dict[str, ModuleReport] = Field(default_factory=dict)
    distributions: list[Distribution] = Field(default_factory=list)
    platform_plugins: list[Plugin] = Field(default_factory=list)
    general_plugins: list[Plugin] = Field(default_factory=list)
    plugins_filter: str | None = Field(default=None, description="VLLM_PLUGINS as the probe saw it (None: all load).")
    runtime_source: Literal["reviewed_repository", "other_copy", "not_importable"] | None = None
    instruction_files: list[str] = Field(default_factory=list, description="Read these before changing anything.")
    probe_id: str | None = None
    confirmed: bool = False
    confirmed_by: Literal["user", "caller"] | None = None
    note: str = Field(default="", description="What the record means for the next calls.")


def _output(
    action: str, record: EnvironmentRecord, args: EnvironmentInput, env: ToolEnv, drifted: bool | None = None
) -> EnvironmentOutput:
    report = record.probe
    confirmation = record.confirmation
    step = None
    if record.upstream is None:
        note = "No upstream recorded: analysis tools need one (establish with upstream); trim and smoke do not."
    elif confirmation:
        note = "The target is confirmed; recording tools may use it."
    else:
        note = "Ask the user to confirm the upstream and target, then make next_step."
        upstream = {"upstream": env.policy.display(record.upstream.path), "target": record.upstream.target}
        arguments = {"plugin_repo": args.plugin_repo, "action": "confirm"} | {k: v for k, v in upstream.items() if v}
        step = NextCall(tool="environment", arguments=arguments, why="record the user's confirmation of the target")
    return EnvironmentOutput(
        action=action,
        record_exists=True,
        record_id=record.record_id,
        subject=record.subject,
        subject_tree_hash=record.subject_tree_hash,
        subject_drifted=drifted,
        upstream=record.upstream.as_dict() if record.upstream else None,
        python=record.python,
        python_accepted=record.python_accepted.reason if record.python_accepted else None,
        python_version=report.python.version,
        modules={
            name: ModuleReport(version=m.version, origin=m.origin, error=m.error) for name, m in report.modules.items()
        },
        distributions=[Distribution(name=d.name, version=d.version) for d in report.distributions or ()],
        platform_plugins=[Plugin(name=e.name, value=e.value) for e in report.plugin_group("vllm.platform_plugins")],
        general_plugins=[Plugin(name=e.name, value=e.value) for e in report.plugin_group("vllm.general_plugins")],
        plugins_filter=report.vllm_plugins_filter,
        runtime_source=record.runtime_source,
        instruction_files=list(record.instruction_files),
        probe_id=record.probe_id,
        confirmed=confirmation is not None,
        confirmed_by=confirmation.confirmed_by if confirmation else None,
        note=note,
        next_step=step,
    )


def _establish(args: EnvironmentInput, env: ToolEnv) -> EnvironmentOutput:
    repo = open_plugin_repo(args, env)
    if repo is None:
        raise bad_input("establish needs the plugin git repository (subject worktree, index, revision or installed).")
    mapping = resolve_upstream(env.policy, args.upstream, args.target) if args.upstream else None
    accepted = check_interpreter(args.python or env.interpreters.default(), env.policy, env.interpreters, "establish")
    request = EstablishRequest(repo, args.subject, args.revision, mapping, accepted)
    record = establish_record(env.store, request, lambda installed: open_plugin_subject(args, env, repo, installed))
    return _output("establish", record, args, env)


def _recorded(args: EnvironmentInput, env: ToolEnv) -> tuple[Repository, EnvironmentRecord]:
    repo = open_plugin_repo(args, env)
    record = load_record(env.store, repo) if repo else None
    if repo is None or record is None:
        raise ToolFailure(
            ErrorCode.NOT_FOUND, "No environment record for this repository: call action=establish first."
        )
    return repo, record


def confirmation_question(args: BaseModel, env: ToolEnv) -> str | None:
    """The question put to the user (through elicitation) before a confirm is recorded."""
    if not isinstance(args, EnvironmentInput) or args.action != "confirm":
        return None
    try:
        _, record = _recorded(args, env)
        upstream = _check_names_record(args, env, record)
    except ToolFailure:
        return None  # the tool itself refuses with the precise reason
    target = f" at {upstream.target} ({upstream.target_commit[:12]})" if upstream.target_commit else ""
    return f"Use {upstream.path}{target} as the upstream vLLM target for {record.plugin_repo}?"


def _check_names_record(args: EnvironmentInput, env: ToolEnv, record: EnvironmentRecord) -> UpstreamMapping:
    upstream = record.upstream
    if upstream is None:
        raise bad_input("The record has no upstream to confirm: establish with upstream (and target) first.")
    if not args.upstream:
        raise bad_input("confirm must name the upstream (and target) it confirms.")
    named: UpstreamMapping = resolve_upstream(env.policy, args.upstream, args.target)
    if not named.same_as(upstream):
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "confirm names a different upstream or target than the record holds; establish that mapping first, "
            "or confirm the recorded one.",
        )
    return upstream


def _confirm(args: EnvironmentInput, env: ToolEnv) -> EnvironmentOutput:
    repo, record = _recorded(args, env)
    upstream = _check_names_record(args, env, record)
    if env.user_answer == "declined":
        output = _output("confirm", record, args, env)
        output.note, output.next_step = "The user declined: establish the upstream and target they want.", None
        return output
    confirmed_by: ConfirmedBy = "user" if env.user_answer == "accepted" else "caller"
    return _output("confirm", confirm_record(env.store, repo, record, upstream, confirmed_by), args, env)


def _show(args: EnvironmentInput, env: ToolEnv) -> EnvironmentOutput:
    repo = open_plugin_repo(args, env)
    record = load_record(env.store, repo) if repo else None
    if record is None:
        establish = {"plugin_repo": args.plugin_repo, "action": "establish"}
        why = "probe and record the environment (add upstream, target and python as needed)"
        return EnvironmentOutput(action="show", next_step=NextCall(tool="environment", arguments=establish, why=why))
    record.grant_reads(env.policy)
    current = open_plugin_subject(
        args.model_copy(update={"subject": record.subject_kind, "revision": record.revision}), env, repo
    )
    return _output("show", record, args, env, drifted=current.tree_hash() != record.subject_tree_hash)


def environment(args: EnvironmentInput, env: ToolEnv) -> EnvironmentOutput:
    """Show, establish (one isolated probe) or confirm (the user's yes to upstream and target) the
    environment record. Call first."""
    if args.python and args.action != "establish":
        raise bad_input("python is only taken by action=establish.")
    if args.action == "show" and (args.upstream or args.target):
        raise bad_input("show reads the record: upstream and target are taken by establish and confirm.")
    if args.target and not args.upstream:
        raise bad_input("target names a revision of upstream: pass upstream with it.")
    if args.action == "establish":
        return _establish(args, env)
    if args.action == "confirm":
        return _confirm(args, env)
    return _show(args, env)


SPEC = ToolSpec(
    name="environment",
    effect=Effect.READS,
    run=environment,
    input_model=EnvironmentInput,
    output_model=EnvironmentOutput,
    title="Environment record",
    idempotent=False,
    question=confirmation_question,
)
