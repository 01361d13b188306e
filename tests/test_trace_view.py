"""trace_dependency's stop rule and views: an upstream module whose used definitions did not change
between base and target is a stable-interface boundary; the default view (`changes`) keeps the
plugin's nodes and the upstream nodes whose used definitions changed, reached through plugin or
changed modules; `full` keeps every node. Synthetic two-release histories for the edge cases, the
real vllm-ascend snapshot against vLLM 0.26.0 -> 0.27.0 for the size of the view.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_upstream_history, git

from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.trace.run import NO_BASE
from vllm_metax_mcp.core.trace.stability import STABLE
from vllm_metax_mcp.tools import trace_dependency as tool
from vllm_metax_mcp.tools.dispatch import invoke, parse_input
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

ARCH = "ToyForCausalLM"


def _upstream(version: int) -> dict[str, str]:
    """The upstream tree of release `version` (1: base, 2: target); `{v}` marks what changes."""
    v = str(version)
    files = {
        "vllm/__init__.py": "",
        "vllm/registry.py": '_MODELS = {"ToyForCausalLM": ("vllm.toy", "ToyModel")}\n',
        "vllm/toy.py": "class ToyModel:\n    pass\n",
        "vllm/layers/__init__.py": "",
        # line 4: Stable; `unused` changes, but nothing on the path uses it
        "vllm/layers/stable_mod.py": "from vllm.deep.behind import Hidden\n\n\nclass Stable:\n"
        "    def make(self):\n        return Hidden()\n\n\ndef unused():\n    return {v}\n",
        # line 5: _helper changes; Changed (line 9) uses it, and used_fn; only `other` uses unused_fn
        "vllm/layers/changed_mod.py": "from vllm.deep.used import used_fn\nfrom vllm.deep.unused import unused_fn\n\n\n"
        "def _helper():\n    return {v}\n\n\nclass Changed:\n    def run(self):\n"
        "        return _helper() + used_fn()\n\n\ndef other():\n    return unused_fn()\n",
        "vllm/layers/base2.py": "class Base2:\n    def hook(self):\n        return {v}\n",
        "vllm/layers/derived_mod.py": "from vllm.layers.base2 import Base2\n\n\nclass Derived(Base2):\n    pass\n",
        "vllm/layers/whole_mod.py": "def helper():\n    return 1\n\n\ndef other():\n    return {v}\n",
        "vllm/deep/__init__.py": "",
        "vllm/deep/behind.py": "class Hidden:\n    size = {v}\n",
        "vllm/deep/used.py": "def used_fn():\n    return {v}\n",
        "vllm/deep/unused.py": "def unused_fn():\n    return {v}\n",
    }
    if version == 1:
        files["vllm/gone.py"] = "class Gone:\n    pass\n"
    return {path: text.replace("{v}", v) for path, text in files.items()}


PLUGIN = {
    "vllm_metax/__init__.py": "",
    "vllm_metax/models/__init__.py": "def register_model():\n    from vllm import ModelRegistry\n\n"
    '    ModelRegistry.register_model("ToyForCausalLM", "vllm_metax.models.toy:ToyForCausalLM")\n',
    "vllm_metax/models/toy.py": "from vllm.layers import whole_mod\nfrom vllm.layers.changed_mod import Changed\n"
    "from vllm.layers.derived_mod import Derived\nfrom vllm.layers.stable_mod import Stable\n"
    "from vllm.gone import Gone\nfrom vllm_metax.models.helpers import assist\n\n\n"
    "class ToyForCausalLM(Changed):\n    def __init__(self):\n"
    "        self.parts = [Stable(), Derived(), Gone(), assist()]\n        whole_mod.helper()\n",
    "vllm_metax/models/helpers.py": "from vllm.layers.stable_mod import Stable\n\n\ndef assist():\n"
    "    return Stable()\n",
}


def _write(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("view")
    releases = {str(v): _write(tmp_path_factory.mktemp(f"release{v}"), _upstream(v)) for v in (1, 2)}
    build_upstream_history(root / "vllm", ["1", "2"], sources=releases)
    plugin = _write(root / "plugin", PLUGIN)
    git(root, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "toy plugin")
    return {"root": root, "state": tmp_path_factory.mktemp("view-state")}


def trace(ws: dict[str, Path], **arguments: Any) -> Any:
    """One page of the inventory (or of `section`; the summary takes no limit)."""
    runtime = Runtime.create([str(ws["root"])], state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    arguments = {"section": "inventory", **arguments}
    paging = {} if arguments["section"] == "summary" else {"limit": 1000}
    defaults = {"plugin_repo": "plugin", "upstream": "vllm", "target": "v2", "base": "v1", "arch": ARCH}
    return anyio.run(lambda: invoke(tool.SPEC, {**defaults, **paging, "depth": 8, **arguments}, env))


def rows(result: Any) -> dict[str, Any]:
    return {row.name: row for row in result.inventory}


def expand(importers: list[str]) -> set[str]:
    """`a.b.{c,d}` -> a.b.c, a.b.d."""
    names = set()
    for entry in importers:
        parent, _, leaves = entry.partition(".{")
        names |= {f"{parent}.{leaf}" for leaf in leaves.rstrip("}").split(",")} if leaves else {entry}
    return names


def test_used_definitions_decide_stable_and_changed(toy: dict[str, Path]) -> None:
    full = rows(trace(toy, view="full"))
    stable = full["vllm.layers.stable_mod"]
    # Stable (stable_mod.py:4) is the same at v1 and v2; only `unused` changed, and nothing uses it
    assert stable.stability == "stable" and stable.boundary == STABLE
    assert stable.stability_evidence == ["unchanged:Stable 4->4"] and stable.upstream_delta == []
    changed = full["vllm.layers.changed_mod"]
    # Changed (line 9) calls _helper (line 5: `return 1` -> `return 2`): the class changed through it
    assert changed.stability == "changed" and changed.stability_evidence == []
    assert changed.upstream_delta == ["changed:_helper 5->5 via Changed"]
    assert full["vllm.layers.changed_mod:Changed"].stability == "changed"
    # Derived's own body is the same; its base Base2 (base2.py) changed
    assert full["vllm.layers.derived_mod"].upstream_delta == ["base vllm.layers.base2:Base2 of Derived: changed"]
    # `from vllm.layers import whole_mod`: every definition counts, and `other` changed
    assert full["vllm.layers.whole_mod"].upstream_delta == ["changed:other 5->5"]
    # vllm/gone.py is at v1 only
    gone = full["vllm.gone"]
    assert gone.side == "missing" and gone.stability == "changed"
    assert gone.upstream_delta == ["removed: vllm/gone.py at base, absent at target"]
    # a package whose __init__ only runs, defining nothing
    assert full["vllm.layers"].stability == "stable"
    assert all(row.stability is None for row in full.values() if row.side == "plugin")


def test_stable_modules_are_boundaries_with_evidence(toy: dict[str, Path]) -> None:
    result = trace(toy, section="boundaries", view="full")
    stable = {b.package: b for b in result.boundaries if b.kind == "stable_interface"}
    boundary = stable["vllm.layers.stable_mod"]
    assert boundary.file == "vllm/layers/stable_mod.py" and "Stable" in boundary.reason
    tags = {git(toy["root"] / "vllm", "rev-parse", tag).strip(): tag for tag in ("v1", "v2")}
    assert [(e.path, e.line, tags[e.rev]) for e in boundary.evidence] == [
        ("vllm/layers/stable_mod.py", 4, "v2"),
        ("vllm/layers/stable_mod.py", 4, "v1"),
    ]
    assert "vllm.layers.changed_mod" not in stable
    assert result.counts["boundaries.stable_interface"] == len(stable)


def assert_plugin_modules_shown_and_their_names_folded(
    every: dict[str, Any], shown: dict[str, Any], some_folded: bool = True
) -> None:
    """Every plugin module is in the changes view; a plugin `module:Name` is folded into its module's
    row (the full view keeps it), unless the walk starts from it."""
    plugin = {n: r for n, r in every.items() if r.side == "plugin"}
    assert {n for n in plugin if ":" not in n} <= set(shown)
    folded = {n for n, r in plugin.items() if ":" in n and r.depth > 0 and n.partition(":")[0] in every}
    assert (bool(folded) or not some_folded) and not folded & set(shown)


def test_changes_view_stops_at_stable_interfaces(toy: dict[str, Path]) -> None:
    full, changes = trace(toy, view="full"), trace(toy)
    every, shown = rows(full), rows(changes)
    assert set(shown) < set(every) and len(every) == full.counts["inventory"] == full.total
    assert changes.total == len(shown) == changes.counts["inventory.changes"]
    assert_plugin_modules_shown_and_their_names_folded(every, shown)
    assert {
        "vllm.layers.changed_mod",
        "vllm.layers.changed_mod:Changed",
        "vllm.layers.derived_mod",
        "vllm.layers.whole_mod",
        "vllm.gone",
        "vllm.deep.used",  # Changed.run calls used_fn
        "vllm.layers.base2",  # Derived's base
    } <= set(shown)
    # behind the stable interface (Hidden changed, but Stable did not), used by nothing that changed
    # (`other` calls unused_fn, and nothing on the path uses `other`), or stable themselves
    for name in ("vllm.deep.behind", "vllm.deep.unused", "vllm.layers.stable_mod", "vllm.toy", "torch"):
        assert name not in shown, name
    assert every["vllm.deep.behind"].stability == every["vllm.deep.unused"].stability == "changed"
    # a changed name only upstream imports is named in its module's evidence, not a row of its own
    assert every["vllm.deep.used:used_fn"].stability == "changed" and "vllm.deep.used:used_fn" not in shown
    assert shown["vllm.deep.used"].upstream_delta == ["changed:used_fn 1->1"]
    # boundaries: the stable interfaces summarised, each listed in full
    summary = [b for b in trace(toy, section="boundaries").boundaries if b.kind == "stable_interface"]
    assert sum(b.count for b in summary) == changes.counts["boundaries.stable_interface"] > 1
    assert len(summary) == 1 and "view=full" in summary[0].reason


def test_every_importer_is_listed(toy: dict[str, Path]) -> None:
    every = rows(trace(toy, view="full"))
    # siblings fold into one entry
    assert every["vllm.layers.stable_mod"].importers == ["vllm_metax.models.{helpers,toy}"]
    assert expand(every["vllm.layers.stable_mod:Stable"].importers) == {
        "vllm_metax.models.helpers",
        "vllm_metax.models.toy",
    }
    assert every["vllm.layers.changed_mod"].importers == ["vllm_metax.models.toy"]
    assert all(r.reached_from in expand(r.importers) for r in every.values() if r.reached_from)


def test_without_a_base_nothing_is_verified(toy: dict[str, Path]) -> None:
    shown = rows(trace(toy, base=None))
    result = trace(toy, base=None, section="summary")
    assert NO_BASE in result.unknowns
    # the plugin's own imports are shown, unverified; what they import in turn is not
    assert shown["vllm.layers.stable_mod"].stability == "unknown"
    assert shown["vllm.layers.changed_mod"].stability == "unknown"
    assert "vllm.deep.used" not in shown and "vllm.deep.behind" not in shown
    assert not [b for b in result.boundaries if b.kind == "stable_interface"]


def test_consumers_list_every_row_and_refuse_a_view(toy: dict[str, Path]) -> None:
    arguments = {"direction": "consumers", "symbol": "vllm.layers.stable_mod:Stable", "depth": 1, "arch": None}
    names = {r.name for r in trace(toy, **arguments).inventory}
    assert names == {"vllm_metax.models.helpers", "vllm_metax.models.toy"}
    with pytest.raises(ToolFailure, match="every row"):
        trace(toy, view="full", **arguments)


@pytest.mark.slow
@needs_snapshots
def test_real_fork_changes_view_is_a_fraction_of_the_walk(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vllm-ascend 7662ec925a (written for vLLM 0.26.0) traced at 0.27.0 with base 0.26.0."""
    root = tmp_path_factory.mktemp("ascend-view")
    build_upstream_history(root / "vllm", ["0.26.0", "0.27.0"], include=["vllm/"])
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / "vllm-ascend-7662ec925a.tar.gz", root / "fork")
    ws = {"root": root, "state": tmp_path_factory.mktemp("ascend-view-state")}
    arguments = {
        "plugin_repo": str(repo.relative_to(root)),
        "target": "v0.27.0",
        "base": "v0.26.0",
        "arch": "DeepseekV4ForCausalLM",
        "depth": 4,
        "probe_ops": False,
    }
    # one trace, every page of both views cut from it as the calls with a cursor would be
    runtime = Runtime.create([str(ws["root"])], state_dir=str(ws["state"]))
    env = ToolEnv(runtime=runtime, tool="trace_dependency")
    done = tool.run(parse_input(tool.SPEC, {"upstream": "vllm", "section": "inventory", **arguments}), env)

    def every_row(**view: Any) -> tuple[dict[str, Any], Any]:
        found: dict[str, Any] = {}
        cursor: dict[str, str] = {}
        while True:
            raw = {"upstream": "vllm", "section": "inventory", "limit": 1000, **arguments, **view, **cursor}
            page = tool.answer(parse_input(tool.SPEC, raw), done)
            found.update(rows(page))
            if not page.next_cursor:
                return found, page
            cursor = {"cursor": page.next_cursor}

    (every, full), (shown, changes) = every_row(view="full"), every_row()
    assert full.total == len(every) == changes.counts["inventory"] and len(shown) == changes.counts["inventory.changes"]
    assert len(shown) * 3 < full.total
    assert_plugin_modules_shown_and_their_names_folded(every, shown, some_folded=False)
    # vllm_ascend/models/deepseek_v4.py imports DeepseekV4Config; transformers_utils/configs/deepseek_v4.py
    # defines it at line 8 in both releases, unchanged
    config = every["vllm.transformers_utils.configs.deepseek_v4"]
    assert config.stability == "stable" and config.stability_evidence == ["unchanged:DeepseekV4Config 8->8"]
    assert "vllm_ascend.models.deepseek_v4" in config.importers
    assert "vllm.transformers_utils.configs.deepseek_v4" not in shown
    # the same file imports DeepseekV4IndexerCache (attention.py:627 at 0.26.0, :677 at 0.27.0) whose body
    # is the same, but its base AttentionLayerBase gained bind_kv_cache (attention_layer_base.py:25 at 0.27.0)
    cache = shown["vllm.models.deepseek_v4.attention:DeepseekV4IndexerCache"]
    assert cache.stability == "changed" and cache.importers == ["vllm_ascend.models.deepseek_v4"]
    assert cache.upstream_delta == [
        "base vllm.model_executor.layers.attention_layer_base:AttentionLayerBase of DeepseekV4IndexerCache: changed"
    ]
    # upstream's own model imports the module too (nvidia/model.py), beside the fork's file
    importers = expand(shown["vllm.models.deepseek_v4.attention"].importers)
    assert {"vllm.models.deepseek_v4.nvidia.model", "vllm_ascend.models.deepseek_v4"} <= importers
