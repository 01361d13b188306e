"""port_model on a real vendor plugin, beside `git merge-file --diff3` on the same three inputs in the same run.

Run: `python -m bench.bench_port_model` (needs the shared plugin snapshots, see tests/test_real_plugins.py).
The fork is vllm-ascend at 351879064c (its vllm_ascend/models/); upstream is a git history of the real
releases 0.25.0, 0.26.0 and 0.27.1 (built once under the test cache). port_model carries the fork onto
v0.27.1 with v0.25.0 and v0.26.0 as the releases it may come from. For every file it writes, the
reference merges the same three inputs with `git merge-file -p --diff3`: the plugin file, the base the
report names (`git show <base>:<base_path>`) and the target (`git show v0.27.1:<upstream>`). Both are
counted (conflict blocks, files that parse) and both are compared line by line (difflib ratio) with the
vendor's own port to v0.27.1, vllm-ascend at b4b04c5eb1, where it has the file at the same path.
Prints a table and totals; asserts nothing.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_real_plugins import PLUGINS, snapshot_repo
from workbench import build_upstream_history, cache_root, file_lock

from bench.table import BenchRow, run_alone
from vllm_metax_mcp.tools.port_model import PortModelInput, port_model
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

VERSIONS = ["0.25.0", "0.26.0", "0.27.1"]
TARGET = "v0.27.1"
RELEASES = ["v0.25.0", "v0.26.0"]
PATHS = ["vllm_ascend/models/"]
FORK = "vllm-ascend-351879064c.tar.gz"
VENDOR = "vllm-ascend-b4b04c5eb1.tar.gz"
WRITTEN = ("ported", "conflicts", "unverified")


@dataclass
class Merged:
    """One merge result: its text, its conflict blocks and whether it parses."""

    text: str
    conflicts: int
    parses: bool


@dataclass
class Row:
    local: str
    status: str
    base: str
    ours: Merged
    reported_parses: bool
    verified: bool
    git: Merged
    vendor: bool
    ours_close: float | None
    git_close: float | None


def workspace() -> Path:
    """The upstream history (`vllm/`) and the fork snapshot (`fork/vllm-ascend/`), built once under the test cache."""
    assert PLUGINS is not None
    root = cache_root() / "bench-port-model"
    with file_lock(root.with_suffix(".lock")):
        if not (root / "ready").is_file():
            shutil.rmtree(root, ignore_errors=True)
            build_upstream_history(root / "vllm", VERSIONS, include=["vllm/"])
            snapshot_repo(PLUGINS / FORK, root / "fork")
            (root / "ready").write_text(f"{VERSIONS} {FORK}\n")
    return root


def run_port(root: Path, scratch: Path) -> tuple[float, dict[str, Any], Path]:
    """The tool's own call (cold state); seconds, the report and the output directory."""
    outputs, output = scratch / "out", scratch / "out" / "port"
    outputs.mkdir()
    runtime = Runtime.create([str(root)], [str(outputs)], mode="edit", state_dir=str(scratch / "state"))
    arguments = PortModelInput(
        plugin_repo=str(root / "fork" / "vllm-ascend"),
        upstream=str(root / "vllm"),
        target=TARGET,
        releases=RELEASES,
        paths=PATHS,
        output=str(output),
    )
    start = time.perf_counter()
    port_model(arguments, ToolEnv(runtime=runtime, tool="port_model"))
    elapsed = time.perf_counter() - start
    return elapsed, json.loads((output / "port_report.json").read_text()), output


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def clean_git(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """git with no system or user configuration (HOME an empty directory)."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def git_merge(root: Path, scratch: Path, entry: dict[str, Any]) -> Merged:
    """`git merge-file -p --diff3` of the plugin file, the base the report names and the target."""
    home, work, upstream = scratch / "home", scratch / "merge", root / "vllm"
    for directory in (home, work):
        directory.mkdir(exist_ok=True)
    for name, spec in (("base", f"{entry['base']}:{entry['base_path']}"), ("target", f"{TARGET}:{entry['upstream']}")):
        shown = clean_git(home, "show", spec, cwd=upstream)
        if shown.returncode:
            raise RuntimeError(f"git show {spec}: {shown.stderr.strip()}")
        (work / name).write_text(shown.stdout)
    local = root / "fork" / "vllm-ascend" / entry["local"]
    labels = ("-L", "local", "-L", "base", "-L", "target")
    merged = clean_git(home, "merge-file", "-p", "--diff3", *labels, str(local), "base", "target", cwd=work)
    if merged.returncode > 127:
        raise RuntimeError(f"git merge-file on {entry['local']}: {merged.stderr.strip()}")
    text = merged.stdout
    return Merged(text, sum(1 for line in text.splitlines() if line.startswith("<<<<<<<")), parses(text))


def ours(output: Path, entry: dict[str, Any]) -> Merged:
    text = (output / entry["local"]).read_text()
    return Merged(text, len(entry["conflicts"]), parses(text))


def vendor_files(names: list[str]) -> dict[str, str]:
    """The vendor's own port (b4b04c5eb1): text of each plugin path it has."""
    assert PLUGINS is not None
    found: dict[str, str] = {}
    with tarfile.open(PLUGINS / VENDOR) as opened:
        for name in names:
            try:
                member = opened.extractfile(f"vllm-ascend/{name}")
            except KeyError:
                continue
            if member is not None:
                found[name] = member.read().decode()
    return found


def similarity(text: str, vendor: str | None) -> float | None:
    if vendor is None:
        return None
    return difflib.SequenceMatcher(None, text.splitlines(), vendor.splitlines(), autojunk=False).ratio()


def merged_rows(root: Path, scratch: Path, report: dict[str, Any], output: Path) -> tuple[list[Row], float]:
    """One row per written file with a base; and the seconds the git reference took."""
    entries = [e for e in report["files"] if e["status"] in WRITTEN and e.get("base")]
    start = time.perf_counter()
    by_git = [git_merge(root, scratch, e) for e in entries]
    git_s = time.perf_counter() - start
    vendor = vendor_files([e["local"] for e in entries])
    return [row(e, ours(output, e), g, vendor.get(e["local"])) for e, g in zip(entries, by_git, strict=True)], git_s


def row(entry: dict[str, Any], mine: Merged, by_git: Merged, vendor: str | None) -> Row:
    check = entry["verification"]
    return Row(
        local=entry["local"],
        status=entry["status"],
        base=entry["base"],
        ours=mine,
        reported_parses=bool(check["parses"]),
        verified=bool(check["passed"]),
        git=by_git,
        vendor=vendor is not None,
        ours_close=similarity(mine.text, vendor),
        git_close=similarity(by_git.text, vendor),
    )


def percent(value: float | None) -> str:
    return "   -" if value is None else f"{value * 100:3.0f}%"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def print_table(table: list[Row]) -> None:
    heads = ("conflicts", "parses", "verified", "~vendor")
    print(f"{'file (under ' + PATHS[0] + ')':<36} {'status':<10} {'base':<8} " + "  ".join(f"{h:>9}" for h in heads))
    print(f"{'':<56} " + "  ".join(f"{h:>9}" for h in ("pm/git", "pm/git", "pm", "pm/git")))
    for row in table:
        name = row.local.removeprefix(PATHS[0])
        counts = f"{row.ours.conflicts}/{row.git.conflicts}"
        parsed = f"{yes(row.ours.parses)}/{yes(row.git.parses)}"
        close = f"{percent(row.ours_close)}/{percent(row.git_close)}"
        cells = "  ".join(f"{c:>9}" for c in (counts, parsed, yes(row.verified), close))
        print(f"{name:<36} {row.status:<10} {row.base:<8} {cells}")


def mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def print_totals(table: list[Row], report: dict[str, Any], port_s: float, git_s: float) -> list[BenchRow]:
    ours_blocks, git_blocks = sum(r.ours.conflicts for r in table), sum(r.git.conflicts for r in table)
    ratio = f"{ours_blocks / git_blocks:.2f}" if git_blocks else "-"
    mismatched = [r.local for r in table if r.ours.parses != r.reported_parses]
    compared = [r for r in table if r.vendor]
    ours_sim, git_sim = mean([r.ours_close for r in compared]), mean([r.git_close for r in compared])
    closer = sum(1 for r in compared if (r.ours_close or 0) > (r.git_close or 0))
    farther = sum(1 for r in compared if (r.ours_close or 0) < (r.git_close or 0))
    print(f"\nport_model report: {report['summary']}")
    print(f"files merged by both: {len(table)}")
    print(f"conflict blocks: port_model {ours_blocks}, git merge-file {git_blocks}  (ratio {ratio})")
    print(
        f"parseable files: port_model {sum(r.reported_parses for r in table)} reported, "
        f"{sum(r.ours.parses for r in table)} by ast.parse; git merge-file {sum(r.git.parses for r in table)}"
        + (f"  (report and ast.parse disagree on {', '.join(mismatched)})" if mismatched else "")
    )
    print(f"files verified (port_model): {sum(r.verified for r in table)}")
    print(
        f"line similarity to the vendor's port ({VENDOR.removesuffix('.tar.gz')}), {len(compared)} files: "
        f"port_model mean {percent(ours_sim)}, git merge-file mean {percent(git_sim)}; "
        f"port_model closer on {closer}, farther on {farther}"
    )
    print(f"wall time: port_model {port_s:6.2f} s, git show + merge-file {git_s:6.2f} s  (ratio {port_s / git_s:.1f}x)")
    git, parsed = "git merge-file", sum(r.ours.parses for r in table)
    return [
        BenchRow(f"port_model conflict blocks ({len(table)} files)", ours_blocks, git_blocks, git, unit=""),
        BenchRow("port_model files that parse", parsed, sum(r.git.parses for r in table), git, unit=""),
        BenchRow(
            "port_model mean similarity to the vendor's port",
            100 * (ours_sim or 0),
            100 * (git_sim or 0),
            git,
            unit="%",
        ),
        BenchRow("port_model wall time", port_s, git_s, "git show + merge-file"),
    ]


def rows() -> list[BenchRow]:
    if PLUGINS is None:
        print("skipped: the real plugin snapshots are not found (point VLLM_METAX_MCP_SHARED at the shared folder)")
        return []
    started = time.perf_counter()
    root = workspace()
    print(f"workspace {root} ready in {time.perf_counter() - started:.1f} s")
    with tempfile.TemporaryDirectory(prefix="bench-port-") as tmp:
        scratch = Path(tmp)
        port_s, report, output = run_port(root, scratch)
        table, git_s = merged_rows(root, scratch, report, output)
        print(f"{FORK.removesuffix('.tar.gz')} {PATHS[0]} onto {TARGET} (releases {', '.join(RELEASES)})\n")
        print_table(table)
        return print_totals(table, report, port_s, git_s)


def main() -> None:
    run_alone(rows)


if __name__ == "__main__":
    main()
