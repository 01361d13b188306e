"""audit_commits action=local: the plugin's own commits over a range, with the modules they moved or
deleted while plugin code still names the old location, and the op registrations they dropped
while Python still calls the op.

Real history: the three vllm-ascend snapshots of shared/fixtures/plugins/ as successive commits
(7662ec925a and 351879064c on the v0.26.0 lane, then b4b04c5eb1, the vendor's "main2main vllm
v0.27.1" upgrade). The vendor fixed every import of what it moved between them, so the real range
has moves and no dangling reference; three synthetic commits on top make the breaks the real data
lacks: a module moved without its importers (`ops/triton/triton_utils.py`), a model file moved while
the registration string still names it (`models/deepseek_v4_mtp.py`), and a custom-op registration
removed while the op is still called (`maybe_chunk_residual`, `ops/register_custom_ops.py:195`).
"""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import git

from vllm_metax_mcp.core.audit.session import MAX_LIMIT
from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.core.sources.git import last_removal, open_repository
from vllm_metax_mcp.tools import audit_commits as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

SNAPSHOTS = ["vllm-ascend-7662ec925a.tar.gz", "vllm-ascend-351879064c.tar.gz", "vllm-ascend-b4b04c5eb1.tar.gz"]
TRITON_UTILS = "vllm_ascend/ops/triton/triton_utils.py"
MOVED_UTILS = "vllm_ascend/ops/triton/common_utils.py"
MTP = "vllm_ascend/models/deepseek_v4_mtp.py"
MOVED_MTP = "vllm_ascend/models/deepseek_v4/mtp.py"
CUSTOM_OPS = "vllm_ascend/ops/register_custom_ops.py"
CHUNK_RESIDUAL = """\
direct_register_custom_op(
    op_name="maybe_chunk_residual",
    op_func=_maybe_chunk_residual_impl,
    fake_impl=lambda x, residual: torch.empty_like(x),
    mutates_args=[],
    dispatch_key="PrivateUse1",
)
"""


def _replace_tree(repo: Path, archive: Path, scratch: Path) -> None:
    """The repository's files become the snapshot's (its .git kept)."""
    for child in repo.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    scratch.mkdir(parents=True)
    with tarfile.open(archive) as opened:
        for member in opened.getmembers():
            assert member.isfile() or member.isdir(), member.name
            assert not Path(member.name).is_absolute() and ".." not in Path(member.name).parts
            target = scratch / member.name
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = opened.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
    (top,) = list(scratch.iterdir())
    for child in top.iterdir():
        shutil.move(str(child), repo / child.name)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("ascend-history")
    repo = snapshot_repo(PLUGINS / SNAPSHOTS[0], root / "first")
    shas = [git(repo, "rev-parse", "HEAD").strip()]
    for index, name in enumerate(SNAPSHOTS[1:], 1):
        _replace_tree(repo, PLUGINS / name, root / f"scratch{index}")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"snapshot {name}")
        shas.append(git(repo, "rev-parse", "HEAD").strip())
    git(repo, "mv", TRITON_UTILS, MOVED_UTILS)
    git(repo, "commit", "-qm", "move triton_utils (importers left as they were)")
    (repo / MOVED_MTP).parent.mkdir(exist_ok=True)
    git(repo, "mv", MTP, MOVED_MTP)
    git(repo, "commit", "-qm", "move the MTP model into the deepseek_v4 package")
    source = (repo / CUSTOM_OPS).read_text()
    assert CHUNK_RESIDUAL in source
    (repo / CUSTOM_OPS).write_text(source.replace(CHUNK_RESIDUAL, ""))
    git(repo, "commit", "-qam", "drop the maybe_chunk_residual registration")
    shas.append(git(repo, "rev-parse", "HEAD").strip())
    return {"root": root, "repo": repo, "shas": shas, "state": tmp_path_factory.mktemp("ascend-history-state")}


def local(ws: dict[str, Any], local_range: str, **arguments: Any) -> Any:
    runtime = Runtime.create([str(ws["root"])], mode="review", state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="audit_commits")
    call = {"plugin_repo": str(ws["repo"]), "action": "local", "local_range": local_range, "limit": 50}
    return anyio.run(lambda: invoke(tool.SPEC, {**call, **arguments}, env))


@needs_snapshots
def test_the_vendor_upgrade_window_as_the_plugin_history_shows_it(history: dict[str, Any]) -> None:
    first, before, upgrade = history["shas"][:3]
    result = local(history, f"{first}..{upgrade}", paths=["vllm_ascend/models/"])
    assert [c.sha for c in result.local_commits] == [before, upgrade]  # oldest first
    lane, window = result.local_commits
    # the upgrade commit (b4b04c5eb1) touched 18 files, none under models/ and Dockerfile's VLLM_TAG
    # (44: v0.26.0 -> v0.27.1) among the non-production ones
    assert window.mapped == [] and window.production_total == 17 and window.moves == []
    assert "vllm_ascend/ops/fused_moe/fused_moe.py" in window.production
    # on the v0.26.0 lane the vendor moved memcache_comm_fence.py (git: 100% similar) and every
    # importer with it: nothing at the end still names the old module
    moved = {m.path: m for m in lane.moves}
    fence = moved["vllm_ascend/memcache_comm_fence.py"]
    assert fence.to == "vllm_ascend/distributed/kv_transfer/kv_pool/ascend_store/attention_fence.py"
    assert fence.similarity == 100 and fence.dangling == []
    # ucm_connector.py became the package ucm_connector/ (its __init__ exists at the end): not gone
    assert moved["vllm_ascend/distributed/kv_transfer/kv_pool/ucm_connector.py"].dangling == []
    # models/ files it added or changed, e.g. deepseek_mtp.py (new in 351879064c)
    assert "vllm_ascend/models/deepseek_mtp.py" in lane.mapped
    # the only C++ source of the range: the pybind module added on the lane
    assert lane.native == ["vllm_ascend/distributed/kv_transfer/sparse_kv_offload/sparse_kv_offload.cpp"]
    assert result.local_counts == {"commits": 2, "moves": len(lane.moves), "dangling": 0, "dropped_bindings": 0}


@needs_snapshots
def test_moves_that_leave_imports_and_strings_behind(history: dict[str, Any]) -> None:
    upgrade, end = history["shas"][2], history["shas"][3]
    result = local(history, f"{upgrade}..{end}")
    moved_utils, moved_mtp, dropped = result.local_commits
    (utils,) = moved_utils.moves
    assert (utils.module, utils.to) == ("vllm_ascend.ops.triton.triton_utils", MOVED_UTILS)
    # every plugin import of the old module at the end (read here with a plain regex over the files)
    repo = history["repo"]
    expected = sorted(
        f"{path.relative_to(repo).as_posix()}:{number}"
        for path in (repo / "vllm_ascend").rglob("*.py")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.match(r"\s*from vllm_ascend\.ops\.triton\.triton_utils import", line)
    )
    assert len(expected) > 20
    assert [r.where for r in utils.dangling if r.kind != "string"] == expected
    # models/minimax_m3/ops/msa_m3_triton.py:24-25 imports it under `try:` with an ImportError fallback
    kinds = {r.where: r.kind for r in utils.dangling}
    assert kinds["vllm_ascend/models/minimax_m3/ops/msa_m3_triton.py:25"] == "guarded_import"
    # models/__init__.py:14 registers "vllm_ascend.models.deepseek_v4_mtp:DeepSeekV4MTP"
    (mtp,) = moved_mtp.moves
    assert mtp.module == "vllm_ascend.models.deepseek_v4_mtp"
    strings = [r for r in mtp.dangling if r.kind == "string"]
    assert [(r.where, r.text) for r in strings] == [
        ("vllm_ascend/models/__init__.py:14", "vllm_ascend.models.deepseek_v4_mtp:DeepSeekV4MTP")
    ]
    # the registration at register_custom_ops.py:195 is gone; 18 calls of the op remain
    (binding,) = dropped.dropped
    assert binding.op == "vllm.maybe_chunk_residual"
    assert binding.registered_at == f"{CUSTOM_OPS}:195" and binding.parent == f"{dropped.sha}^"
    calls = [
        f"{path.relative_to(repo).as_posix()}:{number}"
        for path in sorted((repo / "vllm_ascend").rglob("*.py"))
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if "torch.ops.vllm.maybe_chunk_residual" in line
    ]
    assert sorted(binding.called_at) == sorted(calls) and len(calls) >= 10
    assert result.local_counts["dangling"] == 2 and result.local_counts["dropped_bindings"] == 1


@needs_snapshots
def test_every_page_of_the_whole_range_fits_the_budget(history: dict[str, Any]) -> None:
    """The whole range over the whole package at the largest limit: each page within the result budget,
    every commit once, the pages followed through next_step (the same call with the cursor)."""
    first, end = history["shas"][0], history["shas"][-1]
    pages = [local(history, f"{first}..{end}", paths=["vllm_ascend/"], limit=MAX_LIMIT)]
    while pages[-1].next_cursor:
        step = pages[-1].next_step
        assert step.arguments["cursor"] == pages[-1].next_cursor
        rest = {k: v for k, v in step.arguments.items() if k not in ("plugin_repo", "local_range")}
        pages.append(local(history, step.arguments["local_range"], **rest))
    assert all(len(text_of(page)) <= RESULT_BUDGET for page in pages)
    shas = [c.sha for page in pages for c in page.local_commits]
    assert len(shas) == len(set(shas)) == pages[0].total and set(history["shas"][1:]) <= set(shas)
    assert pages[-1].next_step.arguments["action"] == "list"


def _one_commit(tmp_path: Path) -> dict[str, Any]:
    """A plugin repository of one commit, the read root above it and a state directory beside."""
    repo = tmp_path / "root" / "plugin"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    return {"root": tmp_path / "root", "repo": repo, "state": tmp_path / "state"}


def test_local_range_must_be_two_revisions(tmp_path: Path) -> None:
    ws = _one_commit(tmp_path)
    for wrong in ("HEAD", "..HEAD", "HEAD..", "HEAD...HEAD"):
        with pytest.raises(ToolFailure, match="START..END") as refused:
            local(ws, wrong)
        assert refused.value.code.value == "bad_input"
    with pytest.raises(ToolFailure, match="only used with action=local"):
        local(ws, "HEAD~1..HEAD", action="status")


SYNTHETIC_START = {
    "pkg/__init__.py": "",
    "pkg/worker.py": "class W:\n    pass\n",
    "pkg/fence.py": "def fence():\n    pass\n",
    "pkg/d.py": "X = 1\n",
    "csrc/ops.cpp": 'TORCH_LIBRARY(myns, m) {\n  m.def("foo(Tensor x) -> Tensor");\n'
    '  m.def("bar(Tensor x) -> Tensor");\n}\n',
    "pkg/main.py": """\
import torch

WORKER = "pkg.worker.W"
MESSAGE = "pkg.fence is gone, use pkg.new_fence"

try:
    from pkg.fence import fence
except ImportError:
    fence = None
from pkg import d


def run(x):
    return torch.ops.myns.foo(x) + torch.ops.myns.bar(x)
""",
}


def test_what_counts_as_still_naming_a_moved_module_or_a_dropped_op(tmp_path: Path) -> None:
    """Synthetic: worker.py and fence.py deleted, d.py replaced by a name pkg/__init__.py defines,
    `foo` moved to another C++ file a later commit adds, `bar` dropped for good."""
    root = tmp_path / "root"
    repo = root / "plugin"
    for relative, text in SYNTHETIC_START.items():
        (repo / relative).parent.mkdir(parents=True, exist_ok=True)
        (repo / relative).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "start")
    git(repo, "rm", "-q", "pkg/worker.py", "pkg/fence.py", "pkg/d.py")
    (repo / "pkg/__init__.py").write_text("d = 1\n")
    (repo / "csrc/ops.cpp").write_text("// nothing left here\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "drop modules and both ops")
    (repo / "csrc/more_ops.cpp").write_text(
        'TORCH_LIBRARY_FRAGMENT(myns, m) {\n  m.def("foo(Tensor x) -> Tensor");\n}\n'
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "foo registered again elsewhere")
    ws = {"root": root, "repo": repo, "state": tmp_path / "state"}
    dropping, _again = local(ws, "HEAD~2..HEAD").local_commits
    moves = {m.module: m for m in dropping.moves}
    # main.py:3 names pkg.worker.W (module path plus class); the message at :4 only mentions pkg.fence
    assert [(r.where, r.kind) for r in moves["pkg.worker"].dangling] == [("pkg/main.py:3", "string")]
    # main.py:7 imports pkg.fence under a try that catches ImportError: it now fails quietly
    assert [(r.where, r.kind, r.text) for r in moves["pkg.fence"].dangling] == [
        ("pkg/main.py:7", "guarded_import", "from pkg.fence import fence")
    ]
    # `from pkg import d` (main.py:10) now takes the name pkg/__init__.py defines
    assert moves["pkg.d"].dangling == []
    # foo is registered again at the end (more_ops.cpp:2); bar is not, and main.py:14 calls it
    (bar,) = dropping.dropped
    assert (bar.op, bar.registered_at, bar.called_at) == ("myns.bar", "csrc/ops.cpp:3", ["pkg/main.py:14"])


def test_an_option_like_local_range_is_refused(tmp_path: Path) -> None:
    ws = _one_commit(tmp_path)
    canary = tmp_path / "written"
    for wrong in ("-n1..HEAD", f"--output={canary}..HEAD", "HEAD..--all"):
        with pytest.raises(ToolFailure) as refused:
            local(ws, wrong)
        assert refused.value.code.value == "invalid_revision"
    assert not canary.exists()


def test_the_commit_that_removed_a_path_absent_at_the_revision(tmp_path: Path) -> None:
    repo = tmp_path / "plugin"
    (repo / "pkg").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "pkg/c.py").write_text("X = 1\n")
    (repo / "pkg/e.py").write_text("def e():\n    return 'e'\n")  # unlike c.py, so git pairs the move right
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "add")
    git(repo, "mv", "pkg/e.py", "pkg/f.py")
    git(repo, "rm", "-q", "pkg/c.py")
    git(repo, "commit", "-qm", "move e, delete c")
    removed = git(repo, "rev-parse", "HEAD").strip()
    (repo / "pkg/c.py").write_text("X = 2\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c again")
    opened = open_repository(repo, Policy(roots=[tmp_path], output_roots=[]))
    moved = last_removal(opened, "HEAD", ["pkg/e.py", "pkg/e/__init__.py"])
    assert moved is not None and (moved.commit, moved.renamed_to) == (removed, "pkg/f.py")
    # pkg/c.py exists again at HEAD: no commit removed what is there
    assert last_removal(opened, "HEAD", ["pkg/c.py"]) is None
    deleted = last_removal(opened, "HEAD~1", ["pkg/c.py"])
    assert deleted is not None and (deleted.commit, deleted.renamed_to) == (removed, None)
