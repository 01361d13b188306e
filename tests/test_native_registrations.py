"""Kernels and ops from every side: C/C++ registrations (every `TORCH_LIBRARY*` family, defs and impls
with their dispatch keys; `PYBIND11_MODULE` functions apart, as no torch ops), Python registrations
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
    OpRegistration,
    PybindFunction,
    PythonOpFacts,
    native_registrations,
    pybind_functions,
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
    assert pybind_functions(trees.store, trees.code) == [
        PybindFunction("TORCH_EXTENSION_NAME", "lru_resident_compact", f"{SPARSE}:332"),
        PybindFunction("TORCH_EXTENSION_NAME", "compute_lru_resident_addrs", f"{SPARSE}:334"),
    ]
    every = native_registrations(trees.store, trees.code, kinds=("def", "impl", "fake"))
    assert not [r for r in every if r.where.startswith(SPARSE)]
    lines = (trees.code.subjects["plugin"].read(SPARSE).decode()).splitlines()
    assert lines[329].startswith("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)") and "lru_resident_compact" in lines[331]


def test_a_macro_definition_is_no_block() -> None:
    facts = scan_native(REGISTRATION_H.encode())
    assert facts["blocks"] == [] and facts["registrations"] == [] and facts["impls"] == []


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
"""


def test_a_precompiled_wheel_switch_and_cmake_targets(tmp_path: Path) -> None:
    subject = _tree(tmp_path, {"setup.py": VLLM_SETUP, "vllm/envs.py": VLLM_ENVS, "CMakeLists.txt": VLLM_CMAKE})
    facts = build_facts(subject)
    # VLLM_ENVS:4 reads VLLM_USE_PRECOMPILED with default ""; VLLM_SETUP:22 `if envs.VLLM_USE_PRECOMPILED:`
    # empties ext_modules (:27), the else arm builds vllm._C (:29)
    switch = EnvSwitch("VLLM_USE_PRECOMPILED", "", "vllm/envs.py:4", "setup.py:22", builds_when=False)
    assert facts.extensions == [
        BuiltExtension("vllm._C", "_C", "setup.py:29", "CMakeExtension", [], switch),
        # VLLM_CMAKE:6 the target, its DESTINATION (:8) and SOURCES (:10), the list set at :1-3, appended at :4
        BuiltExtension(
            "vllm._C",
            "_C",
            "CMakeLists.txt:6",
            "define_gpu_extension_target",
            ["csrc/cache_kernels.cu", "csrc/torch_bindings.cpp", "csrc/layernorm_kernels.cu"],
        ),
        BuiltExtension("_fast", "_fast", "CMakeLists.txt:13", "pybind11_add_module", ["csrc/fast.cpp"]),
        # :14 a STATIC library is no extension module
        BuiltExtension("_plugin", "_plugin", "CMakeLists.txt:15", "add_library", ["csrc/plugin.cpp"]),
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
    # COPIED_SETUP:9 an early return of build_extensions gates every extension (:15, no enclosing if)
    skip = EnvSwitch("BAR_SKIP_BUILD", None, "setup.py:9", "setup.py:9", builds_when=False)
    assert copied.extensions == [BuiltExtension("bar._C", "_C", "setup.py:15", "Extension", ["csrc/x.cpp"], skip)]
    # :16 the arm empties ext_modules (:19) and copies the files of the package it imports (:17-18)
    switch = EnvSwitch("BAR_PRECOMPILED", None, "setup.py:16", "setup.py:16", builds_when=False)
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
