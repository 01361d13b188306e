"""The git runner: argument lists only, read-only subcommands, repository programs neutralised.

Every call disables what a repository's own configuration could make git execute or write
(fsmonitor, hooks, external diff, textconv, signature programs, pager, optional index locks).
Only subcommands that read objects and refs run: nothing that stages, commits, resets, stashes,
checks out or touches a remote, and nothing that compares against the work tree (git would
refresh `.git/index` and run the repository's clean filters); the work tree is read directly.
Options that write files or start programs are refused.

What a `-c` override can neutralise is neutralised on every call (the overrides come last, so
they beat the repository's values); every protocol is forbidden (`GIT_ALLOW_PROTOCOL=` empty
allows none and beats any `protocol.<name>.allow`, plus `-c protocol.<name>.allow=never` for each
transport) and lazy fetching is off where git knows `GIT_NO_LAZY_FETCH`. What no override can
undo is refused by the guard (git_guard.py) before a repository is used.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from ..foundation.errors import ErrorCode, ToolFailure

READ_ONLY_SUBCOMMANDS = frozenset(
    {
        "rev-parse",
        "ls-files",
        "ls-tree",
        "cat-file",
        "log",
        "rev-list",
        "diff-tree",
        "show",
        "merge-base",
        "for-each-ref",
        "name-rev",
        "version",
    }
)
LS_FILES_OPTIONS = frozenset(
    {"-z", "-s", "--stage", "-c", "--cached", "-o", "--others", "--exclude-standard", "--full-name", "--"}
)
"""ls-files may list, never compare with the work tree (-m/-d would run clean filters)."""
REFUSED_OPTION_PREFIXES = (
    "--output",
    "--ext-diff",
    "--textconv",
    "--show-signature",
    "--exec",
    "--open-files-in-pager",
    "--no-index",
    "--upload-pack",
    "--receive-pack",
    "--filters",
    "--path=",
)
TRANSPORTS = ("file", "git", "ssh", "http", "https", "ftp", "ftps", "ext", "fd")
"""Every transport git knows by name; each is forbidden explicitly (a repository's
`protocol.<name>.allow=always` beats a general `protocol.allow=never`)."""
NEUTRALISING_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.untrackedCache=false",
    "core.pager=cat",
    "diff.external=",
    "core.sshCommand=false",
    "credential.helper=",
    "protocol.allow=never",
    *(f"protocol.{name}.allow=never" for name in TRANSPORTS),
    "diff.submodule=short",
    "submodule.recurse=false",
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
        GIT_NO_LAZY_FETCH="1",  # git >= 2.44; older gits are covered by refusing promisor remotes
        GIT_ALLOW_PROTOCOL="",  # an empty allow-list: no transport at all, whatever the config says
        GIT_PROTOCOL_FROM_USER="0",
        XDG_CONFIG_HOME=os.devnull,  # no user-level git/ignore, git/attributes or git/config outside the roots
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
            raise ToolFailure(
                ErrorCode.BAD_INPUT, f"git {subcommand} {arg} could write files or run programs; it is refused."
            )


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


def run_git(
    directory: Path, subcommand: str, *args: str, input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            git_command(directory, subcommand, *args),
            check=False,
            input=input,
            capture_output=True,
            env=hardened_env(),
            timeout=GIT_TIMEOUT_S,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ToolFailure(
            ErrorCode.BLOCKED,
            f"git {subcommand} did not finish within {GIT_TIMEOUT_S} s in {directory.name}; a file git reads there "
            "may be a FIFO or on a stalled file system. Check the repository by hand.",
        ) from None


def scrub_paths(text: str, roots: tuple[Path, ...]) -> str:
    """git's message with the resolved roots taken out, so paths read root-relative."""
    for root in sorted((str(r) for r in roots), key=len, reverse=True):
        text = text.replace(root + "/", "")
        text = re.sub(re.escape(root) + r"(?![\w.-])", ".", text)
    return text
