"""Tool `run_smoke_test`: a real vLLM server on a (trimmed) model, proven to answer, nothing left behind.

Beyond one machine: `ray_address` (auto, or host:port of a cluster this machine is a node of) sets
RAY_ADDRESS and `--distributed-executor-backend ray` with the TP/PP asked for. The cluster's free
devices (vLLM's platform Ray key) are checked first, the server's Ray job carries the run id, and
after the server only that job's leftover actors are killed (`core/smoke/ray_cluster.py`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

from ..core.foundation.errors import ToolFailure, not_found
from ..core.foundation.policy import Effect
from ..core.smoke.plan import SmokeRequest, plan_smoke_test
from ..core.smoke.run import JOB_TARGET
from ..core.sources.environment import check_interpreter, load_record
from ..core.sources.git import open_repository
from ..core.sources.subjects import Subject, SubjectKind
from .arguments import SubjectArgs, open_plugin_subject
from .spec import JobOutput, ToolEnv, ToolSpec

TIMEOUT_S = 300
SIZES = {"tp": (1, 64), "pp": (1, 64), "dp": (1, 64), "ep": (1, 4096), "max_model_len": (16, 2**24)}
SIZES["timeout_s"] = (30, 3600)
LOAD_FORMATS = Literal["auto", "dummy", "safetensors", "pt", "fastsafetensors", "sharded_state", "npcache"]


class SmokeInput(SubjectArgs):
    model: str | None = Field(default=None, description="Model dir; optional with batched_model.")
    load_format: LOAD_FORMATS | None = Field(default=None, description="Default: the cases' or auto.")
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    extra_args: list[str] = Field(default_factory=list, description="Serve options (allow-listed).")
    env: dict[str, str] = Field(default_factory=dict, description="Allow-listed.")
    cases: list[dict[str, Any]] | str | None = Field(
        default=None, description="Inline or YAML path; default: the model's smoke_cases.yaml."
    )
    batched_model: str | None = Field(default=None, description="Entry of a batched_test file.")
    devices: list[int] | None = None
    trust_remote_code: bool = False
    speculative_config: dict[str, Any] | None = None
    ray_address: str | None = None
    plugin_repo: str | None = None  # type: ignore[assignment]
    subject: SubjectKind = SubjectKind.INSTALLED
    timeout_s: int | None = Field(default=None, description="Health deadline; default 300.")
    python: str | None = Field(default=None, description="Edit mode.")

    @model_validator(mode="after")
    def _sizes(self) -> Self:
        """Bounds kept out of the schema (read on every tools/list), checked before any work all the same."""
        for name, (least, most) in SIZES.items():
            value = getattr(self, name)
            if value is not None and not least <= value <= most:
                raise ValueError(f"{name} is between {least} and {most}")
        return self


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
    command: list[str] = Field(default_factory=list, description="The exact argv launched.")
    equivalent_command: list[str] = Field(default_factory=list, description="The same server started by hand.")
    entry: dict[str, str] | None = Field(
        default=None, description="how: 'vllm serve' or 'module'; module: the entry used."
    )
    env_delta: dict[str, Any] = Field(default_factory=dict)
    devices: dict[str, Any] | None = None
    drafts: dict[str, int] | None = Field(default=None, description="Spec-decode counters after the cases.")
    versions: dict[str, str | None] = Field(default_factory=dict)
    import_origins: dict[str, ModuleOrigin] = Field(default_factory=dict)
    subject: dict[str, Any] | None = Field(default=None, description="Exported snapshot, tree hash, imported or not.")
    startup_s: float | None = None
    requests: list[RequestResult] = Field(default_factory=list)
    requests_total: int = 0
    log_tail: str = ""
    errors: list[str] = Field(default_factory=list, description="Error lines of the server log.")
    teardown: dict[str, Any] | None = None
    evidence_path: str = Field(default="", description="The evidence record, relative to the state directory.")
    manifest_sha256: str | None = Field(default=None, description="sha256 of the model's trim_manifest.json, if any.")
    load_validated: bool | None = Field(
        default=None, description="Real-weight trim served with its weights: this run validated its load."
    )
    model_fingerprint: str | None = None
    cases_source: str | None = None
    python: str | None = None


# -- arguments -------------------------------------------------------------------------------


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
    if not record or not record.python:
        raise not_found(
            "No interpreter: record one with environment action=establish (python=...), or pass python (edit mode)."
        )
    return str(check_interpreter(record.python, env.policy, env.interpreters, "record").path), repo


def _request(args: SmokeInput) -> SmokeRequest:
    return SmokeRequest(
        model=args.model,
        load_format=args.load_format,
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        ep=args.ep,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        extra_args=args.extra_args,
        env=args.env,
        cases=args.cases,
        batched_model=args.batched_model,
        devices=args.devices,
        trust_remote_code=args.trust_remote_code,
        speculative_config=args.speculative_config,
        ray_address=args.ray_address,
        timeout_s=args.timeout_s or TIMEOUT_S,
    )


def run_smoke_test(args: SmokeInput, env: ToolEnv) -> Any:
    """Serve a (trimmed) model on a real vLLM server, run the smoke cases at temperature 0, stop it
    leaving nothing. Busy devices: verdict=blocked. A job: poll jobs."""
    python, repo = _interpreter(args, env)

    def open_subject() -> Subject:
        return open_plugin_subject(args, env, repo)

    exported = open_subject if args.subject is not SubjectKind.INSTALLED else None
    plan = plan_smoke_test(_request(args), env.policy, env.store, python, exported)
    return env.jobs.start(env.tool, JOB_TARGET, plan)


SPEC = ToolSpec(
    name="run_smoke_test",
    effect=Effect.VALIDATES,
    run=run_smoke_test,
    input_model=SmokeInput,
    output_model=SmokeOutput,
    title="Smoke-test a model on a real vLLM server",
    idempotent=False,
)
