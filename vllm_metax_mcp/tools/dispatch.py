"""One dispatch path for every tool: the MCP server and the CLI both call `invoke`, so mode checks,
input validation, jobs and result ids behave the same whichever way a tool is reached.
"""

from __future__ import annotations

import difflib
import errno
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ValidationError

from ..core.foundation.errors import ErrorCode, ToolFailure, bad_input
from ..core.foundation.jobs import JobHandle, job_resource, poll_after, progress_message
from ..core.foundation.policy import Effect, writes_refused
from ..core.foundation.process_call import run_in_process
from ..core.foundation.progress import HEARTBEAT_S, Monotonic
from ..core.foundation.results import record_result
from ..core.foundation.safe_load import check_arguments
from .spec import JobInfo, ToolEnv, ToolSpec

JOB_WAIT_S = 20.0
"""How long a call waits for its job before answering with the job's id and progress."""
PERCENT = 100.0
"""The total of a worker call's progress: its phases' fraction done, in percent."""
WORKER_PRELOAD = ("vllm_metax_mcp.tools",)
"""Imported once by the worker forkserver, so a worker call starts without importing the tools."""
T = TypeVar("T")

log = logging.getLogger("vllm_metax_mcp")


def parse_input(spec: ToolSpec, raw: dict[str, Any]) -> BaseModel:
    """The tool's input model from raw arguments, after the input limits (core/foundation/safe_load.py)."""
    check_arguments(raw, spec.name)
    _refuse_unknown(spec, raw)
    try:
        return spec.input_model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        raise ToolFailure(ErrorCode.BAD_INPUT, f"Invalid arguments for {spec.name}: {problems}.") from None


def _refuse_unknown(spec: ToolSpec, raw: dict[str, Any]) -> None:
    """An argument the tool does not take is a mistake (a typo, an old name), never silently dropped."""
    known = {info.alias or name for name, info in spec.input_model.model_fields.items()}
    unknown = sorted(set(raw) - known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise bad_input(f"{spec.name} takes no argument {', '.join(hints)}; it takes: {', '.join(sorted(known))}.")


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
    progress = Monotonic(env.progress) if env.progress else None  # one increasing sequence per call
    if inspect.iscoroutinefunction(spec.run):
        with writes_refused(spec.name) if spec.effect is not Effect.WRITES else nullcontext():
            output = await spec.run(arguments, env)
    elif spec.cpu_heavy:
        output = await run_in_worker(spec, arguments, env, progress)
    else:
        work = anyio.to_thread.run_sync(guarded(spec), arguments, env, abandon_on_cancel=True)
        output = await with_heartbeat(progress, work, announce=f"{spec.name}: working")
    if isinstance(output, JobHandle):
        output = await settle_job(spec, output.job_id, env, job_wait_s, progress)
    output.result_id = record_result(
        env.store, spec.name, arguments.model_dump(mode="json"), output.model_dump(mode="json")
    )
    return output


def guarded(spec: ToolSpec) -> Callable[[BaseModel, ToolEnv], Any]:
    """The tool's work as it runs in a thread or worker: a tool that does not write cannot ask for an output."""
    if spec.effect is Effect.WRITES:
        return spec.run
    return functools.update_wrapper(functools.partial(run_reading, spec.name, spec.run), spec.run)


def run_reading(tool: str, run: Callable[[BaseModel, ToolEnv], Any], arguments: BaseModel, env: ToolEnv) -> Any:
    with writes_refused(tool):
        return run(arguments, env)


async def run_in_worker(spec: ToolSpec, arguments: BaseModel, env: ToolEnv, progress: Monotonic | None) -> Any:
    """A cpu_heavy tool in a worker process of its own (core/foundation/process_call.py): the phases it
    reports reach the client as percent, at least every HEARTBEAT_S; a cancel stops the worker's tree."""

    async def forward(value: float, ceiling: float, message: str) -> None:
        if progress is not None:
            await progress.report(value * PERCENT, PERCENT, message, ceiling * PERCENT)

    if progress is not None:
        await progress.report(0, PERCENT, "starting the worker")  # the heartbeat's first value
    work = run_in_process(guarded(spec), (arguments, replace(env, progress=None)), forward, WORKER_PRELOAD)
    return await with_heartbeat(progress, work)


async def with_heartbeat(progress: Monotonic | None, work: Awaitable[T], announce: str | None = None) -> T:
    """`await work`, while `progress` re-sends its last value (a little higher) whenever it falls silent;
    `announce`: the first report of work that reports nothing itself, once it has run for HEARTBEAT_S."""
    if progress is None:
        return await work
    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(progress.heartbeat)
        if announce is not None:
            group.start_soon(_announce, progress, announce)
        try:
            result = await work
        except Exception as exc:  # raised below, outside the group, as itself (not an exception group)
            failure = exc
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result


async def _announce(progress: Monotonic, message: str) -> None:
    await anyio.sleep(HEARTBEAT_S)
    await progress.report(0, PERCENT, message)


async def settle_job(spec: ToolSpec, job_id: str, env: ToolEnv, wait_s: float, progress: Monotonic | None) -> BaseModel:
    """Wait a bounded time for a job: its final output, its failure, or its id and progress (in percent where
    the job has a total; strictly increasing whatever the job's own counts do; re-sent while it is silent)."""

    async def forward(reported: dict[str, Any]) -> None:
        done, total = reported.get("done") or 0, reported.get("total")
        if progress is not None and total:
            await progress.report(done / total * PERCENT, PERCENT, reported.get("message"))
        elif progress is not None:
            await progress.report(done, None, reported.get("message"))

    try:
        status = await with_heartbeat(
            progress, env.jobs.wait(job_id, wait_s if math.isfinite(wait_s) else 10**9, forward)
        )
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(env.jobs.cancel, job_id)
        raise
    return job_outcome(spec, status)


def job_outcome(spec: ToolSpec, status: dict[str, Any]) -> BaseModel:
    """A finished job's output or failure; a job still running answers in the small shape the client gets instead
    of the output: the job (id, state, progress, a line saying where it is), when to poll again, its resource."""
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
    job = JobInfo(
        id=status["id"], status=status["status"], progress=status.get("progress"), message=progress_message(status)
    )
    fields = {"job": job, "poll_after_s": poll_after(status), "resource": job_resource(status["id"])}
    known = spec.output_model.model_fields  # an output with `job` but not JobOutput's other fields gets `job` only
    return spec.output_model(**{name: value for name, value in fields.items() if name in known})
