"""Tool `cancel_job`: stop a job's whole process tree (only processes the job started)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ..core.foundation.policy import Effect
from .spec import JobInfo, ToolEnv, ToolOutput, ToolSpec


class CancelJobInput(BaseModel):
    job_id: str = Field(description="job.id of a call, or from jobs.")


class CancelledJob(JobInfo):
    error: dict[str, Any] | None = None
    finished_at: float | None = None


class CancelJobOutput(ToolOutput):
    job: CancelledJob


def cancel_job(args: CancelJobInput, env: ToolEnv) -> CancelJobOutput:
    """Stop a job's whole process tree (only what it started); a finished job is left as is."""
    status = env.jobs.cancel(args.job_id)
    return CancelJobOutput(
        job=CancelledJob(
            id=status["id"],
            status=status["status"],
            progress=status.get("progress"),
            error=status.get("error"),
            finished_at=status.get("finished_at"),
        )
    )


SPEC = ToolSpec(
    name="cancel_job",
    effect=Effect.VALIDATES,
    run=cancel_job,
    input_model=CancelJobInput,
    output_model=CancelJobOutput,
    title="Cancel a job",
    idempotent=True,
)
