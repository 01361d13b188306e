"""Tool `jobs`: list long-running work, report a job's status or fetch its result (read-only; cancel_job stops one)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.foundation.errors import bad_input
from ..core.foundation.jobs import FINAL_STATES, job_resource, poll_after, progress_message
from ..core.foundation.policy import Effect
from ..core.foundation.results import (
    RESULT_BUDGET,
    SizeBudget,
    inputs_fingerprint,
    paginate,
    record_result,
    result_resource,
)
from .output import rows_budget, size_of
from .spec import JobInfo, NextCall, ToolEnv, ToolOutput, ToolSpec

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


class JobsInput(BaseModel):
    action: Literal["list", "status", "result"] = Field(default="list", description="list; or status/result of job_id.")
    job_id: str | None = None
    cursor: str | None = None
    limit: int | None = Field(default=None, ge=1, le=MAX_LIMIT)


class JobDetail(JobInfo):
    tool: str | None = None
    created_at: float | None = None
    finished_at: float | None = None
    heartbeat_age_s: float | None = None
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = Field(default=None, description="The tool's final output (action=result).")
    result_resource: str | None = Field(default=None, description="Read the output here when too big to inline.")


class JobsOutput(ToolOutput):
    jobs: list[JobDetail] = Field(default_factory=list)
    total: int | None = None
    next_cursor: str | None = None
    job: JobDetail | None = None
    poll_after_s: float | None = Field(default=None, description="While the job runs: poll again after this.")
    resource: str | None = Field(default=None, description="The job's status resource URI.")


def _final_result(env: ToolEnv, status: dict[str, Any]) -> dict[str, Any] | None:
    """A finished job's output, with a result_id of its own so it can be cited as evidence."""
    result = status.get("result")
    if result is None:
        return None
    cited = {k: v for k, v in result.items() if k != "result_id"}
    cited["result_id"] = record_result(env.store, status.get("tool") or "job", {"job_id": status["id"]}, cited)
    return cited


def _detail(env: ToolEnv, status: dict[str, Any], with_result: bool = False) -> JobDetail:
    live = status["status"] not in FINAL_STATES
    detail = JobDetail(
        id=status["id"],
        status=status["status"],
        progress=status.get("progress"),
        message=progress_message(status) if live else None,
        tool=status.get("tool"),
        created_at=status.get("created_at"),
        finished_at=status.get("finished_at"),
        error=status.get("error"),
        heartbeat_age_s=env.jobs.heartbeat_age(status["id"]) if live else None,
    )
    result = _final_result(env, status) if with_result else None
    if result is not None and size_of(JobsOutput(job=detail.model_copy(update={"result": result}))) > RESULT_BUDGET:
        return detail.model_copy(update={"result_resource": result_resource(result["result_id"])})
    return detail.model_copy(update={"result": result})


def _list(args: JobsInput, env: ToolEnv) -> JobsOutput:
    row = rows_budget(JobsOutput(total=10**6, result_id="r-" + "0" * 16))
    page = paginate(
        env.jobs.list(),
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=inputs_fingerprint("jobs", args.model_dump()),
        default_limit=DEFAULT_LIMIT,
        max_limit=MAX_LIMIT,
        budget=SizeBudget(size_of=lambda status: size_of(_detail(env, status)), chars=row.chars),
    )
    paging = {"action": "list", "cursor": page.next_cursor} | ({"limit": args.limit} if args.limit else {})
    more = NextCall(tool="jobs", arguments=paging, why="more jobs")
    return JobsOutput(
        jobs=[_detail(env, s) for s in page.items],
        total=page.total,
        next_cursor=page.next_cursor,
        next_step=more if page.next_cursor else None,
    )


def jobs(args: JobsInput, env: ToolEnv) -> JobsOutput:
    """List jobs (trims, smoke tests), or one job's status or final result. cancel_job stops one."""
    if args.action == "list":
        if args.job_id:
            raise bad_input("action=list takes no job_id; use action=status or action=result for one job.")
        return _list(args, env)
    if not args.job_id:
        raise bad_input(f"action={args.action} needs job_id; list jobs with action=list.")
    if args.cursor or args.limit:
        raise bad_input(f"cursor and limit page action=list only; action={args.action} shows one job.")
    status = env.jobs.get(args.job_id)
    if status["status"] not in FINAL_STATES:
        detail = JobDetail(
            id=status["id"], status=status["status"], progress=status.get("progress"), message=progress_message(status)
        )
        return JobsOutput(job=detail, poll_after_s=poll_after(status), resource=job_resource(status["id"]))
    detail = _detail(env, status, with_result=args.action == "result")
    if args.action == "status" and status["status"] == "succeeded":
        fetch = NextCall(tool="jobs", arguments={"action": "result", "job_id": status["id"]}, why="fetch its output")
        return JobsOutput(job=detail, next_step=fetch)
    return JobsOutput(job=detail)


SPEC = ToolSpec(
    name="jobs",
    effect=Effect.READS,
    run=jobs,
    input_model=JobsInput,
    output_model=JobsOutput,
    title="Long-running jobs",
)
