"""The environment record: what interpreter, packages, plugin repository and upstream target a
review or upgrade runs against — probed once, confirmed once, reused while unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ..foundation.errors import ErrorCode, ToolFailure, bad_input, not_found
from ..foundation.isolated import run_isolated
from ..foundation.policy import Policy, is_within, real
from ..foundation.results import digest
from ..foundation.state import StateStore
from ..target import script_source
from .git import Repository, open_repository
from .interpreters import AcceptedInterpreter, Interpreters, Source
from .subjects import Subject, SubjectKind

PROBE_MARKER = "@@PROBE@@"
INSTRUCTION_FILE_NAMES = frozenset({"agents.md", "claude.md", "contributing.md", "copilot-instructions.md"})


# -- the probe -------------------------------------------------------------------------------


def check_interpreter(
    python: str, policy: Policy, interpreters: Interpreters, source: Source = "override"
) -> AcceptedInterpreter:
    """The interpreter chokepoint: the operator's allowed set (core/sources/interpreters.py) decides, for the
    policy's mode and roots, whether `python` may run when `source` asks ("override": a tool's python
    argument; "establish"; "record": an environment record). Returns the path to run and the reason."""
    return interpreters.accept(policy, python, source)


def run_probe(python: Path, store: StateStore, pythonpath: list[Path] | None = None) -> tuple[str, ProbeReport]:
    """Import torch, vllm, vllm_metax and transformers in the target interpreter, in isolation.

    The probe runs from an empty directory with devices hidden and bytecode writing off, in its
    own process group that is killed at the deadline. Returns (probe_id, report).
    """
    script = script_source("probe")
    report = run_isolated(python, script, PROBE_MARKER, what="probe", pythonpath=pythonpath)
    report["pythonpath"] = [str(p) for p in pythonpath or []]
    probe_id = f"p-{digest(report)}"
    store.write(f"probes/{probe_id}.json", report)
    return probe_id, ProbeReport.from_json(report)


def runtime_package_dir(report: ProbeReport, package: str = "vllm_metax") -> Path | None:
    """Where the target interpreter imports `package` from (resolved), or None when it cannot."""
    module = report.module(package)
    if module.package_dirs:
        return real(module.package_dirs[0])
    return real(module.origin).parent if module.origin else None


def runtime_location(report: ProbeReport) -> RuntimeLocation:
    package_dir = runtime_package_dir(report)
    return RuntimeLocation(str(package_dir) if package_dir else None, report.python.site_dirs)


def runtime_source(report: ProbeReport, repo: Repository | None) -> RuntimeSource:
    """Whether the runtime imports vllm_metax from the repository under review or another copy."""
    package_dir = runtime_package_dir(report)
    if package_dir is None:
        return "not_importable"
    if repo is not None and not repo.bare and is_within(package_dir, repo.top):
        return "reviewed_repository"
    return "other_copy"


def instruction_files(subject: Subject) -> list[str]:
    """Repository instructions an agent must read before changing anything."""
    found = []
    for path in subject.list():
        name = path.rsplit("/", 1)[-1].lower()
        if name in INSTRUCTION_FILE_NAMES or (
            path.lower().startswith("docs/") and "develop" in name and name.endswith((".md", ".rst"))
        ):
            found.append(path)
    return found


# -- the upstream mapping --------------------------------------------------------------------


UpstreamKind = Literal["git", "directory"]
"""A git repository with a target revision, or a plain source directory (no revisions)."""


@dataclass(frozen=True)
class UpstreamMapping:
    path: str
    kind: UpstreamKind
    target: str | None
    target_commit: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "target": self.target, "target_commit": self.target_commit}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpstreamMapping:
        return cls(data["path"], data["kind"], data.get("target"), data.get("target_commit"))

    @property
    def commit(self) -> str:
        """The target commit of a git upstream (a plain directory has no revisions)."""
        if self.target_commit is None:
            raise bad_input("The upstream is a plain directory: it has no revisions.")
        return self.target_commit

    def same_as(self, other: UpstreamMapping | None) -> bool:
        return other is not None and other.path == self.path and other.target_commit == self.target_commit


def resolve_upstream(policy: Policy, upstream: str, target: str | None) -> UpstreamMapping:
    """An upstream git repository plus a target revision, or a plain source directory."""
    location = policy.readable(upstream)
    if not location.is_dir():
        raise not_found(f"upstream {upstream} is not a directory.")
    policy.protect(location)
    if (location / ".git").exists() or (location / "HEAD").is_file():
        repo = open_repository(location, policy)
        if not target:
            raise bad_input("upstream is a git repository: pass target (the upstream revision to upgrade to).")
        return UpstreamMapping(str(location), "git", target, repo.resolve_commit(target))
    if target:
        raise bad_input("upstream is a plain directory, which has no revisions: omit target.")
    if not (location / "vllm").is_dir():
        raise bad_input(f"upstream {upstream} has no vllm/ package; pass the directory that contains vllm/.")
    return UpstreamMapping(str(location), "directory", None, None)


# -- the record ------------------------------------------------------------------------------
# Typed here, stored as JSON in the state directory: `from_json` reads what any earlier server wrote
# (keys added since then are optional), `to_json` writes the same shape.

RuntimeSource = Literal["reviewed_repository", "other_copy", "not_importable"]
"""Where the target interpreter imports vllm_metax from: the repository under review, another copy, nowhere."""

ConfirmedBy = Literal["user", "caller"]
"""Who confirmed the upstream target: the user (asked through elicitation) or the calling agent."""


@dataclass(frozen=True)
class ModuleProbe:
    """One probed import: its version, file and package directories, or why it failed."""

    version: str | None = None
    origin: str | None = None
    package_dirs: tuple[str, ...] = ()
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleProbe:
        return cls(data.get("version"), data.get("origin"), tuple(data.get("package_dirs") or ()), data.get("error"))

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        return {"version": self.version, "origin": self.origin, "package_dirs": list(self.package_dirs)}


@dataclass(frozen=True)
class PythonProbe:
    """The target interpreter itself."""

    version: str | None = None
    executable: str | None = None
    prefix: str | None = None
    site_dirs: tuple[str, ...] = ()
    sys_path: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PythonProbe:
        return cls(
            data.get("version"),
            data.get("executable"),
            data.get("prefix"),
            tuple(data.get("site_dirs") or ()),
            tuple(data.get("sys_path") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "executable": self.executable,
            "prefix": self.prefix,
            "site_dirs": list(self.site_dirs),
            "sys_path": list(self.sys_path),
        }


@dataclass(frozen=True)
class InstalledDistribution:
    name: str
    version: str


@dataclass(frozen=True)
class PluginEntryPoint:
    name: str
    value: str


@dataclass(frozen=True)
class ProbeReport:
    """What the probe script (core/target/probe.py) printed, plus the path it ran with.

    `distributions` and `plugins` are None when reading package metadata failed (`metadata_error`)."""

    python: PythonProbe
    vllm_plugins_filter: str | None
    modules: Mapping[str, ModuleProbe]
    distributions: tuple[InstalledDistribution, ...] | None = None
    plugins: Mapping[str, tuple[PluginEntryPoint, ...]] | None = None
    metadata_error: str | None = None
    pythonpath: tuple[str, ...] = ()

    def module(self, name: str) -> ModuleProbe:
        return self.modules.get(name) or ModuleProbe()

    def package_dir(self, name: str) -> str | None:
        """The first package directory of a probed module, as the target interpreter named it."""
        dirs = self.module(name).package_dirs
        return dirs[0] if dirs else None

    def plugin_group(self, group: str) -> tuple[PluginEntryPoint, ...]:
        return (self.plugins or {}).get(group, ())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeReport:
        distributions = data.get("distributions")
        plugins = data.get("plugins")
        return cls(
            python=PythonProbe.from_json(data.get("python") or {}),
            vllm_plugins_filter=data.get("vllm_plugins_filter"),
            modules={name: ModuleProbe.from_json(m or {}) for name, m in (data.get("modules") or {}).items()},
            distributions=None
            if distributions is None
            else tuple(InstalledDistribution(d["name"], d["version"]) for d in distributions),
            plugins=None
            if plugins is None
            else {group: tuple(PluginEntryPoint(e["name"], e["value"]) for e in eps) for group, eps in plugins.items()},
            metadata_error=data.get("metadata_error"),
            pythonpath=tuple(data.get("pythonpath") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "python": self.python.to_json(),
            "vllm_plugins_filter": self.vllm_plugins_filter,
            "modules": {name: m.to_json() for name, m in self.modules.items()},
        }
        if self.distributions is not None:
            data["distributions"] = [{"name": d.name, "version": d.version} for d in self.distributions]
        if self.plugins is not None:
            data["plugins"] = {
                group: [{"name": e.name, "value": e.value} for e in eps] for group, eps in self.plugins.items()
            }
        if self.metadata_error is not None:
            data["metadata_error"] = self.metadata_error
        data["pythonpath"] = list(self.pythonpath)
        return data


@dataclass(frozen=True)
class RuntimeLocation:
    """Where the target interpreter's vllm_metax lives (the `installed` subject) and its site directories."""

    package_dir: str | None
    site_dirs: tuple[str, ...]

    def grant_reads(self, policy: Policy) -> None:
        """The interpreter's site directories become readable (installed packages are read there)."""
        for site in self.site_dirs:
            policy.allow_read(site)


@dataclass(frozen=True)
class Confirmation:
    upstream: UpstreamMapping
    confirmed_by: ConfirmedBy
    confirmed_at: float

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Confirmation:
        return cls(UpstreamMapping.from_json(data["upstream"]), data["confirmed_by"], data["confirmed_at"])

    def to_json(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream.as_dict(),
            "confirmed_by": self.confirmed_by,
            "confirmed_at": self.confirmed_at,
        }


@dataclass(frozen=True)
class EnvironmentRecord:
    """What a review or upgrade of one plugin repository runs against (stored per repository)."""

    plugin_repo: str
    subject: str
    subject_kind: SubjectKind
    revision: str | None
    subject_tree_hash: str
    upstream: UpstreamMapping | None
    python: str
    python_accepted: AcceptedInterpreter | None
    probe_id: str
    probe: ProbeReport
    site_dirs: tuple[str, ...]
    runtime_package_dir: str | None
    runtime_source: RuntimeSource
    instruction_files: tuple[str, ...]
    confirmation: Confirmation | None
    established_at: float
    record_id: str | None

    @property
    def runtime(self) -> RuntimeLocation:
        return RuntimeLocation(self.runtime_package_dir, self.site_dirs)

    def grant_reads(self, policy: Policy) -> None:
        self.runtime.grant_reads(policy)

    def confirmed(self, confirmation: Confirmation) -> EnvironmentRecord:
        return replace(self, confirmation=confirmation)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EnvironmentRecord:
        accepted = data.get("python_accepted")
        upstream = data.get("upstream")
        confirmation = data.get("confirmation")
        return cls(
            plugin_repo=data["plugin_repo"],
            subject=data["subject"],
            subject_kind=SubjectKind(data["subject_kind"]),
            revision=data.get("revision"),
            subject_tree_hash=data["subject_tree_hash"],
            upstream=UpstreamMapping.from_json(upstream) if upstream else None,
            python=data["python"],
            python_accepted=AcceptedInterpreter(Path(accepted["path"]), accepted["reason"]) if accepted else None,
            probe_id=data["probe_id"],
            probe=ProbeReport.from_json(data.get("probe") or {}),
            site_dirs=tuple(data.get("site_dirs") or ()),
            runtime_package_dir=data.get("runtime_package_dir"),
            runtime_source=data["runtime_source"],
            instruction_files=tuple(data.get("instruction_files") or ()),
            confirmation=Confirmation.from_json(confirmation) if confirmation else None,
            established_at=data.get("established_at", 0.0),
            record_id=data.get("record_id"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin_repo": self.plugin_repo,
            "subject": self.subject,
            "subject_kind": self.subject_kind.value,
            "revision": self.revision,
            "subject_tree_hash": self.subject_tree_hash,
            "upstream": self.upstream.as_dict() if self.upstream else None,
            "python": self.python,
            "python_accepted": self.python_accepted.as_record() if self.python_accepted else None,
            "probe_id": self.probe_id,
            "probe": self.probe.to_json(),
            "site_dirs": list(self.site_dirs),
            "runtime_package_dir": self.runtime_package_dir,
            "runtime_source": self.runtime_source,
            "instruction_files": list(self.instruction_files),
            "confirmation": self.confirmation.to_json() if self.confirmation else None,
            "established_at": self.established_at,
            "record_id": self.record_id,
        }


def record_id(repo: Repository) -> str:
    return digest(repo.key, 16)


def record_key(repo: Repository) -> str:
    return f"environments/{record_id(repo)}.json"


def load_record(store: StateStore, repo: Repository) -> EnvironmentRecord | None:
    """The stored record, or None; a record that is not one this server can read (edited by hand, cut
    short) is a precise failure saying how to make a new one."""
    data = store.read(record_key(repo))
    if data is None:
        return None
    try:
        return EnvironmentRecord.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problem = f"no {exc.args[0]!r} entry" if isinstance(exc, KeyError) else type(exc).__name__
        raise ToolFailure(
            ErrorCode.FAILED,
            f"The environment record of this plugin repository cannot be read ({problem}); make a new one with "
            "environment(action=establish, ...), then confirm it.",
        ) from None


def save_record(store: StateStore, repo: Repository, record: EnvironmentRecord) -> None:
    store.write(record_key(repo), record.to_json())


def carry_confirmation(previous: EnvironmentRecord | None, mapping: UpstreamMapping | None) -> Confirmation | None:
    """An unchanged upstream mapping keeps its confirmation; a changed one must be confirmed again."""
    if previous is None or mapping is None:
        return None
    confirmation = previous.confirmation
    if confirmation and mapping.same_as(confirmation.upstream):
        return confirmation
    return None


def confirmation_for(mapping: UpstreamMapping, confirmed_by: ConfirmedBy) -> Confirmation:
    return Confirmation(mapping, confirmed_by, time.time())


def require_confirmed_target(record: EnvironmentRecord | None, override: UpstreamMapping | None = None) -> Confirmation:
    """Recording a decision needs a confirmed upstream target (and an override must be the confirmed one)."""
    if record is None:
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "No environment record: call environment action=establish, then action=confirm.",
        )
    confirmation = record.confirmation
    upstream = record.upstream
    if not confirmation or not upstream or not upstream.same_as(confirmation.upstream):
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "The upstream target is not confirmed: call environment action=confirm naming the recorded upstream "
            "and target.",
        )
    if override is not None and not override.same_as(confirmation.upstream):
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "This call names a different upstream or target than the confirmed one: establish and confirm it first.",
        )
    return confirmation


@dataclass(frozen=True)
class EstablishRequest:
    """What an establish call names: the plugin repository and subject, the upstream, the accepted interpreter."""

    repo: Repository
    subject_kind: SubjectKind
    revision: str | None
    upstream: UpstreamMapping | None
    interpreter: AcceptedInterpreter


def establish_record(
    store: StateStore, request: EstablishRequest, open_subject: Callable[[RuntimeLocation], Subject]
) -> EnvironmentRecord:
    """Probe the interpreter once, open the subject (`installed` is where the probe found the plugin), and
    store the new record; an unchanged upstream keeps its confirmation."""
    repo = request.repo
    probe_id, report = run_probe(request.interpreter.path, store)
    installed = runtime_location(report)
    subject = open_subject(installed)
    try:
        previous = load_record(store, repo)
    except ToolFailure:  # an unreadable record is what establish replaces; it confirms nothing
        previous = None
    record = EnvironmentRecord(
        plugin_repo=str(repo.top),
        subject=subject.label,
        subject_kind=request.subject_kind,
        revision=request.revision,
        subject_tree_hash=subject.tree_hash(),
        upstream=request.upstream,
        python=str(request.interpreter.path),
        python_accepted=request.interpreter,
        probe_id=probe_id,
        probe=report,
        site_dirs=installed.site_dirs,
        runtime_package_dir=installed.package_dir,
        runtime_source=runtime_source(report, repo),
        instruction_files=tuple(instruction_files(subject)),
        confirmation=carry_confirmation(previous, request.upstream),
        established_at=time.time(),
        record_id=record_id(repo),
    )
    save_record(store, repo, record)
    return record


def confirm_record(
    store: StateStore, repo: Repository, record: EnvironmentRecord, upstream: UpstreamMapping, by: ConfirmedBy
) -> EnvironmentRecord:
    """Record the confirmation of the record's upstream and target, and store it."""
    confirmed = record.confirmed(confirmation_for(upstream, by))
    save_record(store, repo, confirmed)
    return confirmed
