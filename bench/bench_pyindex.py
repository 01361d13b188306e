"""Module index over the whole upstream vLLM tree, cold (2 workers) and warm, beside grimp.

Run: `python -m bench.bench_pyindex [VERSION]` (default 0.26.0; the tree comes from the test
workbench's wheel cache). Prints seconds and the ratios the issue sets targets for:
cold within 4x grimp cold, warm within 1x grimp warm. Nothing here asserts a time.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from vllm_metax_mcp.core.pyindex import ModuleIndex, RecordCache  # noqa: E402
from vllm_metax_mcp.core.state import StateStore  # noqa: E402
from vllm_metax_mcp.core.subjects import DirectorySubject  # noqa: E402
from workbench import upstream_source  # noqa: E402


def index_once(tree: Path, state: Path) -> tuple[float, int, int]:
    start = time.perf_counter()
    index, cache = ModuleIndex(), RecordCache(StateStore(state))
    index.add_tree("upstream", DirectorySubject(tree), cache, ["vllm/"])
    return time.perf_counter() - start, len(index.modules), cache.misses


def grimp_once(tree: Path, cache_dir: Path) -> tuple[float, int]:
    start = time.perf_counter()
    graph = grimp.build_graph("vllm", cache_dir=str(cache_dir))
    return time.perf_counter() - start, len(graph.modules)


def main() -> None:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.26.0"
    tree = upstream_source(version)
    sys.path.insert(0, str(tree))
    with tempfile.TemporaryDirectory() as scratch:
        state, grimp_cache = Path(scratch) / "state", Path(scratch) / "grimp"
        ours_cold, modules, parsed = index_once(tree, state)
        ours_warm, _, reparsed = index_once(tree, state)
        theirs_cold, grimp_modules = grimp_once(tree, grimp_cache)
        theirs_warm, _ = grimp_once(tree, grimp_cache)
        shutil.rmtree(state, ignore_errors=True)
    print(f"vLLM {version}: {modules} modules indexed ({parsed} parsed cold, {reparsed} warm); grimp saw {grimp_modules}")
    print(f"index cold {ours_cold:6.2f} s   grimp cold {theirs_cold:6.2f} s   ratio {ours_cold / theirs_cold:5.1f}x (target <= 4x)")
    print(f"index warm {ours_warm:6.2f} s   grimp warm {theirs_warm:6.2f} s   ratio {ours_warm / theirs_warm:5.1f}x (target <= 1x)")


if __name__ == "__main__":
    main()
