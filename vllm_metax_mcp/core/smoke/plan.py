"""The smoke job's payload, `SmokePlan`, and how a call becomes one: the cases chosen (inline, a case file,
a batched_test entry, or the defaults), the model and the settings checked, every launch value
allow-listed (`launch_rules.py`), the run directory made and the subject exported into it.

Everything that can refuse the call does so before anything is written, in the order below; the plan
then holds only resolved, checked paths and values.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundation.atomic import TRIM_MANIFEST
from ..foundation.errors import ToolFailure, bad_input, not_found
from ..foundation.policy import Policy
from ..foundation.results import digest
from ..foundation.safe_load import load_json_bounded
from ..foundation.state import StateStore
from ..sources.subjects import Subject, SubjectKind
from ..trim.cases import (
    FILE_NAME,
    BatchedModel,
    ServeSettings,
    SmokeCase,
    default_cases,
    parse_cases,
    read_case_file,
)
from .launch_rules import OwnedSettings, check_env, check_json_value, check_serve_args, lift_owned_args

_RAY_ADDRESS = re.compile(r"^(auto|[A-Za-z0-9.\-]+:\d{1,5})$")


@dataclass(frozen=True)
class SmokeRequest:
    """What the caller asked for: the tool's inputs less the interpreter and the subject."""

    model: str | None
    load_format: str | None
    tp: int | None
    pp: int | None
    dp: int | None
    ep: int | None
    max_model_len: int | None
    gpu_memory_utilization: float | None
    extra_args: list[str]
    env: dict[str, str]
    cases: list[dict[str, Any]] | str | None
    batched_model: str | None
    devices: list[int] | None
    trust_remote_code: bool
    speculative_config: dict[str, Any] | None
    ray_address: str | None
    timeout_s: int


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    """vLLM's expert parallel size: 1, or tp*dp (--enable-expert-parallel)."""

    @property
    def devices(self) -> int:
        """The devices one server takes."""
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class SubjectExport:
    """The snapshot exported into the run directory and put first on the server's PYTHONPATH."""

    kind: SubjectKind
    label: str
    tree_hash: str
    files: int
    export_dir: str


@dataclass(frozen=True)
class ModelIdentity:
    """Which model directory was served, and whether this run can validate a real-weight trim's load."""

    fingerprint: str
    """A digest of the directory's file names and sizes and its config.json."""
    manifest_sha256: str | None
    """sha256 of its trim_manifest.json, if any."""
    validates_trim: bool


@dataclass(frozen=True)
class SmokePlan:
    """The job's payload: one checked smoke test, every path resolved and every value allow-listed."""

    run_id: str
    run_dir: Path
    state_dir: Path
    python: str
    model: Path
    model_label: str
    """The model as the caller named it (shown in the evidence)."""
    load_format: str
    max_model_len: int | str | None
    """A number, or vLLM's human-readable form from a batched_test entry (`4k`)."""
    gpu_memory_utilization: float | None
    parallel: Parallelism
    extra_args: list[str]
    env: dict[str, str]
    trust_remote_code: bool
    speculative_config: dict[str, Any] | None
    ray_address: str | None
    devices: list[int] | None
    timeout_s: int
    cases: list[SmokeCase]
    cases_source: str
    subject: SubjectExport | None
    identity: ModelIdentity
    notes: list[str]


@dataclass
class _CaseChoice:
    """The cases a call resolves to, and what their file brings along."""

    cases: list[SmokeCase]
    source: str
    model: Path | None
    notes: list[str] = field(default_factory=list)
    serve: ServeSettings = field(default_factory=ServeSettings)
    owned: OwnedSettings = field(default_factory=lambda: OwnedSettings())
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def _select_model(models: list[BatchedModel], wanted: str | None, model: Path | None, source: str) -> BatchedModel:
    if wanted:
        found = [m for m in models if m.name == wanted]
        if not found:
            raise not_found(f"{source} has no model {wanted!r}; it lists {', '.join(m.name for m in models)}.")
        return found[0]
    if model is not None:
        found = [m for m in models if m.path and Path(m.path).resolve() == model]
        if len(found) == 1:
            return found[0]
    if len(models) == 1:
        return models[0]
    raise bad_input(f"{source} lists several models ({', '.join(m.name for m in models)}): pass batched_model.")


def _batched_entry(
    choice: _CaseChoice, request: SmokeRequest, models: list[BatchedModel], file_name: str, policy: Policy
) -> None:
    """A batched_test models file: the entry to run supplies cases, serve options, variables, maybe the model."""
    entry = _select_model(models, request.batched_model, choice.model, file_name)
    lifted = lift_owned_args(entry.args)
    choice.owned, choice.args, choice.env = lifted.owned, lifted.rest, entry.env
    choice.notes += lifted.notes
    choice.cases = entry.cases or default_cases().cases
    choice.source += f"#{entry.name}"
    if choice.model is None and entry.path:
        choice.model = policy.readable(entry.path)
    if choice.owned.get("trust_remote_code") and not request.trust_remote_code:
        raise bad_input(
            f"{entry.name} asks for --trust-remote-code: pass trust_remote_code=true if you accept its code."
        )


def _choose_cases(request: SmokeRequest, policy: Policy) -> _CaseChoice:
    model = policy.readable(request.model) if request.model else None
    if isinstance(request.cases, list):
        return _CaseChoice(parse_cases(request.cases, "cases"), "inline", model)
    if request.cases:
        case_path: Path | None = policy.readable(request.cases)
    else:
        case_path = model / FILE_NAME if model and (model / FILE_NAME).is_file() else None
    if case_path is None:
        return _CaseChoice(default_cases().cases, "default", model)
    if not case_path.is_file():
        raise not_found(f"case file {request.cases} does not exist.")
    loaded = read_case_file(case_path, policy.readable)
    choice = _CaseChoice(loaded.cases, f"{loaded.format}:{case_path.name}", model, list(loaded.notes), loaded.serve)
    if loaded.format == "batched_test_models":
        _batched_entry(choice, request, loaded.models, case_path.name, policy)
    return choice


def _model_dir(request: SmokeRequest, choice: _CaseChoice, policy: Policy) -> Path:
    if request.batched_model and not choice.source.startswith("batched_test_models"):
        raise bad_input("batched_model applies only when cases is a tools/batched_test models file.")
    model = choice.model
    if model is None:
        raise bad_input("model is required (the model directory to serve).")
    if not model.is_dir() or not (model / "config.json").is_file():
        raise not_found(f"{request.model or model.name} is not a model directory with a config.json.")
    policy.readable_entries(model)  # vLLM reads the whole directory: no entry may link out of the roots
    return model


def _parallelism(request: SmokeRequest, owned: OwnedSettings) -> Parallelism:
    tp = request.tp or owned.get("tp") or 1
    pp = request.pp or owned.get("pp") or 1
    dp = request.dp or owned.get("dp") or 1
    ep = request.ep or (tp * dp if owned.get("ep") else 1)
    if ep not in (1, tp * dp):
        raise bad_input(f"ep must be 1 or tp*dp ({tp * dp}): vLLM's expert parallel size is TP x DP.")
    parallel = Parallelism(tp, pp, dp, ep)
    if request.devices is not None:
        if len(set(request.devices)) != len(request.devices) or any(d < 0 for d in request.devices):
            raise bad_input("devices must be distinct non-negative ids.")
        if len(request.devices) != parallel.devices:
            raise bad_input(f"devices lists {len(request.devices)} ids but tp*pp*dp is {parallel.devices}.")
    if request.ray_address is not None and not _RAY_ADDRESS.match(request.ray_address):
        raise bad_input(
            "ray_address must be auto or the host:port of a cluster this machine is a node of: vLLM's driver "
            "joins it as a local node (Ray Client ray:// addresses are not supported)."
        )
    if request.ray_address is not None and request.devices is not None:
        raise bad_input("devices names this machine's devices, but with ray_address Ray places the workers: pass one.")
    return parallel


def _checked_case(case: SmokeCase, policy: Policy) -> SmokeCase:
    """The case with its image file resolved under the roots (a data: URL stays as it is)."""
    if not case.image or case.image.startswith("data:"):
        return case
    if re.match(r"^[a-z]+://", case.image):
        raise bad_input(
            f"case {case.name}: image {case.image!r} is a URL; pass a file under the roots (no network fetches)."
        )
    image = policy.readable(case.image)
    if not image.is_file():
        raise not_found(f"case {case.name}: image {policy.display(case.image)} does not exist.")
    return case.model_copy(update={"image": str(image)})


def _identity(model: Path, load_format: str) -> ModelIdentity:
    files = sorted((p.name, p.stat().st_size) for p in model.iterdir() if p.is_file())
    config = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
    manifest = model / TRIM_MANIFEST
    manifest_sha = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
    fingerprint = digest({"files": files, "config": config})
    return ModelIdentity(fingerprint, manifest_sha, _validates_trim(model, load_format))


def _validates_trim(model: Path, load_format: str) -> bool:
    """A real-weight trim's manifest, served with its real weights: this run can validate the load."""
    manifest = model / TRIM_MANIFEST
    if load_format == "dummy" or not manifest.is_file():
        return False
    try:
        return load_json_bounded(manifest.read_bytes(), TRIM_MANIFEST).get("output_mode") == "real"
    except (ValueError, AttributeError, ToolFailure):
        return False


def _export(subject: Subject, directory: Path) -> SubjectExport:
    export = directory / "snapshot"
    export.mkdir()
    count = subject.export(export)
    return SubjectExport(subject.kind, subject.label, subject.tree_hash(), count, str(export))


def plan_smoke_test(
    request: SmokeRequest,
    policy: Policy,
    store: StateStore,
    python: str,
    open_subject: Callable[[], Subject] | None,
) -> SmokePlan:
    """Check a call and make its run directory: the plan the job runs.

    `open_subject` opens the subject to export (None: the installed plugin is served); it is called
    only once every check has passed.
    """
    choice = _choose_cases(request, policy)
    model = _model_dir(request, choice, policy)
    parallel = _parallelism(request, choice.owned)
    extra_args = check_serve_args([*choice.serve.extra_args, *choice.args, *request.extra_args], policy.readable)
    launch_env = check_env({**choice.env, **request.env}, policy.readable)
    speculative = (
        request.speculative_config or choice.owned.get("speculative_config") or choice.serve.speculative_config
    )
    if speculative is not None:
        check_json_value(json.dumps(speculative), "speculative_config", policy.readable)
    cases = [_checked_case(case, policy) for case in choice.cases]
    load_format = request.load_format or choice.owned.get("load_format") or choice.serve.load_format or "auto"
    identity = _identity(model, load_format)
    run_id = f"s-{uuid.uuid4().hex[:16]}"
    directory = store.path(f"smoke/{run_id}")
    directory.mkdir(parents=True)
    subject = _export(open_subject(), directory) if open_subject is not None else None
    notes = list(choice.notes)
    if (model / "config.json").read_text(errors="replace").find('"auto_map"') >= 0 and not request.trust_remote_code:
        notes.append("config.json has auto_map (remote code) and trust_remote_code is off: vLLM may refuse the model.")
    return SmokePlan(
        run_id=run_id,
        run_dir=directory,
        state_dir=store.root,
        python=python,
        model=model,
        model_label=request.model or str(model),
        load_format=load_format,
        max_model_len=request.max_model_len or choice.owned.get("max_model_len") or choice.serve.max_model_len,
        gpu_memory_utilization=request.gpu_memory_utilization or choice.owned.get("gpu_memory_utilization"),
        parallel=parallel,
        extra_args=extra_args,
        env=launch_env,
        trust_remote_code=request.trust_remote_code,
        speculative_config=speculative,
        ray_address=request.ray_address,
        devices=request.devices,
        timeout_s=request.timeout_s,
        cases=cases,
        cases_source=choice.source,
        subject=subject,
        identity=identity,
        notes=notes,
    )
