"""Running a script in the *target* interpreter, and telling how it ended.

The target interpreter is foreign code: its kernel libraries may be built for instructions this
CPU lacks (SIGILL), an import may hang or crash. A probe that dies is a fact about the target,
reported in words with the signal's name and the step it was at, never an internal error. A
script may announce its steps (`STEP_MARKER` lines) and print reports more than once; the last
complete report survives a later crash, so what was learnt before it is kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ErrorCode, ToolFailure

PROBE_TIMEOUT_S = 180
STEP_MARKER = "@@STEP@@"
HIDDEN_DEVICE_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "MACA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
)
SIGNAL_MEANINGS = {
    signal.SIGILL: "illegal instruction: a compiled library uses CPU instructions this machine lacks",
    signal.SIGSEGV: "segmentation fault in native code",
    signal.SIGBUS: "bus error in native code",
    signal.SIGABRT: "aborted by native code",
    signal.SIGFPE: "arithmetic fault in native code",
    signal.SIGKILL: "killed (out of memory, or by another process)",
}


def describe_exit(status: int) -> str:
    """An exit status in words: `SIGILL (illegal instruction: ...)` for a signal, else the status."""
    if status >= 0:
        return f"exit status {status}"
    try:
        sig = signal.Signals(-status)
    except ValueError:
        return f"killed by signal {-status}"
    meaning = SIGNAL_MEANINGS.get(sig)
    return f"{sig.name} ({meaning})" if meaning else f"killed by {sig.name}"


@dataclass(frozen=True)
class ProbeDeath:
    """How a target-interpreter script ended without a complete report."""

    what: str
    cause: str
    step: str | None

    def sentence(self) -> str:
        where = f" while {self.step}" if self.step else ""
        return f"the {self.what} died: {self.cause}{where}"


class ProbeDied(ToolFailure):
    """A target script that crashed, hung or printed no report; `partial` is its last report, if any."""

    def __init__(self, death: ProbeDeath, partial: dict[str, Any] | None = None) -> None:
        super().__init__(
            ErrorCode.BLOCKED,
            f"In the target interpreter, {death.sentence()}; the interpreter cannot run it here. "
            "Check the interpreter by hand or pick another one.",
            cause=death.cause,
            step=death.step,
        )
        self.death = death
        self.partial = partial

    def __reduce__(self) -> tuple[Any, ...]:
        return (ProbeDied, (self.death, self.partial))


def isolated_env(pythonpath: list[Path] | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a target-interpreter subprocess: devices hidden, no bytecode, no startup hooks."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONPATH")}
    env.update({name: "" for name in HIDDEN_DEVICE_VARIABLES})
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env.update(extra or {})
    return env


def die_with_parent() -> None:
    """In the child before exec: be killed when the process that started us dies (Linux), so a
    cancelled call whose worker process is killed leaves no probe running to its deadline."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kill_group(pgid: int) -> None:
    """Children the script left behind (a group of its own) do not outlive the call."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_report(lines: list[str], marker: str) -> tuple[int, dict[str, Any] | None]:
    """(line number, report) of the last report after `marker` that parses; a crash may cut one short."""
    for number in range(len(lines) - 1, -1, -1):
        found = lines[number].find(marker)
        if found < 0:
            continue
        try:
            value = json.loads(lines[number][found + len(marker) :])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return number, value
    return -1, None


def _last_step(lines: list[str]) -> tuple[int, str | None]:
    """(line number, text) of the last step the script announced."""
    for number in range(len(lines) - 1, -1, -1):
        if lines[number].startswith(STEP_MARKER):
            return number, lines[number][len(STEP_MARKER) :].strip()
    return -1, None


def _last_error_line(err: bytes) -> str | None:
    lines = [line.strip() for line in err.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else None


def run_isolated(
    python: Path,
    script: str,
    marker: str,
    *,
    what: str,
    stdin: bytes | None = None,
    pythonpath: list[Path] | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> dict[str, Any]:
    """Run `script` in the target interpreter from an empty directory, in its own process group
    killed at the deadline, and return the last report it printed after `marker`.

    A signal, the deadline, or an exit without a report raises `ProbeDied` with the cause in
    words, the step the script had announced, and the last report printed before it ended.
    """
    env = isolated_env(pythonpath, extra_env)
    timed_out = False
    with tempfile.TemporaryDirectory(prefix="vmm-probe-") as empty:
        proc = subprocess.Popen(
            [str(python), "-c", script],
            cwd=empty,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            out, err = proc.communicate(input=stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        finally:
            kill_group(proc.pid)
    lines = out.decode(errors="replace").splitlines()
    report_at, report = _last_report(lines, marker)
    step_at, step = _last_step(lines)
    status = proc.returncode
    if report is not None and report_at > step_at and not timed_out and status >= 0:
        return report
    if timed_out:
        cause = f"it did not finish within {timeout_s:g} s (an import hangs)"
    elif status < 0:
        cause = describe_exit(status)
    else:
        last = _last_error_line(err)
        cause = f"{describe_exit(status)} before a complete report" + (f" ({last})" if last else "")
    raise ProbeDied(ProbeDeath(what, cause, step), report)
