"""The export as markdown: a compact disposition record a reviewer reads top to bottom (files,
decisions, commits without one, unaccounted differences, baseline, inventory annotations)."""

from __future__ import annotations

import time
from typing import Any


def _cell(value: Any) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _evidence(items: list[dict[str, Any]]) -> str:
    shown = []
    for item in items:
        kind = item["kind"]
        if kind == "file":
            shown.append(f"file {item['path']}:{item['line']}@{item['rev'][:12]}")
        elif kind == "commit":
            shown.append(f"commit {item['sha'][:12]}")
        elif kind == "tool_result":
            shown.append(f"result {item['result_id']}")
        elif kind == "probe":
            shown.append(f"probe {item['probe_id']}")
        elif kind == "test":
            shown.append(f"test {item['name']} {item['outcome']}")
        else:
            shown.append(f"note: {item['text']}")
    return "; ".join(shown)


def _head(document: dict[str, Any]) -> list[str]:
    summary = document["summary"]
    upstream = document["upstream"]
    lines = [
        f"# Upstream commit audit — ledger {document['ledger_id']}",
        "",
        f"- Upstream: `{upstream.get('target')}` ({(upstream.get('target_commit') or '')[:12]})",
        f"- Commits: {summary['total']} total, {summary['with_entry']} with an entry, "
        f"{summary['without_entry']} without",
        f"- Unaccounted differences: {len(document['unaccounted'])}",
        f"- Complete: {'yes' if document['complete'] else 'no'}",
        "",
        "## Files",
        "",
        "| plugin file | upstream at target | base | commits | with entry | without |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [
        f"| {_cell(f['local'])} | {_cell(f['upstream'] or '—')} | {_cell(f['base'] or '—')} | "
        f"{f['commits']} | {f['with_entry']} | {f['without_entry']} |"
        for f in document["files"]
    ]


def _decisions(document: dict[str, Any]) -> list[str]:
    subjects = document.get("subjects", {})
    return [
        "",
        "## Decisions",
        "",
        "| commit | subject | plugin file | disposition | local edit | interface | plugin symbols | evidence |",
        "|---|---|---|---|---|---|---|---|",
    ] + [
        f"| {e['commit'][:12]} | {_cell(subjects.get(e['commit'], ''))} | {_cell(e['file'])} | {e['disposition']} | "
        f"{'yes' if e['local_edit'] else 'no'} | {_cell(e['affected_interface'])} | {_cell(e['plugin_symbols'])} | "
        f"{_cell(_evidence(e['evidence']))} |"
        for e in document["entries"]
    ]


def _open_items(document: dict[str, Any]) -> list[str]:
    lines = ["", "## Commits without an entry", ""]
    lines += [f"- {m['commit'][:12]} {_cell(m['subject'])} — {_cell(m['files'])}" for m in document["missing"]] or [
        "- none"
    ]
    lines += ["", "## Unaccounted differences", ""]
    lines += [
        f"- {_cell(u['local'])} `{u['symbol']}` ({u['change']}, {u['proposed_class']}): {_cell(u['reason'])}"
        for u in document["unaccounted"]
    ] or ["- none"]
    return lines


def _baseline_and_annotations(document: dict[str, Any]) -> list[str]:
    baseline = document.get("baseline")
    lines = ["", "## Baseline", ""]
    if baseline:
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(baseline["taken_at"]))
        classes = ", ".join(f"{k} {v}" for k, v in sorted(baseline["classes"].items()))
        lines.append(f"- taken {taken} UTC, {baseline['rows']} rows: " + classes)
    else:
        lines.append("- none taken")
    lines += ["", "## Inventory annotations", ""]
    lines += [
        f"- `{a['node']}`: {a['disposition']} — {_cell(_evidence(a['evidence']))}" for a in document["annotations"]
    ] or ["- none"]
    return lines


def render_markdown(document: dict[str, Any]) -> str:
    """The export document (`core/audit/export.py`) as markdown."""
    lines = _head(document) + _decisions(document) + _open_items(document) + _baseline_and_annotations(document)
    return "\n".join(lines) + "\n"
