"""Kernels and ops from every side: C/C++ registrations (every `TORCH_LIBRARY*` family, defs and impls
with their dispatch keys; a `PYBIND11_MODULE` registers no torch op), Python registrations
(`torch.library` functions and `Library` methods, called or as decorators) and build files (the
extensions a build compiles, the environment switches that gate them, precompiled kernel packages).

Real code: the vllm-ascend b4b04c5eb1 and vllm-gcu 7b5aaca941 snapshots (shared/fixtures/plugins/);
each expected value names the line of the real file it comes from. Shapes neither snapshot has (IMPL
and stable-ABI blocks, `TORCH_SELECTIVE_SCHEMA`, upstream vLLM's `VLLM_USE_PRECOMPILED` switch, CMake
targets) are written here after upstream vLLM's csrc/torch_bindings.cpp, setup.py and CMakeLists.txt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo

from vllm_metax_mcp.core.code.build_files import BuiltExtension, EnvSwitch, PrecompiledSource, build_facts
from vllm_metax_mcp.core.code.codebase import Codebase
from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.code.op_scanners import (
    LIBRARY_FORMS,
    PYTHON_NEEDLES,
    QUALIFIED_FORMS,
    OpRegistration,
    PythonOpFacts,
    native_registrations,
    python_facts,
    python_registrations,
    scan_native,
    scan_python,
)
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject

ASCEND = "vllm-ascend-b4b04c5eb1.tar.gz"
GCU = "vllm-gcu-7b5aaca941.tar.gz"
SPARSE = "vllm_ascend/distributed/kv_transfer/sparse_kv_offload/sparse_kv_offload.cpp"
REGISTRATION_H = """\
#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)
// A version of the TORCH_LIBRARY macro that expands the NAME
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) \\
  TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)
#define REGISTER_EXTENSION(NAME) \\
  PyMODINIT_FUNC CONCAT(PyInit_, NAME)() { return nullptr; }
"""
"""Upstream vLLM's csrc/core/registration.h: the macros defined, no block registered."""
BINDINGS = """\
#include "core/registration.h"
#include <torch/library.h>

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Layernorm
  ops.def(
      "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> "
      "()");
  ops.impl("rms_norm", torch::kCUDA, &rms_norm);
  ops.def(TORCH_SELECTIVE_SCHEMA("silu_and_mul(Tensor! result, Tensor input) -> ()"));
}

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CUDA, ops) {
  ops.impl("silu_and_mul", &silu_and_mul);
  ops.impl("rms_norm", c10::DispatchKey::Meta, &rms_norm_meta);
}

TORCH_LIBRARY_FRAGMENT(_moe_C, m) { m.def("topk_softmax(Tensor! w, Tensor g) -> ()"); }
TORCH_LIBRARY_IMPL(_moe_C, CUDA, m) { m.impl("topk_softmax", &topk_softmax); }

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
"""
STABLE = """\
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY_FRAGMENT(_C, m) {
  m.def("permute_cols(Tensor A, Tensor perm) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  m.impl("permute_cols", TORCH_BOX(&permute_cols));
}
"""
TORCH_UTILS = """\
from torch.library import Library

vllm_lib = Library("vllm", "FRAGMENT")


def direct_register_custom_op(op_name, op_func, mutates_args=None, fake_impl=None, target_lib=None,
                              dispatch_key=None, tags=()):
    (target_lib or vllm_lib).define(op_name)
"""
"""Upstream vLLM's vllm/utils/torch_utils.py: the helper registers into `Library("vllm", "FRAGMENT")`."""


@dataclass
class Trees:
    store: StateStore
    code: Codebase


def _tree(root: Path, files: dict[str, str]) -> DirectorySubject:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return DirectorySubject(root)


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert PLUGINS is not None
    return snapshot_repo(PLUGINS / ASCEND, tmp_path_factory.mktemp("ascend-snapshot"))


@pytest.fixture(scope="module")
def gcu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert PLUGINS is not None
    return snapshot_repo(PLUGINS / GCU, tmp_path_factory.mktemp("gcu-snapshot"))


@pytest.fixture(scope="module")
def trees(ascend: Path, tmp_path_factory: pytest.TempPathFactory) -> Trees:
    """vllm-ascend as the plugin; an upstream tree holding upstream vLLM's binding shapes."""
    tmp = tmp_path_factory.mktemp("ascend-trees")
    files = {
        "vllm/__init__.py": "",
        "vllm/utils/__init__.py": "",
        "vllm/utils/torch_utils.py": TORCH_UTILS,
        "csrc/core/registration.h": REGISTRATION_H,
        "csrc/torch_bindings.cpp": BINDINGS,
        "csrc/libtorch_stable/torch_bindings.cpp": STABLE,
    }
    upstream = _tree(tmp / "upstream", files)
    plugin = DirectorySubject(ascend)
    store = StateStore(tmp / "state")
    cache = RecordCache(store)
    index = ModuleIndex()
    index.add_tree("plugin", plugin, cache, ["vllm_ascend/"])
    index.add_tree("upstream", upstream, cache, ["vllm/"])
    return Trees(store, Codebase(index, {"plugin": plugin, "upstream": upstream}, frozenset({"vllm", "vllm_ascend"})))


# -- native ------------------------------------------------------------------------------------


@needs_snapshots
def test_every_torch_library_family_defines_and_implements(trees: Trees) -> None:
    defined = native_registrations(trees.store, trees.code)
    # the IMPL blocks add kernels only; registration.h's #defines open no block; the plugin has no TORCH_LIBRARY
    assert [(r.op, r.where, r.how, r.kind) for r in defined] == [
        ("_C.permute_cols", "csrc/libtorch_stable/torch_bindings.cpp:4", "STABLE_TORCH_LIBRARY_FRAGMENT", "def"),
        ("*.rms_norm", "csrc/torch_bindings.cpp:6", "TORCH_LIBRARY_EXPAND", "def"),  # `ops.def(` at BINDINGS:6
        ("*.silu_and_mul", "csrc/torch_bindings.cpp:10", "TORCH_LIBRARY_EXPAND", "def"),
        ("_moe_C.topk_softmax", "csrc/torch_bindings.cpp:18", "TORCH_LIBRARY_FRAGMENT", "def"),
    ]
    # BINDINGS:7-8 concatenated literals; :10 the schema inside TORCH_SELECTIVE_SCHEMA(...)
    assert defined[1].schema == "rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()"
    assert defined[2].schema == "silu_and_mul(Tensor! result, Tensor input) -> ()"
    kernels = native_registrations(trees.store, trees.code, kinds=["impl"])
    assert [(r.op, r.where, r.how, r.dispatch_key) for r in kernels] == [
        # STABLE:8 TORCH_BOX(&fn) names no key: the block's CUDA (STABLE:7)
        ("_C.permute_cols", "csrc/libtorch_stable/torch_bindings.cpp:8", "STABLE_TORCH_LIBRARY_IMPL", "CUDA"),
        ("*.rms_norm", "csrc/torch_bindings.cpp:9", "TORCH_LIBRARY_EXPAND", "CUDA"),  # torch::kCUDA (BINDINGS:9)
        ("*.silu_and_mul", "csrc/torch_bindings.cpp:14", "TORCH_LIBRARY_IMPL_EXPAND", "CUDA"),  # block key, :13
        ("*.rms_norm", "csrc/torch_bindings.cpp:15", "TORCH_LIBRARY_IMPL_EXPAND", "Meta"),  # its own key wins
        ("_moe_C.topk_softmax", "csrc/torch_bindings.cpp:19", "TORCH_LIBRARY_IMPL", "CUDA"),
    ]
    assert all(r.kind == "impl" and r.schema is None and r.module is None for r in kernels)
    assert OpRegistration("x.y", "a.cpp:1", "TORCH_LIBRARY").kind == "def"  # the old constructor still works


@needs_snapshots
def test_pybind_module_functions_are_no_torch_ops(trees: Trees) -> None:
    # sparse_kv_offload.cpp:330 `PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {`, :332 and :334 `m.def("...", &fn, "doc")`
    every = native_registrations(trees.store, trees.code, kinds=("def", "impl", "fake"))
    assert not [r for r in every if r.where.startswith(SPARSE)]
    lines = (trees.code.subjects["plugin"].read(SPARSE).decode()).splitlines()
    assert lines[329].startswith("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)") and "lru_resident_compact" in lines[331]
    assert scan_native(trees.code.subjects["plugin"].read(SPARSE)) == {}


def test_a_macro_definition_is_no_block() -> None:
    facts = scan_native(REGISTRATION_H.encode())
    assert facts["blocks"] == [] and facts["registrations"] == [] and facts["impls"] == []


TRICKY = """\
#include <torch/library.h>
TORCH_LIBRARY(tricky, m) {
  char quote = '"'; /* m.def("ghost(Tensor x) -> Tensor"); */
  m.def(R"(raw_op(Tensor x) -> Tensor)");
  m.def(R"schema(multi(Tensor x,
                      Tensor y) -> Tensor)schema");
  char open = '(';
  m.impl("raw_op", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(raw_op)));
  int big = 1'000'000;
  m.def("after(Tensor x) -> Tensor");  // it's no string
}
STABLE_TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, s) {
  s.impl("after", TORCH_BOX(&after_cpu));
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m, py::mod_gil_not_used()) {
  m.def("pyfn", &pyfn);
}
"""
"""C++ shapes that broke the text scan: a char literal holding a quote before a comment, raw string
schemas (one spanning lines), a kernel wrapped by `torch::dispatch`, digit separators, a stable
EXPAND block, and a pybind module taking a third argument."""


def test_native_text_shapes_keep_blocks_schemas_and_lines(tmp_path: Path) -> None:
    facts = scan_native(TRICKY.encode())
    # :3 the comment after `'"'` is blanked (no ghost op); :4 and :5-6 raw strings, the later lines still right
    assert [(d["name"], d["line"], d["schema"]) for d in facts["registrations"]] == [
        ("raw_op", 4, "raw_op(Tensor x) -> Tensor"),
        ("multi", 5, "multi(Tensor x, Tensor y) -> Tensor"),
        ("after", 10, "after(Tensor x) -> Tensor"),
    ]
    # :8 `torch::dispatch(c10::DispatchKey::CUDA, ...)` names the key; :13 the IMPL block's CPU
    assert [(i["ns"], i["name"], i["line"], i["dispatch_key"]) for i in facts["impls"]] == [
        ("tricky", "raw_op", 8, "CUDA"),
        ("*", "after", 13, "CPU"),
    ]
    # :15-17 the pybind module opens no block and registers nothing
    assert [(b["how"], b["line"], b["end"]) for b in facts["blocks"]] == [
        ("TORCH_LIBRARY", 2, 11),
        ("STABLE_TORCH_LIBRARY_IMPL_EXPAND", 12, 14),
    ]
    store = StateStore(tmp_path / "state")
    index = ModuleIndex()
    subject = _tree(tmp_path / "tree", {"csrc/tricky.cpp": TRICKY})
    code = Codebase(index, {"upstream": subject}, frozenset())
    kernels = native_registrations(store, code, kinds=["impl"])
    assert [(r.op, r.how, r.dispatch_key) for r in kernels] == [
        ("tricky.raw_op", "TORCH_LIBRARY", "CUDA"),
        ("*.after", "STABLE_TORCH_LIBRARY_IMPL_EXPAND", "CPU"),
    ]


def test_native_lines_in_a_large_file() -> None:
    """Lines come from precomputed line starts (the speed is bench territory, not a test's)."""
    body = "".join(f'  m.def("op{i}(Tensor x) -> Tensor");\n' for i in range(20000))
    facts = scan_native(f"TORCH_LIBRARY(big, m) {{\n{body}}}\n".encode())
    assert len(facts["registrations"]) == 20000 and facts["registrations"][-1]["line"] == 20001


# -- Python ------------------------------------------------------------------------------------


@needs_snapshots
def test_python_registrations_by_kind(trees: Trees) -> None:
    facts = python_facts(trees.store, trees.code)
    defined, unknowns = python_registrations(trees.code, facts)
    by_where = {r.where: r for r in defined}
    # ops/register_custom_ops.py:195 `direct_register_custom_op(op_name="maybe_chunk_residual", ...,
    # dispatch_key="PrivateUse1")` (:200), into upstream's `Library("vllm", "FRAGMENT")` (TORCH_UTILS:3)
    chunk = by_where["vllm_ascend/ops/register_custom_ops.py:195"]
    assert (chunk.op, chunk.how, chunk.kind, chunk.dispatch_key) == (
        "vllm.maybe_chunk_residual",
        "direct_register_custom_op",
        "def",
        "PrivateUse1",
    )
    assert all(r.kind == "def" for r in defined) and unknowns == []
    kernels, unknown = python_registrations(trees.code, facts, kinds=("impl", "fake"))
    # batch_invariant.py:100 `_batch_invariant_LIB = torch.library.Library("aten", "IMPL")`; :109-136 its
    # `.impl("aten::<op>", fn, "NPU")` calls
    invariant = "vllm_ascend/batch_invariant.py"
    assert [(r.op, r.where) for r in kernels] == [
        ("aten.addmm", f"{invariant}:109"),
        ("aten.bmm", f"{invariant}:110"),
        ("aten.softmax", f"{invariant}:111"),
        ("aten._softmax", f"{invariant}:112"),
        ("aten.mm", f"{invariant}:116"),
        ("aten.matmul", f"{invariant}:117"),
        ("aten.sum", f"{invariant}:118"),
        ("aten.mm", f"{invariant}:131"),
        ("aten.matmul", f"{invariant}:132"),
        ("aten.linear", f"{invariant}:136"),
    ]
    assert {(r.how, r.kind, r.dispatch_key) for r in kernels} == {("Library.impl", "impl", "NPU")}
    # meta_registration.py:42 `lib = Library("_C_ascend", "IMPL")`; :52 `lib.impl(op_name, fn, "Meta")`
    assert unknown == [
        "vllm_ascend/meta_registration.py:52: lib.impl registers an op whose name is computed at run time"
    ]
    meta = facts["vllm_ascend.meta_registration"]
    assert meta.libraries == {"lib": "_C_ascend"} and meta.registrations[0].dispatch_key == "Meta"
    assert meta.local_ops() == [] and facts["vllm_ascend.batch_invariant"].local_ops() == []  # impls define no op


@needs_snapshots
def test_fake_kernels_as_decorators_and_library_impls(gcu: Path) -> None:
    # kernels/_custom_ops.py:8-10 `from torch.library import register_fake` (or impl_abstract as register_fake);
    # :227 `@register_fake("_C::awq_gemm_gcu")`, :277 `@register_fake("_C::gptq_gemm_gcu")`
    ops = PythonOpFacts.from_json(scan_python((gcu / "vllm_gcu/kernels/_custom_ops.py").read_bytes()))
    assert [(r.op, r.line, r.how, r.kind) for r in ops.registrations] == [
        ("_C.awq_gemm_gcu", 227, "torch.library.register_fake", "fake"),
        ("_C.gptq_gemm_gcu", 277, "torch.library.register_fake", "fake"),
    ]
    # quantization/fp8.py:10 `from vllm.utils import vllm_lib`; :208 `vllm_lib.impl("apply_w8a8_block_fp8_linear",
    # apply_w8a8_block_fp8_linear, dispatch_key="PrivateUse1")` (:211)
    fp8 = PythonOpFacts.from_json(scan_python((gcu / "vllm_gcu/kernels/quantization/fp8.py").read_bytes()))
    (impl,) = fp8.registrations
    assert (impl.name, impl.lib, impl.line, impl.how, impl.kind, impl.dispatch_key) == (
        "apply_w8a8_block_fp8_linear",
        "vllm_lib",
        208,
        "Library.impl",
        "impl",
        "PrivateUse1",
    )


def test_every_torch_library_form_is_found() -> None:
    source = b"""\
import torch
from torch.library import Library, impl_abstract
lib = Library("maca", "FRAGMENT")
lib.define("fused(Tensor x) -> Tensor")
@torch.library.custom_op("maca::topk", mutates_args=(), device_types="cuda")
def topk(x): return x
@torch.library.register_fake("maca::topk")
def _(x): return x
@torch.library.impl("maca::fused", ["CPU", "CUDA"])
def fused(x): return x
torch.library.register_kernel("maca::topk", "cpu", topk)
@torch.library.triton_op("maca::tri", mutates_args={})
def tri(x): return x
lib.impl("fused", fused, "CUDA")
lib._register_fake("fused", fused)
@impl_abstract("maca::old")
def old(x): return x
torch.library.define("maca::plain", "(Tensor x) -> Tensor")
self.impl(query)
"""
    found = PythonOpFacts.from_json(scan_python(source))
    # :18 the schema is the second argument, after the op's name
    assert [r.schema for r in found.registrations if r.op == "maca.plain"] == ["plain(Tensor x) -> Tensor"]
    assert [(r.op or f"{r.lib}:{r.name}", r.line, r.how, r.kind, r.dispatch_key) for r in found.registrations] == [
        ("lib:fused", 4, "Library.define", "def", None),
        ("maca.topk", 5, "torch.library.custom_op", "def", "cuda"),  # a decorator is a call
        ("maca.topk", 7, "torch.library.register_fake", "fake", None),
        ("maca.fused", 9, "torch.library.impl", "impl", "CPU,CUDA"),
        ("maca.topk", 11, "torch.library.register_kernel", "impl", "cpu"),
        ("maca.tri", 12, "torch.library.triton_op", "def", None),
        ("lib:fused", 14, "Library.impl", "impl", "CUDA"),
        ("lib:fused", 15, "Library.register_fake", "fake", None),
        ("maca.old", 16, "torch.library.impl_abstract", "fake", None),
        ("maca.plain", 18, "torch.library.define", "def", None),
    ]  # :19 `self.impl(query)` is no registration
    assert [(s.op, s.line) for s in found.local_ops()] == [
        ("maca.fused", 4),
        ("maca.topk", 5),
        ("maca.tri", 12),
        ("maca.plain", 18),
    ]


# -- build files -------------------------------------------------------------------------------


@needs_snapshots
def test_gcu_builds_its_extension_always_and_lmcache_behind_a_switch(gcu: Path) -> None:
    facts = build_facts(DirectorySubject(gcu))
    # setup.py:49 `_WITH_LMCACHE = bool(int(os.getenv("WITH_LMCACHE", "0")))`, :344 `if _WITH_LMCACHE:`
    lmcache = EnvSwitch("WITH_LMCACHE", "0", "setup.py:49", "setup.py:344", builds_when=True)
    assert facts.extensions == [
        # setup.py:326-328 `TopsTorchExtension(name="vllm_gcu._C", sources=_get_all_sources("csrc"), ...)`
        BuiltExtension("vllm_gcu._C", "_C", "setup.py:326", "TopsTorchExtension", ["csrc"], None),
        # setup.py:346-348 `TopsTorchExtension(name="lmcache.c_ops", sources=_get_all_sources("lmcache/csrc"), ...)`
        BuiltExtension("lmcache.c_ops", "c_ops", "setup.py:346", "TopsTorchExtension", ["lmcache/csrc"], lmcache),
    ]
    assert facts.precompiled == [] and facts.gaps == []


@needs_snapshots
def test_ascend_compiles_kernels_when_its_envs_switch_says(ascend: Path) -> None:
    facts = build_facts(DirectorySubject(ascend))
    # setup.py:135 `envs = load_module_from_path("envs", ... "vllm_ascend", "envs.py")`; vllm_ascend/envs.py:43
    # `"COMPILE_CUSTOM_KERNELS": lambda: bool(int(os.getenv("COMPILE_CUSTOM_KERNELS", "1")))`;
    # setup.py:435 `if envs.COMPILE_CUSTOM_KERNELS:`,
    # setup.py:436 `ext_modules = [CMakeExtension(name="vllm_ascend.vllm_ascend_C")]`
    switch = EnvSwitch("COMPILE_CUSTOM_KERNELS", "1", "vllm_ascend/envs.py:43", "setup.py:435", builds_when=True)
    assert facts.extensions == [
        BuiltExtension("vllm_ascend.vllm_ascend_C", "vllm_ascend_C", "setup.py:436", "CMakeExtension", [], switch)
    ]
    # setup.py:341 `if not envs.COMPILE_CUSTOM_KERNELS: return` takes nothing precompiled instead
    assert facts.precompiled == [] and facts.gaps == []


VLLM_ENVS = """\
import os

environment_variables = {
    "VLLM_USE_PRECOMPILED": lambda: os.environ.get("VLLM_USE_PRECOMPILED", "").strip().lower() in ("1", "true")
    or bool(os.environ.get("VLLM_PRECOMPILED_WHEEL_LOCATION")),
}
"""
VLLM_SETUP = """\
import importlib.util
import os

from setuptools import Extension, setup


def load_module_from_path(module_name, path):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


envs = load_module_from_path("envs", os.path.join(os.path.dirname(__file__), "vllm", "envs.py"))


class CMakeExtension(Extension):
    def __init__(self, name: str, cmake_lists_dir: str = ".", **kwa) -> None:
        super().__init__(name, sources=[], py_limited_api=True, **kwa)


if envs.VLLM_USE_PRECOMPILED:
    wheel_location = os.getenv("VLLM_PRECOMPILED_WHEEL_LOCATION", None)
    if wheel_location is None:
        base_commit = "0123abcd"
        wheel_location = f"https://wheels.vllm.ai/{base_commit}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl"
    ext_modules = []
else:
    ext_modules = [CMakeExtension(name="vllm._C")]

setup(name="vllm", ext_modules=ext_modules)
"""
VLLM_CMAKE = """\
set(VLLM_EXT_SRC
  "csrc/cache_kernels.cu"
  "csrc/torch_bindings.cpp")
list(APPEND VLLM_EXT_SRC "csrc/layernorm_kernels.cu")
# define_gpu_extension_target(_commented_out)
define_gpu_extension_target(
  _C
  DESTINATION vllm
  LANGUAGE ${VLLM_GPU_LANG}
  SOURCES ${VLLM_EXT_SRC}
  USE_SABI 3
  WITH_SOABI)
pybind11_add_module(_fast MODULE csrc/fast.cpp)
add_library(helpers STATIC csrc/helpers.cpp)
add_library(_plugin SHARED csrc/plugin.cpp)
add_library(_loaded MODULE csrc/loaded.cpp)
"""


def test_a_precompiled_wheel_switch_and_cmake_targets(tmp_path: Path) -> None:
    subject = _tree(tmp_path, {"setup.py": VLLM_SETUP, "vllm/envs.py": VLLM_ENVS, "CMakeLists.txt": VLLM_CMAKE})
    facts = build_facts(subject)
    # VLLM_ENVS:4 reads VLLM_USE_PRECOMPILED with default "" (`in ("1", "true")`), or-ed with the wheel
    # location (:5); VLLM_SETUP:22 `if envs.VLLM_USE_PRECOMPILED:` empties ext_modules (:27), the else arm
    # builds vllm._C (:29)
    switch = EnvSwitch(
        "VLLM_USE_PRECOMPILED", "", "vllm/envs.py:4", "setup.py:22", False, ("VLLM_PRECOMPILED_WHEEL_LOCATION",)
    )
    # VLLM_CMAKE:6 the target that builds it (DESTINATION vllm, :8): one extension, setup.py's declaration
    # with the target's SOURCES (:10), the list set at :1-3 and appended at :4
    sources = ["csrc/cache_kernels.cu", "csrc/torch_bindings.cpp", "csrc/layernorm_kernels.cu"]
    assert facts.extensions == [
        BuiltExtension("vllm._C", "_C", "setup.py:29", "CMakeExtension", sources, switch),
        BuiltExtension("_fast", "_fast", "CMakeLists.txt:13", "pybind11_add_module", ["csrc/fast.cpp"]),
        # :14 a STATIC and :15 a SHARED library are no Python modules; :16 a MODULE is
        BuiltExtension("_loaded", "_loaded", "CMakeLists.txt:16", "add_library", ["csrc/loaded.cpp"]),
    ]
    # VLLM_SETUP:26 the wheel the precompiled arm fetches; :23 its location read from the environment first
    assert facts.precompiled == [PrecompiledSource("vllm", "wheel", switch, "setup.py:26")]
    assert facts.gaps == []


PREBUILT_SETUP = """\
import os
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

USE_PREBUILT = os.environ.get("FOO_USE_PREBUILT", "0") == "1"
install_requires = ["torch"]
ext_modules = []
if not USE_PREBUILT:
    ext_modules.append(CUDAExtension(name="foo._kernels", sources=["csrc/a.cu", "csrc/b.cpp"]))
if USE_PREBUILT:
    install_requires.append("foo-kernels==0.3")
    os.system("pip install --no-deps foo-extra-kernels")

setup(name="foo", install_requires=install_requires, ext_modules=ext_modules)
"""
COPIED_SETUP = """\
import os
import shutil
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    def build_extensions(self):
        if os.environ.get("BAR_SKIP_BUILD") == "1":
            print("skipping the kernels")
            return
        super().build_extensions()


ext_modules = [Extension("bar._C", ["csrc/x.cpp"])]
if os.getenv("BAR_PRECOMPILED"):
    import bar_kernels
    shutil.copytree(bar_kernels.__path__[0], "bar/kernels")
    ext_modules = []
setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
"""


def test_a_switch_that_adds_a_kernel_package_instead(tmp_path: Path) -> None:
    facts = build_facts(_tree(tmp_path / "prebuilt", {"setup.py": PREBUILT_SETUP}))
    # PREBUILT_SETUP:5 the name read from FOO_USE_PREBUILT ("0"); :8 `if not USE_PREBUILT:` builds, :10
    # `if USE_PREBUILT:` adds a requirement (:11) and pip-installs a package (:12)
    built = EnvSwitch("FOO_USE_PREBUILT", "0", "setup.py:5", "setup.py:8", builds_when=False)
    assert facts.extensions == [
        BuiltExtension("foo._kernels", "_kernels", "setup.py:9", "CUDAExtension", ["csrc/a.cu", "csrc/b.cpp"], built)
    ]
    instead = EnvSwitch("FOO_USE_PREBUILT", "0", "setup.py:5", "setup.py:10", builds_when=False)
    assert facts.precompiled == [
        PrecompiledSource("foo-kernels", "requirement", instead, "setup.py:11"),
        PrecompiledSource("foo-extra-kernels", "pip", instead, "setup.py:12"),
    ]
    copied = build_facts(_tree(tmp_path / "copied", {"setup.py": COPIED_SETUP}))
    # COPIED_SETUP:16 the arm empties ext_modules (:19) after bar._C went in (:15): that switch gates it
    # before the early return of build_extensions (:9); the arm copies the files of the package it
    # imports (:17-18)
    switch = EnvSwitch("BAR_PRECOMPILED", None, "setup.py:16", "setup.py:16", builds_when=False)
    assert copied.extensions == [BuiltExtension("bar._C", "_C", "setup.py:15", "Extension", ["csrc/x.cpp"], switch)]
    assert copied.precompiled == [PrecompiledSource("bar_kernels", "import", switch, "setup.py:17")]


def test_unreadable_build_files_are_gaps(tmp_path: Path) -> None:
    broken = build_facts(_tree(tmp_path / "broken", {"setup.py": "def broken(:\n"}))
    assert (broken.extensions, broken.precompiled) == ([], []) and broken.gaps == [
        "setup.py: not parseable (SyntaxError)"
    ]
    setup = "import envs\nfrom setuptools import Extension\nif envs.MAKE_KERNELS:\n    Extension('x._C', [])\n"
    missing = build_facts(_tree(tmp_path / "missing", {"setup.py": setup}))
    # :3 `envs.MAKE_KERNELS` with no envs.py in the repository: the switch is known, its default is not
    assert missing.extensions[0].switch == EnvSwitch("MAKE_KERNELS", None, "setup.py:3", "setup.py:3", True)
    assert missing.gaps == ["setup.py:3: envs.MAKE_KERNELS is defined in no envs.py of the repository"]


POLARITY_SETUP = """\
import os
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension

SKIP_KERNELS = os.getenv("BUILD_KERNELS", "1") == "0"
ext_modules = []
if not SKIP_KERNELS:
    ext_modules.append(CUDAExtension("pkg._C", ["csrc/ops.cu"]))
if os.getenv("USE_PREBUILT", "").lower() not in ("0", "false", ""):
    pass
else:
    ext_modules.append(CUDAExtension("pkg._local", ["csrc/local.cu"]))
if os.environ.get("WITH_B", "0").strip() in ("1", "true"):
    ext_modules.append(CUDAExtension("pkg._b", ["csrc/b.cu"]))
if int(os.getenv("WITH_EXTRA", "0")) > 0:
    ext_modules.append(CUDAExtension("pkg._extra", ["csrc/extra.cu"]))
if int(os.getenv("NO_SPLIT", "0")) >= 1:
    pass
else:
    ext_modules.append(CUDAExtension("pkg._split", ["csrc/split.cu"]))
if "WITH_MOE" in os.environ:
    ext_modules.append(CUDAExtension("pkg._moe", ["csrc/moe.cu"]))
if os.getenv("WITH_X") == "1" or os.getenv("WITH_Y") == "1":
    ext_modules.append(CUDAExtension("pkg._xy", ["csrc/xy.cu"]))
if os.getenv("WITH_P") and os.getenv("WITH_Q"):
    ext_modules.append(CUDAExtension("pkg._pq", ["csrc/pq.cu"]))


def enabled(name):
    return os.getenv(name, "0") == "1"


if enabled("WITH_H"):
    ext_modules.append(CUDAExtension("pkg._h", ["csrc/h.cu"]))
if os.getenv("CUDA_ARCH", "all") in supported_archs():
    ext_modules.append(CUDAExtension("pkg._arch", ["csrc/arch.cu"]))
setup(name="pkg", ext_modules=ext_modules)
"""


def test_switch_polarity_follows_the_test_as_a_function_of_the_value(tmp_path: Path) -> None:
    facts = build_facts(_tree(tmp_path, {"setup.py": POLARITY_SETUP}))
    switches = {e.module: e.switch for e in facts.extensions}
    assert all(s is not None for s in switches.values()) and facts.gaps == []
    when = {module: (s.name, s.default, s.gate, s.builds_when, s.combined_with) for module, s in switches.items() if s}
    assert when == {
        # :5 a name bound to a comparison keeps it: `not SKIP` (:7) builds unless BUILD_KERNELS is "0"
        "pkg._C": ("BUILD_KERNELS", "1", "setup.py:7", True, ()),
        # :9 `not in ("0", "false", "")` holds when on: the else arm (:12) builds when off
        "pkg._local": ("USE_PREBUILT", "", "setup.py:9", False, ()),
        "pkg._b": ("WITH_B", "0", "setup.py:13", True, ()),  # `.strip() in ("1", "true")`
        "pkg._extra": ("WITH_EXTRA", "0", "setup.py:15", True, ()),  # `int(...) > 0`
        "pkg._split": ("NO_SPLIT", "0", "setup.py:17", False, ()),  # `int(...) >= 1`, else arm
        "pkg._moe": ("WITH_MOE", None, "setup.py:21", True, ()),  # presence in os.environ
        # :23 and :25 two switches: the first reported, the other named
        "pkg._xy": ("WITH_X", None, "setup.py:23", True, ("WITH_Y",)),
        "pkg._pq": ("WITH_P", None, "setup.py:25", True, ("WITH_Q",)),
        # :33 a setup.py helper called with the variable's name (:30 its one return)
        "pkg._h": ("WITH_H", "0", "setup.py:33", True, ()),
        # :35 compared with what a call returns: the value alone decides nothing, so no polarity is claimed
        "pkg._arch": ("CUDA_ARCH", "all", "setup.py:35", None, ()),
    }


FETCHED_SETUP = """\
import os
import shutil
import subprocess
import sys
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension

install_requires = ["torch", "numpy"]
ext_modules = [CUDAExtension("pkg._C", ["csrc/ops.cu"])]
if os.getenv("PKG_PRECOMPILED", "0") == "1":
    ext_modules = []
    print("pip install ninja for faster builds")
    import json
    import pkg_kernels
    import other_kernels
    shutil.copy("README.md", "build/README.md")
    root = os.path.dirname(pkg_kernels.__file__)
    shutil.copytree(root, "pkg/kernels")
    install_requires.extend(["pkg-kernels-a==1.0", "pkg-kernels-b"])
    install_requires.append("torch>=2.5")
    wheel = "pkg_prebuilt-1.0-cp310-linux_x86_64.whl"
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--no-deps", "pkg-extra"])
    command = "pip install pkg-more"
    os.system(command)
setup(name="pkg", install_requires=install_requires, ext_modules=ext_modules)
"""
ASSIGNED_SETUP = """\
import glob
import os
from setuptools import setup
from torch.utils.cpp_extension import CUDAExtension
ext_modules = []
if os.getenv("USE_PREBUILT", "").lower() not in ("0", "false", ""):
    install_requires = ["pkg-kernels==1.0"]
else:
    ext_modules.append(CUDAExtension("pkg._C", sources=[os.path.join("csrc", "ops.cu")] + glob.glob("csrc/**/*.cu")))
if os.environ.get("VERBOSE"):
    print("pip install ninja recommended")
setup(name="pkg", ext_modules=ext_modules)
"""


def test_only_fetch_evidence_makes_a_precompiled_package(tmp_path: Path) -> None:
    facts = build_facts(_tree(tmp_path / "fetched", {"setup.py": FETCHED_SETUP}))
    # FETCHED_SETUP:10 the arm empties ext_modules (:11) after pkg._C went in (:9): it is built when off
    switch = EnvSwitch("PKG_PRECOMPILED", "0", "setup.py:10", "setup.py:10", builds_when=False)
    assert facts.extensions == [BuiltExtension("pkg._C", "_C", "setup.py:9", "CUDAExtension", ["csrc/ops.cu"], switch)]
    assert [(p.package, p.how, p.where) for p in facts.precompiled] == [
        ("pkg-kernels-a", "requirement", "setup.py:19"),  # `.extend([...])`: every package
        ("pkg-kernels-b", "requirement", "setup.py:19"),
        ("pkg_prebuilt", "wheel", "setup.py:21"),
        ("pkg-extra", "pip", "setup.py:22"),  # an argument list run by check_call
        ("pkg-more", "pip", "setup.py:24"),  # a command assigned (:23), then run by os.system
        ("pkg_kernels", "import", "setup.py:14"),  # its files copied through `root` (:17-18)
    ]
    # not: ninja (:12 a printed string), json (:13 stdlib), other_kernels (:15 nothing copies it; :16 copies
    # an unrelated file), torch (:20, already required unconditionally at :8)
    assert {p.switch for p in facts.precompiled} == {switch}
    assigned = build_facts(_tree(tmp_path / "assigned", {"setup.py": ASSIGNED_SETUP}))
    # ASSIGNED_SETUP:7 a plain assignment to install_requires in the arm that builds nothing (:6)
    instead = EnvSwitch("USE_PREBUILT", "", "setup.py:6", "setup.py:6", builds_when=False)
    assert assigned.precompiled == [PrecompiledSource("pkg-kernels", "requirement", instead, "setup.py:7")]
    # :9 `os.path.join("csrc", "ops.cu")` is one path; the glob keeps its fixed directory
    assert assigned.extensions[0].sources == ["csrc/ops.cu", "csrc"] and assigned.extensions[0].switch == instead


COMMANDS_SETUP = """\
import os
from setuptools import Extension, setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension


class my_build_py(build_py):
    def build_module(self, module, module_file, package):
        if os.getenv("SKIP_DOCS"):
            return
        return super().build_module(module, module_file, package)


class Base(BuildExtension):
    def helper(self):
        if os.getenv("NOT_A_GATE"):
            return


class Kernels(Base):
    def build_extensions(self):
        if os.getenv("PKG_SKIP_KERNELS", "0") == "1":
            return
        super().build_extensions()


setup(ext_modules=[Extension("pkg._C", ["csrc/ops.cpp"])], cmdclass={"build_py": my_build_py, "build_ext": Kernels})
"""
REGISTERED_SETUP = """\
import os
from setuptools import Extension, setup


class Compile:
    def run(self):
        if not os.getenv("PKG_COMPILE"):
            return


setup(name="pkg", ext_modules=[Extension("pkg._C", ["csrc/ops.cpp"])], cmdclass={"build_ext": Compile})
"""


def test_only_build_ext_commands_gate_every_extension(tmp_path: Path) -> None:
    facts = build_facts(_tree(tmp_path / "commands", {"setup.py": COMMANDS_SETUP}))
    # COMMANDS_SETUP:9 build_py.build_module's return and :16 a helper method of a BuildExtension gate
    # nothing; :22 build_extensions of Kernels (a BuildExtension through Base, :14 and :20) does
    skip = EnvSwitch("PKG_SKIP_KERNELS", "0", "setup.py:22", "setup.py:22", builds_when=False)
    assert facts.extensions == [BuiltExtension("pkg._C", "_C", "setup.py:27", "Extension", ["csrc/ops.cpp"], skip)]
    registered = build_facts(_tree(tmp_path / "registered", {"setup.py": REGISTERED_SETUP}))
    # REGISTERED_SETUP:11 registers Compile (no build_ext base) under "build_ext"; its run (:7) returns unless set
    compile_switch = EnvSwitch("PKG_COMPILE", None, "setup.py:7", "setup.py:7", builds_when=True)
    assert [e.switch for e in registered.extensions] == [compile_switch]


CMAKE_SETUP = """\
import os
from setuptools import setup
from cmake_build import CMakeExtension

ROOT_DIR = os.path.dirname(__file__)
ext_modules = [
    CMakeExtension("pkg._ext", cmake_lists_dir="."),
    CMakeExtension("pkg._x", sourcedir=os.path.join(ROOT_DIR, "extra")),
]
if os.getenv("PKG_KERNELS", "1") != "0":
    ext_modules.append(CMakeExtension(name="pkg._C"))
setup(name="pkg", ext_modules=ext_modules)
"""
CMAKE_TOP = """\
cmake_minimum_required(VERSION 3.20)
project(pkg)
set(COMMON_SRC common.cu)
add_subdirectory(csrc)
add_subdirectory(third_party/pybind11)
add_subdirectory(tests)
add_library(helpers SHARED csrc/helpers.cpp)
"""
CMAKE_CSRC = """\
set(SRC ops.cpp kernels/a.cu)
define_gpu_extension_target(
  _C
  DESTINATION pkg
  LANGUAGE CUDA
  SOURCES ${SRC} ${CMAKE_CURRENT_SOURCE_DIR}/b.cu ${CMAKE_SOURCE_DIR}/shared/c.cu
  WITH_SOABI)
add_library(_ext MODULE ${COMMON_SRC})
"""


def test_cmake_targets_of_the_project_merge_with_setup_declarations(tmp_path: Path) -> None:
    files = {
        "setup.py": CMAKE_SETUP,
        "CMakeLists.txt": CMAKE_TOP,
        "csrc/CMakeLists.txt": CMAKE_CSRC,
        "third_party/pybind11/CMakeLists.txt": "pybind11_add_module(pybind11_tests test_a.cpp)\n",
        "tests/CMakeLists.txt": "pybind11_add_module(_test_ext t.cpp)\n",
        "stray/CMakeLists.txt": "pybind11_add_module(_stray s.cpp)\n",
        "extra/CMakeLists.txt": "pybind11_add_module(_x x.cpp)\n",
    }
    facts = build_facts(_tree(tmp_path, files))
    # CMAKE_SETUP:7-8 directory arguments are no sources; :8 names extra/ as a CMake root (its _x target);
    # CMAKE_CSRC:8 `_ext` (no DESTINATION) is pkg._ext by its last component, its source relative to csrc/;
    # CMAKE_CSRC:2-7 pkg._C: sources relative to csrc/, ${CMAKE_CURRENT_SOURCE_DIR} and ${CMAKE_SOURCE_DIR}
    switch = EnvSwitch("PKG_KERNELS", "1", "setup.py:10", "setup.py:10", builds_when=True)
    assert facts.extensions == [
        BuiltExtension("pkg._ext", "_ext", "setup.py:7", "CMakeExtension", ["csrc/common.cu"]),
        BuiltExtension("pkg._x", "_x", "setup.py:8", "CMakeExtension", ["extra/x.cpp"]),
        BuiltExtension(
            "pkg._C",
            "_C",
            "setup.py:11",
            "CMakeExtension",
            ["csrc/ops.cpp", "csrc/kernels/a.cu", "csrc/b.cu", "shared/c.cu"],
            switch,
        ),
    ]  # not: third_party/ and tests/ targets, stray/ (no add_subdirectory reaches it), CMAKE_TOP:7 a SHARED library
    assert facts.gaps == []


def test_a_file_without_the_needles_holds_nothing_the_python_scan_finds() -> None:
    """The scan skips files holding none of PYTHON_NEEDLES, so every name a registration is found by
    (a `Library` method, a `torch.library` function, vLLM's direct helper) must contain a needle, or
    be one of the bare `define`/`impl`, which a file imports from `torch.library` (needle `library`)."""
    needles = [n.decode().strip(".(") for n in PYTHON_NEEDLES]
    names = {*QUALIFIED_FORMS, *LIBRARY_FORMS, "direct_register_custom_op", "Library"}
    uncovered = {name for name in names if not any(needle in name for needle in needles)}
    assert uncovered <= {"define", "impl"} and {".define(", ".impl(", "library"} <= {n.decode() for n in PYTHON_NEEDLES}
    assert scan_python(b"import torch\nx = torch.ops.vllm.rms_norm(y)\n")["uses"] == [["vllm.rms_norm", 2]]
    assert scan_python(b"def register_buffer():\n    pass\n") == {}, "a needle-free file is not parsed"
