"""audit_commits results stay within the result budget at any arguments (issue 23), on a real vendor
plugin: vllm-ascend at 7662ec925a audited over v0.26.0..HEAD of an upstream history built from the real
0.26.0 and 0.27.0 release trees plus COMMITS small commits touching the counterparts that changed (so the
list has pages). Every action runs at the largest limit, every cursor is followed to the end, the rows of
all pages together are the list exactly once, and each next_step is called and succeeds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import workbench
from test_real_plugins import ARCHIVE, PLUGINS, needs_snapshots, snapshot_repo
from test_real_plugins_audit import CHANGED, MODELS
from workbench import build_upstream_history, git

from vllm_metax_mcp.core.audit.session import MAX_LIMIT
from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.tools import audit_commits as tool
from vllm_metax_mcp.tools import export_snapshot as export_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

COMMITS = 24


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("budget-audit")
    sources = {"0.26.0": upstream_026, "0.27.0": workbench.upstream_source("0.27.0")}
    history = build_upstream_history(root / "vllm", list(sources), sources=sources)
    counterparts = sorted(set(CHANGED.values()))
    for n in range(COMMITS):
        path = counterparts[n % len(counterparts)]
        text = (history.path / path).read_text() + f"\n\ndef budget_marker_{n}() -> int:\n    return {n}\n"
        history.add_commit({path: text}, f"[Misc] marker {n} in {path.rsplit('/', 1)[-1]}")
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / ARCHIVE, root)
    base = {
        "upstream": str(history.path),
        "target": history.rev_parse("HEAD"),
        "plugin_repo": str(repo),
        "paths": [f"{MODELS}/"],
        "releases": ["v0.26.0"],
    }
    return {"root": root, "state": tmp_path_factory.mktemp("budget-state"), "base": base, "history": history}


def call(ws: dict[str, Any], arguments: dict[str, Any]) -> Any:
    runtime = Runtime.create([str(ws["root"])], mode="review", state_dir=str(ws["state"]))
    return anyio.run(lambda: invoke(tool.SPEC, arguments, ToolEnv(runtime=runtime, tool="audit_commits")))


def pages(ws: dict[str, Any], **arguments: Any) -> list[Any]:
    """The call and every further page: through next_step where it is the same call with the cursor (a page
    of commits names the review of its first undecided commit instead)."""
    found = [call(ws, {**ws["base"], **arguments})]
    while found[-1].next_cursor:
        step = found[-1].next_step
        further = {**ws["base"], **arguments, "cursor": found[-1].next_cursor}
        assert step.tool == "audit_commits" and (step.arguments == further or step.arguments.get("patch") == "mapped")
        found.append(call(ws, further))
    sizes = [len(text_of(page)) for page in found]
    print("audit_commits", {k: v for k, v in arguments.items() if k != "commit"}, "page sizes:", sizes)
    assert max(sizes) <= RESULT_BUDGET, (arguments, sizes)
    return found


def follow(ws: dict[str, Any], result: Any) -> Any:
    """The next_step a result names, called as it stands: it must succeed."""
    assert result.next_step is not None and result.next_step.tool == "audit_commits"
    return call(ws, result.next_step.arguments)


@pytest.mark.slow
@needs_snapshots
def test_commit_pages_hold_every_commit_once_within_the_budget(ws: dict[str, Any]) -> None:
    listed = pages(ws, limit=MAX_LIMIT)
    shas = [c.sha for page in listed for c in page.commits]
    assert len(listed) > 1 and len(shas) == len(set(shas)) == listed[0].total == COMMITS + 1
    assert listed[0].summary.total == COMMITS + 1 and listed[0].summary.without_entry == COMMITS + 1
    # the files and unknowns are sent once, on the first page
    assert listed[0].files and listed[0].files_total == len(CHANGED) and all(not p.files for p in listed[1:])
    assert all(not p.unknowns for p in listed[1:])
    # nothing is decided: the step is the review of the page's first commit, and it succeeds
    step = listed[0].next_step
    assert step.arguments["action"] == "list" and step.arguments["commit"] == shas[0]
    reviewed = follow(ws, listed[0])
    assert reviewed.patch and [c.sha for c in reviewed.commits] == [shas[0]]
    assert len(text_of(pages(ws)[0])) <= RESULT_BUDGET  # the default page too


@pytest.mark.slow
@needs_snapshots
def test_one_commit_and_its_patch_fit_at_any_limit(ws: dict[str, Any]) -> None:
    release = ws["history"].rev_parse("v0.27.0")
    (detail,) = pages(ws, commit=release)
    (row,) = detail.commits
    assert row.files.production_total > 500 and 0 < len(row.files.production) < row.files.production_total
    patch = pages(ws, commit=release, patch="mapped", limit=MAX_LIMIT)
    lines = [line for page in patch for line in page.patch]
    assert len(patch) > 1 and len(lines) == patch[0].total
    assert [len(page.commits) for page in patch] == [1] + [0] * (len(patch) - 1)
    assert follow(ws, patch[-1]).action == "status"  # after the last page: status
    whole = call(ws, {**ws["base"], "commit": release, "patch": "all", "limit": MAX_LIMIT})
    assert whole.next_cursor and len(text_of(whole)) <= RESULT_BUDGET


@pytest.mark.slow
@needs_snapshots
def test_status_recheck_and_export_fit_and_name_their_next_call(ws: dict[str, Any]) -> None:
    started = time.perf_counter()
    status = pages(ws, action="status", limit=MAX_LIMIT)
    files = [f.local for page in status for f in page.files]
    assert len(files) == len(set(files)) == status[0].total and status[0].declared
    assert follow(ws, status[-1]).action == "list"  # commits lack entries
    recheck = pages(ws, action="recheck", limit=MAX_LIMIT)
    rows = [(u.local, u.symbol) for page in recheck for u in page.unaccounted]
    assert len(rows) == len(set(rows)) == recheck[0].total > 0
    reviewed = follow(ws, recheck[0])  # the commit behind the first difference nothing explains
    assert reviewed.patch or reviewed.commits
    (exported,) = pages(ws, action="export")
    assert exported.export.missing > 0 and not exported.complete
    assert (ws["state"] / exported.export.json_path).stat().st_size > RESULT_BUDGET  # written, not repeated
    assert follow(ws, exported).action == "list"
    assert time.perf_counter() - started < 600


def test_arguments_an_action_would_ignore_are_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    runtime = Runtime.create([str(tmp_path / "root")], mode="review", state_dir=str(tmp_path / "state"))
    env = ToolEnv(runtime=runtime, tool="audit_commits")
    note = [{"kind": "note", "text": "n"}]
    cases = {
        "limit": ({"limit": MAX_LIMIT + 1}, "less than or equal to 1000"),
        "local_range": ({"action": "status", "local_range": "A..B"}, "local_range is only used with action=local"),
        "patch": ({"patch": "mapped"}, "patch needs commit"),
        "commit": ({"action": "status", "commit": "abc"}, "commit is only used with action=list"),
        "cursor": ({"action": "export", "cursor": "x"}, "cursor is only used with action="),
        "local": ({"action": "local", "local_range": "A..B", "base": "v1"}, "base is not used by action=local"),
        "entries": (
            {"action": "status", "entries": [{"node": "m", "disposition": "merge", "evidence": note}]},
            "entries is only used",
        ),
        "node": (
            {"action": "annotate", "entries": [{"node": "m", "commit": "c", "disposition": "merge", "evidence": note}]},
            "annotate takes node, disposition, evidence; not commit",
        ),
        "record": (
            {"action": "record", "entries": [{"commit": "c", "disposition": "merge", "evidence": note}]},
            "record needs file, local_edit, affected_interface",
        ),
        "unknown": ({"entries": [{"nod": "m"}]}, "nod"),
    }
    for name, (arguments, expected) in cases.items():
        with pytest.raises(ToolFailure) as refused:
            anyio.run(invoke, tool.SPEC, {"plugin_repo": "missing", **arguments}, env)
        assert refused.value.code.value == "bad_input" and expected in refused.value.message, (name, refused.value)


def test_an_export_answers_where_it_wrote_and_what_to_call_next(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    repo = root / "plugin"
    (repo / "vllm_metax").mkdir(parents=True)
    for n in range(300):  # many files: the answer counts them, it never lists them
        (repo / "vllm_metax" / f"m{n}.py").write_text(f"X = {n}\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "plugin")
    runtime = Runtime.create([str(root)], mode="edit", state_dir=str(state))
    arguments = {"plugin_repo": "plugin", "subject": "index", "output": "snap"}
    done = anyio.run(invoke, export_tool.SPEC, arguments, ToolEnv(runtime=runtime, tool="export_snapshot"))
    assert done.files == 300 and len(text_of(done)) < 1000 and (root / "snap" / "vllm_metax" / "m299.py").is_file()
    assert done.next_step.tool == "diff_model"
    assert done.next_step.arguments == {"plugin_repo": "plugin", "subject": "directory", "directory": "snap"}
