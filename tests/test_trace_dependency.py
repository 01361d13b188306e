"""trace_dependency on real upstream vLLM trees (0.26.0 and 0.33.0 wheels) and a plugin built from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from workbench import build_plugin_repo, build_upstream_history, git

from vllm_metax_mcp.core.code.dispatch import evaluate
from vllm_metax_mcp.core.code.module_index import scan_source
from vllm_metax_mcp.tools import trace_dependency as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.slow

ARCH = "DeepseekV4ForCausalLM"
V4 = "vllm/models/deepseek_v4"
PLUGIN_FILES = {
    "vllm_metax/models/deepseek_v4/model.py": f"{V4}/nvidia/model.py",
    "vllm_metax/models/deepseek_v4/mtp.py": f"{V4}/nvidia/mtp.py",
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path, upstream_033: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("trace")
    history = build_upstream_history(root / "vllm", ["0.26.0", "0.33.0"], include=["vllm/"])
    plugin = build_plugin_repo(
        root / "plugin",
        upstream_026,
        PLUGIN_FILES,
        registrations={ARCH: "vllm_metax.models.deepseek_v4:DeepseekV4ForCausalLM"},
    )
    package = plugin / "vllm_metax/models/deepseek_v4"
    (package / "__init__.py").write_text("from .model import DeepseekV4ForCausalLM\nfrom .mtp import DeepSeekV4MTP\n")
    (package / "unused_kernel.py").write_text("def never_called():\n    return 1\n")
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "package exports and an unreferenced kernel")
    # beside the root: a review-mode server refuses a state directory inside a read root
    return {"root": root, "history": history, "state": tmp_path_factory.mktemp("trace-state")}


def trace(ws: dict[str, Any], mode: str = "edit", **arguments: Any) -> Any:
    """One page of the inventory (or of `section`; the summary takes no limit)."""
    runtime = Runtime.create([str(ws["root"])], mode=mode, state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    arguments = {"section": "inventory", **arguments}
    paging = {} if arguments["section"] == "summary" else {"limit": 1000}
    defaults = {"plugin_repo": "plugin", "upstream": "vllm", "target": "v0.26.0", "arch": ARCH}
    return anyio.run(lambda: invoke(tool.SPEC, {**defaults, **paging, **arguments}, env))


def rows(result: Any) -> dict[str, Any]:
    return {row.name: row for row in result.inventory}


def all_rows(ws: dict[str, Any], **arguments: Any) -> dict[str, Any]:
    """Every inventory row, page by page (a full walk can exceed one page)."""
    found: dict[str, Any] = {}
    cursor = None
    while True:
        result = trace(ws, **arguments, **({"cursor": cursor} if cursor else {}))
        found.update(rows(result))
        cursor = result.next_cursor
        if not cursor:
            return found


def test_registrations_of_both_sides_are_found(workspace: dict[str, Any]) -> None:
    entry = trace(workspace, depth=1).entry
    assert entry.plugin == "vllm_metax.models.deepseek_v4:DeepseekV4ForCausalLM"
    assert entry.plugin_registration.startswith("vllm_metax/models/__init__.py:")
    assert entry.upstream == "vllm.models.deepseek_v4:DeepseekV4ForCausalLM"
    assert entry.upstream_registration.startswith("vllm/model_executor/models/registry.py:")


def test_walk_takes_the_out_of_tree_branch_and_records_the_others(workspace: dict[str, Any]) -> None:
    found = all_rows(workspace, depth=3, view="full")
    nvidia = found["vllm.models.deepseek_v4.nvidia.model"]
    assert nvidia.branch == "taken" and "is_rocm()" in nvidia.guard and "is_xpu()" in nvidia.guard
    for platform in ("amd", "xpu"):
        other = found[f"vllm.models.deepseek_v4.{platform}.model"]
        assert other.branch == "not_taken", platform
        assert other.guard
    # the re-export in the family __init__ resolves to the class's defining module
    assert found["vllm.models.deepseek_v4.nvidia.model:DeepseekV4ForCausalLM"].side == "upstream"
    # relative imports of the plugin package resolve to its own modules
    assert found["vllm_metax.models.deepseek_v4.model"].side == "plugin"
    assert (
        found["vllm_metax.models.deepseek_v4.model:DeepseekV4ForCausalLM"].reached_from
        == "vllm_metax.models.deepseek_v4"
    )
    # model-private attention outside the main model file is reached
    assert "vllm.models.deepseek_v4.attention" in found
    assert found["torch"].side == "third_party" and found["torch"].boundary


def test_the_cpu_branch_of_a_later_release_is_conditional_not_taken(workspace: dict[str, Any]) -> None:
    found = all_rows(workspace, target="v0.33.0", depth=2, view="full")
    assert found["vllm.models.deepseek_v4.cpu.model"].branch == "not_taken"
    assert found["vllm.models.deepseek_v4.nvidia.model"].branch == "taken"


def test_platform_answers_can_be_overridden(workspace: dict[str, Any]) -> None:
    found = all_rows(workspace, depth=1, platform_answers={"is_rocm": True}, view="full")
    assert found["vllm.models.deepseek_v4.amd.model"].branch == "taken"
    assert found["vllm.models.deepseek_v4.nvidia.model"].branch == "not_taken"


def test_unreferenced_plugin_file_is_inactive(workspace: dict[str, Any]) -> None:
    assert trace(workspace, depth=2, section="summary").inactive == ["vllm_metax/models/deepseek_v4/unused_kernel.py"]


def test_plugin_rows_carry_counterpart_and_difference_and_delta(workspace: dict[str, Any]) -> None:
    found = all_rows(workspace, depth=1, base="v0.26.0", target="v0.33.0")
    upstream_init = found["vllm.models.deepseek_v4"]
    assert upstream_init.upstream_delta is not None
    assert any(change.startswith(("changed:", "added:")) for change in upstream_init.upstream_delta)


def test_depth_bounds_the_walk_and_the_second_call_hits_the_cache(workspace: dict[str, Any]) -> None:
    shallow = trace(workspace, depth=1)
    assert max(row.depth for row in shallow.inventory) <= 2  # symbol rows sit one hop below their module
    again = trace(workspace, depth=1)
    # only the modules the walk and its checks look into are read, and none is parsed again
    assert again.parsed == 0 and 0 < again.cache_hits < again.modules_indexed


def test_consumers_of_a_shared_helper(workspace: dict[str, Any]) -> None:
    result = trace(
        workspace,
        direction="consumers",
        symbol="vllm.models.deepseek_v4.compressor:DeepseekCompressor",
        depth=1,
        arch=None,
    )
    names = {row.name for row in result.inventory}
    assert "vllm.models.deepseek_v4.attention" in names
    assert all(row.depth == 1 for row in result.inventory)


def test_paging_is_bound_to_the_inputs(workspace: dict[str, Any]) -> None:
    first = trace(workspace, depth=2, limit=10)
    assert len(first.inventory) == 10 and first.total > 10 and first.next_cursor
    assert first.next_step.arguments["cursor"] == first.next_cursor
    second = trace(workspace, depth=2, limit=10, cursor=first.next_cursor)
    assert {r.name for r in second.inventory}.isdisjoint({r.name for r in first.inventory})
    with pytest.raises(Exception) as refused:
        trace(workspace, depth=3, limit=10, cursor=first.next_cursor)
    assert getattr(refused.value, "code", None).value == "bad_input"


def test_review_mode_leaves_the_plugin_repository_identical(workspace: dict[str, Any]) -> None:
    plugin = workspace["root"] / "plugin"
    before = (git(plugin, "status", "--porcelain"), (plugin / ".git/index").read_bytes(), git(plugin, "for-each-ref"))
    trace(workspace, mode="review", depth=1)
    assert (
        git(plugin, "status", "--porcelain"),
        (plugin / ".git/index").read_bytes(),
        git(plugin, "for-each-ref"),
    ) == before


def test_cycles_terminate(tmp_path: Path) -> None:
    root = tmp_path
    (root / "vllm").mkdir()
    (root / "vllm/__init__.py").write_text("")
    (root / "vllm/a.py").write_text("from vllm.b import B\nclass A(B):\n    pass\n")
    (root / "vllm/b.py").write_text("from vllm.a import A\nclass B:\n    pass\n")
    (root / "vllm/registry.py").write_text('_MODELS = {"CycleForCausalLM": ("vllm.a", "A")}\n')
    plugin = root / "plugin"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("")
    git(root, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "empty plugin")
    runtime = Runtime.create([str(root)], state_dir=str(root / "state"))
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    arguments = {
        "plugin_repo": "plugin",
        "upstream": str(root),
        "arch": "CycleForCausalLM",
        "depth": 50,
    }
    result = anyio.run(lambda: invoke(tool.SPEC, {**arguments, "section": "inventory", "view": "full"}, env))
    assert {"vllm.a", "vllm.b", "vllm.a:A", "vllm.b:B"} <= {r.name for r in result.inventory}
    summary = anyio.run(lambda: invoke(tool.SPEC, arguments, env))
    assert any("No register_model call" in u for u in summary.unknowns)


def test_dispatch_evaluation_is_three_valued() -> None:
    import ast

    def answer(expression: str) -> bool | None:
        return evaluate(ast.parse(expression, mode="eval").body)

    assert answer("current_platform.is_rocm()") is False
    assert answer("not current_platform.is_rocm()") is True
    assert answer("TYPE_CHECKING or not current_platform.is_rocm()") is True
    assert answer("envs.VLLM_USE_X") is None
    assert answer("current_platform.is_cuda() and envs.VLLM_USE_X") is False
    assert answer("current_platform.has_device_capability(90)") is None


def test_malformed_python_is_a_record_error_not_a_crash() -> None:
    record = scan_source(b"def broken(:\n")
    assert record.error and "line 1" in record.error
