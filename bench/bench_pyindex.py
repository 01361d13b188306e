"""Module index over the whole upstream vLLM tree, cold (2 workers) and warm, beside grimp.

Run: `python -m bench.bench_pyindex [VERSION]` (default 0.26.0; the tree comes from the test
workbench's wheel cache). Prints seconds and the ratios issue 26 sets targets for: the cold
whole-tree pass within 2x grimp cold, warm within 1x grimp warm. The pass ends with every file's
outline (its import lines included), so it has the whole import graph in hand, as grimp's graph
does; `parsed` counts the files the outline could not vouch for. For scale it also times bare
`ast.parse` of the tree in 2 processes, the floor of any `ast`-based index. Nothing here asserts a
time.
"""

from __future__ import annotations

import ast
import gc
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import grimp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import upstream_source

from bench.table import BenchRow, at_most, run_alone
from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject

COLD_TARGET = 2.0
WARM_TARGET = 1.0


def index_once(tree: Path, state: Path) -> tuple[float, int, int, int]:
    """The whole-tree pass: the file list, blob ids, and every file's outline (top-level names and
    every import line), which is the import graph grimp builds; full records are made per call."""
    start = time.perf_counter()
    index, cache = ModuleIndex(), RecordCache(StateStore(state))
    index.add_tree("upstream", DirectorySubject(tree), cache, ["vllm/"])
    imports = sum(len(outline.imports) for outline in index.outlines("upstream").values())
    return time.perf_counter() - start, len(index.modules), cache.misses, imports


def grimp_once(tree: Path, cache_dir: Path) -> tuple[float, int]:
    start = time.perf_counter()
    graph = grimp.build_graph("vllm", cache_dir=str(cache_dir))
    return time.perf_counter() - start, len(graph.modules)


def _parse(source: bytes) -> int:
    return len(ast.parse(source).body)


def parse_floor(tree: Path) -> float:
    """Bare `ast.parse` of every file in 2 worker processes: what a cold index cannot go below."""
    sources = sorted((path.read_bytes() for path in tree.glob("vllm/**/*.py")), key=len, reverse=True)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2, initializer=gc.disable) as pool:
        list(pool.map(_parse, sources, chunksize=max(1, len(sources) // 64)))
    return time.perf_counter() - start


def verdict(ratio: float, target: float) -> str:
    return f"target <= {target:g}x: {'met' if ratio <= target else 'MISSED'}"


def rows(version: str = "0.26.0") -> list[BenchRow]:
    tree = upstream_source(version)
    saved = list(sys.path)
    sys.path.insert(0, str(tree))
    with tempfile.TemporaryDirectory() as scratch:
        state, grimp_cache = Path(scratch) / "state", Path(scratch) / "grimp"
        ours_cold, modules, parsed, imports = index_once(tree, state)
        ours_warm, _, reparsed, _ = index_once(tree, state)
        theirs_cold, grimp_modules = grimp_once(tree, grimp_cache)
        theirs_warm, _ = grimp_once(tree, grimp_cache)
        shutil.rmtree(state, ignore_errors=True)
    sys.path[:] = saved
    floor = parse_floor(tree)
    cold, warm = ours_cold / theirs_cold, ours_warm / theirs_warm
    print(
        f"vLLM {version}: {modules} modules indexed ({parsed} parsed cold, {reparsed} warm), {imports} imports; "
        f"grimp saw {grimp_modules}"
    )
    print(
        f"index cold {ours_cold:6.2f} s   grimp cold {theirs_cold:6.2f} s   "
        f"ratio {cold:5.1f}x ({verdict(cold, COLD_TARGET)})"
    )
    print(
        f"index warm {ours_warm:6.2f} s   grimp warm {theirs_warm:6.2f} s   "
        f"ratio {warm:5.1f}x ({verdict(warm, WARM_TARGET)})"
    )
    print(
        f"ast.parse alone, 2 processes {floor:6.2f} s = {floor / theirs_cold:4.1f}x grimp cold "
        "(the floor of an ast-based cold index)"
    )
    return [
        BenchRow(f"index, whole tree, cold ({modules} modules)", ours_cold, theirs_cold, "grimp", at_most(COLD_TARGET)),
        BenchRow("index, warm", ours_warm, theirs_warm, "grimp", at_most(WARM_TARGET)),
    ]


def main() -> None:
    run_alone(lambda: rows(*sys.argv[1:2]))


if __name__ == "__main__":
    main()
