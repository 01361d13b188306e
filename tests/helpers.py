"""Small real-parts helpers for the Foundation tests: git repositories, snapshots, processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from vllm_metax_mcp.core.foundation.atomic import write_bytes_atomic
from vllm_metax_mcp.core.foundation.policy import Effect
from vllm_metax_mcp.tools.spec import JobOutput, ToolEnv, ToolOutput, ToolSpec

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
JOB_MARKER_ENV = "VLLM_METAX_MCP_JOB"

GIT_IDENTITY = (
    "-c",
    "user.name=Test Author",
    "-c",
    "user.email=test@example.invalid",
    "-c",
    "init.defaultBranch=main",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "tag.gpgsign=false",
    "-c",
    f"core.hooksPath={os.devnull}",
    "-c",
    "core.fsmonitor=false",
)


def plain_git_env() -> dict[str, str]:
    """git as a user would run it in the repo, minus the machine's global/system config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


def git(cwd: Path, *args: str, check: bool = True, identity: bool = True) -> str:
    cmd = ["git", *(GIT_IDENTITY if identity else ()), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=plain_git_env(), capture_output=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed: {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode()


def make_repo(path: Path) -> Path:
    """A small git repository with two commits, a tag, a staged change, an unstaged change,
    an untracked file and a tracked file whose stat info is stale (a refresh would rewrite
    `.git/index`)."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    pkg = path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("def forward(x):\n    return x\n")
    (path / "README.md").write_text("# demo\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "first")
    git(path, "tag", "v1")
    (pkg / "model.py").write_text("def forward(x):\n    return x + 1\n")
    git(path, "commit", "-q", "-am", "second")
    git(path, "branch", "feature")
    (pkg / "staged.py").write_text("STAGED = True\n")
    git(path, "add", "pkg/staged.py")
    (pkg / "model.py").write_text("def forward(x):\n    return x + 2  # unstaged\n")
    (path / "untracked.txt").write_text("not tracked\n")
    stale = time.time() + 5
    os.utime(path / "README.md", (stale, stale))
    return path


def snapshot(repo: Path) -> dict[str, Any]:
    """Everything a read-only call must leave alone: worktree bytes, every file of the git dir
    except objects (index, HEAD, refs, packed-refs, logs, config), and the index's mtime."""
    files: dict[str, bytes] = {}
    for item in sorted(repo.rglob("*")):
        rel = item.relative_to(repo).as_posix()
        if rel == ".git/objects" or rel.startswith(".git/objects/"):
            continue
        if item.is_symlink():
            files[rel] = b"->" + os.readlink(item).encode()
        elif item.is_file():
            files[rel] = item.read_bytes()
        elif item.is_dir():
            files[rel + "/"] = b""
    index = repo / ".git" / "index"
    return {"files": files, "index_mtime_ns": index.stat().st_mtime_ns if index.exists() else None}


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pids_with_marker(job_id: str) -> list[int]:
    marker = f"{JOB_MARKER_ENV}={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def live_pids_with_env(name: str, value: str) -> list[int]:
    """Live (not zombie) processes whose environment has `name=value`: a server started with a marker
    variable and everything it started, whatever became of their parents."""
    marker = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and pid_alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def console_script() -> Path:
    """The installed `vllm-metax-mcp` script of whatever environment runs the suite."""
    return Path(sys.executable).parent / "vllm-metax-mcp"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def with_tests_on_pythonpath(monkeypatch: Any) -> None:
    """Job workers import `jobtargets` from tests/; they inherit the environment."""
    existing = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS_DIR), *([existing] if existing else [])]))


# -- tools that exist only in tests ----------------------------------------------------------


class JobToolInput(BaseModel):
    target: str = "jobtargets:sleep_with_progress"
    args: dict[str, Any] = Field(default_factory=dict)


class JobToolOutput(JobOutput):
    steps: int | None = None
    message: str | None = None


def start_job(args: JobToolInput, env: ToolEnv):
    """Run a test target as a job."""
    return env.jobs.start(env.tool, args.target, args.args)


JOB_TOOL = ToolSpec(
    name="test_job",
    effect=Effect.VALIDATES,
    run=start_job,
    input_model=JobToolInput,
    output_model=JobToolOutput,
    title="Test job",
    idempotent=False,
)


class WriteNoteInput(BaseModel):
    path: str = Field(description="Output file, relative to the first root or absolute.")
    text: str = "hello"


class WriteNoteOutput(ToolOutput):
    written: str = ""


def write_note(args: WriteNoteInput, env: ToolEnv) -> WriteNoteOutput:
    """Write a small text file under an output root."""
    target = env.policy.writable(args.path)
    write_bytes_atomic(target, args.text.encode())
    return WriteNoteOutput(written=target.name)


WRITE_TOOL = ToolSpec(
    name="test_write_note",
    effect=Effect.WRITES,
    run=write_note,
    input_model=WriteNoteInput,
    output_model=WriteNoteOutput,
    title="Write a note",
)
