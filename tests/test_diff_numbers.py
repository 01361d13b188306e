"""diff_model's numbers an agent needs without a second call (issue 20, mechanism 7): the line totals
of both sides, the count of unchanged symbols beside the changed/added/removed lists (and both counts
in a summary), and import swaps that follow aliases (`from m import A as B`).

Real cases come from the vllm-gcu 7b5aaca941 snapshot against the 0.9.2 it pins; the edge cases
(each alias shape, an import the plugin keeps beside its own, the stats cache's old entries) from a
small synthetic plugin repository and upstream directory.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import GCU_ARCHIVE, PLUGINS, needs_snapshots, snapshot_repo
from workbench import git

from vllm_metax_mcp.core.compare.textdiff import STATS_VERSION, StatsCache, line_stats
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.tools import diff_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

GLM4 = "vllm_gcu/models/glm4/glm4.py"
RUNNER = "vllm_gcu/worker/model_runner.py"
GPTQ = "vllm_gcu/kernels/quantization/gptq.py"
GCU_PAIRS = {
    GLM4: "vllm/model_executor/models/glm4.py",
    RUNNER: "vllm/worker/model_runner.py",
    GPTQ: "vllm/model_executor/layers/quantization/gptq.py",
}


def call(roots: list[Path], state: Path, **arguments: Any) -> Any:
    runtime = Runtime.create([str(r) for r in roots], mode="review", state_dir=str(state))
    env = ToolEnv(runtime=runtime, tool="diff_model")
    return anyio.run(lambda: invoke(tool.SPEC, arguments, env))


def numstat(upstream: Path, local: Path) -> tuple[int, int]:
    """(added, removed) as git's own diff of the two files counts them."""
    out = subprocess.run(
        ["git", "diff", "--no-index", "--numstat", str(upstream), str(local)], capture_output=True, text=True
    ).stdout
    added, removed, _ = out.split("\t", 2)
    return int(added), int(removed)


def assert_line_numbers(stats: Any, upstream: Path, local: Path) -> None:
    assert (stats.local_lines, stats.upstream_lines) == (
        len(local.read_bytes().splitlines()),
        len(upstream.read_bytes().splitlines()),
    )
    assert (stats.added, stats.removed) == numstat(upstream, local)
    assert stats.local_lines - stats.added == stats.upstream_lines - stats.removed


# -- the real plugin -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gcu(tmp_path_factory: pytest.TempPathFactory, upstream_092: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("numbers-gcu")
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / GCU_ARCHIVE, root)
    state = tmp_path_factory.mktemp("numbers-gcu-state")
    arguments = {
        "plugin_repo": str(repo),
        "upstream": str(upstream_092),
        "paths": list(GCU_PAIRS),
        "mapping_overrides": GCU_PAIRS,
    }
    summary = call([root, upstream_092], state, **arguments)
    symbols = call([root, upstream_092], state, **arguments, detail="symbols")
    return {
        "repo": repo,
        "upstream": upstream_092,
        "summary": {p.local: p for p in summary.pairs},
        "symbols": {p.local: p for p in symbols.pairs},
    }


@pytest.mark.slow
@needs_snapshots
def test_line_totals_and_symbol_counts_of_a_real_copy(gcu: dict[str, Any]) -> None:
    pair = gcu["summary"][GLM4]
    assert pair.symbols is None  # a summary
    assert (pair.stats.local_lines, pair.stats.upstream_lines) == (313, 305)
    assert_line_numbers(pair.stats, gcu["upstream"] / GCU_PAIRS[GLM4], gcu["repo"] / GLM4)
    # glm4.py:211-213 ALL_DECODER_LAYER_TYPES and :223-228 Glm4Model are upstream's :212-214 and :224-229
    # line for line; Glm4Attention (:64 `Optional[Tuple]`), Glm4DecoderLayer (:187 `Tuple[...]`, :203
    # `hidden_state`) and Glm4ForCausalLM (:270 `self.sampler`, :298 `def sample`) differ.
    assert (pair.stats.symbols_unchanged, pair.stats.symbols_differing) == (2, 3)
    detailed = gcu["symbols"][GLM4]
    assert detailed.stats == pair.stats
    assert detailed.symbols.unchanged == 2
    assert detailed.symbols.added == ["Glm4ForCausalLM.sample"]
    assert detailed.symbols.changed == [
        "Glm4Attention.__init__",
        "Glm4DecoderLayer.forward",
        "Glm4ForCausalLM.__init__",
        "Glm4ForCausalLM.load_weights",
    ]
    # glm4.py:46 `from vllm.model_executor.models.llama import LlamaMLP as Glm4MLP` binds the same vLLM class
    # as upstream glm4.py:47 `from .llama import LlamaMLP as Glm4MLP`: an alias on both sides, no swap.
    assert detailed.import_swaps == []


@pytest.mark.slow
@needs_snapshots
def test_real_import_swaps_report_their_aliases(gcu: dict[str, Any]) -> None:
    # gptq.py:24 `from vllm_gcu.kernels import _custom_ops as ops` where upstream
    # layers/quantization/gptq.py:12 has `from vllm import _custom_ops as ops`
    (gptq,) = gcu["symbols"][GPTQ].import_swaps
    assert (gptq.name, gptq.local_module, gptq.line, gptq.upstream_module, gptq.upstream_line) == (
        "_custom_ops",
        "vllm_gcu.kernels",
        24,
        "vllm",
        12,
    )
    assert (gptq.local_name, gptq.local_alias, gptq.upstream_alias) == (None, "ops", "ops")
    # model_runner.py:30 `from vllm_gcu.utils import set_gcu_forward_context as set_forward_context` puts the
    # plugin's function under the name upstream worker/model_runner.py:31 imports from vllm.forward_context
    runner = {s.name: s for s in gcu["symbols"][RUNNER].import_swaps}
    swap = runner["set_forward_context"]
    assert (swap.local_module, swap.line, swap.upstream_module, swap.upstream_line) == (
        "vllm_gcu.utils",
        30,
        "vllm.forward_context",
        31,
    )
    assert (swap.local_name, swap.local_alias, swap.upstream_alias) == ("set_gcu_forward_context", None, None)
    assert_line_numbers(gcu["summary"][RUNNER].stats, gcu["upstream"] / GCU_PAIRS[RUNNER], gcu["repo"] / RUNNER)


# -- a synthetic plugin for every alias shape ------------------------------------------------------

UPSTREAM_GLM4 = """\
import vllm.envs as envs
from vllm import _custom_ops as ops
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.norm import RMSNorm as Norm
from vllm.model_executor.models.llama import LlamaMLP as Glm4MLP
from vllm.model_executor.models.llama import LlamaModel

CONSTANT = 1


def helper(x):
    return x + 1


class Glm4Attention:
    def forward(self, x):
        \"\"\"Upstream's docstring.\"\"\"
        return ops.rotate(x)


class Glm4Model(LlamaModel):
    def forward(self, x):
        return Glm4MLP(Norm(x), envs)


def upstream_only():
    return None
"""
LOCAL_GLM4 = """\
import vllm_x.envs as envs
from vllm import _custom_ops as ops
from vllm_x import _custom_ops as vendor_ops
from vllm_x.utils import set_x_forward_context as set_forward_context
from vllm_x.layers.norm import RMSNorm
from vllm_x.models.llama import LlamaMLP as Glm4MLP
from vllm_x.models.llama import LlamaModel as BaseModel

CONSTANT = 1


def helper(x):
    # a comment is no change
    return x + 1


class Glm4Attention:
    def forward(self, x):
        \"\"\"The plugin's own docstring.\"\"\"
        return ops.rotate(x)


class Glm4Model(BaseModel):
    def forward(self, x):
        with set_forward_context():
            return Glm4MLP(RMSNorm(x), envs)


def local_only():
    return vendor_ops
"""
LLAMA = "class LlamaMLP:\n    pass\n\n\nclass LlamaModel:\n    pass\n"
SYNTHETIC_PAIRS = {
    "vllm_x/models/glm4.py": "vllm/model_executor/models/glm4.py",
    "vllm_x/models/llama.py": "vllm/model_executor/models/llama.py",
}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("numbers-synthetic")
    upstream, repo = root / "upstream", root / "plugin"
    for path, text in {
        "vllm/model_executor/models/glm4.py": UPSTREAM_GLM4,
        "vllm/model_executor/models/llama.py": LLAMA,
    }.items():
        (upstream / path).parent.mkdir(parents=True, exist_ok=True)
        (upstream / path).write_text(text)
    local = {
        "vllm_x/__init__.py": "",
        "vllm_x/models/glm4.py": LOCAL_GLM4,
        "vllm_x/models/llama.py": LLAMA + "\n\nX = 1",
    }
    for path, text in local.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "plugin")
    arguments = {
        "plugin_repo": str(repo),
        "upstream": str(upstream),
        "paths": ["vllm_x/models/"],
        "mapping_overrides": SYNTHETIC_PAIRS,
    }
    state = tmp_path_factory.mktemp("numbers-synthetic-state")
    summary = call([root], state, **arguments)
    symbols = call([root], state, **arguments, detail="symbols")
    return {
        "root": root,
        "summary": {p.local: p for p in summary.pairs},
        "symbols": {p.local: p for p in symbols.pairs},
    }


def test_import_swaps_follow_aliases_either_way(synthetic: dict[str, Any]) -> None:
    swaps = {
        s.name: (
            s.local_module,
            s.line,
            s.upstream_module,
            s.upstream_line,
            s.local_name,
            s.local_alias,
            s.upstream_alias,
        )
        for s in synthetic["symbols"]["vllm_x/models/glm4.py"].import_swaps
    }
    assert swaps == {
        # aliased alike on both sides (LOCAL_GLM4:6, UPSTREAM_GLM4:5)
        "LlamaMLP": ("vllm_x.models.llama", 6, "vllm.model_executor.models.llama", 5, None, "Glm4MLP", "Glm4MLP"),
        # only the plugin aliases (:7 `LlamaModel as BaseModel`, upstream :6 `LlamaModel`)
        "LlamaModel": ("vllm_x.models.llama", 7, "vllm.model_executor.models.llama", 6, None, "BaseModel", None),
        # only upstream aliases (:5 `RMSNorm`, upstream :4 `RMSNorm as Norm`)
        "RMSNorm": ("vllm_x.layers.norm", 5, "vllm.model_executor.layers.norm", 4, None, None, "Norm"),
        # the plugin binds its own function under upstream's name (:4, upstream :3)
        "set_forward_context": ("vllm_x.utils", 4, "vllm.forward_context", 3, "set_x_forward_context", None, None),
        # a module import (:1, upstream :1)
        "envs": ("vllm_x.envs", 1, "vllm.envs", 1, None, None, None),
    }
    # `from vllm import _custom_ops as ops` stays (LOCAL_GLM4:2): the plugin's `vendor_ops` (:3) is an
    # addition beside it, not a swap of upstream's import
    assert "_custom_ops" not in swaps
    paired = {s.name: s.paired for s in synthetic["symbols"]["vllm_x/models/glm4.py"].import_swaps}
    assert paired == {
        "LlamaMLP": True,
        "LlamaModel": True,
        "RMSNorm": False,
        "set_forward_context": False,
        "envs": False,
    }


def test_unchanged_symbols_are_counted_beside_the_lists(synthetic: dict[str, Any]) -> None:
    pair = synthetic["symbols"]["vllm_x/models/glm4.py"]
    symbols = pair.symbols
    # CONSTANT, helper (a comment added) and Glm4Attention (another method docstring) are unchanged
    assert symbols.unchanged == 3
    assert (symbols.added, symbols.removed, symbols.changed) == (
        ["local_only"],
        ["upstream_only"],
        ["Glm4Model", "Glm4Model.forward"],
    )
    assert [(b.symbol, b.local, b.upstream) for b in symbols.bases] == [("Glm4Model", ["BaseModel"], ["LlamaModel"])]
    summary = synthetic["summary"]["vllm_x/models/glm4.py"]
    assert summary.symbols is None and summary.import_swaps == []
    assert (summary.stats.symbols_unchanged, summary.stats.symbols_differing) == (3, 3)
    assert summary.stats == pair.stats
    root = synthetic["root"]
    assert_line_numbers(
        pair.stats, root / "upstream" / SYNTHETIC_PAIRS[pair.local], root / "plugin" / "vllm_x/models/glm4.py"
    )


def test_a_last_line_without_newline_counts(synthetic: dict[str, Any]) -> None:
    # the plugin's llama.py ends in `X = 1` without a newline: 9 lines, git's diff adds 3 of them
    stats = synthetic["summary"]["vllm_x/models/llama.py"].stats
    assert (stats.added, stats.removed, stats.hunks, stats.local_lines, stats.upstream_lines) == (3, 0, 1, 9, 6)
    root = synthetic["root"]
    assert_line_numbers(
        stats, root / "upstream" / SYNTHETIC_PAIRS["vllm_x/models/llama.py"], root / "plugin/vllm_x/models/llama.py"
    )
    # LlamaMLP and LlamaModel are unchanged, X is added
    assert (stats.symbols_unchanged, stats.symbols_differing) == (2, 1)
    # an empty upstream file has 0 lines, which is not the same as no counterpart (no stats at all)
    empty = line_stats(b"", b"a\n")
    assert (empty.added, empty.removed, empty.hunks, empty.local_lines, empty.upstream_lines) == (1, 0, 1, 1, 0)


def test_stats_cached_without_the_totals_are_computed_again(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    upstream, local = b"a\nb\n", b"a\nc\nd\n"
    cache = StatsCache(store)
    # an entry of the shape before the totals existed, where this version looks
    path = store.path(f"cache/linestats/v{STATS_VERSION}") / "aa" / "aa11-bb22.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"added": 0, "removed": 0, "hunks": 0}))
    stats = cache.get("aa11", "bb22", lambda: (upstream, local))
    assert (stats.added, stats.removed, stats.hunks, stats.local_lines, stats.upstream_lines) == (2, 1, 1, 3, 2)
    assert (cache.hits, cache.misses) == (0, 1)
    again = StatsCache(store)
    assert again.get("aa11", "bb22", lambda: pytest.fail("read again")) == stats and again.hits == 1
