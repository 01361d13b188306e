"""The environment record: what interpreter, packages, plugin repository and upstream target a
review or upgrade runs against — probed once, confirmed once, reused while unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..foundation.errors import ErrorCode, ToolFailure, bad_input, not_found
from ..foundation.isolated import run_isolated
from ..foundation.policy import Policy, is_within, real
from ..foundation.results import digest
from ..foundation.state import StateStore
from ..target import script_source
from .git import Repository, open_repository
from .interpreters import AcceptedInterpreter, Interpreters, Source
from .subjects import Subject

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


def run_probe(python: Path, store: StateStore, pythonpath: list[Path] | None = None) -> tuple[str, dict[str, Any]]:
    """Import torch, vllm, vllm_metax and transformers in the target interpreter, in isolation.

    The probe runs from an empty directory with devices hidden and bytecode writing off, in its
    own process group that is killed at the deadline. Returns (probe_id, report).
    """
    script = script_source("probe")
    report = run_isolated(python, script, PROBE_MARKER, what="probe", pythonpath=pythonpath)
    report["pythonpath"] = [str(p) for p in pythonpath or []]
    probe_id = f"p-{digest(report)}"
    store.write(f"probes/{probe_id}.json", report)
    return probe_id, report


def runtime_package_dir(report: dict[str, Any], package: str = "vllm_metax") -> Path | None:
    module = report.get("modules", {}).get(package, {})
    dirs = module.get("package_dirs") or []
    if dirs:
        return real(dirs[0])
    origin = module.get("origin")
    return real(origin).parent if origin else None


def runtime_source(report: dict[str, Any], repo: Repository | None) -> str:
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


@dataclass(frozen=True)
class UpstreamMapping:
    path: str
    kind: str  # "git" | "directory"
    target: str | None
    target_commit: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "target": self.target, "target_commit": self.target_commit}

    def same_as(self, other: dict[str, Any] | None) -> bool:
        return bool(other) and other.get("path") == self.path and other.get("target_commit") == self.target_commit


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


def record_id(repo: Repository) -> str:
    return digest(repo.key, 16)


def record_key(repo: Repository) -> str:
    return f"environments/{record_id(repo)}.json"


def load_record(store: StateStore, repo: Repository) -> dict[str, Any] | None:
    return store.read(record_key(repo))


def save_record(store: StateStore, repo: Repository, record: dict[str, Any]) -> None:
    store.write(record_key(repo), record)


def carry_confirmation(previous: dict[str, Any] | None, mapping: UpstreamMapping | None) -> dict[str, Any] | None:
    """An unchanged upstream mapping keeps its confirmation; a changed one must be confirmed again."""
    if previous is None or mapping is None:
        return None
    confirmation = previous.get("confirmation")
    if confirmation and mapping.same_as(confirmation.get("upstream")):
        return confirmation
    return None


def confirmation_for(mapping: dict[str, Any], confirmed_by: str) -> dict[str, Any]:
    return {"upstream": mapping, "confirmed_by": confirmed_by, "confirmed_at": time.time()}


def require_confirmed_target(record: dict[str, Any] | None, override: UpstreamMapping | None = None) -> dict[str, Any]:
    """Recording a decision needs a confirmed upstream target (and an override must be the confirmed one)."""
    if record is None:
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "No environment record: call environment action=establish, then action=confirm.",
        )
    confirmation = record.get("confirmation")
    upstream = record.get("upstream")
    if not confirmation or not upstream or not UpstreamMapping(**upstream).same_as(confirmation.get("upstream")):
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "The upstream target is not confirmed: call environment action=confirm naming the recorded upstream and target.",
        )
    if override is not None and not override.same_as(confirmation["upstream"]):
        raise ToolFailure(
            ErrorCode.TARGET_UNCONFIRMED,
            "This call names a different upstream or target than the confirmed one: establish and confirm it first.",
        )
    return confirmation
