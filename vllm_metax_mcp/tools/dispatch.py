"""One dispatch path for every tool: the MCP server and the CLI both call `invoke`, so mode checks,
input validation, jobs and result ids behave the same whichever way a tool is reached.
"""

from __future__ import annotations

import errno
import inspect
import logging
import math
from dataclasses import replace
from typing import Any

import anyio
import anyio.to_process
from pydantic import BaseModel, ValidationError

from ..core.foundation.errors import ErrorCode, ToolFailure, bad_input
from ..core.foundation.jobs import JobHandle
from ..core.foundation.results import record_result
from ..core.foundation.safe_load import check_arguments
from .spec import JobInfo, ToolEnv, ToolSpec

JOB_WAIT_S = 20.0
"""How long a call waits for its job before answering with the job's id and progress."""

log = logging.getLogger("vllm_metax_mcp")


def parse_input(spec: ToolSpec, raw: dict[str, Any]) -> BaseModel:
    """The tool's input model from raw arguments, after the input limits (core/foundation/safe_load.py)."""
    check_arguments(raw, spec.name)
    try:
        return spec.input_model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        raise ToolFailure(ErrorCode.BAD_INPUT, f"Invalid arguments for {spec.name}: {problems}.") from None


async def invoke(spec: ToolSpec, raw: dict[str, Any], env: ToolEnv, *, job_wait_s: float = JOB_WAIT_S) -> BaseModel:
    """Run one tool call through the policy: mode, input limits and model, the work (or its job), result id.

    Every failure leaves as a ToolFailure: an exception the work did not expect becomes a precise
    `bad_input` where the input caused it (too deep, a name too long, an argument list too long), else
    a `failed` naming the tool and the exception type — never a traceback or an install path. The
    traceback goes to the server's log at debug level only (`--debug`)."""
    try:
        return await _invoke(spec, raw, env, job_wait_s)
    except ToolFailure:
        raise
    except Exception as exc:  # the last resort: what reaches a client is one clean error
        log.debug("unexpected error in %s", spec.name, exc_info=True)
        raise unexpected_failure(spec.name, exc) from None


def unexpected_failure(tool: str, exc: BaseException) -> ToolFailure:
    """An exception no layer turned into a ToolFailure, in words that hold no path or traceback."""
    for inner in getattr(exc, "exceptions", None) or ():  # an exception group (anyio task groups)
        return inner if isinstance(inner, ToolFailure) else unexpected_failure(tool, inner)
    if isinstance(exc, RecursionError):
        return bad_input(f"An input of {tool} nests too deeply to process (JSON or YAML nesting); no real file does.")
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        return bad_input(f"A path given to {tool} has a name longer than the file system allows (255 bytes per name).")
    if isinstance(exc, OSError) and exc.errno == errno.E2BIG:
        return bad_input(f"The arguments of {tool} are too long to pass to a subprocess; pass shorter values.")
    if isinstance(exc, ValueError) and "null byte" in str(exc):
        return bad_input(f"A value given to {tool} contains a NUL byte.")
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return bad_input(f"An input of {tool} holds an integer with too many digits.")
    return ToolFailure(
        ErrorCode.FAILED,
        f"{tool} failed with an internal error ({type(exc).__name__}); this is a server bug. Start the server "
        "with --debug to log the traceback to its stderr.",
    )


async def _invoke(spec: ToolSpec, raw: dict[str, Any], env: ToolEnv, job_wait_s: float) -> BaseModel:
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
        code = (
            ErrorCode(error.get("code", "failed"))
            if error.get("code") in ErrorCode._value2member_map_
            else ErrorCode.FAILED
        )
        raise ToolFailure(
            code, f"Job {status['id']} {status['status']}: {error.get('message', 'no detail')}", job_id=status["id"]
        )
    return spec.output_model(job=JobInfo(id=status["id"], status=status["status"], progress=status.get("progress")))
