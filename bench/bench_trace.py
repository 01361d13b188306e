"""trace_dependency for one architecture, cold and warm, beside grimp's import graph of the same trees.

Run: `python -m bench.bench_trace [VERSION]` (default 0.26.0; the tree comes from the test workbench's wheel
cache). Upstream is a git history of the release (`vllm/` only, tag v<VERSION>); the plugin carries the
DeepSeek V4 model and MTP files with the MACA edit and registers DeepseekV4ForCausalLM. The tool's entry is
called in this process, each call with a new Runtime as a new server would have.
- cold: the first call with a new, empty state directory, the OS page cache warm (every file of both
  repositories read just before), so it pays for parsing and indexing, not for the disk.
- warm: the same call again on the state directory the cold call left.
The reference, in the same run, is what an agent builds by hand to follow a model's imports: grimp's import
graph of upstream `vllm` and the plugin's `vllm_metax` (cold: an empty grimp cache; warm: the cache it left).
Prints seconds, ratios and the issue's absolute goals (cold <= 8 s, warm <= 1.5 s); asserts no time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import build_plugin_repo, build_upstream_history, upstream_source

from bench.table import BenchRow, differing, run_alone, seconds_at_most, warm_page_cache
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv
from vllm_metax_mcp.tools.trace_dependency import TraceInput, TraceOutput, trace_dependency

ARCH = "DeepseekV4ForCausalLM"
V4 = "vllm/models/deepseek_v4"
FILES = {
    "vllm_metax/models/deepseek_v4/model.py": f"{V4}/nvidia/model.py",
    "vllm_metax/models/deepseek_v4/mtp.py": f"{V4}/nvidia/mtp.py",
}
REGISTRATIONS = {ARCH: "vllm_metax.models.deepseek_v4:DeepseekV4ForCausalLM"}
COLD_GOAL, WARM_GOAL = 8.0, 1.5


def run_tool(root: Path, state: Path, version: str) -> tuple[float, TraceOutput]:
    env = ToolEnv(runtime=Runtime.create([str(root)], state_dir=str(state)), tool="trace_dependency")
    arguments = TraceInput(plugin_repo="plugin", upstream="vllm", target=f"v{version}", arch=ARCH, section="summary")
    start = time.perf_counter()
    output = trace_dependency(arguments, env)
    return time.perf_counter() - start, output


def grimp_once(tree: Path, plugin: Path, cache: Path) -> tuple[float, int]:
    """grimp's graph of upstream vllm and the plugin, both found on sys.path for the call only."""
    saved = list(sys.path)
    sys.path[:0] = [str(tree), str(plugin)]
    try:
        start = time.perf_counter()
        graph = grimp.build_graph("vllm", "vllm_metax", cache_dir=str(cache))
        return time.perf_counter() - start, len(graph.modules)
    finally:
        sys.path[:] = saved


def rows(version: str = "0.26.0") -> list[BenchRow]:
    tree = upstream_source(version)
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as scratch:
        root = Path(scratch) / "ws"
        root.mkdir()
        started = time.perf_counter()
        build_upstream_history(root / "vllm", [version], include=["vllm/"])
        build_plugin_repo(root / "plugin", tree, FILES, registrations=REGISTRATIONS)
        built = time.perf_counter() - started
        read = warm_page_cache(root, tree)
        state = Path(scratch) / "state"
        cold, output = run_tool(root, state, version)
        warm, again = run_tool(root, state, version)
        grimp_cold, modules = grimp_once(tree, root / "plugin", Path(scratch) / "grimp")
        grimp_warm, _ = grimp_once(tree, root / "plugin", Path(scratch) / "grimp")
    differ = differing(output.model_dump(), again.model_dump())
    print(f"vLLM {version} history and plugin built in {built:.1f} s; page cache warmed ({read / 2**20:.0f} MiB read)")
    print(f"{ARCH}: counts {output.counts}; modules indexed {output.modules_indexed}, warm hits {again.cache_hits}")
    print(
        f"fields the warm answer has unlike the cold one: {', '.join(differ) or 'none'}; grimp graph: {modules} modules"
    )
    print(f"grimp build_graph  cold {grimp_cold:6.2f} s   warm {grimp_warm:6.2f} s")
    for label, seconds, reference, goal in (
        ("cold", cold, grimp_cold, COLD_GOAL),
        ("warm", warm, grimp_warm, WARM_GOAL),
    ):
        verdict = "met" if seconds <= goal else "MISSED"
        print(
            f"trace_dependency {label} {seconds:6.2f} s   ratio {seconds / reference:5.1f}x grimp {label}   "
            f"goal <= {goal:g} s: {verdict}"
        )
    return [
        BenchRow("trace_dependency cold, one arch, fresh state", cold, grimp_cold, "grimp", seconds_at_most(COLD_GOAL)),
        BenchRow("trace_dependency warm", warm, grimp_warm, "grimp", seconds_at_most(WARM_GOAL)),
    ]


def main() -> None:
    run_alone(lambda: rows(*sys.argv[1:2]))


if __name__ == "__main__":
    main()
