"""Plugin patches found by what they do, each with its target at base and target and whether it is
active: reached from the plugin's entry points through imports and calls.

Synthetic trees hold one case per form (assignment, `setattr`, `sys.modules`, a module bound from
a string, the plugin's own helpers recognised by their bodies, a library patcher started by hand)
and per way of being reached. The real plugins are vllm-ascend 351879064c (its `vllm_ascend/patch/`
tree, applied through `adapt_patch` from its entry points and its platform's and worker's hooks)
against upstream 0.26.0 (base) and 0.33.0 (target), and vllm-gcu 7b5aaca941 (`mock.patch(...).start()`
patches, per upstream release) against 0.9.2. Each expectation names the code that decides it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo

from vllm_metax_mcp.core.code.activity import entry_points, mark_active
from vllm_metax_mcp.core.code.codebase import Codebase
from vllm_metax_mcp.core.code.conditions import conditions, simplify
from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.code.overrides import Overrides, Patch, find_overrides, override_facts
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.core.trace.defects import override_defects

UPSTREAM = {
    "vllm/__init__.py": "",
    "vllm/layers.py": "def rms_norm(x):\n    return x\n\n\n"
    "class Attention:\n    def forward(self, x):\n        return x\n",
    "vllm/sampler.py": "def sample(logits):\n    return logits\n",
    "vllm/envs.py": "FLAG = 1\n",
    "vllm/platforms/__init__.py": "from .interface import Platform\n",
    "vllm/platforms/interface.py": "class Platform:\n"
    "    @classmethod\n    def pre_register_and_update(cls, parser=None):\n        pass\n\n"
    "    @classmethod\n    def check_and_update_config(cls, config):\n        pass\n",
    "vllm/worker.py": "class WorkerBase:\n    def init_device(self):\n        pass\n",
}
BASE_CHANGES = {
    "vllm/layers.py": "def rms_norm(x, eps=1e-6):\n    return x\n\n\nclass Attention:\n"
    "    def forward(self, x):\n        return x * 1\n\n    def gone(self):\n        pass\n"
}
PYPROJECT = """\
[project]
name = "plug"

[project.entry-points."vllm.platform_plugins"]
plug = "plug:register"

[project.entry-points."vllm.general_plugins"]
plug_models = "plug:register_models"
"""
PLUGIN = {
    "plug/__init__.py": """\
def register():
    return "plug.platform.PlugPlatform"


def register_models():
    from plug import models  # noqa: F401
""",
    "plug/models.py": "",
    "plug/helpers.py": '''\
import importlib


def apply_patch(target, replacement):
    """Function form: the module and the attribute come from one dotted string."""
    module_name, attr = target.rsplit(".", 1)
    setattr(importlib.import_module(module_name), attr, replacement)


def patch_function(module_name, name=None):
    """Decorator form: the attribute defaults to the decorated function's name."""

    def decorate(fn):
        module = importlib.import_module(module_name)
        setattr(module, name or fn.__name__, fn)
        return fn

    return decorate


def patch_method(module_name, class_name, fn):
    """Through getattr: a class of the module, the attribute named after the function passed."""
    owner = getattr(importlib.import_module(module_name), class_name)
    setattr(owner, fn.__name__, fn)


def adapt(is_global=False):
    if is_global:
        from plug.patches import platform_side  # noqa: F401
    else:
        from plug.patches import worker_side  # noqa: F401
''',
    "plug/platform.py": """\
import os

from vllm.platforms import Platform


class PlugPlatform(Platform):
    @classmethod
    def pre_register_and_update(cls, parser=None):
        from plug.helpers import adapt

        adapt(is_global=True)
        if os.environ.get("PLUG_EXTRA"):
            import plug.patches.extra  # noqa: F401

    @classmethod
    def check_and_update_config(cls, config):
        if config.worker_cls == "auto":
            config.worker_cls = "plug.worker.PlugWorker"

    def unrelated(self):
        import plug.patches.never  # noqa: F401
""",
    "plug/worker.py": """\
from vllm.worker import WorkerBase


class PlugWorker(WorkerBase):
    def __init__(self):
        from plug.helpers import adapt

        adapt()
""",
    "plug/patches/__init__.py": "",
    "plug/patches/platform_side.py": """\
import importlib
import sys

import vllm.layers as layers
from vllm.layers import Attention

from plug.helpers import apply_patch, patch_function, patch_method


def plug_rms_norm(x):
    return x


def plug_forward(self, x):
    return x


def gone(self):
    pass


layers.rms_norm = plug_rms_norm
setattr(Attention, "forward", plug_forward)
sys.modules["vllm.envs"] = object()
apply_patch("vllm.sampler.sample", plug_rms_norm)
patch_method("vllm.layers", "Attention", gone)


@patch_function("vllm.sampler")
def sample(logits):
    return logits


_sampler = importlib.import_module("vllm.sampler")
_sampler.extra = plug_rms_norm
""",
    "plug/patches/worker_side.py": """\
from unittest.mock import patch

import vllm.layers

HAS_FAST = True


def plug_norm(x):
    return x


patch("vllm.layers.rms_norm", plug_norm).start()
patch.object(vllm.layers.Attention, "forward", plug_norm).start()
with patch("vllm.sampler.sample", plug_norm):
    pass
if not HAS_FAST:
    vllm.layers.rms_norm = plug_norm
""",
    "plug/patches/extra.py": "import vllm.sampler\n\nvllm.sampler.sample = print\n",
    "plug/patches/never.py": "import vllm.sampler\n\nvllm.sampler.sample = print\n",
    "plug/patches/orphan.py": "import vllm.layers\n\nvllm.layers.rms_norm = print\n",
}


def _tree(root: Path, files: dict[str, str]) -> DirectorySubject:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return DirectorySubject(root)


def find(
    store: StateStore, plugin: DirectorySubject, package: str, upstream: DirectorySubject, base: DirectorySubject
) -> Overrides:
    """What a trace finds: the plugin and upstream target indexed together, upstream at base beside."""
    return find_with_code(store, plugin, package, upstream, base)[0]


def find_with_code(
    store: StateStore, plugin: DirectorySubject, package: str, upstream: DirectorySubject, base: DirectorySubject
) -> tuple[Overrides, Codebase]:
    cache = RecordCache(store)
    index, base_index = ModuleIndex(), ModuleIndex()
    index.add_tree("plugin", plugin, cache, [f"{package}/"])
    index.add_tree("upstream", upstream, cache, ["vllm/"])
    base_index.add_tree("upstream", base, cache, ["vllm/"])
    code = Codebase(index, {"plugin": plugin, "upstream": upstream}, frozenset({"vllm", package}))
    found = find_overrides(code, override_facts(store, code, frozenset({package})), base_index)
    found.unknowns += mark_active(code, found)
    return found, code


def at(found: Overrides, file: str, line: int) -> Patch:
    (patch,) = [p for p in found.patches if p.file == file and p.line == line]
    return patch


def line_of(files: dict[str, str], relative: str, text: str) -> int:
    return next(n for n, line in enumerate(files[relative].splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Overrides:
    root = tmp_path_factory.mktemp("patches")
    upstream = _tree(root / "target", UPSTREAM)
    base = _tree(root / "base", {**UPSTREAM, **BASE_CHANGES})
    plugin = _tree(root / "plugin", {**PLUGIN, "pyproject.toml": PYPROJECT})
    return find(StateStore(root / "state"), plugin, "plug", upstream, base)


def synthetic_at(found: Overrides, relative: str, text: str) -> Patch:
    return at(found, relative, line_of(PLUGIN, relative, text))


SIDE = "plug/patches/platform_side.py"
WORKER = "plug/patches/worker_side.py"


def test_assignment_setattr_and_module_replacement(synthetic: Overrides) -> None:
    assigned = synthetic_at(synthetic, SIDE, "layers.rms_norm = ")
    assert (assigned.how, assigned.target.symbol) == ("assignment", "vllm.layers:rms_norm")
    assert assigned.replacement == "plug.patches.platform_side:plug_rms_norm"
    assert (assigned.target.at_base, assigned.target.exists, assigned.target.changed) == (True, True, True)
    forward = synthetic_at(synthetic, SIDE, "setattr(Attention")
    assert (forward.how, forward.target.symbol, forward.target.changed) == (
        "setattr",
        "vllm.layers:Attention.forward",
        True,
    )
    replaced = synthetic_at(synthetic, SIDE, "sys.modules[")
    assert (replaced.how, replaced.target.symbol) == ("module_replacement", "vllm.envs")


def test_helpers_are_recognised_by_their_bodies(synthetic: Overrides) -> None:
    function = synthetic_at(synthetic, SIDE, 'apply_patch("vllm.sampler.sample"')
    assert (function.how, function.helper) == ("helper", "plug.helpers:apply_patch")
    assert function.target.symbol == "vllm.sampler:sample"  # module and attribute split from one string
    assert function.replacement == "plug.patches.platform_side:plug_rms_norm"
    decorated = synthetic_at(synthetic, SIDE, '@patch_function("vllm.sampler")')
    assert decorated.target.symbol == "vllm.sampler:sample"  # the attribute is the decorated function's name
    assert (decorated.helper, decorated.replacement) == (
        "plug.helpers:patch_function",
        "plug.patches.platform_side:sample",
    )
    method = synthetic_at(synthetic, SIDE, "patch_method(")
    # getattr(module, "Attention"), then the name of the function passed: a method only the base had
    assert method.target.symbol == "vllm.layers:Attention.gone"
    assert (method.target.at_base, method.target.exists, method.target.changed) == (True, False, True)


def test_a_module_bound_from_a_string(synthetic: Overrides) -> None:
    bound = synthetic_at(synthetic, SIDE, "_sampler.extra = ")
    assert (bound.how, bound.target.symbol) == ("assignment", "vllm.sampler:extra")
    assert (bound.target.at_base, bound.target.exists) == (False, False)


def test_library_patcher_started_by_hand(synthetic: Overrides) -> None:
    started = synthetic_at(synthetic, WORKER, 'patch("vllm.layers.rms_norm"')
    assert (started.how, started.helper, started.target.symbol) == (
        "mock_patch",
        "unittest.mock.patch",
        "vllm.layers:rms_norm",
    )
    on_object = synthetic_at(synthetic, WORKER, "patch.object(")
    assert on_object.target.symbol == "vllm.layers:Attention.forward"
    # a patcher used as a context manager is undone when the block ends: not a patch
    assert not [p for p in synthetic.patches if p.file == WORKER and p.target.symbol == "vllm.sampler:sample"]


def test_activity_from_entry_points_and_start_up_hooks(synthetic: Overrides) -> None:
    # pyproject: plug:register returns the platform class path; PlugPlatform overrides upstream's
    # pre_register_and_update, which calls adapt(is_global=True): the platform side, unconditionally
    platform = synthetic_at(synthetic, SIDE, "layers.rms_norm = ")
    assert platform.active is True and platform.active_if == []
    assert platform.activation[0] == "pyproject.toml:5 plug:register"
    assert platform.activation[-1].endswith("plug.patches.platform_side")
    assert any("plug.platform:PlugPlatform.pre_register_and_update" in s for s in platform.activation)
    # check_and_update_config hands upstream the worker class path; its __init__ calls adapt():
    # the default is_global=False takes the other branch
    worker = synthetic_at(synthetic, WORKER, 'patch("vllm.layers.rms_norm"')
    assert worker.active is True and worker.active_if == ["config.worker_cls == 'auto'"]
    assert any("plug.worker:PlugWorker.__init__" in s for s in worker.activation)
    extra = at(synthetic, "plug/patches/extra.py", 3)
    assert extra.active is True and extra.active_if == ["os.environ.get('PLUG_EXTRA')"]


def test_inactive_patches(synthetic: Overrides) -> None:
    # imported only by a method no upstream hook calls, or by nothing at all
    assert at(synthetic, "plug/patches/never.py", 3).active is False
    orphan = at(synthetic, "plug/patches/orphan.py", 3)
    assert (orphan.active, orphan.activation) == (False, [])
    # a guard on a module constant is not evaluated: it stays a condition of the patch
    guarded = synthetic_at(synthetic, WORKER, "    vllm.layers.rms_norm = ")
    assert guarded.active is True and guarded.active_if == ["not (HAS_FAST) and config.worker_cls == 'auto'"]


def test_only_patches_that_run_are_defects(tmp_path: Path) -> None:
    """A patch whose upstream target changed is a defect only when something runs it: orphan.py
    patches the changed `vllm.layers.rms_norm` (BASE_CHANGES gives it `eps`) but nothing imports it."""
    upstream = _tree(tmp_path / "target", UPSTREAM)
    base = _tree(tmp_path / "base", {**UPSTREAM, **BASE_CHANGES})
    plugin = _tree(tmp_path / "plugin", {**PLUGIN, "pyproject.toml": PYPROJECT})
    found, code = find_with_code(StateStore(tmp_path / "state"), plugin, "plug", upstream, base)
    for patch in found.patches:
        patch.on_path = True  # as if the model's walk reached every target
    module_of = {m.path: m.name for m in code.index.modules.values() if m.side == "plugin"}
    changed = {(d.file, d.line) for d in override_defects(code, [], found.patches, module_of)}
    assert (SIDE, line_of(PLUGIN, SIDE, "layers.rms_norm = ")) in changed  # active, from the platform's hook
    assert at(found, "plug/patches/orphan.py", 3).active is False
    assert ("plug/patches/orphan.py", 3) not in changed


def test_a_load_named_at_run_time_leaves_unreached_patches_unknown(tmp_path: Path) -> None:
    """register_models imports every module of plug/patches by a name computed from a directory
    listing (line 8): nothing decides which modules it loads, so a patch there is not "inactive"."""
    plugin_files = {
        "pyproject.toml": PYPROJECT,
        "plug/__init__.py": "import importlib\nimport pkgutil\n\n\ndef register_models():\n"
        "    import plug.patches as pkg\n    for info in pkgutil.iter_modules(pkg.__path__):\n"
        '        importlib.import_module(f"plug.patches.{info.name}")\n',
        "plug/patches/__init__.py": "",
        "plug/patches/p1.py": "import vllm.layers as layers\n\n\ndef mine(x):\n    return x\n\n\n"
        "layers.rms_norm = mine\n",
    }
    upstream = _tree(tmp_path / "target", UPSTREAM)
    base = _tree(tmp_path / "base", {**UPSTREAM, **BASE_CHANGES})
    found, code = find_with_code(
        StateStore(tmp_path / "state"), _tree(tmp_path / "plugin", plugin_files), "plug", upstream, base
    )
    (patch,) = found.patches
    assert patch.active is None and patch.activation == []
    assert any("plug/__init__.py:8" in u and "active unknown" in u for u in found.unknowns)
    patch.on_path = True
    module_of = {m.path: m.name for m in code.index.modules.values() if m.side == "plugin"}
    # its target changed (BASE_CHANGES: rms_norm gained eps): unknown activity keeps the defect
    assert [(d.file, d.line) for d in override_defects(code, [], [patch], module_of)] == [("plug/patches/p1.py", 8)]


def test_no_entry_points_leaves_activity_unknown(tmp_path: Path) -> None:
    upstream = _tree(tmp_path / "target", UPSTREAM)
    plugin = _tree(tmp_path / "plugin", PLUGIN)
    found = find(StateStore(tmp_path / "state"), plugin, "plug", upstream, upstream)
    assert found.patches and {p.active for p in found.patches} == {None}
    assert any("No vLLM plugin entry points" in u for u in found.unknowns)


def test_entry_points_from_setup_py_and_setup_cfg(tmp_path: Path) -> None:
    setup = (
        'from setuptools import setup\nsetup(entry_points={\n    "vllm.platform_plugins": ["x = plug:register"],\n})\n'
    )
    cfg = "[options.entry_points]\nvllm.general_plugins =\n    m = plug.models:register\n"
    subject = _tree(tmp_path, {"setup.py": setup, "setup.cfg": cfg})
    assert [(s.unit, s.file, s.line) for s in entry_points(subject)] == [
        ("plug:register", "setup.py", 3),
        ("plug.models:register", "setup.cfg", 1),
    ]


def test_conditions_merge_branches_and_decide_literals() -> None:
    # if/elif/else whose every branch leads to the same place is no condition
    chain = [
        frozenset(conditions(g, {}) or [])
        for g in ["ready and is_a()", "ready and not (is_a()) and b", "ready and not (is_a()) and not (b)"]
    ]
    assert simplify(set(chain)) == {frozenset({("ready", True)})}
    assert conditions("not (is_global)", {"is_global": True}) is None
    assert conditions("is_global and x", {"is_global": True}) == [("x", True)]
    # an elif chain on one value keeps only the test that selects the branch
    assert conditions("not (m == 'a') and m == 'b'", {}) == [("m == 'b'", True)]


# -- the real plugins ------------------------------------------------------------------------


ASCEND = "vllm-ascend-351879064c.tar.gz"
GCU = "vllm-gcu-7b5aaca941.tar.gz"


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path, upstream_033: Path) -> Overrides:
    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("ascend-patches")
    repo = snapshot_repo(PLUGINS / ASCEND, root)
    store = StateStore(tmp_path_factory.mktemp("ascend-patches-state"))
    upstream, base = DirectorySubject(upstream_033), DirectorySubject(upstream_026)
    return find(store, DirectorySubject(repo), "vllm_ascend", upstream, base)


@needs_snapshots
@pytest.mark.slow
def test_ascend_platform_patches_run_from_the_entry_points(ascend: Overrides) -> None:
    # patch/platform/patch_mla_prefill_backend.py:48 assigns upstream's get_mla_prefill_backend;
    # setup.py:518 registers vllm_ascend:register_connector -> _ensure_global_patch (__init__.py:80)
    # -> adapt_patch(is_global_patch=True) (__init__.py:69) -> `from vllm_ascend.patch import platform`
    # (utils.py:534, the branch the literal True takes) -> patch/platform/__init__.py:21
    mla = at(ascend, "vllm_ascend/patch/platform/patch_mla_prefill_backend.py", 48)
    assert mla.how == "assignment" and mla.active is True and mla.active_if == []
    assert mla.activation[0].startswith("setup.py:5")
    assert "vllm_ascend/utils.py:534 vllm_ascend.patch.platform" in mla.activation
    assert (
        mla.activation[-1]
        == "vllm_ascend/patch/platform/__init__.py:21 vllm_ascend.patch.platform.patch_mla_prefill_backend"
    )
    # the symbol it replaces changed between 0.26.0 and 0.33.0
    assert (mla.target.at_base, mla.target.exists, mla.target.changed) == (True, True, True)


@needs_snapshots
@pytest.mark.slow
def test_ascend_worker_patches_run_when_the_plugin_picks_the_worker(ascend: Overrides) -> None:
    # platform.py:1131-1141: only when worker_cls == "auto" does the platform set one of its worker
    # classes (310P, Xlite or NPUWorker, every branch); worker/worker.py:117-119 NPUWorker.__init__
    # calls adapt_patch(), whose default takes `from vllm_ascend.patch import worker` (utils.py:536);
    # patch/worker/__init__.py:28 imports patch_distributed, whose line 338 replaces GroupCoordinator
    group = at(ascend, "vllm_ascend/patch/worker/patch_distributed.py", 338)
    assert group.target.symbol == "vllm.distributed.parallel_state:GroupCoordinator"
    assert group.active is True
    assert group.active_if == ["parallel_config and parallel_config.worker_cls == 'auto'"]
    assert any("vllm_ascend.worker.worker:NPUWorker.__init__" in s for s in group.activation)


@needs_snapshots
@pytest.mark.slow
def test_ascend_conditions_and_dead_patches(ascend: Overrides) -> None:
    # platform.py:1156-1161 imports patch_profiling_chunk only under the profiling-chunk switch
    profiling = at(ascend, "vllm_ascend/patch/platform/patch_profiling_chunk.py", 229)
    assert profiling.active_if == ["scheduler_config.profiling_chunk_config.enabled"]
    # patch/platform/__init__.py:26-29: `if not is_310p(): patch_mamba_config else: patch_mamba_config_310`
    assert at(ascend, "vllm_ascend/patch/platform/patch_mamba_config.py", 149).active_if == ["not (is_310p())"]
    assert at(ascend, "vllm_ascend/patch/platform/patch_mamba_config_310.py", 103).active_if == ["is_310p()"]
    # patch/worker/__init__.py:21-23 imports patch_triton only `if HAS_TRITON`; its line 64 patch
    # sits under `if not HAS_TRITON` (patch_triton.py:23): it never runs
    dead = at(ascend, "vllm_ascend/patch/worker/patch_triton.py", 64)
    assert dead.active is False and dead.active_if[0].startswith("never: its own guard (not HAS_TRITON)")
    # patch_fused_moe.py:180-182 patch FusedMoE only `if vllm_version_is("0.26.0")`; 0.33.0 has no FusedMoE there
    moe = at(ascend, "vllm_ascend/patch/platform/patch_fused_moe.py", 181)
    assert moe.active_if == ["vllm_version_is('0.26.0')"]
    assert (moe.target.at_base, moe.target.exists) == (True, False)


@needs_snapshots
@pytest.mark.slow
def test_ascend_module_from_sys_modules_and_installed_replacements(ascend: Overrides) -> None:
    # patch_kv_cache_coordinator.py:465 binds vllm.v1.core.kv_cache_manager from sys.modules.get and
    # line 467 patches it when loaded; kv_cache_manager imports the function from kv_cache_coordinator
    bound = at(ascend, "vllm_ascend/patch/platform/patch_kv_cache_coordinator.py", 467)
    assert bound.target.symbol == "vllm.v1.core.kv_cache_coordinator:get_kv_cache_coordinator"
    assert bound.active_if == ["_kv_cache_manager is not None"]
    # patch_balance_schedule.py:906 runs inside _balance_run_engine_core, which line 912 installs
    # (through staticmethod) as EngineCoreProc.run_engine_core: upstream calls it
    inner = at(ascend, "vllm_ascend/patch/platform/patch_balance_schedule.py", 906)
    assert inner.active_if == ["_balance_scheduling_enabled(vllm_config)"]
    assert inner.activation[-1].endswith("patch_balance_schedule:_balance_run_engine_core")


@needs_snapshots
@pytest.mark.slow
def test_gcu_library_patches_per_upstream_release(tmp_path_factory: pytest.TempPathFactory, upstream_092: Path) -> None:
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / GCU, tmp_path_factory.mktemp("gcu-patches"))
    upstream = DirectorySubject(upstream_092)
    found = find(
        StateStore(tmp_path_factory.mktemp("gcu-state")), DirectorySubject(repo), "vllm_gcu", upstream, upstream
    )
    # vllm_gcu/__init__.py:32 `patch("vllm.utils.cuda_device_count_stateless", ...).start()`, at import of
    # the package setup.py:408 registers (vllm_gcu:register_platform_plugins)
    device = at(found, "vllm_gcu/__init__.py", 32)
    assert (device.how, device.target.symbol, device.active, device.active_if) == (
        "mock_patch",
        "vllm.utils:cuda_device_count_stateless",
        True,
        [],
    )
    # patch_0_9_2/core.py:163 patch.object(core.EngineCore, "__init__", ...); vllm_gcu/patch/__init__.py:4-7
    # imports patch_0_9_2 only when is_vllm_equal("0.9.2") (after the 0.8.0 test)
    engine = at(found, "vllm_gcu/patch/patch_0_9_2/core.py", 163)
    assert engine.target.symbol == "vllm.v1.engine.core:EngineCore.__init__" and engine.active is True
    assert all("is_vllm_equal('0.9.2')" in c for c in engine.active_if)
    # nothing imports vllm_gcu/patch/patch_0_9_1/ (patch/__init__.py picks 0.8.0 or 0.9.2)
    assert at(found, "vllm_gcu/patch/patch_0_9_1/utils.py", 9).active is False
