"""The safe git runner: validated revisions, read-only subcommands, repository programs never run,
`.git/index` never rewritten.

Each canary test first shows (on a throwaway copy, with plain git) that the canary is live,
so a pass means the server neutralised it, not that the set-up was inert.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import git, make_repo, plain_git_env, snapshot

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.sources.git import Repository, open_repository
from vllm_metax_mcp.core.sources.git_runner import READ_ONLY_SUBCOMMANDS

pytestmark = pytest.mark.timeout(90)

HOOK_NAMES = (
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "post-checkout",
    "post-merge",
    "pre-rebase",
    "post-rewrite",
    "post-index-change",
    "reference-transaction",
    "pre-auto-gc",
    "fsmonitor-watchman",
    "pre-push",
    "sendemail-validate",
)

# One entry per read-only subcommand the runner allows; a new subcommand must be added here.
READ_BATTERY: dict[str, list[tuple[str, ...]]] = {
    "rev-parse": [("HEAD",), ("--show-toplevel",), ("--git-dir",)],
    "ls-files": [(), ("-s",), ("-o", "--exclude-standard")],
    "ls-tree": [("-r", "HEAD")],
    "cat-file": [("-p", "HEAD"), ("-p", "HEAD:pkg/model.py")],
    "log": [("-p",), ("--stat", "HEAD~1..HEAD"), ("-p", "--all")],
    "rev-list": [("--all",)],
    "diff-tree": [("-p", "-r", "HEAD~1", "HEAD")],
    "show": [(), ("HEAD~1",), ("v1",)],
    "merge-base": [("HEAD", "feature")],
    "for-each-ref": [()],
    "name-rev": [("HEAD",)],
    "version": [()],
}
# Subcommands and options that compare with the work tree: git would refresh .git/index and run
# the repository's clean filters, so the runner refuses them (the work tree is read directly).
WORKTREE_COMPARING: list[tuple[str, ...]] = [
    ("diff",),
    ("diff", "HEAD"),
    ("describe", "--always", "--dirty"),
    ("blame", "--", "pkg/model.py"),
    ("grep", "-e", "forward"),
    ("ls-files", "-m"),
    ("ls-files", "--modified"),
    ("ls-files", "-d"),
]


def test_worktree_comparing_commands_are_refused(tmp_path: Path) -> None:
    repo_path = make_repo(tmp_path / "root" / "repo")
    repo = open_repository(repo_path, Policy.create([str(tmp_path / "root")]))
    for args in WORKTREE_COMPARING:
        with pytest.raises(ToolFailure) as refused:
            repo.run(*args)
        assert refused.value.code is ErrorCode.BAD_INPUT, args


def test_battery_covers_every_read_only_subcommand() -> None:
    assert set(READ_BATTERY) == set(READ_ONLY_SUBCOMMANDS), "extend READ_BATTERY for new subcommands"


def exercise_everything(root: Path, repo_path: Path) -> Repository:
    """open_repository, resolve_commit, key, and every read-only subcommand through run/text."""
    policy = Policy.create([str(root)])
    repo = open_repository(repo_path, policy)
    assert repo.key
    for revision in ("HEAD", "v1", "feature", "HEAD~1", "main"):
        assert len(repo.resolve_commit(revision)) == 40
    for bad in ("-x", "no-such-branch"):
        with pytest.raises(ToolFailure):
            repo.resolve_commit(bad)
    for subcommand, variants in READ_BATTERY.items():
        for args in variants:
            repo.run(subcommand, *args)
            repo.text(subcommand, *args)
    open_repository(repo_path / "pkg", policy)
    return repo


def write_canary(bin_dir: Path, hits: Path, name: str, body: str = "") -> Path:
    """A program that records that it ran (hits/<name>) and then does `body`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    hits.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    script.write_text(f'#!/bin/sh\necho "$@" >> "{hits / name}"\n{body}\nexit 0\n')
    script.chmod(0o755)
    return script


def canary_repo(tmp_path: Path, config: dict[str, str], attributes: str | None = None) -> Path:
    repo = make_repo(tmp_path / "root" / "repo")
    if attributes is not None:
        (repo / ".gitattributes").write_text(attributes)
        git(repo, "add", ".gitattributes")
        git(repo, "commit", "-q", "-m", "attributes")
        git(repo, "add", "pkg/staged.py")
        (repo / "pkg" / "model.py").write_text("def forward(x):\n    return x + 3  # unstaged\n")
    for key, value in config.items():
        git(repo, "config", key, value)
    return repo


def plain_git_in_copy(repo: Path, tmp_path: Path, *args: str) -> None:
    """Run git the way a user would, on a copy (so the repository under test stays untouched)."""
    copy = tmp_path / "control-copy"
    if not copy.exists():
        shutil.copytree(repo, copy, symlinks=True)
    identity = ["-c", "user.name=Control", "-c", "user.email=control@example.invalid"]
    subprocess.run(["git", *identity, *args], cwd=copy, env=plain_git_env(), capture_output=True, timeout=60)


def reset_hits(hits: Path) -> None:
    for item in hits.iterdir():
        item.unlink()


def hits_of(hits: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in hits.iterdir()} if hits.exists() else {}


# -- revisions and subcommands ---------------------------------------------------------------


@pytest.mark.parametrize("revision", ["-x", "--output=x.txt", "--output", "-ox.txt", ""])
def test_option_like_revision_is_refused_and_writes_nothing(
    revision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo_path = make_repo(tmp_path / "root" / "repo")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    repo = open_repository(repo_path, Policy.create([str(tmp_path / "root")]))
    before = snapshot(repo_path)

    with pytest.raises(ToolFailure) as info:
        repo.resolve_commit(revision)
    assert info.value.code is ErrorCode.INVALID_REVISION
    assert list(tmp_path.rglob("x.txt")) == []
    assert list(cwd.iterdir()) == []
    assert snapshot(repo_path) == before


def test_revision_with_end_of_options_does_not_parse_options(tmp_path: Path) -> None:
    repo = open_repository(make_repo(tmp_path / "root" / "repo"), Policy.create([str(tmp_path / "root")]))
    for revision in ("HEAD --output=x.txt", "HEAD\n--output=x.txt", "main^{tree}"):
        with pytest.raises(ToolFailure) as info:
            repo.resolve_commit(revision)
        assert info.value.code is ErrorCode.INVALID_REVISION
    assert list(tmp_path.rglob("x.txt")) == []


@pytest.mark.parametrize(
    "subcommand, args",
    [
        ("commit", ("-m", "x", "--allow-empty")),
        ("reset", ("--hard", "HEAD~1")),
        ("checkout", ("feature",)),
        ("stash", ()),
        ("add", ("-A",)),
        ("status", ()),
        ("update-index", ("--refresh",)),
        ("config", ("core.fsmonitor", "true")),
        ("fetch", ()),
        ("gc", ()),
    ],
)
def test_non_read_only_subcommands_are_refused(subcommand: str, args: tuple[str, ...], tmp_path: Path) -> None:
    repo_path = make_repo(tmp_path / "root" / "repo")
    repo = open_repository(repo_path, Policy.create([str(tmp_path / "root")]))
    before = snapshot(repo_path)
    with pytest.raises(ToolFailure):
        repo.run(subcommand, *args)
    assert snapshot(repo_path) == before


def test_run_refuses_caller_options_that_write_files_or_run_programs(tmp_path: Path) -> None:
    """Defence in depth: read-only subcommands still take options that write a file
    (`--output`) or execute a program (`grep -O`, `--ext-diff`, `--textconv`)."""
    root = tmp_path / "root"
    repo_path = make_repo(root / "repo")
    hits = tmp_path / "hits"
    pager = write_canary(tmp_path / "bin", hits, "pager")
    repo = open_repository(repo_path, Policy.create([str(root)]))
    attempts = [
        ("log", f"--output={tmp_path / 'x.txt'}"),
        ("diff", f"--output={tmp_path / 'y.txt'}", "HEAD~1"),
        ("grep", f"-O{pager}", "-e", "forward"),
        ("grep", f"--open-files-in-pager={pager}", "-e", "forward"),
    ]
    ran = []
    for args in attempts:
        try:
            repo.run(*args, check=False)
            ran.append(args)
        except ToolFailure:
            pass
    assert hits_of(hits) == {}, f"a caller-supplied option ran a program: {hits_of(hits)}"
    assert not (tmp_path / "x.txt").exists() and not (tmp_path / "y.txt").exists(), "an option wrote a file"
    assert ran == [], f"options that write files or run programs were accepted: {ran}"


# -- repository-configured programs ----------------------------------------------------------


def test_fsmonitor_canary_never_runs(tmp_path: Path) -> None:
    hits = tmp_path / "hits"
    canary = write_canary(tmp_path / "bin", hits, "fsmonitor")
    repo = canary_repo(tmp_path, {"core.fsmonitor": str(canary)})

    plain_git_in_copy(repo, tmp_path, "status")
    assert "fsmonitor" in hits_of(hits), "control: plain git should run the fsmonitor canary"
    reset_hits(hits)

    exercise_everything(tmp_path / "root", repo)
    assert hits_of(hits) == {}


def test_hooks_canary_never_runs(tmp_path: Path) -> None:
    hits = tmp_path / "hits"
    hooks_dir = tmp_path / "hooks"
    for name in HOOK_NAMES:
        write_canary(hooks_dir, hits, name)
    repo = canary_repo(tmp_path, {"core.hooksPath": str(hooks_dir)})
    own_hooks = repo / ".git" / "hooks"
    own_hooks.mkdir(exist_ok=True)
    for name in HOOK_NAMES:
        write_canary(own_hooks, hits, name)

    plain_git_in_copy(repo, tmp_path, "commit", "-q", "--allow-empty", "-m", "control")
    assert "pre-commit" in hits_of(hits), "control: plain git commit should run the hook canary"
    reset_hits(hits)

    repo_obj = exercise_everything(tmp_path / "root", repo)
    for args in (("log", "-p"), ("show",), ("diff-tree", "-p", "HEAD~1", "HEAD")):
        repo_obj.run(*args)
    assert hits_of(hits) == {}


def test_diff_external_canary_never_runs(tmp_path: Path) -> None:
    hits = tmp_path / "hits"
    canary = write_canary(tmp_path / "bin", hits, "external")
    repo = canary_repo(tmp_path, {"diff.external": str(canary)})

    plain_git_in_copy(repo, tmp_path, "diff", "HEAD")
    assert "external" in hits_of(hits), "control: plain git diff should run diff.external"
    reset_hits(hits)

    repo_obj = exercise_everything(tmp_path / "root", repo)
    for args in (("log", "-p"), ("show",), ("show", "HEAD~1"), ("diff-tree", "-p", "HEAD~1", "HEAD")):
        repo_obj.run(*args)
    assert hits_of(hits) == {}


def test_attribute_diff_driver_and_textconv_canaries_never_run(tmp_path: Path) -> None:
    hits = tmp_path / "hits"
    command = write_canary(tmp_path / "bin", hits, "diffcommand")
    textconv = write_canary(tmp_path / "bin", hits, "textconv", 'cat "$1"')
    repo = canary_repo(
        tmp_path,
        {"diff.cmd.command": str(command), "diff.conv.textconv": str(textconv)},
        attributes="*.py diff=cmd\n*.md diff=conv\n",
    )
    (repo / "README.md").write_text("# changed\n")

    plain_git_in_copy(repo, tmp_path, "diff", "HEAD")
    assert {"diffcommand", "textconv"} <= set(hits_of(hits)), "control: plain git diff should run both drivers"
    reset_hits(hits)

    repo_obj = exercise_everything(tmp_path / "root", repo)
    for args in (("log", "-p"), ("show",), ("diff-tree", "-p", "HEAD~1", "HEAD")):
        repo_obj.run(*args)
    assert hits_of(hits) == {}


def test_clean_filter_canary_never_runs(tmp_path: Path) -> None:
    """`git diff`, `ls-files -m` and `blame` of a modified file run the repository's clean filter."""
    hits = tmp_path / "hits"
    clean = write_canary(tmp_path / "bin", hits, "clean", "cat")
    repo = canary_repo(tmp_path, {}, attributes="*.py filter=canary\n")
    git(repo, "config", "filter.canary.clean", str(clean))
    git(repo, "config", "filter.canary.smudge", str(clean))

    plain_git_in_copy(repo, tmp_path, "diff")
    assert "clean" in hits_of(hits), "control: plain git diff should run the clean filter"
    reset_hits(hits)

    root = tmp_path / "root"
    repo_obj = open_repository(repo, Policy.create([str(root)]))
    for args in (("diff",), ("diff", "HEAD"), ("ls-files", "-m"), ("blame", "--", "pkg/model.py")):
        with pytest.raises(ToolFailure):  # refused before git starts
            repo_obj.run(*args, check=False)
    for args in (("ls-files", "-s"), ("log", "-p"), ("show", "HEAD"), ("cat-file", "-p", "HEAD:pkg/model.py")):
        repo_obj.run(*args, check=False)
    assert hits_of(hits) == {}, f"repository filter driver ran: {sorted(hits_of(hits))}"


def test_gpg_program_canary_never_runs(tmp_path: Path) -> None:
    """`log.showSignature=true` makes `git log`/`show` verify a signed commit with `gpg.program`."""
    hits = tmp_path / "hits"
    gpg = write_canary(tmp_path / "bin", hits, "gpg")
    repo = canary_repo(tmp_path, {"log.showSignature": "true", "gpg.program": str(gpg)})
    tree = git(repo, "rev-parse", "HEAD^{tree}").strip()
    parent = git(repo, "rev-parse", "HEAD").strip()
    body = (
        f"tree {tree}\nparent {parent}\nauthor T <t@e> 1700000000 +0000\ncommitter T <t@e> 1700000000 +0000\n"
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n AAAA\n -----END PGP SIGNATURE-----\n\nsigned\n"
    )
    sha = (
        subprocess.run(
            ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
            cwd=repo,
            input=body.encode(),
            env=plain_git_env(),
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    git(repo, "update-ref", "refs/heads/signed", sha)

    plain_git_in_copy(repo, tmp_path, "log", "-1", "signed")
    assert "gpg" in hits_of(hits), "control: plain git log should run gpg.program"
    reset_hits(hits)

    repo_obj = open_repository(repo, Policy.create([str(tmp_path / "root")]))
    for args in (("log", "signed"), ("show", "signed")):
        repo_obj.run(*args, check=False)
    with pytest.raises(ToolFailure):  # signature placeholders would verify with gpg: refused
        repo_obj.run("log", "-1", "--format=%G?", "signed")
    assert hits_of(hits) == {}, "gpg.program ran"


# -- no index writes -------------------------------------------------------------------------


def test_index_bytes_and_mtime_unchanged_after_every_call(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "root" / "repo")
    index = repo / ".git" / "index"
    # control: a plain `git status` on a copy rewrites the copy's index (stale stat info)
    copy = tmp_path / "control-copy"
    shutil.copytree(repo, copy, symlinks=True)
    copy_before = (copy / ".git" / "index").read_bytes()
    subprocess.run(["git", "status"], cwd=copy, env=plain_git_env(), capture_output=True, check=True)
    assert (copy / ".git" / "index").read_bytes() != copy_before, "control: plain git status should refresh the index"

    before_bytes, before_stat = index.read_bytes(), index.stat()
    before = snapshot(repo)
    exercise_everything(tmp_path / "root", repo)
    assert index.read_bytes() == before_bytes
    assert index.stat().st_mtime_ns == before_stat.st_mtime_ns
    assert not (repo / ".git" / "index.lock").exists()
    assert snapshot(repo) == before


def test_describe_dirty_does_not_rewrite_the_index(tmp_path: Path) -> None:
    """`git describe --dirty` refreshes and writes `.git/index` even with GIT_OPTIONAL_LOCKS=0."""
    repo = make_repo(tmp_path / "root" / "repo")
    index = repo / ".git" / "index"
    before_bytes, before_mtime = index.read_bytes(), index.stat().st_mtime_ns
    opened = open_repository(repo, Policy.create([str(tmp_path / "root")]))
    for args in (("--always", "--dirty"), ("--always", "--broken")):
        try:
            opened.run("describe", *args)
        except ToolFailure:
            pass  # refusing the option is a fine answer too
    assert index.read_bytes() == before_bytes, "git describe --dirty rewrote .git/index"
    assert index.stat().st_mtime_ns == before_mtime


def test_outer_git_environment_does_not_redirect_the_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIT_DIR / GIT_INDEX_FILE in the server's environment must not point git elsewhere."""
    repo = make_repo(tmp_path / "root" / "repo")
    other = make_repo(tmp_path / "other")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "evil-index"))
    opened = open_repository(repo, Policy.create([str(tmp_path / "root")]))
    assert opened.top == repo.resolve()
    assert opened.text("rev-parse", "--git-dir").strip() in (".git", str(repo / ".git"))
    opened.run("ls-files", "-s")
    assert not (tmp_path / "evil-index").exists()
    assert os.environ["GIT_DIR"] == str(other / ".git")
