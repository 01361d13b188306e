"""Tool `export_snapshot`: write one subject (e.g. the staged index) to a directory for import or tests."""

from __future__ import annotations

import json

from pydantic import Field

from ..core.foundation.atomic import EXPORT_MARKER, staged_directory
from ..core.foundation.errors import bad_input
from ..core.foundation.policy import Effect
from .arguments import SubjectArgs, open_plugin_repo, open_plugin_subject
from .spec import ToolEnv, ToolOutput, ToolSpec


class ExportInput(SubjectArgs):
    output: str = Field(description="New directory strictly inside an output root that receives the snapshot.")
    prefix: str = Field(default="", description="Only paths under this repository-relative prefix (e.g. vllm_metax/).")
    overwrite: bool = Field(
        default=False,
        description="Replace an earlier output of this server (a directory carrying its marker that the server's state "
        "directory recorded writing, holding no git repository and no file a repository tracks, not a read root, "
        "output root or protected path) — only once the new copy is complete.",
    )


class ExportOutput(ToolOutput):
    subject: str = ""
    tree_hash: str = Field(default="", description="Identity of the exported subject, comparable across subjects.")
    files: int = Field(default=0, description="Files of the subject written (the marker not counted).")
    output: str = ""
    marker: str = Field(
        default=EXPORT_MARKER,
        description="The one file added beside the subject's files: names this server's export, so overwrite=true may "
        "replace it later.",
    )


def export_snapshot(args: ExportInput, env: ToolEnv) -> ExportOutput:
    """Export a subject of the plugin repository — typically the staged index — to a fresh directory,
    so code can be imported or tested from exactly that snapshot (put the directory first on PYTHONPATH).

    The repository itself is never touched; the output appears whole or not at all. The files are
    exactly the subject's, plus one small hidden marker (`.vllm-metax-mcp-export.json`: tool, subject,
    tree hash), which the server's state directory records, so overwrite=true recognises its own earlier
    export (a marker alone, e.g. one a repository commits, is not enough); overwrite never replaces
    anything else (a git repository, a read root, an output root, a protected path, the state directory,
    a tree holding one, or files a repository tracks).
    """
    repo = open_plugin_repo(args, env)
    subject = open_plugin_subject(args, env, repo)
    target = env.policy.writable(args.output, overwrite=args.overwrite)
    tree_hash = subject.tree_hash()
    shown = env.policy.display(args.output)
    with staged_directory(target, replace=args.overwrite, shown=shown, policy=env.policy) as staging:
        count = subject.export(staging, args.prefix)
        marker = staging / EXPORT_MARKER
        if marker.exists():
            raise bad_input(
                f"the subject holds a file named {EXPORT_MARKER}, the name of this server's export marker; export a "
                "prefix without it."
            )
        document = {
            "format": "vllm-metax-mcp/export/1",
            "tool": "export_snapshot",
            "subject": subject.label,
            "tree_hash": tree_hash,
            "prefix": args.prefix,
            "files": count,
        }
        marker.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return ExportOutput(subject=subject.label, tree_hash=tree_hash, files=count, output=args.output)


SPEC = ToolSpec(
    name="export_snapshot",
    effect=Effect.WRITES,
    run=export_snapshot,
    input_model=ExportInput,
    output_model=ExportOutput,
    title="Export a subject snapshot",
    idempotent=False,
    destructive=True,  # overwrite=true replaces an earlier export
)
