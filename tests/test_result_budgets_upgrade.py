"""trace_dependency and diff_model results fit the result budget at any arguments, lead with a summary
and name the next call: the real vllm-ascend snapshot (7662ec925a, written for vLLM 0.26.0) against the
real vLLM 0.26.0 -> 0.27.0 history.

Each tool's work runs once (its own `run`); every page is then cut from it by the tool's own `check` and
`answer`, as a call with those arguments would be, and measured as the client receives it (`text_of`).
One call per tool goes the whole way through `invoke`. Paging is followed to the end: every row once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_upstream_history

from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.core.trace.run import Section
from vllm_metax_mcp.tools import diff_model as diff_tool
from vllm_metax_mcp.tools import trace_dependency as trace_tool
from vllm_metax_mcp.tools.dispatch import invoke, parse_input
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = [pytest.mark.slow, needs_snapshots]

SECTIONS: tuple[Section, ...] = Section.__args__  # type: ignore[attr-defined]
RESULT_ID = "r-" + "0" * 24
"""The id dispatch adds to every result: measured with it."""


class Pages:
    """One tool's work done once; `page(arguments)` answers a call with those arguments from it."""

    def __init__(self, module: Any, env: ToolEnv, base: dict[str, Any]) -> None:
        self.module, self.env, self.base = module, env, base
        done = module.run(parse_input(module.SPEC, base), env)
        self.work = done if isinstance(done, tuple) else (done,)

    def page(self, **arguments: Any) -> Any:
        args = parse_input(self.module.SPEC, {**self.base, **arguments})
        self.module.check(args)
        output = self.module.answer(args, *self.work)
        output.result_id = RESULT_ID
        size = len(text_of(output))
        assert size <= RESULT_BUDGET, (arguments, size)
        return output

    def every_page(self, rows: Callable[[Any], list[Any]], **arguments: Any) -> tuple[list[Any], Any]:
        """Follow next_cursor (and next_step, which must be that same call) to the end."""
        first = output = self.page(**arguments)
        found = list(rows(output))
        while output.next_cursor:
            assert output.next_step.arguments == {**arguments, "cursor": output.next_cursor} | {
                k: v for k, v in self.base.items() if k not in arguments
            }
            output = self.page(**arguments, cursor=output.next_cursor)
            assert rows(output), "a page always advances"
            found += rows(output)
        return found, first


def dumped(rows: list[Any]) -> list[str]:
    return [json.dumps(r.model_dump(mode="json") if hasattr(r, "model_dump") else r, sort_keys=True) for r in rows]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("budgets")
    build_upstream_history(root / "vllm", ["0.26.0", "0.27.0"], include=["vllm/"])
    assert PLUGINS is not None
    repo = snapshot_repo(PLUGINS / "vllm-ascend-7662ec925a.tar.gz", root / "fork")
    runtime = Runtime.create([str(root)], state_dir=str(tmp_path_factory.mktemp("budgets-state")))
    return {"root": root, "repo": str(repo.relative_to(root)), "runtime": runtime}


@pytest.fixture(scope="module")
def traced(workspace: dict[str, Any]) -> Pages:
    base = {
        "plugin_repo": workspace["repo"],
        "upstream": "vllm",
        "target": "v0.27.0",
        "base": "v0.26.0",
        "arch": "DeepseekV4ForCausalLM",
        "probe_ops": False,
    }
    return Pages(trace_tool, ToolEnv(runtime=workspace["runtime"], tool="trace_dependency"), base)


@pytest.fixture(scope="module")
def compared(workspace: dict[str, Any]) -> Pages:
    base = {
        "plugin_repo": workspace["repo"],
        "upstream": "vllm",
        "target": "v0.27.0",
        "paths": ["vllm_ascend/models/"],
        "releases": ["v0.26.0", "v0.27.0"],
    }
    return Pages(diff_tool, ToolEnv(runtime=workspace["runtime"], tool="diff_model"), base)


def test_the_trace_summary_holds_every_defect_and_names_the_next_call(traced: Pages) -> None:
    summary = traced.page()
    trace = traced.work[0]
    assert summary.section == "summary" and not summary.inventory
    # the snapshot has defects (imports 0.27.0 breaks); each is listed, or the rest is one call away
    assert summary.counts["defects"] == len(trace.findings.defects) > 0
    assert summary.defects
    step = summary.next_step
    if len(summary.defects) < summary.counts["defects"]:
        assert step.arguments["section"] == "defects" and step.arguments["cursor"]
        rest, _ = traced.every_page(
            lambda o: o.defects, **{k: v for k, v in step.arguments.items() if k not in traced.base}
        )
        assert dumped(summary.defects + rest) == dumped(trace_tool._section_rows("defects", "changes", trace))
    else:
        assert step.arguments == {**traced.base, "section": "inventory"}
    # boundaries: one entry per kind and side, counted
    assert len({(b.kind, b.side) for b in summary.boundaries}) == len(summary.boundaries) > 1
    assert sum(b.count for b in summary.boundaries) == summary.counts["boundaries"]
    assert summary.counts["inventory.changes"] < summary.counts["inventory"]
    # the named call succeeds
    after = traced.page(**{k: v for k, v in step.arguments.items() if k not in traced.base})
    assert after.section == step.arguments["section"]


@pytest.mark.parametrize("section", [s for s in SECTIONS if s != "summary"])
def test_every_trace_section_pages_within_the_budget_to_the_end(traced: Pages, section: Section) -> None:
    trace = traced.work[0]
    views = ("changes", "full") if section in ("inventory", "boundaries") else (None,)
    for view in views:
        chosen = {"view": view} if view else {}
        for limit in (None, trace_tool.MAX_LIMIT):
            paging = {"limit": limit} if limit else {}
            found, first = traced.every_page(lambda o: getattr(o, section), section=section, **chosen, **paging)
            expected = trace_tool._section_rows(section, view or "changes", trace)
            assert dumped(found) == dumped(expected), (section, view, limit)
            assert first.total == len(expected)
            assert not first.boundaries or section == "boundaries"


def test_the_full_inventory_no_longer_comes_in_one_oversized_page(traced: Pages) -> None:
    page = traced.page(section="inventory", view="full", limit=1000)
    assert page.total == page.counts["inventory"] > len(page.inventory) and page.next_cursor


def test_trace_refuses_what_a_combination_would_ignore(traced: Pages) -> None:
    for arguments, words in [
        ({"section": "summary", "limit": 5}, "sized to fit"),
        ({"section": "summary", "cursor": "abc"}, "sized to fit"),
        ({"section": "defects", "view": "full"}, "view chooses"),
        ({"symbol": "vllm.config"}, "consumers"),
        ({"probe_ops": False, "python": "/usr/bin/python3"}, "probe_ops=true"),
        ({"direction": "consumers", "symbol": "vllm.config", "section": "ops"}, "runs no checks"),
    ]:
        with pytest.raises(ToolFailure, match=words):
            traced.page(**arguments)
    with pytest.raises(ToolFailure, match="limit"):  # the schema maximum, before any work
        parse_input(trace_tool.SPEC, {**traced.base, "section": "inventory", "limit": 100000})


def test_the_default_trace_call_fits_through_dispatch(workspace: dict[str, Any], traced: Pages) -> None:
    env = ToolEnv(runtime=workspace["runtime"], tool="trace_dependency")
    output = anyio.run(lambda: invoke(trace_tool.SPEC, traced.base, env))
    assert len(text_of(output)) <= RESULT_BUDGET and output.section == "summary" and output.next_step


@pytest.mark.parametrize("detail", ["summary", "symbols", "releases"])
def test_every_pair_detail_pages_within_the_budget_to_the_end(compared: Pages, detail: str) -> None:
    comparison = compared.work[0]
    locals_ = [p.local for p in comparison.pairing.pairs]
    for limit in (None, diff_tool.MAX_PAIRS):
        paging = {"limit": limit} if limit else {}
        found: list[Any] = []
        output = first = compared.page(detail=detail, **paging)
        found += output.pairs
        while output.next_cursor:
            output = compared.page(detail=detail, cursor=output.next_cursor, **paging)
            assert output.pairs and not output.target_only and not output.families  # first page only
            found += output.pairs
        assert [p.local for p in found] == locals_ and first.total == len(locals_)
        assert first.target_only and first.families


def test_the_summary_names_the_diff_of_a_changed_pair_and_the_diff_is_plain_text(compared: Pages) -> None:
    summary = compared.page()
    step = summary.next_step
    assert step.tool == "diff_model" and step.arguments["detail"] == "diff"
    changed = {p.local for p in compared.work[0].pairing.pairs if p.status.value == "changed"}
    assert step.arguments["file"] in changed
    arguments = {k: v for k, v in step.arguments.items() if k not in compared.base}
    first = compared.page(**arguments)
    text = text_of(first)
    head, _, body = text.partition("\n")
    assert json.loads(head)["pairs"][0]["local"] == step.arguments["file"]
    assert body == first.diff and body.startswith("--- a/")


def test_every_diff_pages_within_the_budget_and_loses_no_line(compared: Pages) -> None:
    comparison = compared.work[0]
    pairs = [p for p in comparison.pairing.pairs if p.status.value == "changed"]
    biggest = max(pairs, key=lambda p: len(comparison.describer.diff_lines(p)))
    for limit in (None, diff_tool.MAX_DIFF_LINES, 7):
        paging = {"limit": limit} if limit else {}
        output = compared.page(detail="diff", file=biggest.local, **paging)
        assert output.pairs  # the pair and its symbols: first page only
        text = output.diff
        while output.next_cursor:
            output = compared.page(detail="diff", file=biggest.local, cursor=output.next_cursor, **paging)
            assert not output.pairs
            text += output.diff
        assert text.splitlines() == comparison.describer.diff_lines(biggest)


def test_the_matrix_pages_within_the_budget_to_the_end(compared: Pages) -> None:
    for limit in (None, diff_tool.MAX_ROWS):
        paging = {"limit": limit} if limit else {}
        output = first = compared.page(detail="matrix", **paging)
        keys = [(r.local, r.symbol) for r in output.matrix]
        while output.next_cursor:
            output = compared.page(detail="matrix", cursor=output.next_cursor, **paging)
            keys += [(r.local, r.symbol) for r in output.matrix]
        assert len(keys) == len(set(keys)) == first.total == sum(first.matrix_counts.values())


def test_diff_model_refuses_what_a_combination_would_ignore(compared: Pages) -> None:
    with pytest.raises(ToolFailure, match="only used with detail=diff"):
        compared.page(file="vllm_ascend/models/deepseek_v4.py")
    with pytest.raises(ToolFailure, match="at most 500"):
        compared.page(detail="symbols", limit=4000)
    with pytest.raises(ToolFailure, match="limit"):
        parse_input(diff_tool.SPEC, {**compared.base, "limit": 100000})
