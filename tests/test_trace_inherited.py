"""Inherited behaviour of plugin subclasses of upstream classes (issue 21, item 5), and the
skipped-base-`__init__` hazard.

Synthetic trees decide the edge cases (one upstream release at base, one at the target, each
change named where it is made). The real cases come from the vllm-ascend snapshot 7662ec925a
("main2main vllm v0.26.0") against the 0.26.0 wheel as base and the 0.27.0 / 0.33.0 wheels as
target; where the vendor's own adaptation (snapshot b4b04c5eb1, "main2main vllm v0.27.1") made the
change a finding asks for, that is named as the evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_plugin_repo, build_upstream_history, git

from vllm_metax_mcp.core.code.codebase import Codebase
from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject
from vllm_metax_mcp.core.trace.base_init import skipped_base_init
from vllm_metax_mcp.core.trace.inherited import (
    Inherited,
    base_codebase,
    inherited_behaviour,
    linearization,
    parameter_gaps,
)
from vllm_metax_mcp.tools import trace_dependency as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

LAYERS_BASE = """\
class Layer:
    def __init__(self, size):
        self.size = size

    def forward(self, x):
        return x

    def load(self, path, strict=True):
        return path

    def pick(self, x, y):
        return x

    def reset(self):
        return None

    def old_hook(self):
        return 0


class Linear(Layer):
    pass


class Alpha:
    pass


class Beta:
    pass


class Beta2(Beta):
    pass


class Helper:
    pass


class Backend(Layer):
    pass


class Aliased(Layer):
    pass
"""
# At the target: forward's body, load gains keyword-only mmap, pick's y gets a default, reset's
# body, old_hook is gone, new_hook (abstract) and tag appear, Linear gains describe, Beta2 puts
# Alpha after Beta (no consistent MRO for a class listing Alpha first), Backend gains Helper, and
# Aliased's base is a name bound only in the `else` of `if TYPE_CHECKING`.
LAYERS_TARGET = """\
from typing import TYPE_CHECKING


class Layer:
    def __init__(self, size):
        self.size = size

    def forward(self, x):
        return x * 2

    def load(self, path, strict=True, *, mmap=False):
        return path

    def pick(self, x, y=0):
        return x

    def reset(self):
        return 1

    def new_hook(self):
        raise NotImplementedError

    def tag(self):
        return "layer"


class Linear(Layer):
    def describe(self):
        return "linear"


class Alpha:
    pass


class Beta:
    pass


class Beta2(Beta, Alpha):
    pass


class Helper:
    pass


class Backend(Layer, Helper):
    pass


if TYPE_CHECKING:

    class _AliasedBase:
        pass

else:
    _AliasedBase = Layer


class Aliased(_AliasedBase):
    pass
"""
GONE = "from vllm.layers import Layer\n\n\nclass Gone(Layer):\n    def gone_method(self):\n        return 1\n"
PLUGIN = """\
from vllm.layers import Aliased, Alpha, Backend, Beta2, Layer, Linear
from vllm.gone import Gone


class Mine(Layer):
    def forward(self, x):
        return x + 1

    def load(self, path, strict=True):
        return path

    def pick(self, x, y):
        return y

    def old_hook(self):
        return 1

    def tag(self):
        return "mine"


class Flexible(Layer):
    def load(self, path, **kwargs):
        return path


class Composite(Layer):
    def load(self, source):
        return source


class Caller(Layer):
    def run(self):
        return self.old_hook()


class Child(Caller):
    pass


class Describer:
    def describe(self):
        return "plugin"


class Shadowed(Linear, Describer):
    pass


class PluginBackend(Layer):
    pass


class Swapped(PluginBackend, Backend):
    pass


class Conflicted(Alpha, Beta2):
    pass


class OnAlias(Aliased):
    pass


class OnGone(Gone):
    def gone_method(self):
        return 2
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inherited")
    upstream = {"vllm/__init__.py": ""}
    base = _write(root / "base", {**upstream, "vllm/layers.py": LAYERS_BASE, "vllm/gone.py": GONE})
    target = _write(root / "target", {**upstream, "vllm/layers.py": LAYERS_TARGET})
    plugin = _write(root / "plugin", {"vllm_x/__init__.py": "", "vllm_x/layers.py": PLUGIN})
    return {"root": root, "base": base, "target": target, "plugin": plugin}


def codebases(plugin: Path, target: Path, base: Path | None, state: Path) -> tuple[Codebase, Codebase | None]:
    cache = RecordCache(StateStore(state))
    subjects = {"plugin": DirectorySubject(plugin), "upstream": DirectorySubject(target)}
    index = ModuleIndex()
    index.add_tree(
        "plugin",
        subjects["plugin"],
        cache,
        [f"{p.name}/" for p in plugin.iterdir() if p.is_dir() and not p.name.startswith(".")],
    )
    index.add_tree("upstream", subjects["upstream"], cache, ["vllm/"])
    packages = frozenset({"vllm", *(p.name for p in plugin.iterdir() if p.is_dir() and not p.name.startswith("."))})
    code = Codebase(index, subjects, packages)  # type: ignore[arg-type]
    if base is None:
        return code, None
    base_index = ModuleIndex()
    base_index.add_tree("upstream", DirectorySubject(base), cache, ["vllm/"])
    return code, base_codebase(code, base_index, DirectorySubject(base))


def by_symbol(found: list[Inherited]) -> dict[str, Inherited]:
    return {f.symbol: f for f in found}


@pytest.fixture(scope="module")
def synthetic(trees: dict[str, Path]) -> dict[str, Inherited]:
    code, base = codebases(trees["plugin"], trees["target"], trees["base"], trees["root"] / "state")
    return by_symbol(inherited_behaviour(code, base, ["vllm_x.layers"]))


def test_overrides_whose_upstream_method_changed(synthetic: dict[str, Inherited]) -> None:
    forward = synthetic["vllm_x.layers:Mine.forward"]
    assert (forward.kind, forward.upstream) == ("override_changed", "vllm.layers:Layer.forward")
    assert forward.detail == "body changed, signature unchanged"
    # plugin line, upstream at the target, upstream at base: Layer.forward is at line 8 and 5
    assert [(e.path, e.line) for e in forward.evidence] == [
        ("vllm_x/layers.py", 6),
        ("vllm/layers.py", 8),
        ("vllm/layers.py", 5),
    ]
    gone = synthetic["vllm_x.layers:Mine.old_hook"]
    assert gone.kind == "override_gone" and [(e.path, e.line) for e in gone.evidence][1:] == [("vllm/layers.py", 17)]
    new = synthetic["vllm_x.layers:Mine.tag"]
    assert new.kind == "override_new" and new.upstream == "vllm.layers:Layer.tag"


def test_override_lacking_what_the_base_gained(synthetic: dict[str, Inherited]) -> None:
    assert synthetic["vllm_x.layers:Mine.load"].kind == "lacks_parameter"
    assert synthetic["vllm_x.layers:Mine.load"].detail == "lacks mmap"
    assert synthetic["vllm_x.layers:Mine.pick"].detail == "requires y, which the base now defaults"
    # **kwargs takes the new keyword: only the changed base is left to review
    assert synthetic["vllm_x.layers:Flexible.load"].kind == "override_changed"
    # a signature of its own (not following the base's) is not held to the base's new parameters
    assert synthetic["vllm_x.layers:Composite.load"].kind == "override_changed"


def test_parameter_gaps_read_kinds_and_defaults() -> None:
    assert parameter_gaps("(self, a)", "(self, a)", "(self, a, *, b=1)") == ["lacks b"]
    assert parameter_gaps("(self, a, **kw)", "(self, a)", "(self, a, *, b=1)") == []
    assert parameter_gaps("(self, *, a)", "(self, *, a)", "(self, a)") == [
        "takes a keyword-only, the base now positionally"
    ]
    assert parameter_gaps("(cls, a)", "(cls, a)", "(cls, a=None)") == ["requires a, which the base now defaults"]


def test_inherited_methods_that_changed_appeared_or_vanished(synthetic: dict[str, Inherited]) -> None:
    reset = synthetic["vllm_x.layers:Mine.reset"]
    assert (reset.kind, reset.line) == ("inherited_changed", 5)  # the class line: it does not define reset
    added = synthetic["vllm_x.layers:Mine.new_hook"]
    assert added.kind == "inherited_added" and added.detail.startswith("new upstream method, abstract: implement it")
    # a vanished method is a finding only where the class uses it, at the use
    used = synthetic["vllm_x.layers:Caller.old_hook"]
    assert (used.kind, used.line) == ("inherited_gone", 34)
    assert "vllm_x.layers:Flexible.old_hook" not in synthetic


def test_one_inherited_change_is_one_finding(synthetic: dict[str, Inherited]) -> None:
    # every plugin subclass of Layer inherits the new reset; the first names the others. Child gets it
    # through Caller and Swapped through PluginBackend, so neither counts: Flexible, Composite, Caller,
    # Shadowed, PluginBackend, OnAlias
    reset = synthetic["vllm_x.layers:Mine.reset"]
    assert reset.detail == "body changed, signature unchanged; also inherited by 6 more: Flexible, Composite, Caller, …"
    assert not [s for s in synthetic if s.endswith(".reset") and s != "vllm_x.layers:Mine.reset"]


def test_plugin_method_shadowed_by_an_upstream_class_ahead_of_it(synthetic: dict[str, Inherited]) -> None:
    shadowed = synthetic["vllm_x.layers:Shadowed.describe"]
    assert (shadowed.kind, shadowed.upstream) == ("override_shadowed", "vllm.layers:Linear.describe")
    assert "vllm_x.layers:Describer.describe no longer wins" in shadowed.detail


def test_mro_of_a_hierarchy_where_the_plugin_swaps_a_base(synthetic: dict[str, Inherited]) -> None:
    swapped = synthetic["vllm_x.layers:Swapped"]
    assert (swapped.kind, swapped.upstream) == ("mro_changed", "vllm.layers:Helper")
    assert swapped.detail.startswith(
        "adds vllm.layers:Helper; puts plugin vllm_x.layers:PluginBackend before upstream vllm.layers:Backend; "
        "MRO at base PluginBackend > Backend > Layer; at target PluginBackend > Backend > Layer > Helper"
    )
    assert [(e.path, e.line) for e in swapped.evidence] == [("vllm_x/layers.py", 54), ("vllm/layers.py", 44)]
    conflict = synthetic["vllm_x.layers:Conflicted"]
    assert conflict.kind == "mro_conflict" and conflict.line == 58


def test_bases_through_guarded_aliases_and_bases_gone_at_the_target(
    synthetic: dict[str, Inherited], trees: dict[str, Path]
) -> None:
    # `_AliasedBase = Layer` under `else:` of `if TYPE_CHECKING`: the same MRO as at base
    assert "vllm_x.layers:OnAlias" not in synthetic
    code, _ = codebases(trees["plugin"], trees["target"], None, trees["root"] / "state")
    assert linearization(code, "vllm_x.layers", "OnAlias") == [
        "vllm_x.layers:OnAlias",
        "vllm.layers:Aliased",
        "vllm.layers:Layer",
    ]
    # vllm.gone is gone: the MRO says so once, the members of what only it brought are not guessed at
    gone = synthetic["vllm_x.layers:OnGone"]
    assert gone.kind == "mro_changed" and gone.detail.startswith("unresolved vllm.gone:Gone;")
    assert [s for s in synthetic if s.startswith("vllm_x.layers:OnGone")] == ["vllm_x.layers:OnGone"]


def test_without_a_base_only_conflicts_are_reported(trees: dict[str, Path]) -> None:
    code, _ = codebases(trees["plugin"], trees["target"], None, trees["root"] / "state")
    found = inherited_behaviour(code, None, ["vllm_x.layers"])
    assert [(f.kind, f.symbol) for f in found] == [("mro_conflict", "vllm_x.layers:Conflicted")]


# -- skipped base __init__ -------------------------------------------------------------------

CACHE = """\
class Grand:
    def __init__(self):
        self.grand_attr = 1


class Cache(Grand):
    def __init__(self, n):
        super().__init__()
        self.n = n
        self.blocks = []
        self.lazy = None

    def size(self):
        return self.n + len(self.blocks)

    def prepare(self):
        self.lazy = 1

    def use_lazy(self):
        return self.lazy

    def grand(self):
        return self.grand_attr


class Derived(Cache):
    def count(self):
        return self.n
"""
SKIPPING = """\
import torch.nn as nn

from vllm.cache import Cache, Derived
from vllm.reexport import Cache as Reexported


class NoCall(Cache):
    def __init__(self):
        self.x = 1


class SuperSkip(Cache):
    def __init__(self):
        super(Cache, self).__init__()


class ViaReexport(Reexported):
    def __init__(self):
        nn.Module.__init__(self)


class FromDerived(Derived):
    def __init__(self):
        object.__init__(self)

    def size(self):
        return 0


class Fine(Cache):
    def __init__(self):
        super().__init__(3)


class Direct(Derived):
    def __init__(self):
        Derived.__init__(self, 3)
"""


@pytest.fixture(scope="module")
def skipping(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("skipping")
    upstream = {"vllm/__init__.py": "", "vllm/cache.py": CACHE, "vllm/reexport.py": "from vllm.cache import Cache\n"}
    target = _write(root / "target", upstream)
    plugin = _write(root / "plugin", {"vllm_x/__init__.py": "", "vllm_x/skipping.py": SKIPPING})
    code, _ = codebases(plugin, target, None, root / "state")
    return {d.symbol.partition(":")[2]: d for d in skipped_base_init(code, "vllm_x.skipping")}


def test_init_that_calls_no_init_at_all(skipping: dict[str, Any]) -> None:
    found = skipping["NoCall"]
    assert (
        found.line == 8
        and "NoCall.__init__ never calls an __init__ instead of vllm.cache:Cache.__init__" in found.detail
    )
    # self.lazy is also set by prepare(); self.grand_attr by Grand.__init__, not Cache's
    assert found.detail.endswith("2 attribute(s) only that __init__ sets: self.blocks, self.n (in size)")


def test_super_of_the_base_skips_it_and_what_it_calls_instead_counts(skipping: dict[str, Any]) -> None:
    found = skipping["SuperSkip"]
    assert found.line == 14 and "calls super(Cache, self).__init__ instead of vllm.cache:Cache.__init__" in found.detail


def test_the_base_is_found_through_a_reexport(skipping: dict[str, Any]) -> None:
    found = skipping["ViaReexport"]
    assert "calls nn.Module.__init__ instead of vllm.cache:Cache.__init__" in found.detail
    assert {e.path for e in found.evidence} == {"vllm_x/skipping.py", "vllm/cache.py"}


def test_an_init_inherited_by_the_base_and_methods_the_class_overrides(skipping: dict[str, Any]) -> None:
    found = skipping["FromDerived"]
    # Derived has no __init__ of its own: Cache's is skipped; size is overridden, count (Derived's) reads n
    assert "instead of vllm.cache:Cache.__init__" in found.detail and found.detail.endswith("self.n (in count)")
    assert {"Fine", "Direct"}.isdisjoint(skipping)


# -- through the tool --------------------------------------------------------------------------

ARCH = "ToyForCausalLM"
TOY = """\
from vllm.layers import Layer


class ToyForCausalLM(Layer):
    def load(self, path, strict=True):
        return path
"""


def test_the_inherited_section_of_a_trace(trees: dict[str, Path], tmp_path: Path) -> None:
    build_upstream_history(
        tmp_path / "vllm", ["0.1.0", "0.2.0"], sources={"0.1.0": trees["base"], "0.2.0": trees["target"]}
    )
    plugin = build_plugin_repo(
        tmp_path / "plugin", trees["target"], {}, registrations={ARCH: f"vllm_metax.models.toy:{ARCH}"}
    )
    (plugin / "vllm_metax/models/toy.py").write_text(TOY)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "toy model")
    runtime = Runtime.create([str(tmp_path)], state_dir=str(tmp_path / "state"))
    arguments = {"plugin_repo": "plugin", "upstream": "vllm", "target": "v0.2.0", "base": "v0.1.0", "arch": ARCH}
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    result = anyio.run(lambda: invoke(tool.SPEC, {**arguments, "section": "inherited", "probe_ops": False}, env))
    kinds = {row.symbol: row.kind for row in result.inherited}
    assert kinds == {
        f"vllm_metax.models.toy:{ARCH}.load": "lacks_parameter",
        f"vllm_metax.models.toy:{ARCH}.forward": "inherited_changed",
        f"vllm_metax.models.toy:{ARCH}.new_hook": "inherited_added",
        f"vllm_metax.models.toy:{ARCH}.pick": "inherited_changed",
        f"vllm_metax.models.toy:{ARCH}.reset": "inherited_changed",
        f"vllm_metax.models.toy:{ARCH}.tag": "inherited_added",
    }
    assert result.counts["inherited"] == 6 and result.counts["inherited.lacks_parameter"] == 1
    assert result.inherited[0].kind == "lacks_parameter"  # what breaks first is listed first


# -- real code ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ascend(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    """vllm-ascend 7662ec925a (targets 0.26.0) indexed against 0.26.0 as base and 0.27.0 / 0.33.0."""
    from workbench import upstream_source

    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("inherited-real")
    repo = snapshot_repo(PLUGINS / "vllm-ascend-7662ec925a.tar.gz", root)
    state = tmp_path_factory.mktemp("inherited-real-state")
    found: dict[str, Any] = {"repo": repo}
    for version in ("0.27.0", "0.33.0"):
        code, base = codebases(repo, upstream_source(version), upstream_026, state)
        modules = sorted(m.name for m in code.index.modules.values() if m.side == "plugin")
        found[version] = by_symbol(inherited_behaviour(code, base, modules))
        models = [m for m in modules if m.startswith("vllm_ascend.models.")]
        found[f"models {version}"] = by_symbol(inherited_behaviour(code, base, models))
        found[f"skipped {version}"] = {d.symbol: d for m in modules for d in skipped_base_init(code, m)}
    return found


@pytest.mark.slow
@needs_snapshots
def test_real_overrides_lacking_what_the_vendor_added_at_the_next_release(ascend: dict[str, Any]) -> None:
    found = ascend["0.27.0"]
    # 0.27.0 vllm/v1/worker/gpu_input_batch.py:109 adds `use_replayssm`; the vendor's 0.27.1 adaptation
    # adds it to NPUInputBatch.__init__ (b4b04c5eb1 vllm_ascend/worker/npu_input_batch.py:39-66)
    batch = found["vllm_ascend.worker.npu_input_batch:NPUInputBatch.__init__"]
    assert (batch.kind, batch.file, batch.line) == ("lacks_parameter", "vllm_ascend/worker/npu_input_batch.py", 34)
    assert batch.detail.startswith("lacks use_replayssm")
    # InputBatch.__init__ at the target, then at base (line 93 in both releases)
    assert [(e.path, e.line) for e in batch.evidence][1:] == [
        ("vllm/v1/worker/gpu_input_batch.py", 93),
        ("vllm/v1/worker/gpu_input_batch.py", 93),
    ]
    # `use_all2all`: base_device_communicator.py / parallel_state.py at 0.27.0; the vendor adds it at
    # b4b04c5eb1 npu_communicator.py:47 and patch_distributed.py:107 ("`use_all2all` was added to upstream")
    for symbol in (
        "vllm_ascend.distributed.device_communicators.npu_communicator:NPUCommunicator.__init__",
        "vllm_ascend.patch.worker.patch_distributed:GroupCoordinatorPatch.__init__",
    ):
        assert (found[symbol].kind, found[symbol].detail) == ("lacks_parameter", "lacks use_all2all")
    # the MoE runner hook gained `fused_output_is_reduced`; b4b04c5eb1 ops/fused_moe/fused_moe.py:119 accepts it
    reduce = found["vllm_ascend.ops.fused_moe.fused_moe:AscendMoERunner._maybe_reduce_shared_expert_output"]
    assert reduce.detail == "lacks fused_output_is_reduced"
    # a constructor of its own shape (hidden_size, total_num_index_heads, ... at msa_m3.py:841) is not held
    # to ColumnParallelLinear's new tp_rank / tp_size
    own = found["vllm_ascend.models.minimax_m3.msa_m3:AscendMiniMaxM3IndexerLinear.__init__"]
    assert own.kind == "override_changed"


@pytest.mark.slow
@needs_snapshots
def test_real_inherited_changes_of_model_classes(ascend: dict[str, Any]) -> None:
    found = ascend["models 0.27.0"]
    # 0.27.0 vllm/model_executor/layers/attention_layer_base.py:26 adds bind_kv_cache to AttentionLayerBase:
    # one finding at the first model class inheriting it (deepseek_v4.py:110), naming the others
    cache = found["vllm_ascend.models.deepseek_v4:AscendCompressorStateCache.bind_kv_cache"]
    assert (cache.kind, cache.line, cache.upstream) == (
        "inherited_added",
        110,
        "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase.bind_kv_cache",
    )
    assert cache.detail.startswith(
        "new upstream method; also inherited by 5 more: AscendDeepseekV4IndexerCache, AscendDeepseekV4SWACache"
    )
    # AttentionMetadataBuilder.__init__'s kv_cache_spec went from AttentionSpec to KVCacheSpec
    # (vllm/v1/attention/backend.py:630 at 0.26.0, :638 at 0.27.0)
    builder = found["vllm_ascend.models.minimax_m3.msa_m3:AscendMiniMaxM3SparseMetadataBuilder.__init__"]
    assert builder.kind == "override_changed" and [e.line for e in builder.evidence][1:] == [638, 630]
    # the draft models the issue names inherit nothing that changed between 0.26.0 and 0.27.0
    assert not [s for s in found if s.startswith(("vllm_ascend.models.llama_eagle3_vwn", "vllm_ascend.models.qwen3"))]
    later = ascend["models 0.33.0"]
    # 0.33.0 llama_eagle3.py:306 `Eagle3LlamaForCausalLM(_Eagle3LlamaForCausalLMBase)`, bound to LlamaForCausalLM
    # in the `else` of `if TYPE_CHECKING` (:61): the MRO is unchanged, the overridden __init__ is not
    assert "vllm_ascend.models.llama_eagle3_vwn:Eagle3VwnLlamaForCausalLM" not in later
    init = later["vllm_ascend.models.llama_eagle3_vwn:Eagle3VwnLlamaForCausalLM.__init__"]
    assert (init.kind, init.line, init.upstream) == (
        "override_changed",
        174,
        "vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.__init__",
    )
    confidence = later["vllm_ascend.models.qwen3_dspark:AscendQwen3DSparkForCausalLM.compute_confidence"]
    assert confidence.kind == "inherited_added"


@pytest.mark.slow
@needs_snapshots
def test_real_backend_hierarchy_whose_swapped_base_changed(ascend: dict[str, Any]) -> None:
    # vllm_ascend/worker/v2/spec_decode/eagle/speculator.py:24
    # `AscendEagleSpeculator(AscendAutoRegressiveSpeculator, EagleSpeculator)`; at 0.33.0 EagleSpeculator
    # derives from TargetDependentARSpeculator (eagle/speculator.py:12) and AutoRegressiveSpeculator is gone
    eagle = ascend["0.33.0"]["vllm_ascend.worker.v2.spec_decode.eagle.speculator:AscendEagleSpeculator"]
    assert eagle.kind == "mro_changed" and eagle.line == 24
    assert eagle.detail.startswith(
        "unresolved vllm.v1.worker.gpu.spec_decode.autoregressive.speculator:AutoRegressiveSpeculator; "
        "adds vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:TargetDependentARSpeculator; "
        "puts plugin vllm_ascend.worker.v2.spec_decode.autoregressive.speculator:AscendAutoRegressiveSpeculator "
        "before upstream vllm.v1.worker.gpu.spec_decode.eagle.speculator:EagleSpeculator"
    )
    assert "vllm_ascend.worker.v2.spec_decode.eagle.speculator:AscendEagleSpeculator" not in ascend["0.27.0"]


@pytest.mark.slow
@needs_snapshots
def test_real_inits_that_skip_the_base_the_vendor_then_fixed(ascend: dict[str, Any]) -> None:
    skipped = ascend["skipped 0.27.0"]
    # NPUInputBatch.__init__ (npu_input_batch.py:34) calls no __init__; 0.27.0 InputBatch.add_request reads
    # self.use_replayssm (gpu_input_batch.py:392); b4b04c5eb1 npu_input_batch.py:66 sets it
    batch = skipped["vllm_ascend.worker.npu_input_batch:NPUInputBatch"]
    assert batch.line == 34 and "self.use_replayssm" in batch.detail and "(in add_request)" in batch.detail
    # MooncakeConnector never runs KVConnectorBase_V1.__init__; requires_kv_delivery, new at 0.27.0
    # (kv_connector/v1/base.py:185), reads self._kv_transfer_config; b4b04c5eb1 mooncake_connector.py:1515 sets it
    mooncake = skipped["vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector:MooncakeConnector"]
    assert "self._kv_transfer_config" in mooncake.detail and "requires_kv_delivery" in mooncake.detail
    # AscendDeepseekScalingRotaryEmbedding calls super(DeepseekScalingRotaryEmbedding, self).__init__
    # (rotary_embedding.py:331), whose RotaryEmbeddingBase.__init__ sets use_flashinfer too (base.py:48)
    assert "vllm_ascend.ops.rotary_embedding:AscendDeepseekScalingRotaryEmbedding" not in skipped
