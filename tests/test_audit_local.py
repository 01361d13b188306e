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

from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.tools import audit_commits as tool
from vllm_metax_mcp.tools.dispatch import invoke
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
    assert [r.where for r in utils.dangling if r.kind == "import"] == expected
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


def test_local_range_must_be_two_revisions(tmp_path: Path) -> None:
    repo = tmp_path / "root" / "plugin"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    ws = {"root": tmp_path / "root", "repo": repo, "state": tmp_path / "state"}
    for wrong in ("HEAD", "..HEAD", "HEAD..", "HEAD...HEAD"):
        with pytest.raises(ToolFailure, match="START..END") as refused:
            local(ws, wrong)
        assert refused.value.code.value == "bad_input"
    with pytest.raises(ToolFailure, match="only used with action=local"):
        local(ws, "HEAD~1..HEAD", action="status")
