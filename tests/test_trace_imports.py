"""Python's import semantics in the dependency walk: the package `__init__`s an import runs first (and
the branch their dispatch takes), re-export chains, and how each module is reached (import,
package_init, lazy, dynamic, typing_only). Synthetic trees for each mechanism; the real vLLM 0.26.0
tree and the real vllm-ascend snapshot for the same mechanisms on real code."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo

from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache, Side, scan_source
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.core.trace.walk import Row, Start, walk_dependencies

ASCEND = "vllm-ascend-7662ec925a.tar.gz"
FIRST_PARTY = frozenset({"vllm", "vllm_x", "vllm_ascend"})


def write(top: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_text(textwrap.dedent(text))
    return top


def build_index(state: Path, *trees: tuple[Side, Path, list[str]]) -> ModuleIndex:
    cache = RecordCache(StateStore(state))
    index = ModuleIndex()
    for side, top, prefixes in trees:
        index.add_tree(side, DirectorySubject(top), cache, prefixes)
    return index


def walk(index: ModuleIndex, start: str, depth: int = 4) -> dict[str, Row]:
    module, _, symbol = start.partition(":")
    found = walk_dependencies(index, [Start(module, symbol or None)], FIRST_PARTY, depth, 20000)
    assert not found.truncated
    return {row.name: row for row in found.rows}


# -- synthetic trees, one per mechanism ------------------------------------------------------

UPSTREAM = {
    "vllm/__init__.py": "import vllm.env_override\n",
    "vllm/env_override.py": "import os\n",
    "vllm/platforms/__init__.py": "current_platform = object()\n",
    "vllm/models/__init__.py": "",
    "vllm/models/fam/__init__.py": """\
        from vllm.platforms import current_platform

        if current_platform.is_rocm():
            from .amd.model import FamModel
        else:
            from .nvidia.model import FamModel
        """,
    "vllm/models/fam/attention.py": "class FamAttention:\n    pass\n",
    "vllm/models/fam/amd/__init__.py": "",
    "vllm/models/fam/amd/model.py": "class FamModel:\n    pass\n",
    "vllm/models/fam/nvidia/__init__.py": "",
    "vllm/models/fam/nvidia/model.py": "import torch\nclass FamModel:\n    pass\n",
    # a re-export chain across packages that are not each other's parents, the middle hop guarded
    "vllm/layers/__init__.py": "from vllm.impl.core import Thing\n",
    "vllm/impl/__init__.py": "",
    "vllm/impl/core.py": """\
        try:
            from vllm.base import Thing
        except ImportError:
            Thing = None
        """,
    "vllm/base.py": "class Thing:\n    pass\n",
    "vllm/loaded/__init__.py": "",
    "vllm/loaded/by_name.py": "X = 1\n",
    "vllm/loaded/ops.py": "Y = 1\n",
    "vllm/loaded/formatted_one.py": "",
    "vllm/typed.py": "class Typed:\n    pass\n",
    "vllm/later/__init__.py": "from vllm.later.impl import helper\n",
    "vllm/later/impl.py": "def helper():\n    pass\n",
}
PLUGIN = {
    "vllm_x/__init__.py": "",
    "vllm_x/models/__init__.py": "",
    "vllm_x/models/model.py": """\
        import importlib
        from typing import TYPE_CHECKING

        from vllm.models.fam.attention import FamAttention
        from vllm.layers import Thing

        if TYPE_CHECKING:
            from vllm.typed import Typed

        LOADED = "vllm.loaded"
        by_name = importlib.import_module(LOADED + ".by_name")


        def build(which):
            from vllm.later import helper

            importlib.import_module(f"{LOADED}.formatted_{which}")
            importlib.import_module(settings.backend)  # decided by no literal: not a node
            return __import__("vllm.loaded.ops")


        build("one")


        class XModel(FamAttention, Thing):
            pass
        """,
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Row]:
    root = tmp_path_factory.mktemp("imports")
    upstream, plugin = write(root / "upstream", UPSTREAM), write(root / "plugin", PLUGIN)
    index = build_index(root / "state", ("plugin", plugin, [""]), ("upstream", upstream, ["vllm/"]))
    return walk(index, "vllm_x.models.model:XModel")


def test_importing_a_submodule_runs_every_package_init_above_it(synthetic: dict[str, Row]) -> None:
    # `from vllm.models.fam.attention import ...` runs vllm, vllm.models and vllm.models.fam first
    for package in ("vllm", "vllm.models", "vllm.models.fam"):
        row = synthetic[package]
        assert (row.kind, row.reached_from, row.depth) == ("package_init", "vllm_x.models.model", 1), package
    # the plugin's own packages run before the registered module
    assert synthetic["vllm_x"].kind == synthetic["vllm_x.models"].kind == "package_init"
    # what the __init__s run is followed like any import
    assert synthetic["vllm.env_override"].reached_from == "vllm"
    assert synthetic["vllm.platforms"].reached_from == "vllm.models.fam"


def test_a_package_init_dispatch_takes_the_out_of_tree_branch(synthetic: dict[str, Row]) -> None:
    nvidia = synthetic["vllm.models.fam.nvidia.model"]
    assert (nvidia.branch, nvidia.reached_from, nvidia.guard) == (
        "taken",
        "vllm.models.fam",
        "not (current_platform.is_rocm())",
    )
    assert synthetic["vllm.models.fam.nvidia.model:FamModel"].branch == "taken"
    assert synthetic["torch"].reached_from == "vllm.models.fam.nvidia.model"
    amd = synthetic["vllm.models.fam.amd.model"]
    assert (amd.branch, amd.guard) == ("not_taken", "current_platform.is_rocm()")
    assert "vllm.models.fam.amd.model:FamModel" not in synthetic


def test_a_reexport_chain_keeps_every_module_it_passes_through(synthetic: dict[str, Row]) -> None:
    # vllm_x imports Thing from vllm.layers, which re-exports vllm.impl.core's, which re-exports vllm.base's
    chain = [("vllm.layers", "vllm_x.models.model"), ("vllm.impl.core", "vllm.layers"), ("vllm.base", "vllm.impl.core")]
    for module, importer in chain:
        assert (synthetic[module].reached_from, synthetic[module].depth) == (importer, 1), module
    thing = synthetic["vllm.base:Thing"]
    assert thing.reached_from == "vllm.impl.core"
    # the hop through vllm.impl.core sits in a try: the definition is reached only if that import works
    assert (thing.branch, thing.guard) == ("conditional", "try (import may fail)")
    assert synthetic["vllm.impl"].kind == "package_init"


def test_lazy_dynamic_and_typing_only_imports_are_nodes_with_their_kind(synthetic: dict[str, Row]) -> None:
    kinds = {name: (synthetic[name].kind, synthetic[name].branch) for name in synthetic}
    assert kinds["vllm.later"] == ("lazy", "lazy")
    # vllm/later/__init__.py imports its own submodule at module level: that runs no package init of
    # its own (it is running already), so it does not turn vllm.later into a module-level node
    assert synthetic["vllm.later"].reached_from == "vllm_x.models.model"
    assert synthetic["vllm.later.impl"].reached_from == "vllm.later"
    assert kinds["vllm.loaded.by_name"] == ("dynamic", "taken")  # LOADED + ".by_name" at module level
    assert kinds["vllm.loaded.formatted_one"] == ("dynamic", "lazy")  # the f-string, `which` from build("one")
    assert kinds["vllm.loaded.ops"] == ("dynamic", "lazy")  # __import__
    assert kinds["vllm.loaded"] == ("package_init", "taken")
    # under TYPE_CHECKING: recorded, never followed
    assert kinds["vllm.typed"] == ("typing_only", "not_taken")
    assert "vllm.typed:Typed" not in synthetic
    assert kinds["vllm.models.fam.attention"] == ("import", "taken")


def test_the_scanner_records_each_kind_and_the_names_literals_decide() -> None:
    record = scan_source(
        textwrap.dedent(
            """\
            import importlib
            import typing
            from importlib import import_module

            if typing.TYPE_CHECKING:
                import a
            if not TYPE_CHECKING:
                import b
            else:
                import c
            NAME = "pkg.mod"
            import_module(".sibling", __name__)
            import_module(".." + "up", "pkg.a.b")
            import_module(f"{__package__}.ops")
            importlib.import_module(NAME)
            importlib.import_module(".x", package=runtime())  # the package is computed at run time


            def f(name=NAME):
                import d

                return import_module(name), import_module(computed())


            f()
            """
        ).encode()
    )
    kinds = {(r.module, r.kind, r.branch) for r in record.imports}
    assert {("a", "typing_only", "not_taken"), ("b", "import", "taken"), ("c", "typing_only", "not_taken")} <= kinds
    assert ("d", "lazy", "lazy") in kinds
    dynamic = [(r.module, r.line, r.branch) for r in record.dynamic_imports]
    assert dynamic == [
        (".sibling", 12, "taken"),  # relative to this module's package: resolved when the index is assembled
        ("pkg.a.up", 13, "taken"),
        (".ops", 14, "taken"),
        ("pkg.mod", 15, "taken"),
        ("pkg.mod", 22, "lazy"),  # the parameter's default, which the call `f()` leaves it
    ]
    assert all(r.kind == "dynamic" and not r.names for r in record.dynamic_imports)


# -- real code -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream_index(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> ModuleIndex:
    state = tmp_path_factory.mktemp("imports-upstream-state")
    return build_index(state, ("upstream", upstream_026, ["vllm/"]))


@pytest.mark.slow
def test_importing_the_real_nvidia_model_runs_the_family_dispatch(upstream_index: ModuleIndex) -> None:
    """Importing vllm.models.deepseek_v4.nvidia.model (0.26.0) runs vllm/models/deepseek_v4/__init__.py
    first, whose dispatch (lines 17-32: `if current_platform.is_rocm(): ... elif current_platform.is_xpu():
    ... else: from .nvidia.model import ...`) takes the last branch for an out-of-tree platform."""
    found = walk(upstream_index, "vllm.models.deepseek_v4.nvidia.model:DeepseekV4ForCausalLM", depth=1)
    for package in ("vllm", "vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.nvidia"):
        assert (found[package].kind, found[package].depth) == ("package_init", 0), package
    # __init__.py:12 `from .quant_config import DeepseekV4FP8Config`, run by the package init
    assert found["vllm.models.deepseek_v4.quant_config"].reached_from == "vllm.models.deepseek_v4"
    for platform in ("amd", "xpu"):
        other = found[f"vllm.models.deepseek_v4.{platform}.model"]
        assert (other.branch, other.reached_from) == ("not_taken", "vllm.models.deepseek_v4"), platform
    # the module itself is the start; the dispatch's import of it keeps the start's row
    assert found["vllm.models.deepseek_v4.nvidia.model"].depth == 0
    # vllm/__init__.py:14 `import vllm.env_override`
    assert found["vllm.env_override"].reached_from == "vllm"


@pytest.mark.slow
def test_the_registered_family_name_resolves_through_its_dispatch(upstream_index: ModuleIndex) -> None:
    """The registry names vllm.models.deepseek_v4:DeepseekV4ForCausalLM; the __init__ re-exports the
    class from .nvidia.model (line 31) under the guard of the dispatch's last branch."""
    found = walk(upstream_index, "vllm.models.deepseek_v4:DeepseekV4ForCausalLM", depth=1)
    assert found["vllm.models.deepseek_v4"].kind == "import"
    defined = found["vllm.models.deepseek_v4.nvidia.model:DeepseekV4ForCausalLM"]
    assert defined.reached_from == "vllm.models.deepseek_v4" and defined.depth == 1
    assert "is_rocm()" in (defined.guard or "") and "is_xpu()" in (defined.guard or "")
    assert "vllm.models.deepseek_v4:DeepseekV4ForCausalLM" not in found


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("imports-ascend")
    repo = snapshot_repo(PLUGINS / ASCEND, root)
    index = build_index(root / "state", ("plugin", repo, ["vllm_ascend/"]), ("upstream", upstream_026, ["vllm/"]))
    # vllm_ascend/models/__init__.py:5 registers DeepseekV4ForCausalLM to this class
    return {"index": index, "rows": walk(index, "vllm_ascend.models.deepseek_v4:AscendDeepseekV4ForCausalLM")}


@pytest.mark.slow
@needs_snapshots
def test_a_real_plugin_import_runs_the_upstream_family_init(ascend: dict[str, Any]) -> None:
    """vllm_ascend/models/deepseek_v4.py:73 imports vllm.models.deepseek_v4.attention, which runs the
    family __init__ and its dispatch (0.26.0 vllm/models/deepseek_v4/__init__.py:17-32)."""
    found = ascend["rows"]
    family = found["vllm.models.deepseek_v4"]
    assert (family.kind, family.reached_from, family.depth) == ("package_init", "vllm_ascend.models.deepseek_v4", 1)
    nvidia = found["vllm.models.deepseek_v4.nvidia.model"]
    assert (nvidia.branch, nvidia.reached_from) == ("taken", "vllm.models.deepseek_v4")
    assert found["vllm.models.deepseek_v4.amd.model"].branch == "not_taken"
    assert found["vllm.models.deepseek_v4.attention"].kind == "import"
    # the plugin's own top package runs first (vllm_ascend/__init__.py)
    assert (found["vllm_ascend"].kind, found["vllm_ascend"].depth) == ("package_init", 0)


@pytest.mark.slow
@needs_snapshots
def test_a_real_plugin_lazy_and_importlib_imports(ascend: dict[str, Any]) -> None:
    index: ModuleIndex = ascend["index"]
    comm = index.get("vllm_ascend.ops.fused_moe.comm_utils")
    assert comm is not None
    # comm_utils.py:116, inside load_cann_mega_moe_ops: import_module("cann_ops_transformer.ops")
    assert [(r.module, r.line, r.branch) for r in comm.record.dynamic_imports] == [
        ("cann_ops_transformer.ops", 116, "lazy")
    ]
    coordinator = index.get("vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.coordinator")
    assert coordinator is not None
    # coordinator.py:361 and :375, each under `if <cache> is _CACHE_MISSING:` (359, 373) and a try (360, 374)
    assert [(r.module, r.line, r.guard) for r in coordinator.record.dynamic_imports] == [
        ("vllm.v1.kv_cache_spec_registry", 361, "registry is _CACHE_MISSING and try (import may fail)"),
        (
            "vllm.v1.core.single_type_kv_cache_manager",
            375,
            "spec_manager_map is _CACHE_MISSING and try (import may fail)",
        ),
    ]
    scheduler = index.get("vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.pool_scheduler")
    assert scheduler is not None
    # pool_scheduler.py:169 import_module(backend_path): the path comes from the config, not a literal
    assert scheduler.record.dynamic_imports == []
    utils = index.get("vllm_ascend.utils")
    assert utils is not None
    # utils.py:535/537, inside adapt_patch: from vllm_ascend.patch import platform / worker
    lazy = {(r.module, r.line) for r in utils.record.imports if r.kind == "lazy"}
    assert {("vllm_ascend.patch", 535), ("vllm_ascend.patch", 537)} <= lazy
    platform = index.get("vllm_ascend.platform")
    assert platform is not None
    # platform.py:65-67 `if TYPE_CHECKING:` imports
    typing_only = {(r.module, r.line) for r in platform.record.imports if r.kind == "typing_only"}
    assert {("vllm.config", 66), ("vllm.utils", 67)} <= typing_only
    found = ascend["rows"]
    worker = found["vllm_ascend.patch.worker"]
    assert (worker.kind, worker.branch, worker.reached_from, worker.guard) == (
        "lazy",
        "lazy",
        "vllm_ascend.utils",
        "not (is_global_patch)",
    )
    assert found["vllm_ascend.patch"].kind == "package_init"
    assert (found["cann_ops_transformer.ops"].kind, found["cann_ops_transformer.ops"].side) == (
        "dynamic",
        "third_party",
    )
