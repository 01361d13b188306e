"""Every benchmark, each in its own process, then one table of all their rows (what | now | reference | ratio |
goal | met?).

Run: `python -m bench [BENCH ...]` (default: all, in the order below). A bench that fails is named under the
table and the run exits 1 after printing it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from bench.table import BenchRow, load, print_table

BENCHES = (
    "bench_pyindex",
    "bench_diff_model",
    "bench_trace",
    "bench_audit_commits",
    "bench_plan_trim",
    "bench_trim_real",
    "bench_port_model",
)
REPO = Path(__file__).resolve().parents[1]


def run(name: str, scratch: Path) -> list[BenchRow] | None:
    """The bench's rows, or None when its process failed."""
    out = scratch / f"{name}.json"
    code = f"from bench.table import emit; emit({name!r}, {str(out)!r})"
    if subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode:
        return None
    return load(out)


def main() -> int:
    names = sys.argv[1:] or list(BENCHES)
    rows: list[BenchRow] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-rows-") as scratch:
        for name in names:
            print(f"== {name}", flush=True)
            measured = run(name, Path(scratch))
            if measured is None:
                failed.append(name)
            else:
                rows.extend(measured)
    print()
    print_table(rows, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
