"""The path chokepoint: read roots, output roots, protected paths, git dirs, atomic outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from helpers import git, make_repo

from vllm_metax_mcp.core.foundation.atomic import (
    EXPORT_MARKER,
    staged_directory,
    write_bytes_atomic,
)
from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.sources.git import open_repository

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The HF cache is readable by design; keep it somewhere that no test path falls under.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def earlier_output(target: Path) -> Path:
    """A directory this server wrote before: it carries the export marker."""
    target.mkdir(parents=True)
    (target / EXPORT_MARKER).write_text('{\n  "format": "vllm-metax-mcp/export/1",\n  "tool": "export_snapshot"\n}\n')
    return target


def refused(code: ErrorCode, fn, *args) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        fn(*args)
    assert info.value.code is code, info.value.to_dict()
    return info.value


def test_path_outside_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("x")
    policy = Policy.create([str(root)])

    assert policy.readable(root / "sub") == (root / "sub").resolve()
    assert policy.readable("sub") == (root / "sub").resolve()
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, outside / "secret.txt")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, "../elsewhere/secret.txt")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, "/etc/passwd")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, outside / "new.txt")


def test_prefix_sibling_is_not_inside_the_root(tmp_path: Path) -> None:
    allowed = tmp_path / "x" / "allowed"
    evil = tmp_path / "x" / "allowed-evil"
    allowed.mkdir(parents=True)
    evil.mkdir()
    (evil / "f.txt").write_text("x")
    policy = Policy.create([str(allowed)])

    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, evil / "f.txt")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, str(allowed) + "-evil/f.txt")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, evil / "out.txt")


def test_symlink_inside_a_root_pointing_outside_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("x")
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "file-link").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to(outside / "not-yet")
    policy = Policy.create([str(root)])

    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, root / "link" / "secret.txt")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, root / "file-link")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, root / "link" / "new.txt")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, root / "dangling")
    assert not (outside / "new.txt").exists() and not (outside / "not-yet").exists()


def test_git_file_pointing_outside_the_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    external_gitdir = tmp_path / "external-gitdir"
    repo = root / "repo"
    repo.mkdir()
    git(repo, "init", "-q", f"--separate-git-dir={external_gitdir}")
    (repo / "a.txt").write_text("a\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "-q", "-m", "one")
    assert (repo / ".git").is_file() and "gitdir:" in (repo / ".git").read_text()
    policy = Policy.create([str(root)])

    failure = refused(ErrorCode.OUTSIDE_ROOTS, open_repository, repo, policy)
    assert str(external_gitdir) not in failure.message


def test_worktree_whose_common_dir_is_outside_the_roots_is_refused(tmp_path: Path) -> None:
    main_repo = make_repo(tmp_path / "outside-main")
    root = tmp_path / "root"
    root.mkdir()
    git(main_repo, "worktree", "add", "-q", str(root / "wt"), "feature")
    policy = Policy.create([str(root)])

    refused(ErrorCode.OUTSIDE_ROOTS, open_repository, root / "wt", policy)


def test_repository_inside_the_roots_opens(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "root" / "repo")
    opened = open_repository(repo, Policy.create([str(tmp_path / "root")]))
    assert opened.top == repo.resolve()
    assert opened.key == str((repo / ".git").resolve())


def test_output_into_a_protected_path_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    upstream = root / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    policy = Policy.create([str(root)])
    policy.protect(upstream)

    refused(ErrorCode.PROTECTED_PATH, policy.writable, upstream / "vllm" / "new.py")
    refused(ErrorCode.PROTECTED_PATH, policy.writable, upstream)
    # an output that would contain the protected tree is refused too
    refused(ErrorCode.PROTECTED_PATH, policy.writable, root)
    assert policy.writable(root / "trimmed") == (root / "trimmed").resolve()


def test_output_into_a_git_dir_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "root" / "repo")
    policy = Policy.create([str(tmp_path / "root")])

    refused(ErrorCode.PROTECTED_PATH, policy.writable, repo / ".git" / "hooks" / "pre-commit")
    refused(ErrorCode.PROTECTED_PATH, policy.writable, repo / ".git" / "new-dir" / "x")
    refused(ErrorCode.PROTECTED_PATH, policy.writable, repo / ".git")


def test_output_outside_the_output_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    out = root / "out"
    out.mkdir(parents=True)
    policy = Policy.create([str(root)], output_roots=[str(out)])

    assert policy.writable(out / "model") == (out / "model").resolve()
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, root / "other" / "model")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, str(out) + "-evil/model")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, tmp_path / "model")


def test_staged_directory_failure_leaves_no_target_and_no_temp_sibling(tmp_path: Path) -> None:
    parent = tmp_path / "out"
    parent.mkdir()
    target = parent / "model"

    with pytest.raises(RuntimeError, match="half way"), staged_directory(target) as staging:
        (staging / "config.json").write_text("{}")
        (staging / "sub").mkdir()
        (staging / "sub" / "weights.bin").write_bytes(b"\0" * 1024)
        raise RuntimeError("half way")

    assert not target.exists()
    assert sorted(os.listdir(parent)) == []


def test_staged_directory_replace_keeps_old_content_on_failure(tmp_path: Path) -> None:
    parent = tmp_path / "out"
    target = earlier_output(parent / "model")
    (target / "old.txt").write_text("old")

    with pytest.raises(ToolFailure) as info, staged_directory(target):
        pass
    assert info.value.code is ErrorCode.BAD_INPUT

    with pytest.raises(RuntimeError), staged_directory(target, replace=True) as staging:
        (staging / "new.txt").write_text("new")
        raise RuntimeError("boom")
    assert sorted(os.listdir(parent)) == ["model"]
    assert sorted(os.listdir(target)) == [EXPORT_MARKER, "old.txt"]

    with staged_directory(target, replace=True) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(os.listdir(parent)) == ["model"]
    assert sorted(os.listdir(target)) == ["new.txt"]


def test_staged_directory_interrupted_between_its_renames_puts_the_old_output_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = earlier_output(tmp_path / "model")
    (target / "old.txt").write_text("old")
    real_replace = os.replace
    calls = []

    def interrupted(source: Any, destination: Any) -> None:
        calls.append(destination)
        if len(calls) == 2:  # the old output was set aside; the new one never arrives
            raise KeyboardInterrupt
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt), staged_directory(target, replace=True) as staging:
        (staging / "new.txt").write_text("new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert sorted(os.listdir(tmp_path)) == ["model"]
    assert sorted(os.listdir(target)) == [EXPORT_MARKER, "old.txt"]


def test_write_bytes_atomic_failure_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "doc.json"
    write_bytes_atomic(target, b"old")
    with pytest.raises(TypeError):
        write_bytes_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["doc.json"]


def test_output_roots_are_readable_and_their_write_rules_unchanged(tmp_path: Path) -> None:
    """An output root outside the read roots reads (so trim -> smoke works in one server), symlinks out of it
    do not, and reading changes nothing about writing: the root itself, a git dir and the HF cache stay refused."""
    root, outputs, elsewhere = tmp_path / "root", tmp_path / "outputs", tmp_path / "elsewhere"
    for place in (root, outputs, elsewhere):
        place.mkdir()
    (outputs / "model").mkdir()
    (outputs / "model" / "config.json").write_text("{}")
    (elsewhere / "secret").write_text("x")
    (outputs / "model" / "link").symlink_to(elsewhere / "secret")
    policy = Policy.create([str(root)], [str(outputs)])
    assert policy.readable(outputs / "model" / "config.json") == (outputs / "model" / "config.json")
    assert policy.read_bytes(outputs / "model" / "config.json") == b"{}"
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, outputs / "model" / "link")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable_entries, outputs / "model")
    refused(ErrorCode.OUTSIDE_ROOTS, policy.readable, elsewhere / "secret")
    refused(ErrorCode.PROTECTED_PATH, policy.writable, outputs)
    refused(ErrorCode.OUTSIDE_ROOTS, policy.writable, root / "new")
    refused(ErrorCode.PROTECTED_PATH, policy.writable, outputs / ".git" / "x")
    assert policy.writable(outputs / "fresh") == outputs / "fresh"
