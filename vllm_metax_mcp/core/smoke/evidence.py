"""What a smoke run records: the evidence in the state directory (`smoke/<run_id>/evidence.json`), the
records beside it, what the server log shows, and the tool's output made from the evidence."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .answers import RequestRecord
from .devices import Occupancy
from .drafts import DraftCounts
from .plan import SubjectExport
from .processes import Teardown

LOG_TAIL_LINES = 40
LOG_TAIL_CHARS = 4000
LOG_READ_BYTES = 512 * 1024
MAX_ERRORS = 10
MAX_REQUESTS_IN_OUTPUT = 24
OUTPUT_CHARS = 19_000
"""The most the output may hold (compact JSON), below RESULT_BUDGET for the job wrapper and result id."""
LOG_PREFIX = re.compile(r"^\([^)]*\)\s+[A-Z]+\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s*")
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b:?")
NOISE = ("Route: ", " - leaked ", "nanobind: ", " - ... skipped remainder")

Verdict = Literal["passed", "failed", "blocked"]

OUTPUT_FIELDS = (
    "run_id",
    "verdict",
    "reasons",
    "notes",
    "command",
    "equivalent_command",
    "entry",
    "env_delta",
    "devices",
    "drafts",
    "versions",
    "import_origins",
    "subject",
    "startup_s",
    "log_tail",
    "errors",
    "evidence_path",
    "teardown",
    "manifest_sha256",
    "load_validated",
    "model_fingerprint",
    "cases_source",
    "python",
)
"""The evidence the output shows (requests apart, which it bounds)."""


@dataclass
class DeviceEvidence:
    """What the run saw of the accelerators, and what it chose."""

    occupancy: Occupancy
    needed: int
    requested: list[int] | None
    selected: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The occupancy (what answered, the devices and their processes) and the choice, without empty keys."""
        choice = {"needed": self.needed, "requested": self.requested or None, "selected": self.selected or None}
        return {**self.occupancy.as_dict(), **without_unset(choice)}


@dataclass(frozen=True)
class EnvDelta:
    """How the server's environment differs from the worker's."""

    set: dict[str, str]
    """Set for the run (the marker apart)."""
    removed: list[str]
    marker: str


@dataclass(frozen=True)
class ModuleOrigin:
    """Where the server imported a module from (its report's view)."""

    loaded: bool | None = None
    origin: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class SubjectEvidence(SubjectExport):
    used: bool
    """The server imported vllm_metax from the exported snapshot."""
    plugin_origin: str | None


@dataclass(frozen=True)
class ServerRecord:
    """`smoke/<run_id>/server.json`: the launched server, written as soon as it runs."""

    pid: int
    pgid: int
    marker: str
    job_id: str | None
    port: int
    started_at: float
    leader_start_ticks: int | None = None
    """The leader's start time (processes.start_ticks): its group is the run's only while this matches."""


@dataclass(frozen=True)
class TrimValidation:
    """`validations/<manifest sha256>.json`: a passed run with real weights validated this trim's load."""

    manifest_sha256: str
    run_id: str
    load_format: str
    evidence_path: str
    finished_at: float


@dataclass(frozen=True)
class LogSummary:
    tail: str
    """The end of the log, without noise."""
    errors: list[str]
    """Its exception lines, each once."""


@dataclass
class SmokeEvidence:
    """The evidence record of one run; fields stay empty where the run did not get that far."""

    run_id: str
    model: str
    load_format: str
    cases_source: str
    manifest_sha256: str | None
    model_fingerprint: str
    python: str
    started_at: float
    job_id: str | None
    notes: list[str]
    reasons: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    devices: DeviceEvidence | None = None
    short_tmpdir: str | None = None
    command: list[str] | None = None
    env_delta: EnvDelta | None = None
    port: int | None = None
    startup_s: float | None = None
    requests: list[RequestRecord] = field(default_factory=list)
    teardown: Teardown | None = None
    entry: dict[str, str] | None = None
    equivalent_command: list[str] | None = None
    python_version: str | None = None
    versions: dict[str, str | None] | None = None
    import_origins: dict[str, ModuleOrigin] | None = None
    subject: SubjectEvidence | None = None
    log_tail: str | None = None
    errors: list[str] | None = None
    finished_at: float | None = None
    evidence_path: str | None = None
    load_validated: bool | None = None
    drafts: DraftCounts | None = None

    def to_json(self) -> dict[str, Any]:
        """The stored record: what the run got to, with no key for what it did not (an agent pays for
        every null); request entries and import origins likewise name only what was found."""
        record = without_unset(asdict(self))
        record["devices"] = self.devices.to_json() if self.devices else None
        record["requests"] = [without_unset(asdict(r)) for r in self.requests]
        if self.import_origins is not None:
            record["import_origins"] = {name: without_unset(asdict(o)) for name, o in self.import_origins.items()}
        return without_unset(record)


def without_unset(record: dict[str, Any]) -> dict[str, Any]:
    """`record` without its None-valued keys."""
    return {key: value for key, value in record.items() if value is not None}


def read_log(path: Path) -> LogSummary:
    """The tail of the server log without noise, and the error lines in it."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - LOG_READ_BYTES))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return LogSummary("", [])
    lines = [line for line in text.splitlines() if line.strip() and not any(n in line for n in NOISE)]
    tail = "\n".join(lines[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]
    errors: list[str] = []
    for line in lines:
        message = LOG_PREFIX.sub("", line).strip()
        if EXCEPTION_LINE.match(message) and message[:300] not in errors:
            errors.append(message[:300])
    return LogSummary(tail, errors[:MAX_ERRORS])


def output_of(evidence: SmokeEvidence) -> dict[str, Any]:
    """The tool's output: the evidence less what only the record needs, with requests bounded by count and by
    size (failed ones first; the record holds them all), and the call to make after a failure."""
    requests = evidence.requests
    shown = requests
    if len(requests) > MAX_REQUESTS_IN_OUTPUT:
        failed = [r for r in requests if not r.ok]
        shown = (failed + [r for r in requests if r.ok and r.mode == "first"])[:MAX_REQUESTS_IN_OUTPUT]
    record = evidence.to_json()
    output = {name: record[name] for name in OUTPUT_FIELDS if name in record}
    output["requests_total"] = len(requests)
    if evidence.verdict == "failed":
        output["next_step"] = {
            "tool": "inspect_config",
            "arguments": {"model": evidence.model},
            "why": "the server failed (see reasons, errors, log_tail): check the layout vLLM builds from this model",
        }
    room = OUTPUT_CHARS - len(json.dumps(output, separators=(",", ":"), default=str))
    output["requests"] = []
    for entry in (without_unset(asdict(r)) for r in shown):
        room -= len(json.dumps(entry, separators=(",", ":"), default=str)) + 1
        if room < 0:
            break
        output["requests"].append(entry)
    return output
