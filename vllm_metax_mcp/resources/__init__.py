"""The guides an agent reads (markdown shipped with the package) and the server's records as
read-only resources.

Guides name tools as `tool(argument, argument=value)` and output fields as `tool.field`; a test
checks every such mention against the tools' real schemas, so the guides cannot drift from the
tools they describe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources as package_files

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.resources import TextResource

from ..core.audit.ledger import ledger_path
from ..core.foundation.results import load_result
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


def _json(document: object | None, what: str) -> str:
    if document is None:
        raise ResourceError(f"No {what} with that id in this server's state directory.")
    return json.dumps(document, indent=1, sort_keys=True)


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
    @server.resource(
        f"{SCHEME}://environments/{{record_id}}",
        name="environment-record",
        mime_type="application/json",
        description="An environment record (record_id from environment.record_id).",
    )
    def environment_record(record_id: str) -> str:
        if len(record_id) != 16 or not all(c in "0123456789abcdef" for c in record_id):
            raise ResourceError(f"{record_id!r} is not an environment record id (16 hex digits).")
        return _json(runtime.store.read(f"environments/{record_id}.json"), "environment record")

    @server.resource(
        f"{SCHEME}://jobs/{{job_id}}",
        name="job-status",
        mime_type="application/json",
        description="Status, progress and (when finished) result of a job.",
    )
    def job_status(job_id: str) -> str:
        return _json(runtime.store.read(f"jobs/{_hex_id(job_id, 'j-')}/status.json"), "job")

    @server.resource(
        f"{SCHEME}://smoke/{{run_id}}",
        name="smoke-evidence",
        mime_type="application/json",
        description="The evidence record of a smoke test (run_id from run_smoke_test.run_id).",
    )
    def smoke_evidence(run_id: str) -> str:
        return _json(runtime.store.read(f"smoke/{_hex_id(run_id, 's-')}/evidence.json"), "smoke-test run")

    @server.resource(
        f"{SCHEME}://results/{{result_id}}",
        name="tool-result",
        mime_type="application/json",
        description="The inputs and output of an earlier tool result (cite it as tool_result evidence).",
    )
    def tool_result(result_id: str) -> str:
        return _json(load_result(runtime.store, _hex_id(result_id, "r-")), "result")

    @server.resource(
        f"{SCHEME}://ledgers/{{ledger_id}}",
        name="audit-ledger",
        mime_type="application/json",
        description="An audit_commits ledger (ledger_id from audit_commits.ledger_id): decisions, baseline, "
        "annotations.",
    )
    def audit_ledger(ledger_id: str) -> str:
        if len(ledger_id) != 24 or not set(ledger_id) <= set("0123456789abcdef"):
            raise ResourceError(f"{ledger_id!r} is not a ledger id (24 hex digits).")
        return _json(runtime.store.read(ledger_path(ledger_id)), "ledger")
