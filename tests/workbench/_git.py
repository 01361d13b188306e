"""Plain ``git`` subprocess calls that do not depend on the machine's git setup.

Global and system config are switched off and identity, dates, branch name and
excludes are passed explicitly, so the same inputs give the same commit shas on any
machine (tests may compare shas across runs).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

#: Fixed epoch for the first commit of every workbench repository; later commits
#: add one hour each, so dates (and therefore shas) are reproducible.
BASE_EPOCH = 1_704_067_200  # 2024-01-01T00:00:00Z
COMMIT_STEP_S = 3600
COMMITTER = "Workbench Committer <committer@workbench.invalid>"

_IDENT = re.compile(r"^\s*(?P<name>[^<>]+?)\s*<(?P<email>[^<>]*)>\s*$")
_ISOLATING_CONFIG = (
    "-c",
    "user.name=Workbench",
    "-c",
    "user.email=workbench@workbench.invalid",
    "-c",
    "init.defaultBranch=main",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "tag.gpgsign=false",
    "-c",
    "core.autocrlf=false",
    "-c",
    f"core.excludesFile={os.devnull}",
    "-c",
    f"core.hooksPath={os.devnull}",
    "-c",
    "advice.detachedHead=false",
)


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for git that ignores global/system config and any outer repo."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
    )
    if extra:
        env.update(extra)
    return env


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``git args`` in ``cwd`` and return stdout; raise with stderr on failure."""
    proc = subprocess.run(
        ["git", *_ISOLATING_CONFIG, *args],
        cwd=cwd,
        env=git_env(env),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd} (rc={proc.returncode}):\n{proc.stderr}")
    return proc.stdout


def parse_ident(ident: str) -> tuple[str, str]:
    """Split ``"Name <email>"`` into its parts."""
    match = _IDENT.match(ident)
    if not match:
        raise ValueError(f"expected 'Name <email>', got {ident!r}")
    return match["name"], match["email"]


def commit_count(repo: Path) -> int:
    """Number of commits reachable from HEAD (0 in a fresh repository)."""
    proc = subprocess.run(
        ["git", "rev-list", "--count", "HEAD"],
        cwd=repo,
        env=git_env(),
        capture_output=True,
        text=True,
    )
    return int(proc.stdout.strip()) if proc.returncode == 0 else 0


def deterministic_commit(
    repo: Path,
    message: str,
    author: str,
    *,
    git_args: tuple[str, ...] = (),
    allow_empty: bool = False,
) -> str:
    """Commit the index of ``repo`` with a date derived from its commit count.

    The n-th commit of a repository is dated ``BASE_EPOCH + n hours`` for author and
    committer, so rebuilding the same history yields the same shas.
    """
    name, email = parse_ident(author)
    c_name, c_email = parse_ident(COMMITTER)
    date = f"@{BASE_EPOCH + commit_count(repo) * COMMIT_STEP_S} +0000"
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": c_name,
        "GIT_COMMITTER_EMAIL": c_email,
        "GIT_COMMITTER_DATE": date,
    }
    args = ["commit", "-q", "--no-verify", "-m", message]
    if allow_empty:
        args.append("--allow-empty")
    git(repo, *git_args, *args, env=env)
    return git(repo, "rev-parse", "HEAD").strip()
