"""audit_commits listing a release range, beside the raw `git log -p --follow` commands it replaces.

Run: `python -m bench.bench_audit_commits [VERSION ...]` (default 0.24.0 0.25.0 0.26.0 0.27.0: the
range runs from the first to the last; trees come from the test workbench's wheel cache). The
upstream history is fine-grained like upstream's: between two releases every changed model file
is its own commit and the rest of the release one more, so the range holds hundreds of commits.
The plugin is bench_diff_model's (the DeepSeek V4 family flattened, classic models) copied from
the first release. The reference, in the same run, is what an agent runs by hand: one
`git log -p --follow base..target -- <counterpart>` per upstream counterpart the listing tracks.
Cold is the first call with a new, empty state directory (the history was just written, so the OS page
cache is warm); warm is the same call again. Prints seconds and ratios, and the issue's goal (cold list
<= 2x git; warm: keep); asserts no time.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench import (
    UpstreamHistory,
    build_plugin_repo,
    build_upstream_history,
    git,
    upstream_source,
)

from bench.bench_diff_model import REGISTRATIONS, plugin_files
from bench.table import BenchRow, at_most, only, run_alone
from vllm_metax_mcp.tools.audit_commits import (
    MAX_LIMIT,
    Action,
    AuditCommitsInput,
    AuditCommitsOutput,
    audit_commits,
)
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

MODEL_DIRS = ("vllm/models/", "vllm/model_executor/models/")
COLD_GOAL = 2.0


def python_files(tree: Path) -> dict[str, Path]:
    return {p.relative_to(tree).as_posix(): p for p in (tree / "vllm").rglob("*.py")}


def fine_grained_history(dest: Path, versions: list[str]) -> UpstreamHistory:
    """The first release as one commit, then per release: each changed model file, then the rest."""
    history = build_upstream_history(dest, versions[:1], include=["vllm/"])
    for previous, version in zip(versions, versions[1:], strict=False):
        before, after = python_files(upstream_source(previous)), python_files(upstream_source(version))
        changed = sorted(
            p
            for p in before.keys() | after.keys()
            if p not in before or p not in after or before[p].read_bytes() != after[p].read_bytes()
        )
        models = [p for p in changed if p.startswith(MODEL_DIRS)]
        for path in models:
            history.add_commit(
                {path: after[path].read_text() if path in after else None}, f"[Model] {path} for v{version}"
            )
        rest = {p: (after[p].read_text() if p in after else None) for p in changed if p not in models}
        if rest:
            history.add_commit(rest, f"Release v{version}")
        git(history.path, "tag", f"v{version}")
    return history


def run_tool(
    root: Path, base: str, target: str, action: Action, cursor: str | None = None
) -> tuple[float, AuditCommitsOutput]:
    env = ToolEnv(runtime=Runtime.create([str(root)], state_dir=str(root / "state")), tool="audit_commits")
    arguments = AuditCommitsInput(
        plugin_repo="plugin", upstream="vllm", target=target, base=base, action=action, limit=MAX_LIMIT, cursor=cursor
    )
    start = time.perf_counter()
    output = audit_commits(arguments, env)
    return time.perf_counter() - start, output


def every_listed(root: Path, base: str, target: str, first: AuditCommitsOutput) -> set[str]:
    """The shas of every page of the list (the first page is cut by its size budget), untimed."""
    found = {c.sha for c in first.commits}
    cursor = first.next_cursor
    while cursor:
        _, page = run_tool(root, base, target, "list", cursor)
        found |= {c.sha for c in page.commits}
        cursor = page.next_cursor
    return found


def raw_git(root: Path, base: str, target: str, paths: list[str]) -> tuple[float, set[str]]:
    """Seconds for one `git log -p --follow` per path, and the commits they print."""
    found: set[str] = set()
    start = time.perf_counter()
    for path in paths:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(root / "vllm"),
                "log",
                "-p",
                "--follow",
                "--no-color",
                "--format=@@%H",
                f"{base}..{target}",
                "--",
                path,
            ],
            capture_output=True,
            check=True,
            text=True,
            errors="replace",
        ).stdout
        found |= {
            line[2:] for line in out.splitlines() if line.startswith("@@") and len(line) == 42 and " " not in line
        }
    return time.perf_counter() - start, found


def rows(*versions: str) -> list[BenchRow]:
    versions = versions or ("0.24.0", "0.25.0", "0.26.0", "0.27.0")
    base, target = f"v{versions[0]}", f"v{versions[-1]}"
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        started = time.perf_counter()
        fine_grained_history(root / "vllm", list(versions))
        tree = upstream_source(versions[0])
        build_plugin_repo(root / "plugin", tree, plugin_files(tree), registrations=REGISTRATIONS)
        built = time.perf_counter() - started
        commits = len(git(root / "vllm", "rev-list", f"{base}..{target}").split())
        cold, listed = run_tool(root, base, target, "list")
        warm, _ = run_tool(root, base, target, "list")
        status_s, status = run_tool(root, base, target, "status")
        tracked = sorted({f.upstream for f in status.files if f.upstream and f.base})
        reference, by_git = raw_git(root, base, target, tracked)
        mine = every_listed(root, base, target, listed)
    print(
        f"history {base}..{target}: {commits} commits (built in {built:.1f} s); {len(status.files)} plugin files, "
        f"{len(tracked)} upstream counterparts tracked"
    )
    print(
        f"listed {listed.summary.total} commits touching them; "
        f"first page {len(listed.commits)} with symbols and dependents"
    )
    print(
        f"git log --follow finds {len(by_git)}: {len(mine - by_git)} listed only here, {len(by_git - mine)} only by git"
        + "".join(f"\n  unknown: {u}" for u in listed.unknowns)
    )
    print(f"raw git log -p --follow, {len(tracked)} commands: {reference:6.2f} s")
    for label, seconds in (("cold list", cold), ("warm list", warm), ("warm status", status_s)):
        print(f"audit_commits {label:11} {seconds:6.2f} s   ratio {seconds / reference:5.2f}x git")
    verdict = "met" if cold <= COLD_GOAL * reference else "MISSED"
    print(f"goal: cold list <= {COLD_GOAL:g}x git: {verdict}")
    git_log = "git log -p --follow"
    return [
        BenchRow(f"audit_commits list cold ({commits} commits)", cold, reference, git_log, at_most(COLD_GOAL)),
        BenchRow("audit_commits list warm", warm, reference, git_log, only("keep")),
        BenchRow("audit_commits status warm", status_s, reference, git_log),
    ]


def main() -> None:
    run_alone(lambda: rows(*sys.argv[1:]))


if __name__ == "__main__":
    main()
