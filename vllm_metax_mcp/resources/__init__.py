"""The guides an agent reads (markdown shipped with the package) and the server's records as
read-only resources.

Guides name tools as `tool(argument, argument=value)` and output fields as `tool.field`; a test
checks every such mention against the tools' real schemas, so the guides cannot drift from the
tools they describe.

A record is sent as compact JSON when it fits the result budget (RESULT_BUDGET chars, like a tool
result); a larger one (a ledger of a real fork) is sent in pages of `[path, value]` rows, read with
the template's `?cursor=` parameter (`next` in each page is the URI of the following one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources as package_files
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.resources import TextResource

from ..core.audit.ledger import ledger_path
from ..core.foundation.errors import ToolFailure
from ..core.foundation.jobs import FINAL_STATES, poll_after, progress_message
from ..core.foundation.results import (
    CURSOR_RESERVE,
    RESULT_BUDGET,
    SizeBudget,
    inputs_fingerprint,
    load_result,
    paginate,
)
from ..tools.spec import Runtime

SCHEME = "vllm-metax"


@dataclass(frozen=True)
class Guide:
    slug: str
    title: str
    description: str

    @property
    def uri(self) -> str:
        return f"{SCHEME}://guides/{self.slug}"

    def text(self) -> str:
        return package_files.files(__package__).joinpath(f"{self.slug}.md").read_text(encoding="utf-8")


GUIDES: tuple[Guide, ...] = (
    Guide(
        "upgrade-workflow",
        "Upgrade workflow",
        "Steps of a model upgrade, the tool for each, evidence, boundaries, when to stop.",
    ),
    Guide(
        "common-rules",
        "Common rules",
        "Environment record, confirmation, subjects, review mode, evidence, errors, jobs.",
    ),
    Guide(
        "review-cases",
        "Review cases",
        "Investigation prompts per model family: what to check and which tool answers it.",
    ),
    Guide(
        "checkpoint-structure",
        "Checkpoint structure",
        "How real checkpoints lay out backbone, MTP, arrays, rules, id lists and quantization.",
    ),
    Guide(
        "real-weight-trim",
        "Real-weight trims",
        "Source checks, raw byte copy, renaming, verification, reproducible script, load validation.",
    ),
)


def _hex_id(value: str, prefix: str) -> str:
    body = value[len(prefix) :] if value.startswith(prefix) else ""
    if not body or not all(c in "0123456789abcdef" for c in body):
        raise ResourceError(f"{value!r} is not a {prefix}… id of this server.")
    return value


ROW_SPLIT = 2_000
"""A container whose compact JSON is longer than this is sent as its entries, one row each (recursively)."""
MAX_ROWS = 100_000
PAGED = " Larger than one result: pages of [path, value] rows, next page at `next` (?cursor=)."


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _rows(value: Any, path: list[Any]) -> list[list[Any]]:
    """The document as [path, value] rows: a big container becomes its entries, a small one stays whole."""
    if isinstance(value, (dict, list)) and value and len(_compact(value)) > ROW_SPLIT:
        items = sorted(value.items()) if isinstance(value, dict) else enumerate(value)
        return [row for key, item in items for row in _rows(item, [*path, key])]
    if isinstance(value, str) and len(_compact(value)) > RESULT_BUDGET // 2:
        value = _cut(value, RESULT_BUDGET // 2)
    return [[path, value]]


def _cut(text: str, chars: int) -> str:
    """`text` shortened until its JSON form (escapes count: a control character is six) fits `chars`."""
    kept = text
    while len(_compact(kept)) > chars:
        kept = kept[: min(len(kept) - 1, len(kept) * chars // len(_compact(kept)))]
    return kept + f"…[{len(text) - len(kept)} chars cut]"


def paged_json(document: object | None, what: str, uri: str, cursor: str) -> str:
    """The record as compact JSON when it fits one result, else the page of its rows `cursor` names (the first
    page without one): top-level fields first, then the entries of the big containers in key order."""
    if document is None:
        raise ResourceError(f"No {what} with that id in this server's state directory.")
    whole = _compact(document)
    if len(whole) <= RESULT_BUDGET and not cursor:
        return whole
    rows = sorted(_rows(document, []), key=lambda row: len(row[0]) > 1)
    envelope = {"uri": uri, "rows": [], "total": len(rows), "offset": len(rows), "next_cursor": "", "next": uri}
    room = RESULT_BUDGET - len(_compact(envelope)) - 2 * CURSOR_RESERVE
    try:
        page = paginate(
            rows,
            cursor=cursor or None,
            limit=MAX_ROWS,
            fingerprint=inputs_fingerprint("resource", {"uri": uri}),
            default_limit=MAX_ROWS,
            max_limit=MAX_ROWS,
            budget=SizeBudget(size_of=lambda row: len(_compact(row)), chars=room),
        )
    except ToolFailure as failure:
        raise ResourceError(f"{failure.message} ({uri})") from None
    envelope.update(rows=page.items, offset=page.offset)
    if page.next_cursor:
        envelope.update(next_cursor=page.next_cursor, next=f"{uri}?cursor={page.next_cursor}")
    else:
        del envelope["next_cursor"], envelope["next"]
    return _compact(envelope)


def register_resources(server: MCPServer, runtime: Runtime) -> None:
    """The guides as static resources, the server's records as templates read from its state directory."""
    for guide in GUIDES:
        server.add_resource(
            TextResource(
                uri=guide.uri,
                name=guide.slug,
                title=guide.title,
                description=guide.description,
                mime_type="text/markdown",
                text=guide.text(),
            )
        )
    _register_records(server, runtime)


def _register_records(server: MCPServer, runtime: Runtime) -> None:
    store = runtime.store

    @server.resource(
        f"{SCHEME}://environments/{{record_id}}{{?cursor}}",
        name="environment-record",
        mime_type="application/json",
        description="An environment record (record_id from environment.record_id)." + PAGED,
    )
    def environment_record(record_id: str, cursor: str = "") -> str:
        if len(record_id) != 16 or not all(c in "0123456789abcdef" for c in record_id):
            raise ResourceError(f"{record_id!r} is not an environment record id (16 hex digits).")
        document = store.read(f"environments/{record_id}.json")
        return paged_json(document, "environment record", f"{SCHEME}://environments/{record_id}", cursor)

    @server.resource(
        f"{SCHEME}://jobs/{{job_id}}{{?cursor}}",
        name="job-status",
        mime_type="application/json",
        description="A job's status, progress, message and poll_after_s; its result once finished." + PAGED,
    )
    def job_status(job_id: str, cursor: str = "") -> str:
        status = store.read(f"jobs/{_hex_id(job_id, 'j-')}/status.json")
        if status is not None and status.get("status") not in FINAL_STATES:
            status = {**status, "message": progress_message(status), "poll_after_s": poll_after(status)}
        return paged_json(status, "job", f"{SCHEME}://jobs/{job_id}", cursor)

    @server.resource(
        f"{SCHEME}://smoke/{{run_id}}{{?cursor}}",
        name="smoke-evidence",
        mime_type="application/json",
        description="The evidence record of a smoke test (run_id from run_smoke_test.run_id)." + PAGED,
    )
    def smoke_evidence(run_id: str, cursor: str = "") -> str:
        document = store.read(f"smoke/{_hex_id(run_id, 's-')}/evidence.json")
        return paged_json(document, "smoke-test run", f"{SCHEME}://smoke/{run_id}", cursor)

    @server.resource(
        f"{SCHEME}://results/{{result_id}}{{?cursor}}",
        name="tool-result",
        mime_type="application/json",
        description="The inputs and output of an earlier tool result (cite it as tool_result evidence)." + PAGED,
    )
    def tool_result(result_id: str, cursor: str = "") -> str:
        document = load_result(store, _hex_id(result_id, "r-"))
        return paged_json(document, "result", f"{SCHEME}://results/{result_id}", cursor)

    @server.resource(
        f"{SCHEME}://ledgers/{{ledger_id}}{{?cursor}}",
        name="audit-ledger",
        mime_type="application/json",
        description="An audit_commits ledger (ledger_id from audit_commits.ledger_id): decisions, baseline, "
        "annotations." + PAGED,
    )
    def audit_ledger(ledger_id: str, cursor: str = "") -> str:
        if len(ledger_id) != 24 or not set(ledger_id) <= set("0123456789abcdef"):
            raise ResourceError(f"{ledger_id!r} is not a ledger id (24 hex digits).")
        return paged_json(store.read(ledger_path(ledger_id)), "ledger", f"{SCHEME}://ledgers/{ledger_id}", cursor)
