"""One CPU-heavy call in a worker process of its own: its progress comes back, and a cancel kills its whole tree.

Workers come from a forkserver (multiprocessing's 'forkserver' start): the server has threads (anyio's
worker threads, the stdio reader), whose locks a plain fork would copy in whatever state they are in;
the forkserver is single-threaded and has `preload` imported, so a call starts in milliseconds
rather than the ~1.4 s a fresh interpreter spends importing the tools.

The worker leads its own session, so its process group holds everything it starts (git, target
interpreters, a parse pool). Cancelling the call SIGTERMs the group (the worker's cleanup runs),
SIGKILLs what is left after a grace period and waits until the group is empty; after an answer,
whatever the worker left in its group is stopped the same way. When the server exits mid-call its
forkserver does too, and the worker then kills its group itself.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing import forkserver, get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import anyio

from .errors import ErrorCode, ToolFailure
from .isolated import describe_exit
from .jobs import Stopped, stop_requested
from .progress import reporting

OnProgress = Callable[[float, float, str], Awaitable[None]]
"""Receives (fraction done, the most the current phase may reach, the phase's message)."""
TERMINATE_GRACE_S = 3.0
PR_SET_PDEATHSIG = 1
_FORKSERVER = get_context("forkserver")


async def run_in_process(
    function: Callable[..., Any], args: Sequence[Any], on_progress: OnProgress | None, preload: Sequence[str] = ()
) -> Any:
    """`function(*args)` in a fresh worker; its value, or the exception it raised (both pickled back)."""
    _FORKSERVER.set_forkserver_preload([__name__, *preload])  # read when the forkserver starts
    control, control_end = _FORKSERVER.Pipe(duplex=False)
    answers_end, answers = _FORKSERVER.Pipe(duplex=False)
    process = _FORKSERVER.Process(target=_worker, args=(control, answers), name=f"call {function.__name__}")
    # sys.path, the working directory and __main__ travel with the start itself; the forkserver's environment
    # is that of the first call's moment, so each call brings its own
    payload = pickle.dumps((function, tuple(args), dict(os.environ)))
    answered = False
    try:
        await anyio.to_thread.run_sync(_start, process, control_end, payload, control, answers)
        kind, value = await _collect(answers_end, process, on_progress)
        answered = True
    finally:
        with anyio.CancelScope(shield=True):
            control_end.close()
            await anyio.to_thread.run_sync(stop_group, process, 1.0 if answered else 0.0)
        if answered:
            answers_end.close()  # else a cancelled reader thread may still hold it; it sees EOF and lets go
    if kind == "raised":
        raise value
    return value


def _start(process: BaseProcess, control_end: Connection, payload: bytes, *child_ends: Connection) -> None:
    """Start the worker (the first start also waits for the forkserver's imports) and hand it the call."""
    process.start()
    for end in child_ends:
        end.close()
    control_end.send_bytes(payload)


async def _collect(answers: Connection, process: BaseProcess, on_progress: OnProgress | None) -> tuple[str, Any]:
    """Forward the worker's progress until its answer: ("value", v) or ("raised", exception)."""
    while True:
        try:
            message = await anyio.to_thread.run_sync(answers.recv_bytes, abandon_on_cancel=True)
        except EOFError:
            await anyio.to_thread.run_sync(process.join, 5.0)
            code = process.exitcode if process.exitcode is not None else -signal.SIGKILL
            raise ToolFailure(
                ErrorCode.FAILED,
                f"the worker process of this call ended without an answer ({describe_exit(code)}); "
                "run the call again, and check the machine's memory if it happens again.",
            ) from None
        kind, *rest = pickle.loads(message)
        if kind != "progress":
            return kind, rest[0]
        if on_progress is not None:
            await on_progress(*rest)


# -- the worker --------------------------------------------------------------------------------------


def _worker(control: Connection, answers: Connection) -> None:
    os.setsid()  # first: from here on everything this call starts is in the group a cancel stops
    _end_with_the_server()
    signal.signal(signal.SIGTERM, stop_requested)
    multiprocessing.set_start_method(None, force=True)  # the platform's default for the call's own pools
    _quiet_stdio()
    try:
        function, args, environment = pickle.loads(control.recv_bytes())
    except EOFError:
        os._exit(0)
    os.environ.clear()
    os.environ.update(environment)

    def send(message: tuple[Any, ...]) -> None:
        try:
            answers.send_bytes(_dumps(message))
        except BrokenPipeError:  # the server is gone: nobody waits for this call
            _end_group(signal.SIGPIPE, None)

    try:
        with reporting(lambda value, ceiling, text: send(("progress", value, ceiling, text))):
            outcome: tuple[Any, ...] = ("value", function(*args))
    except Stopped:
        os._exit(128 + signal.SIGTERM)  # cancelled: cleanup ran, nobody waits for an answer
    except BaseException as exc:  # every exception goes back to the caller, which words it
        outcome = ("raised", exc)
    send(outcome)


def _end_with_the_server() -> None:
    """The forkserver exits when the server does (its pipe from the server closes); the kernel then sends
    the worker SIGHUP (PR_SET_PDEATHSIG), on which it kills its whole group. No thread watches for it,
    so the call's own process pools fork from a single-threaded process.

    Every worker is handed a copy of the server's end of that pipe (so that it could start processes
    through the same forkserver, which it does not); closed here, so only the server keeps it alive."""
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    signal.signal(signal.SIGHUP, _end_group)
    _signal_on_parent_exit(signal.SIGHUP)
    if os.getppid() == 1:  # the forkserver was gone before the request took
        _end_group(signal.SIGHUP, None)


def _signal_on_parent_exit(sig: signal.Signals) -> None:
    """The kernel sends `sig` when the forking thread's process exits (Linux; elsewhere callers check the parent)."""
    prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, sig)


def _end_group(signum: int, frame: Any) -> None:
    os.killpg(0, signal.SIGKILL)


def ends_with_its_parent(parent: int | None) -> None:
    """For a helper process a worker forks (a parse pool's): SIGTERM/SIGHUP back to their default, so a
    group stop ends it even if it was forked while the worker was ignoring them; and with `parent` (the
    forking pid, which must have forked from its main thread) killed by the kernel when that process
    exits, however it exits (`os._exit` on a cancel runs no pool shutdown)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    if parent is None:
        return
    _signal_on_parent_exit(signal.SIGKILL)
    if os.getppid() != parent:  # the parent was gone before the request took (reparented to init or a subreaper)
        os._exit(0)


def _quiet_stdio() -> None:
    """The server's stdin and stdout may be the MCP channel: the worker and its children get /dev/null."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)


def _dumps(message: tuple[Any, ...]) -> bytes:
    try:
        return pickle.dumps(message)
    except Exception as exc:  # an unpicklable value or exception: say which, as an error of the call
        problem = f"{type(message[-1]).__name__} could not be sent back from the worker ({type(exc).__name__})"
        return pickle.dumps(("raised", RuntimeError(problem)))


# -- stopping ----------------------------------------------------------------------------------------


def stop_group(process: BaseProcess, patience_s: float) -> None:
    """Give the worker `patience_s` to end with its group by itself (a finished call's worker does at
    once), then SIGTERM the group, then SIGKILL it after TERMINATE_GRACE_S; return once no process of
    the group is left, with the worker reaped."""
    pid = process.pid
    if pid is None:
        return
    process.join(patience_s)
    for sig, wait_s in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 5.0)):
        if not process.is_alive() and not group_members(pid):
            return
        _signal_tree(pid, sig)
        deadline = time.monotonic() + wait_s
        process.join(wait_s)
        while group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    process.join(5.0)


def _signal_tree(pid: int, sig: signal.Signals) -> None:
    for kill in (os.killpg, os.kill):  # the group; and the worker, should it not lead one yet
        try:
            kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members
