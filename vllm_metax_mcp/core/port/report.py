"""What a port writes: the ported files under their plugin paths, `port_report.json` (the output's
marker: format first), `PORT_REPORT.md` and `port.patch` (the ported files against the subject's)."""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..foundation.atomic import PORT_REPORT, staged_directory
from ..foundation.policy import Policy
from .contract import Rule
from .port import FilePort, Port

FORMAT = "vllm-metax-mcp/port-report/1"
MARKDOWN = "PORT_REPORT.md"
PATCH = "port.patch"


def _rule(rule: Rule, path: str) -> dict[str, Any]:
    return {"kind": rule.kind, "upstream": rule.upstream, "local": rule.local, "evidence": f"{path}:{rule.line}"}


def _symbols(file: FilePort) -> dict[str, Any]:
    assert file.merge is not None
    by_action: dict[str, list[str]] = {}
    for decision in file.merge.decisions:
        shown = f"{decision.key} ({decision.why})" if decision.why else decision.key
        by_action.setdefault(decision.action, []).append(shown)
    return by_action


def file_document(file: FilePort) -> dict[str, Any]:
    """One file's entry: base used, decisions by action, conflicts, the contract and what was done with
    it, verification."""
    entry: dict[str, Any] = {"local": file.local, "upstream": file.upstream, "status": file.status}
    if file.note:
        entry["note"] = file.note
    if file.base:
        entry |= {"base": file.base, "base_why": file.base_why, "base_path": file.base_path}
        entry["upstream_changed"] = file.upstream_changed
    if file.merge is None or file.contract is None:
        return entry
    merge = file.merge
    applied: dict[tuple[str, str, str], list[str]] = {}
    for item in merge.applied:
        applied.setdefault((item.rule.kind, item.rule.upstream, item.rule.local), []).append(item.unit)
    entry["symbols"] = _symbols(file)
    entry["conflicts"] = [asdict(c) for c in merge.conflicts]
    entry["contract"] = {
        "rules": [_rule(r, file.local) for r in file.contract.rules],
        "applied": [
            {"kind": k[0], "upstream": k[1], "local": k[2], "units": sorted(set(u))} for k, u in applied.items()
        ],
        "not_applied": [{**_rule(s.rule, file.local), "unit": s.unit, "why": s.why} for s in merge.skipped],
    }
    if file.verification is not None:
        entry["verification"] = asdict(file.verification) | {"passed": file.verification.passed}
    return entry


def summary(port: Port) -> dict[str, Any]:
    statuses = Counter(f.status for f in port.files)
    written = port.written
    return {
        "files": len(port.files),
        "by_status": dict(sorted(statuses.items())),
        "written": len(written),
        "conflicts": sum(len(f.merge.conflicts) for f in written if f.merge),
        "parse": sum(1 for f in written if f.verification and f.verification.parses),
        "verified": sum(1 for f in written if f.verification and f.verification.passed),
        "contract_applied": sum(len(f.merge.applied) for f in written if f.merge),
    }


def report_document(port: Port, head: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        **head,
        "releases": port.releases,
        "summary": summary(port),
        "unknowns": port.unknowns,
        "files": [file_document(f) for f in port.files],
    }


def markdown(document: dict[str, Any]) -> str:
    numbers = document["summary"]
    lines = [
        "# Port report",
        "",
        f"Target: {document.get('target')}. Files: {numbers['files']}, written {numbers['written']}, "
        f"verified {numbers['verified']}, conflicts {numbers['conflicts']}.",
        "",
        "| file | status | base | conflicts | contract applied | verification |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for entry in document["files"]:
        check = entry.get("verification")
        verdict = "" if check is None else ("passed" if check["passed"] else _problems(check))
        applied = sum(len(a["units"]) for a in entry.get("contract", {}).get("applied", []))
        lines.append(
            f"| {entry['local']} | {entry['status']} | {entry.get('base') or ''} | "
            f"{len(entry.get('conflicts', []))} | {applied} | {verdict} |"
        )
    lines += ["", "Conflicts are in the files under `# <<<<<<< port_model conflict N` markers: the local lines are",
              "active, the target's commented above them. Every decision is in port_report.json."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _problems(check: dict[str, Any]) -> str:
    if not check["parses"]:
        return f"does not parse: {check['error']}"
    kinds = ("unresolved", "used_before_bound", "undefined", "unaccounted", "lost_local", "lost_upstream")
    parts = [f"{len(check[k])} {k.replace('_', ' ')}" for k in kinds if check[k]]
    return ", ".join(parts)


def patch(port: Port, original: dict[str, str]) -> str:
    """The ported files as a unified diff against the subject's (`original`: local path -> text)."""
    out: list[str] = []
    for file in port.written:
        assert file.merge is not None
        before, after = original[file.local].splitlines(True), file.merge.code.splitlines(True)
        out += difflib.unified_diff(before, after, f"a/{file.local}", f"b/{file.local}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


def write_port(port: Port, document: dict[str, Any], target: Path, replace: bool, shown: str, policy: Policy) -> None:
    """The whole output or nothing (staged, renamed into place)."""
    originals = {f.local: f.merge.measured["local"] for f in port.written if f.merge}
    with staged_directory(target, replace=replace, shown=shown, policy=policy) as staging:
        for file in port.written:
            assert file.merge is not None
            path = staging / file.local
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(file.merge.code, encoding="utf-8")
        (staging / PORT_REPORT).write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
        (staging / MARKDOWN).write_text(markdown(document))
        (staging / PATCH).write_text(patch(port, originals))
