"""JIT kernel launches: a launch through a local name chosen among several kernels counts for each
kernel it may run, and a launch of an upstream kernel is checked against the kernel's signature at
the target and at base (parameters gained, lost, re-declared constexpr).

Real code: vllm-ascend b4b04c5eb1 launches `merge_fn[NT, B * H](...)` where `merge_fn` is chosen
by a conditional expression (`ops/triton/fla/solve_tril.py:385`) or by an if/elif chain
(`ops/triton/kda/solve_tril.py:385-390`). Synthetic upstream releases cover what the real plugins do
not show: an upstream kernel that loses a keyword the plugin still passes, a kernel picked from a
dict of kernels, and a parameter that became constexpr.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo

from vllm_metax_mcp.core.code.build_files import build_facts
from vllm_metax_mcp.core.code.codebase import Codebase
from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.core.trace.build_ops import attach_build, extension_text
from vllm_metax_mcp.core.trace.kernels import KernelLaunch, OpRow, kernel_launches
from vllm_metax_mcp.core.trace.signatures import kernel_drift


def _tree(root: Path, files: dict[str, str]) -> DirectorySubject:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return DirectorySubject(root)


def _codebase(
    tmp: Path, plugin: DirectorySubject, package: str, upstream: DirectorySubject, base: DirectorySubject | None
) -> tuple[Codebase, ModuleIndex | None]:
    cache = RecordCache(StateStore(tmp / "state"))
    index = ModuleIndex()
    index.add_tree("plugin", plugin, cache, [f"{package}/"])
    index.add_tree("upstream", upstream, cache, ["vllm/"])
    base_index = None
    if base is not None:
        base_index = ModuleIndex()
        base_index.add_tree("upstream", base, cache, ["vllm/"])
    return Codebase(index, {"plugin": plugin, "upstream": upstream}, frozenset({"vllm", package})), base_index


def _by_name(launches: list[KernelLaunch]) -> dict[str, KernelLaunch]:
    return {k.kernel.symbol.rsplit(":", 1)[-1]: k for k in launches}


# -- real: vllm-ascend's solve_tril launchers ----------------------------------------------------


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory) -> Codebase:
    assert PLUGINS is not None
    tmp = tmp_path_factory.mktemp("ascend-kernels")
    repo = snapshot_repo(PLUGINS / "vllm-ascend-b4b04c5eb1.tar.gz", tmp / "vllm-ascend")
    upstream = _tree(tmp / "upstream", {"vllm/__init__.py": ""})
    code, _ = _codebase(tmp, DirectorySubject(repo), "vllm_ascend", upstream, None)
    return code


@needs_snapshots
def test_a_conditional_expression_launches_both_kernels(ascend: Codebase) -> None:
    # ops/triton/fla/solve_tril.py:385 `merge_fn = merge_16x16_to_32x32_inverse_kernel if BT == 32 else
    # merge_16x16_to_64x64_inverse_kernel`, launched at :391 `merge_fn[NT, B * H](A=A, Ad=Ad, Ai=Ai, ...)`
    found = _by_name(kernel_launches(ascend, ["vllm_ascend.ops.triton.fla.solve_tril"], None))
    site = "vllm_ascend/ops/triton/fla/solve_tril.py:391"
    for name, line in (("merge_16x16_to_32x32_inverse_kernel", 139), ("merge_16x16_to_64x64_inverse_kernel", 203)):
        launch = found[name]
        assert (launch.file, launch.line) == ("vllm_ascend/ops/triton/fla/solve_tril.py", line)
        assert site in launch.launched_from
        assert launch.via[site] == "merge_fn (one of 2)"
        # the kernels' parameters (:139-149 / :203-213) minus IS_VARLEN, which the heuristics supply (:137)
        assert launch.required == ["A", "Ad", "Ai", "cu_seqlens", "chunk_indices", "T", "H", "BT"]
        assert launch.missing == {}  # the launch passes each of them by keyword; num_warps/num_stages are options
    # solve_tril_16x16_kernel (:22) is not launched here: the file calls DeviceOperator.solve_tril_16x16 (:367)
    assert sorted(found) == ["merge_16x16_to_32x32_inverse_kernel", "merge_16x16_to_64x64_inverse_kernel"]


@needs_snapshots
def test_an_if_elif_chain_launches_each_assigned_kernel(ascend: Codebase) -> None:
    # ops/triton/kda/solve_tril.py:385-390 assigns merge_fn in three branches; :392 launches it
    found = _by_name(kernel_launches(ascend, ["vllm_ascend.ops.triton.kda.solve_tril"], None))
    site = "vllm_ascend/ops/triton/kda/solve_tril.py:392"
    chosen = [
        "solve_tril_16x16_kernel_kda",
        "merge_16x16_to_32x32_inverse_kernel_kda",
        "merge_16x16_to_64x64_inverse_kernel_kda",
    ]
    for name in chosen:
        assert found[name].launched_from == [site]
        assert found[name].via == {site: "merge_fn (one of 3)"}
        # autotune's configs are `triton.Config({}, ...)` (:21): they supply no parameter
        assert "DOT_PRECISION" in found[name].required and found[name].missing == {}


# -- synthetic: an upstream kernel that changed between base and target -------------------------

KERNEL_BASE = """\
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr, LEGACY_FLAG: tl.constexpr):
    pass


@triton.jit
def shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pass
"""
KERNEL_TARGET = """\
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n: tl.constexpr, scale, stride, BLOCK: tl.constexpr):
    pass


@triton.jit
def shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pass
"""
LAUNCHER = """\
from vllm.kernels import scale_kernel, shift_kernel

KERNELS = {"scale": scale_kernel}


def launch(x, out, n, mode):
    scale_kernel[(n,)](x, out, n, 2.0, BLOCK=128, LEGACY_FLAG=True)
    table = {"scale": scale_kernel, "shift": shift_kernel}
    table[mode][(n,)](x, out, n, BLOCK=64)
"""


@pytest.fixture
def changed_kernel(tmp_path: Path) -> tuple[Codebase, ModuleIndex | None]:
    base = _tree(tmp_path / "base", {"vllm/__init__.py": "", "vllm/kernels.py": KERNEL_BASE})
    target = _tree(tmp_path / "target", {"vllm/__init__.py": "", "vllm/kernels.py": KERNEL_TARGET})
    plugin = _tree(tmp_path / "plugin", {"plug/__init__.py": "", "plug/launch.py": LAUNCHER})
    return _codebase(tmp_path, plugin, "plug", target, base)


def test_an_upstream_kernel_checked_against_base_and_target(changed_kernel: tuple[Codebase, ModuleIndex]) -> None:
    code, base = changed_kernel
    found = _by_name(kernel_launches(code, ["plug.launch"], base))
    scale = found["scale_kernel"]
    assert scale.gained == ["stride"] and scale.lost == ["LEGACY_FLAG"] and scale.constexpr_changed == ["n"]
    direct, through_table = "plug/launch.py:7", "plug/launch.py:9"
    assert scale.launched_from == [direct, through_table]
    # the direct launch binds x_ptr, out_ptr, n, scale positionally and BLOCK: stride is missing, and it
    # still passes LEGACY_FLAG, which the target kernel dropped
    assert scale.missing[direct] == ["stride"]
    assert scale.stale == {direct: ["LEGACY_FLAG"]}
    # `table[mode][...]` may run either kernel; it passes three positionals (x_ptr, out_ptr, n) and BLOCK
    assert scale.via[through_table] == "table[mode] (one of 2)"
    assert scale.missing[through_table] == ["scale", "stride"]
    shift = found["shift_kernel"]
    assert shift.via == {through_table: "table[mode] (one of 2)"} and shift.missing == {}
    assert shift.gained == shift.lost == shift.constexpr_changed == []
    defects = {d.line: d.detail for d in kernel_drift(code, list(found.values()), {"plug.launch"})}
    assert "no longer takes (lost since base)" in defects[7] and "stride" in defects[7]
    assert "through table[mode] (one of 2)" in defects[9]


def test_without_base_nothing_is_compared(changed_kernel: tuple[Codebase, ModuleIndex]) -> None:
    code, _ = changed_kernel
    scale = _by_name(kernel_launches(code, ["plug.launch"], None))["scale_kernel"]
    assert scale.gained == scale.lost == scale.constexpr_changed == [] and scale.stale == {}
    # the target kernel alone still shows the missing parameter
    assert scale.missing["plug/launch.py:7"] == ["stride"]


# -- ops and the build that provides them ---------------------------------------------------------


@needs_snapshots
def test_gcu_ops_come_from_the_extension_its_setup_builds(tmp_path: Path) -> None:
    """vllm-gcu 7b5aaca941 calls torch.ops._C.* (e.g. `_C.silu_and_mul`); setup.py:326 builds
    `vllm_gcu._C` (TORCH_EXTENSION_NAME `_C`) from csrc/, always; `lmcache.c_ops` (:346) only when
    WITH_LMCACHE (read at :49, default "0") is set. The snapshot holds no csrc/."""
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / "vllm-gcu-7b5aaca941.tar.gz", tmp_path / "vllm-gcu")
    # `c_ops.an_op` stands for any op in lmcache.c_ops's namespace (no Python file of the snapshot calls one)
    rows = [OpRow("_C.silu_and_mul"), OpRow("c_ops.an_op"), OpRow("vllm.all_gather_v")]
    attach_build(rows, build_facts(DirectorySubject(repo)))
    silu, lmcache, upstream = rows
    assert [extension_text(e) for e in silu.built_by] == [
        "vllm_gcu._C (TopsTorchExtension at setup.py:326 from csrc, always built)"
    ]
    (gated,) = lmcache.built_by
    assert gated.module == "lmcache.c_ops" and gated.switch is not None
    assert (gated.switch.name, gated.switch.default, gated.switch.builds_when) == ("WITH_LMCACHE", "0", True)
    assert upstream.built_by == [] and silu.precompiled == []


SHADOWS = (
    """\
from vllm.kernels import scale_kernel, shift_kernel

KERNELS = {"scale": scale_kernel}


def by_parameter(x, n, scale_kernel):
    scale_kernel[(n,)](x)


def by_module_table(x, out, n, mode):
    KERNELS[mode][(n,)](x, out, n, 1.0, 0, BLOCK=8)


def by_loop(x, n):
    for kernel in (scale_kernel, shift_kernel):
        kernel[(n,)](x)


def chained(x, out, n, flag):
    a0 = shift_kernel
"""
    + "".join(f"    a{i} = a{i - 1} if flag else a{i - 1}\n" for i in range(1, 40))
    + """\
    a39[(n,)](x, out, n, BLOCK=4)
"""
)


def test_names_bound_otherwise_shadow_kernels_and_chains_stay_cheap(tmp_path: Path) -> None:
    base = _tree(tmp_path / "base", {"vllm/__init__.py": "", "vllm/kernels.py": KERNEL_BASE})
    target = _tree(tmp_path / "target", {"vllm/__init__.py": "", "vllm/kernels.py": KERNEL_TARGET})
    plugin = _tree(tmp_path / "plugin", {"plug/__init__.py": "", "plug/shadows.py": SHADOWS})
    code, base_index = _codebase(tmp_path, plugin, "plug", target, base)
    found = _by_name(kernel_launches(code, ["plug.shadows"], base_index))
    # a parameter and a loop target named like a kernel are not the kernel (lines 7 and 15)
    assert "plug/shadows.py:7" not in found["scale_kernel"].launched_from
    assert "plug/shadows.py:15" not in found["shift_kernel"].launched_from
    # a module-level dict of kernels, subscripted inside a function (line 11)
    assert found["scale_kernel"].launched_from == ["plug/shadows.py:11"]
    assert found["scale_kernel"].via == {"plug/shadows.py:11": "KERNELS[mode]"}
    # 39 conditional reassignments resolve to the one kernel (each name's answer is memoised)
    (site,) = found["shift_kernel"].launched_from
    assert found["shift_kernel"].via == {site: "a39"} and found["shift_kernel"].missing == {}
