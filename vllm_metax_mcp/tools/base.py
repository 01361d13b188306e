"""What every tool shares: its declaration (effect class, models), its runtime, and one dispatch path.

The MCP server and the CLI both call `invoke`, so mode checks, input validation, jobs and
result ids behave the same whichever way a tool is reached.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_process
from pydantic import BaseModel, Field, ValidationError

from ..core.errors import ErrorCode, ToolFailure
from ..core.jobs import JobHandle, Jobs
from ..core.policy import Effect, Mode, Policy
from ..core.results import record_result
from ..core.state import StateStore, default_state_dir

JOB_WAIT_S = 20.0
"""How long a call waits for its job before answering with the job's id and progress."""

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]
UserAnswer = Literal["accepted", "declined", "not_asked"]


class ToolOutput(BaseModel):
    result_id: str = Field(default="", description="Cite this id as tool_result evidence.")


class JobInfo(BaseModel):
    id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled", "lost"]
    progress: dict[str, Any] | None = None


class JobOutput(ToolOutput):
    job: JobInfo | None = Field(
        default=None,
        description="Set while the work still runs: poll it with the jobs tool; the other fields are empty until then.",
    )


@dataclass(frozen=True)
class ToolSpec:
    name: str
    effect: Effect
    run: Callable[..., Any]
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    title: str
    idempotent: bool = True
    destructive: bool = False
    cpu_heavy: bool = False
    """Run in a worker process: the event loop stays responsive and a cancelled call kills the work."""
    question: Callable[[BaseModel, "ToolEnv"], str | None] | None = None
    """A yes/no question for the user before the tool runs (asked through elicitation where the client can)."""

    @property
    def description(self) -> str:
        return inspect.getdoc(self.run) or self.title


@dataclass
class Runtime:
    """One server's (or CLI call's) policy, state directory and job table."""

    policy: Policy
    store: StateStore
    jobs: Jobs = field(init=False)

    def __post_init__(self) -> None:
        self.jobs = Jobs(self.store)

    @classmethod
    def create(
        cls,
        roots: list[str] | None = None,
        output_roots: list[str] | None = None,
        mode: Mode | str = Mode.EDIT,
        state_dir: str | None = None,
    ) -> "Runtime":
        store = StateStore(Path(state_dir).expanduser().resolve() if state_dir else default_state_dir())
        return cls(policy=Policy.create(roots, output_roots, mode), store=store)


@dataclass
class ToolEnv:
    """What one call of a tool sees."""

    runtime: Runtime
    tool: str
    progress: ProgressFn | None = None
    user_answer: UserAnswer = "not_asked"
    """The user's answer to the tool's question; "not_asked" where the client cannot elicit (or the CLI)."""

    @property
    def policy(self) -> Policy:
        return self.runtime.policy

    @property
    def store(self) -> StateStore:
        return self.runtime.store

    @property
    def jobs(self) -> Jobs:
        return self.runtime.jobs


def parse_input(spec: ToolSpec, raw: dict[str, Any]) -> BaseModel:
    try:
        return spec.input_model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        raise ToolFailure(ErrorCode.BAD_INPUT, f"Invalid arguments for {spec.name}: {problems}.") from None


async def invoke(spec: ToolSpec, raw: dict[str, Any], env: ToolEnv, *, job_wait_s: float = JOB_WAIT_S) -> BaseModel:
    """Run one tool call through the policy: mode, input, the work (or its job), result id."""
    env.policy.require_mode_allows(spec.effect, spec.name)
    arguments = parse_input(spec, raw)
    if inspect.iscoroutinefunction(spec.run):
        output = await spec.run(arguments, env)
    elif spec.cpu_heavy:
        output = await anyio.to_process.run_sync(spec.run, arguments, replace(env, progress=None), cancellable=True)
    else:
        output = await anyio.to_thread.run_sync(spec.run, arguments, env, abandon_on_cancel=True)
    if isinstance(output, JobHandle):
        output = await settle_job(spec, output.job_id, env, job_wait_s)
    output.result_id = record_result(
        env.store, spec.name, arguments.model_dump(mode="json"), output.model_dump(mode="json")
    )
    return output


async def settle_job(spec: ToolSpec, job_id: str, env: ToolEnv, wait_s: float) -> BaseModel:
    """Wait a bounded time for a job: its final output, its failure, or its id and progress."""

    async def forward(progress: dict[str, Any]) -> None:
        if env.progress:
            await env.progress(progress.get("done", 0), progress.get("total"), progress.get("message"))

    try:
        status = await env.jobs.wait(job_id, wait_s if math.isfinite(wait_s) else 10**9, forward)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(env.jobs.cancel, job_id)
        raise
    return job_outcome(spec, status)


def job_outcome(spec: ToolSpec, status: dict[str, Any]) -> BaseModel:
    if status["status"] == "succeeded":
        return spec.output_model.model_validate(status.get("result") or {})
    if status["status"] in ("failed", "cancelled", "lost"):
        error = status.get("error") or {}
        code = ErrorCode(error.get("code", "failed")) if error.get("code") in ErrorCode._value2member_map_ else ErrorCode.FAILED
        raise ToolFailure(code, f"Job {status['id']} {status['status']}: {error.get('message', 'no detail')}", job_id=status["id"])
    return spec.output_model(job=JobInfo(id=status["id"], status=status["status"], progress=status.get("progress")))
