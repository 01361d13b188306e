"""The safe git runner: argument lists only, read-only subcommands, repository programs neutralised.

Every call disables what a repository's own configuration could make git execute or write
(fsmonitor, hooks, external diff, textconv, signature programs, pager, optional index locks).
Only subcommands that read objects and refs run: nothing that stages, commits, resets, stashes,
checks out or touches a remote, and nothing that compares against the work tree (git would
refresh `.git/index` and run the repository's clean filters); the work tree is read directly.
Options that write files or start programs are refused.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import ErrorCode, ToolFailure
from .policy import Policy, is_within, real

READ_ONLY_SUBCOMMANDS = frozenset(
    {
        "rev-parse", "ls-files", "ls-tree", "cat-file", "log", "rev-list", "diff-tree",
        "show", "merge-base", "for-each-ref", "name-rev", "version",
    }
)
LS_FILES_OPTIONS = frozenset({"-z", "-s", "--stage", "-c", "--cached", "-o", "--others", "--exclude-standard", "--full-name", "--"})
"""ls-files may list, never compare with the work tree (-m/-d would run clean filters)."""
REFUSED_OPTION_PREFIXES = (
    "--output", "--ext-diff", "--textconv", "--show-signature", "--exec", "--open-files-in-pager",
    "--no-index", "--upload-pack", "--receive-pack", "--filters", "--path=",
)
NEUTRALISING_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.untrackedCache=false",
    "core.pager=cat",
    "diff.external=",
    "core.sshCommand=false",
    "credential.helper=",
    "protocol.allow=never",
    "gc.auto=0",
    "maintenance.auto=false",
    "log.showSignature=false",
    "gpg.program=false",
    "gpg.openpgp.program=false",
    "gpg.x509.program=false",
    "gpg.ssh.program=false",
)
PATCH_SAFE_FLAGS = ("--no-ext-diff", "--no-textconv")
GIT_TIMEOUT_S = 120


def hardened_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_OPTIONAL_LOCKS="0",
        GIT_TERMINAL_PROMPT="0",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_PAGER="cat",
        GIT_ASKPASS="false",
        GIT_NO_REPLACE_OBJECTS="1",
        LC_ALL="C",
    )
    return env


def _check_options(subcommand: str, args: tuple[str, ...]) -> None:
    for arg in args:
        if arg == "--" or arg == "--end-of-options":
            return
        if not arg.startswith("-"):
            continue
        refused = (
            (subcommand == "ls-files" and arg not in LS_FILES_OPTIONS)
            or arg.startswith(REFUSED_OPTION_PREFIXES)
            or ("%G" in arg and arg.startswith(("--format", "--pretty")))
        )
        if refused:
            raise ToolFailure(ErrorCode.BAD_INPUT, f"git {subcommand} {arg} could write files or run programs; it is refused.")


def git_command(repo: Path, subcommand: str, *args: str) -> list[str]:
    if subcommand not in READ_ONLY_SUBCOMMANDS:
        raise ToolFailure(ErrorCode.BAD_INPUT, f"git {subcommand} is not a read-only subcommand this server runs.")
    _check_options(subcommand, args)
    cmd = ["git", "-C", str(repo)]
    for setting in NEUTRALISING_CONFIG:
        cmd += ["-c", setting]
    cmd.append(subcommand)
    if subcommand in ("log", "show", "diff-tree"):
        cmd += PATCH_SAFE_FLAGS
    cmd += args
    return cmd


def run_git(directory: Path, subcommand: str, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        git_command(directory, subcommand, *args),
        input=input,
        capture_output=True,
        env=hardened_env(),
        timeout=GIT_TIMEOUT_S,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


@dataclass(frozen=True)
class Repository:
    """A git repository whose work tree (if any) and git dirs all lie inside the read roots."""

    top: Path
    git_dir: Path
    common_dir: Path
    bare: bool

    def run(self, subcommand: str, *args: str, input: bytes | None = None, check: bool = True) -> bytes:
        proc = run_git(self.top, subcommand, *args, input=input)
        if check and proc.returncode != 0:
            message = proc.stderr.decode(errors="replace").strip().splitlines()
            raise ToolFailure(ErrorCode.FAILED, f"git {subcommand} failed: {message[-1] if message else proc.returncode}")
        return proc.stdout

    def text(self, subcommand: str, *args: str) -> str:
        return self.run(subcommand, *args).decode()

    def resolve_commit(self, revision: str) -> str:
        """A full commit sha for a caller's revision; option-like or unknown revisions are refused."""
        if not revision or revision.startswith("-") or any(c in revision for c in "\0\n\r"):
            raise ToolFailure(
                ErrorCode.INVALID_REVISION,
                f"{revision!r} is not a revision: it must not be empty or start with '-'. Pass a commit, tag or branch name.",
            )
        proc = run_git(self.top, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{revision}^{{commit}}")
        if proc.returncode != 0:
            raise ToolFailure(
                ErrorCode.INVALID_REVISION,
                f"{revision!r} does not name a commit in this repository; check the revision with `git log`.",
            )
        return proc.stdout.decode().strip()

    @property
    def key(self) -> str:
        """Repositories (and their worktrees) are identified by their git common dir."""
        return str(self.common_dir)


def open_repository(path: str | os.PathLike[str], policy: Policy) -> Repository:
    """Open the repository at `path`, checking that its work tree and git dirs are inside the roots."""
    start = policy.readable(path)
    if not start.exists():
        raise ToolFailure(ErrorCode.NOT_FOUND, f"{path} does not exist.")
    probe_dir = start if start.is_dir() else start.parent
    lines = _rev_parse(probe_dir, "--is-bare-repository", "--absolute-git-dir", "--git-common-dir")
    if lines is None or len(lines) != 3:
        raise ToolFailure(ErrorCode.NOT_FOUND, f"{path} is not inside a git repository; pass the repository root.")
    bare = lines[0] == "true"
    git_dir = real(lines[1])
    common = Path(lines[2])
    common_dir = real(common if common.is_absolute() else probe_dir / common)
    top = git_dir
    if not bare:
        toplevel = _rev_parse(probe_dir, "--show-toplevel")
        if not toplevel:
            raise ToolFailure(ErrorCode.NOT_FOUND, f"{path} is inside a git directory, not a work tree; pass the repository root.")
        top = real(toplevel[0])
    for location, what in ((git_dir, "git directory"), (common_dir, "git common directory"), (top, "work tree")):
        if not any(is_within(location, root) for root in policy.roots):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"The repository's {what} lies outside the server's roots (a .git file or worktree pointing "
                "elsewhere); add a --root that covers it or use a plain checkout.",
            )
    return Repository(top=top, git_dir=git_dir, common_dir=common_dir, bare=bare)


def _rev_parse(directory: Path, *flags: str) -> list[str] | None:
    proc = run_git(directory, "rev-parse", *flags)
    return proc.stdout.decode().splitlines() if proc.returncode == 0 else None
