"""Tool `jobs`: list long-running work, report a job's status or result, cancel it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.foundation.errors import bad_input
from ..core.foundation.policy import Effect
from ..core.foundation.results import inputs_fingerprint, paginate, record_result
from .spec import JobInfo, ToolEnv, ToolOutput, ToolSpec

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class JobsInput(BaseModel):
    action: Literal["list", "status", "result", "cancel"] = Field(
        default="list", description="list all jobs; status/result/cancel one job named by job_id."
    )
    job_id: str | None = Field(default=None, description="Required for status, result and cancel.")
    cursor: str | None = None
    limit: int | None = Field(
        default=None, description=f"Page size for list (default {DEFAULT_LIMIT}, max {MAX_LIMIT})."
    )


class JobDetail(JobInfo):
    tool: str | None = None
    created_at: float | None = None
    finished_at: float | None = None
    heartbeat_age_s: float | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = Field(default=None, description="The tool's final output (action=result).")


class JobsOutput(ToolOutput):
    jobs: list[JobDetail] = Field(default_factory=list)
    total: int = 0
    next_cursor: str | None = None
    job: JobDetail | None = None


def _final_result(env: ToolEnv, status: dict[str, Any]) -> dict[str, Any] | None:
    """A finished job's output, with a result_id of its own so it can be cited as evidence."""
    result = status.get("result")
    if result is None:
        return None
    cited = {k: v for k, v in result.items() if k != "result_id"}
    cited["result_id"] = record_result(env.store, status.get("tool") or "job", {"job_id": status["id"]}, cited)
    return cited


def _detail(env: ToolEnv, status: dict[str, Any], with_result: bool = False) -> JobDetail:
    return JobDetail(
        id=status["id"],
        status=status["status"],
        progress=status.get("progress"),
        tool=status.get("tool"),
        created_at=status.get("created_at"),
        finished_at=status.get("finished_at"),
        error=status.get("error"),
        heartbeat_age_s=env.jobs.heartbeat_age(status["id"]) if status["status"] == "running" else None,
        result=_final_result(env, status) if with_result else None,
    )


def jobs(args: JobsInput, env: ToolEnv) -> JobsOutput:
    """List, inspect, fetch the result of, or cancel long-running work (trims, smoke tests).

    Cancelling stops the job's whole process group; only processes the job started are touched.
    """
    if args.action == "list":
        page = paginate(
            env.jobs.list(),
            cursor=args.cursor,
            limit=args.limit,
            fingerprint=inputs_fingerprint("jobs", args.model_dump()),
            default_limit=DEFAULT_LIMIT,
            max_limit=MAX_LIMIT,
        )
        return JobsOutput(jobs=[_detail(env, s) for s in page.items], total=page.total, next_cursor=page.next_cursor)
    if not args.job_id:
        raise bad_input(f"action={args.action} needs job_id; list jobs with action=list.")
    if args.action == "cancel":
        status = env.jobs.cancel(args.job_id)
    else:
        status = env.jobs.get(args.job_id)
    return JobsOutput(job=_detail(env, status, with_result=args.action == "result"))


SPEC = ToolSpec(
    name="jobs",
    effect=Effect.VALIDATES,
    run=jobs,
    input_model=JobsInput,
    output_model=JobsOutput,
    title="Long-running jobs",
    idempotent=False,
)
