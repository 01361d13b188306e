"""The export action: the ledger as one document (files, decisions, commits without one, unaccounted
differences, baseline, annotations), written as JSON and markdown to the state directory."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from .counts import file_counts
from .ledger import write_text
from .recheck import Recheck
from .report import render_markdown
from .session import AuditSession


def export_document(session: AuditSession, check: Recheck) -> dict[str, Any]:
    """The export as JSON: what the markdown shows, and the stored items in full."""
    recorded = session.recorded()
    ledger = session.ledger or session.fresh
    baseline = ledger.get("baseline")
    listing = check.listing
    return {
        "ledger_id": session.ledger_id,
        "upstream": session.mapping.as_dict(),
        "summary": asdict(check.counts),
        "complete": check.complete,
        "files": [asdict(f) for f in file_counts(check.scope, listing, recorded)],
        "entries": sorted(ledger["entries"].values(), key=lambda e: (e["file"], e["commit"])),
        "local_entries": sorted(ledger.get("local_entries", {}).values(), key=lambda e: (e["file"], e["commit"])),
        "subjects": {sha: c.subject for sha, c in listing.commits.items()},
        "missing": [
            {"commit": c.sha, "subject": c.subject, "files": missing}
            for c in listing.ordered()
            if (missing := [f for f in listing.files_of(c.sha) if (c.sha, f) not in recorded])
        ],
        "unaccounted": [u.as_json() for u in check.unaccounted],
        "baseline": {
            "taken_at": baseline["taken_at"],
            "rows": len(baseline["rows"]),
            "classes": dict(Counter(r["proposed_class"] for r in baseline["rows"].values())),
        }
        if baseline
        else None,
        "annotations": sorted(ledger["annotations"].values(), key=lambda a: a["node"]),
        "unknowns": check.unknowns,
    }


@dataclass(frozen=True)
class Export:
    json_path: str
    """State-directory-relative paths of the two copies."""
    markdown_path: str
    document: dict[str, Any]
    markdown: str


def export(session: AuditSession, check: Recheck) -> Export:
    document = export_document(session, check)
    markdown = render_markdown(document)
    json_path, markdown_path = f"exports/{session.ledger_id}.json", f"exports/{session.ledger_id}.md"
    session.store.write(json_path, document)
    write_text(session.store, markdown_path, markdown)
    return Export(json_path, markdown_path, document, markdown)
