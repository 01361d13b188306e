"""Subjects over real git repositories: staged vs unstaged vs committed, and exported snapshots."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from workbench import git

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.environment import run_probe, runtime_package_dir
from vllm_metax_mcp.core.sources.git import open_repository
from vllm_metax_mcp.core.sources.subjects import (
    SubjectKind,
    SubjectRequest,
    blob_sha,
    open_subject,
)

MODEL = "vllm_metax/models/deepseek_v2.py"


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A plugin-like repo whose model file has a staged edit and a different unstaged edit."""
    root = tmp_path / "plugin"
    (root / "vllm_metax/models").mkdir(parents=True)
    (root / "vllm_metax/__init__.py").write_text("WHERE = 'committed'\n")
    (root / MODEL).write_text("DTYPE = 'bfloat16'\n")
    git(tmp_path, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "initial")
    (root / MODEL).write_text("DTYPE = 'int8'  # staged\n")
    (root / "vllm_metax/__init__.py").write_text("WHERE = 'staged'\n")
    git(root, "add", "-A")
    (root / MODEL).write_text("DTYPE = 'fp8'  # unstaged\n")
    (root / "vllm_metax/__init__.py").write_text("WHERE = 'worktree'\n")
    (root / "notes.txt").write_text("untracked\n")
    return root


def subject(policy: Policy, root: Path, kind: SubjectKind, revision: str | None = None):
    return open_subject(policy, SubjectRequest(kind, revision=revision), open_repository(root, policy))


def test_index_worktree_and_revision_see_different_content(repo: Path, tmp_path: Path) -> None:
    policy = Policy.create([str(tmp_path)])
    assert subject(policy, repo, SubjectKind.INDEX).read(MODEL) == b"DTYPE = 'int8'  # staged\n"
    assert subject(policy, repo, SubjectKind.WORKTREE).read(MODEL) == b"DTYPE = 'fp8'  # unstaged\n"
    assert subject(policy, repo, SubjectKind.REVISION, "HEAD").read(MODEL) == b"DTYPE = 'bfloat16'\n"
    assert "notes.txt" in subject(policy, repo, SubjectKind.WORKTREE).list()
    assert "notes.txt" not in subject(policy, repo, SubjectKind.INDEX).list()


def test_same_bytes_have_the_same_sha_in_every_subject(repo: Path, tmp_path: Path) -> None:
    policy = Policy.create([str(tmp_path)])
    git(repo, "stash", "-q")  # test setup only: leaves index == worktree == HEAD
    index = subject(policy, repo, SubjectKind.INDEX)
    worktree = subject(policy, repo, SubjectKind.WORKTREE)
    head = subject(policy, repo, SubjectKind.REVISION, "HEAD")
    assert index.sha(MODEL) == worktree.sha(MODEL) == head.sha(MODEL) == blob_sha(b"DTYPE = 'bfloat16'\n")
    assert index.tree_hash() == head.tree_hash()
    assert git(repo, "rev-parse", f"HEAD:{MODEL}").strip() == head.sha(MODEL)


def test_revision_subject_works_without_a_work_tree(repo: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(bare))
    policy = Policy.create([str(tmp_path)])
    head = subject(policy, bare, SubjectKind.REVISION, "HEAD")
    assert head.read(MODEL) == b"DTYPE = 'bfloat16'\n"
    with pytest.raises(ToolFailure) as refused:
        subject(policy, bare, SubjectKind.WORKTREE)
    assert refused.value.code is ErrorCode.BAD_INPUT


def test_paths_leaving_the_subject_are_refused(repo: Path, tmp_path: Path) -> None:
    policy = Policy.create([str(tmp_path)])
    index = subject(policy, repo, SubjectKind.INDEX)
    for bad in ("../outside.py", "/etc/passwd", "vllm_metax/../../x"):
        with pytest.raises(ToolFailure) as refused:
            index.read(bad)
        assert refused.value.code is ErrorCode.BAD_INPUT


def test_worktree_does_not_follow_a_symlink_out_of_the_repository(repo: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("secret\n")
    (repo / "vllm_metax/leak.py").symlink_to(secret)
    worktree = subject(Policy.create([str(tmp_path)]), repo, SubjectKind.WORKTREE)
    assert "vllm_metax/leak.py" not in worktree.list()


def test_directory_subject_lists_plain_files(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    (tmp_path / "src/vllm/models").mkdir(parents=True)
    (tree / "vllm/models/a.py").write_text("A = 1\n")
    (tree / "vllm/models/__pycache__").mkdir()
    (tree / "vllm/models/__pycache__/a.pyc").write_bytes(b"\0")
    directory = open_subject(
        Policy.create([str(tmp_path)]), SubjectRequest(SubjectKind.DIRECTORY, path=str(tree)), None
    )
    assert directory.list() == ["vllm/models/a.py"]
    assert directory.list("vllm/models") == ["vllm/models/a.py"]
    assert directory.list("vllm/mod") == []


def test_exported_index_snapshot_is_what_the_interpreter_imports(repo: Path, tmp_path: Path) -> None:
    policy = Policy.create([str(tmp_path)])
    export = tmp_path / "staged"
    count = subject(policy, repo, SubjectKind.INDEX).export(export, "vllm_metax")
    assert count == 2
    assert (export / "vllm_metax/__init__.py").read_text() == "WHERE = 'staged'\n"
    _, report = run_probe(Path(sys.executable), StateStore(tmp_path / "state"), pythonpath=[export])
    assert runtime_package_dir(report) == Path(os.path.realpath(export / "vllm_metax"))
    assert not list(export.rglob("__pycache__")), "the probe must not write bytecode into the snapshot"
