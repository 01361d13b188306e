"""A target interpreter that dies is a fact about the target, told in words: the signal's name,
what it means, and the step the script was at; never an internal error or a traceback.

Crashes are made on purpose (a script that signals itself, a real shared library compiled here
that raises SIGILL when mapped), so nothing depends on this machine's instruction set.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import console_script
from workbench import crashing_interpreter, git

from vllm_metax_mcp.core.foundation.isolated import (
    STEP_MARKER,
    ProbeDied,
    describe_exit,
    run_isolated,
)

MARKER = "@@TEST@@"
PYTHON = Path(sys.executable)


def script(*lines: str) -> str:
    return "\n".join(["import json, os, signal, sys, time", *lines])


def report(value: dict) -> str:
    return f"sys.stdout.write('\\n{MARKER}' + json.dumps({value!r}) + '\\n'); sys.stdout.flush()"


def announce(text: str) -> str:
    return f"sys.stdout.write('\\n{STEP_MARKER}{text}\\n'); sys.stdout.flush()"


@pytest.mark.parametrize(
    ("sig", "words"),
    [(signal.SIGILL, "illegal instruction"), (signal.SIGSEGV, "segmentation fault"), (signal.SIGABRT, "aborted")],
)
def test_a_signal_is_named_with_the_step_and_the_last_report_kept(sig: signal.Signals, words: str) -> None:
    body = script(report({"stage": 1}), announce("importing a kernel library"), f"os.kill(os.getpid(), {int(sig)})")
    with pytest.raises(ProbeDied) as died:
        run_isolated(PYTHON, body, MARKER, what="test probe")
    assert died.value.death.cause.startswith(f"{sig.name} ({words}")
    assert died.value.death.step == "importing a kernel library"
    assert died.value.partial == {"stage": 1}
    assert died.value.code.value == "blocked"
    assert (
        f"the test probe died: {sig.name}" in died.value.message
        and "while importing a kernel library" in died.value.message
    )


def test_a_report_followed_by_a_step_is_not_a_finished_one() -> None:
    """An exit in the middle (native code calling exit) after an earlier report is a death too."""
    body = script(report({"stage": 1}), announce("loading plugins"), "os._exit(3)")
    with pytest.raises(ProbeDied) as died:
        run_isolated(PYTHON, body, MARKER, what="test probe")
    assert died.value.death.cause.startswith("exit status 3 before a complete report")
    assert died.value.partial == {"stage": 1}


def test_the_deadline_is_a_death_with_its_step() -> None:
    body = script(announce("importing a module that hangs"), "time.sleep(60)")
    with pytest.raises(ProbeDied) as died:
        run_isolated(PYTHON, body, MARKER, what="test probe", timeout_s=1)
    assert "did not finish within 1 s" in died.value.death.cause
    assert died.value.death.step == "importing a module that hangs" and died.value.partial is None


def test_a_finished_report_is_returned() -> None:
    body = script(announce("working"), report({"stage": 1}), report({"stage": 2}))
    assert run_isolated(PYTHON, body, MARKER, what="test probe") == {"stage": 2}


def test_exit_statuses_in_words() -> None:
    assert describe_exit(0) == "exit status 0"
    assert describe_exit(-9) == "SIGKILL (killed (out of memory, or by another process))"
    assert describe_exit(-signal.SIGTERM) == "killed by SIGTERM"


def test_environment_probe_of_an_interpreter_whose_plugin_crashes(tmp_path: Path) -> None:
    """The environment probe imports vllm_metax; its kernel library dies on load. Through the real
    CLI: a `blocked` error naming SIGILL and the import, exit code 3, no traceback."""
    plugin = tmp_path / "plugin"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("")
    git(tmp_path, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    python = crashing_interpreter(PYTHON, tmp_path / "target", "vllm_metax._maca_C")
    (tmp_path / "target/packages/vllm_metax/__init__.py").write_text("from . import _maca_C\n")
    arguments = {"action": "establish", "plugin_repo": "plugin", "python": str(python)}
    proc = subprocess.run(
        [
            str(console_script()),
            "call",
            "environment",
            "--root",
            str(tmp_path),
            "--state-dir",
            str(tmp_path.parent / f"{tmp_path.name}-state"),
            "--args",
            json.dumps(arguments),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    error = json.loads(proc.stderr)["error"]
    assert error["code"] == "blocked"
    assert "SIGILL (illegal instruction" in error["message"] and "while importing vllm_metax" in error["message"]
    assert "Traceback" not in proc.stderr + proc.stdout
