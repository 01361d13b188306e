"""Tool `run_smoke_test`: a real vLLM server on a (trimmed) model, proven to answer, nothing left behind.

Beyond one machine: `ray_address` (auto, host:port or ray://host:port) sets RAY_ADDRESS and
`--distributed-executor-backend ray`, the way vLLM spreads TP/PP over nodes; local occupancy is
then not the whole story and a note says so. Not covered by CI; the manual check: `ray start
--head` on node 0 and `ray start --address=<head>:6379` on the others, `ray status` shows every
GPU, then call with tp*pp larger than one node and ray_address="auto" from node 0; the
evidence's command carries the backend, and `ray status` is empty of vLLM actors afterwards.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.foundation.errors import ToolFailure, bad_input, not_found
from ..core.foundation.policy import Effect
from ..core.foundation.results import digest
from ..core.foundation.safe_load import load_json_bounded
from ..core.smoke.launch_rules import (
    check_env,
    check_json_value,
    check_serve_args,
    lift_owned_args,
)
from ..core.smoke.run import run_dir
from ..core.sources.environment import check_interpreter, load_record
from ..core.sources.git import open_repository
from ..core.sources.subjects import SubjectKind
from ..core.trim.cases import (
    FILE_NAME,
    BatchedModel,
    ServeSettings,
    SmokeCase,
    default_cases,
    parse_cases,
    read_case_file,
)
from .arguments import SubjectArgs, open_plugin_subject
from .spec import JobOutput, ToolEnv, ToolSpec

LOAD_FORMATS = Literal["auto", "dummy", "safetensors", "pt", "fastsafetensors", "sharded_state", "npcache"]
MANIFEST_NAME = "trim_manifest.json"
_RAY_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9.\-]+:\d{1,5})$")


class SmokeInput(SubjectArgs):
    model: str | None = Field(
        default=None,
        description="Model directory (config.json, tokenizer; weights unless load_format=dummy). May be omitted when "
        "cases is a tools/batched_test models file whose entry names the model.",
    )
    load_format: LOAD_FORMATS | None = Field(
        default=None, description="vLLM --load-format; default: the case file's, else auto."
    )
    tp: int | None = Field(default=None, ge=1, le=64, description="Tensor parallel size (default 1).")
    pp: int | None = Field(default=None, ge=1, le=64, description="Pipeline parallel size (default 1).")
    dp: int | None = Field(default=None, ge=1, le=64, description="Data parallel size (default 1).")
    ep: int | None = Field(
        default=None, ge=1, le=4096, description="Expert parallel size: 1, or tp*dp (vLLM's --enable-expert-parallel)."
    )
    max_model_len: int | None = Field(default=None, ge=16)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    extra_args: list[str] = Field(
        default_factory=list,
        description="More serve options, e.g. ['--enforce-eager', '--dtype=float32'] (allow-listed).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Variables for the server (allow-listed; never LD_PRELOAD, PYTHONPATH, ...)."
    )
    cases: list[dict[str, Any]] | str | None = Field(
        default=None,
        description="Inline cases (smoke_cases format), or a file: a smoke_cases.yaml or a tools/batched_test models/cases "
        "YAML. Default: the model's smoke_cases.yaml if present, else one completion and one chat case.",
    )
    batched_model: str | None = Field(
        default=None, description="The entry to run when cases is a batched_test models file."
    )
    devices: list[int] | None = Field(
        default=None, description="Device ids to use (default: free ones, chosen by occupancy)."
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow the model's own Python code (off unless turned on)."
    )
    speculative_config: dict[str, Any] | None = Field(default=None, description="vLLM --speculative-config (e.g. MTP).")
    ray_address: str | None = Field(
        default=None, description="A Ray cluster (auto or host:port): --distributed-executor-backend ray."
    )
    plugin_repo: str | None = Field(  # type: ignore[assignment]
        default=None,
        description="The vLLM-MetaX repository: its environment record supplies the interpreter, and it is the source "
        "of subject worktree/index/revision.",
    )
    subject: SubjectKind = Field(  # type: ignore[assignment]
        default=SubjectKind.INSTALLED,
        description="installed: vllm_metax as the interpreter imports it; index/worktree/revision/directory: that "
        "snapshot is exported and put first on PYTHONPATH, and the run proves the server imported it.",
    )
    timeout_s: int = Field(default=300, ge=30, le=3600, description="Deadline for the server to become healthy.")
    python: str | None = Field(
        default=None, description="Interpreter override (edit mode only; default: the environment record's)."
    )


class RequestResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    case: str
    kind: str
    mode: str = Field(description="first, repeat (determinism at temperature 0) or stream.")
    covers: str = ""
    endpoint: str | None = None
    status: int | None = None
    ok: bool = False
    checks: dict[str, bool] = Field(default_factory=dict)
    latency_s: float | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    keywords: str | None = None
    keywords_missing: list[str] | None = None
    served_models: list[str] | None = None
    error: str | None = None


class ModuleOrigin(BaseModel):
    loaded: bool | None = None
    origin: str | None = None
    error: str | None = None


class SmokeOutput(JobOutput):
    run_id: str = ""
    verdict: Literal["passed", "failed", "blocked"] | None = None
    reasons: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    command: list[str] = Field(
        default_factory=list, description="The exact argv launched (the wrapper runs the entry in-process)."
    )
    equivalent_command: list[str] = Field(default_factory=list, description="The same server started by hand.")
    entry: dict[str, str] | None = Field(
        default=None, description="how: 'vllm serve' or 'module'; module: the entry used."
    )
    env_delta: dict[str, Any] = Field(default_factory=dict)
    devices: dict[str, Any] | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    import_origins: dict[str, ModuleOrigin] = Field(default_factory=dict)
    subject: dict[str, Any] | None = Field(
        default=None, description="The exported snapshot, its tree hash, and whether the server imported it."
    )
    startup_s: float | None = None
    requests: list[RequestResult] = Field(default_factory=list)
    requests_total: int = 0
    log_tail: str = ""
    errors: list[str] = Field(default_factory=list, description="Error lines of the server log.")
    teardown: dict[str, Any] | None = None
    evidence_path: str = Field(default="", description="The evidence record, relative to the state directory.")
    manifest_sha256: str | None = Field(default=None, description="sha256 of the model's trim_manifest.json, if any.")
    load_validated: bool | None = Field(
        default=None,
        description="For a real-weight trim served with real weights: whether this run validated its load (recorded "
        "against manifest_sha256); null when the run cannot validate one (no real-weight manifest, or dummy weights).",
    )
    model_fingerprint: str | None = None
    cases_source: str | None = None
    python: str | None = None


# -- validation ------------------------------------------------------------------------------


def _interpreter(args: SmokeInput, env: ToolEnv) -> tuple[str, Any]:
    repo = None
    if args.plugin_repo is not None or args.subject in (SubjectKind.WORKTREE, SubjectKind.INDEX, SubjectKind.REVISION):
        repo = open_repository(args.plugin_repo or ".", env.policy)
    else:
        try:
            repo = open_repository(".", env.policy)
        except ToolFailure:
            repo = None
    if args.python:  # refused in review mode; in edit mode an allowed one or one inside the roots
        return str(check_interpreter(args.python, env.policy, env.interpreters, "override").path), repo
    record = load_record(env.store, repo) if repo is not None else None
    if not record or not record.get("python"):
        raise not_found(
            "No interpreter: record one with environment action=establish (python=...), or pass python (edit mode)."
        )
    return str(check_interpreter(record["python"], env.policy, env.interpreters, "record").path), repo


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


def _check_cases(cases: list[SmokeCase], env: ToolEnv) -> list[dict[str, Any]]:
    checked = []
    for case in cases:
        body = case.model_dump(mode="json")
        if case.image and not case.image.startswith("data:"):
            if re.match(r"^[a-z]+://", case.image):
                raise bad_input(
                    f"case {case.name}: image {case.image!r} is a URL; pass a file under the roots (no network fetches)."
                )
            image = env.policy.readable(case.image)
            if not image.is_file():
                raise not_found(f"case {case.name}: image {env.policy.display(case.image)} does not exist.")
            body["image"] = str(image)
        checked.append(body)
    return checked


def _fingerprint(model: Path) -> tuple[str, str | None]:
    files = sorted((p.name, p.stat().st_size) for p in model.iterdir() if p.is_file())
    config = hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
    manifest = model / MANIFEST_NAME
    manifest_sha = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
    return digest({"files": files, "config": config}), manifest_sha


def _validates_trim(model: Path, load_format: str) -> bool:
    """A real-weight trim's manifest, served with its real weights: this run can validate the load."""
    manifest = model / MANIFEST_NAME
    if load_format == "dummy" or not manifest.is_file():
        return False
    try:
        return load_json_bounded(manifest.read_bytes(), MANIFEST_NAME).get("output_mode") == "real"
    except (ValueError, AttributeError, ToolFailure):
        return False


def run_smoke_test(args: SmokeInput, env: ToolEnv) -> Any:
    """Start a real vLLM OpenAI-compatible server on a model (typically a trimmed one), send the smoke
    cases (completion, chat, streaming, image) at temperature 0, and stop it so that nothing remains.

    Occupancy first: a busy or missing device answers verdict=blocked and starts nothing; a process
    this tool did not start is never touched. Dummy weights are checked for structure, token counts
    and determinism, real weights also for expected keywords. With subject index/worktree/revision/
    directory the snapshot is exported and put first on PYTHONPATH, and the result proves from the
    running server's import origins that it was used. Cases come from `cases` (inline or a file: a
    smoke_cases.yaml, or the plugin's tools/batched_test YAML), else the model's smoke_cases.yaml,
    else one completion and one chat case. Runs as a job: poll it with `jobs`; the evidence record
    lands in the state directory.
    """
    python, repo = _interpreter(args, env)
    readable = env.policy.readable  # the launch rules also read its roots and mode
    notes: list[str] = []
    serve = ServeSettings()
    owned: dict[str, Any] = {}
    file_args: list[str] = []
    file_env: dict[str, str] = {}
    model = env.policy.readable(args.model) if args.model else None

    cases: list[SmokeCase]
    if isinstance(args.cases, list):
        cases, source = parse_cases(args.cases, "cases"), "inline"
    else:
        case_path = (
            env.policy.readable(args.cases)
            if args.cases
            else (model / FILE_NAME if model and (model / FILE_NAME).is_file() else None)
        )
        if case_path is None:
            cases, source = default_cases().cases, "default"
        else:
            if not case_path.is_file():
                raise not_found(f"case file {args.cases} does not exist.")
            loaded = read_case_file(case_path, readable)
            source, notes = f"{loaded.format}:{case_path.name}", list(loaded.notes)
            serve, cases = loaded.serve, loaded.cases
            if loaded.format == "batched_test_models":
                entry = _select_model(loaded.models, args.batched_model, model, case_path.name)
                owned, file_args, lifted_notes = lift_owned_args(entry.args)
                notes += lifted_notes
                file_env = entry.env
                cases = entry.cases or default_cases().cases
                source += f"#{entry.name}"
                if model is None and entry.path:
                    model = env.policy.readable(entry.path)
                if owned.get("trust_remote_code") and not args.trust_remote_code:
                    raise bad_input(
                        f"{entry.name} asks for --trust-remote-code: pass trust_remote_code=true if you accept its code."
                    )
    if args.batched_model and not source.startswith("batched_test_models"):
        raise bad_input("batched_model applies only when cases is a tools/batched_test models file.")
    if model is None:
        raise bad_input("model is required (the model directory to serve).")
    if not model.is_dir() or not (model / "config.json").is_file():
        raise not_found(f"{args.model or model.name} is not a model directory with a config.json.")
    env.policy.readable_entries(model)  # vLLM reads the whole directory: no entry may link out of the roots

    tp = args.tp or owned.get("tp") or 1
    pp = args.pp or owned.get("pp") or 1
    dp = args.dp or owned.get("dp") or 1
    ep = args.ep or (tp * dp if owned.get("ep") else 1)
    if ep not in (1, tp * dp):
        raise bad_input(f"ep must be 1 or tp*dp ({tp * dp}): vLLM's expert parallel size is TP x DP.")
    if args.devices is not None:
        if len(set(args.devices)) != len(args.devices) or any(d < 0 for d in args.devices):
            raise bad_input("devices must be distinct non-negative ids.")
        if len(args.devices) != tp * pp * dp:
            raise bad_input(f"devices lists {len(args.devices)} ids but tp*pp*dp is {tp * pp * dp}.")
    if args.ray_address is not None and not _RAY_ADDRESS.match(args.ray_address):
        raise bad_input("ray_address must be auto, host:port or ray://host:port.")
    extra_args = check_serve_args([*serve.extra_args, *file_args, *args.extra_args], readable)
    launch_env = check_env({**file_env, **args.env}, readable)
    speculative = args.speculative_config or owned.get("speculative_config") or serve.speculative_config
    if speculative is not None:
        check_json_value(json.dumps(speculative), "speculative_config", readable)

    checked_cases = _check_cases(cases, env)
    fingerprint, manifest_sha = _fingerprint(model)
    run_id = f"s-{uuid.uuid4().hex[:16]}"
    directory = run_dir(env.store, run_id)
    directory.mkdir(parents=True)
    subject_info = None
    if args.subject is not SubjectKind.INSTALLED:
        subject = open_plugin_subject(args, env, repo)
        export = directory / "snapshot"
        export.mkdir()
        count = subject.export(export)
        subject_info = {
            "kind": args.subject.value,
            "label": subject.label,
            "tree_hash": subject.tree_hash(),
            "files": count,
            "export_dir": str(export),
        }
    if (model / "config.json").read_text(errors="replace").find('"auto_map"') >= 0 and not args.trust_remote_code:
        notes.append("config.json has auto_map (remote code) and trust_remote_code is off: vLLM may refuse the model.")
    load_format = args.load_format or owned.get("load_format") or serve.load_format or "auto"
    plan = {
        "run_id": run_id,
        "run_dir": str(directory),
        "state_dir": str(env.store.root),
        "python": python,
        "model": str(model),
        "model_label": args.model or str(model),
        "load_format": load_format,
        "max_model_len": args.max_model_len or owned.get("max_model_len") or serve.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization or owned.get("gpu_memory_utilization"),
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "ep": ep,
        "extra_args": extra_args,
        "env": launch_env,
        "trust_remote_code": args.trust_remote_code,
        "speculative_config": speculative,
        "ray_address": args.ray_address,
        "devices": args.devices,
        "timeout_s": args.timeout_s,
        "cases": checked_cases,
        "cases_source": source,
        "subject": subject_info,
        "manifest_sha256": manifest_sha,
        "validates_trim": _validates_trim(model, load_format),
        "model_fingerprint": fingerprint,
        "notes": notes,
    }
    return env.jobs.start(env.tool, "vllm_metax_mcp.core.smoke.run:run_job", plan)


SPEC = ToolSpec(
    name="run_smoke_test",
    effect=Effect.VALIDATES,
    run=run_smoke_test,
    input_model=SmokeInput,
    output_model=SmokeOutput,
    title="Smoke-test a model on a real vLLM server",
    idempotent=False,
)
