"""Tool `export_snapshot`: write one subject (e.g. the staged index) to a directory for import or tests."""

from __future__ import annotations

import json

from pydantic import Field

from ..core.foundation.atomic import EXPORT_MARKER, staged_directory
from ..core.foundation.errors import bad_input
from ..core.foundation.policy import Effect
from .arguments import SubjectArgs, open_plugin_repo, open_plugin_subject
from .spec import NextCall, ToolEnv, ToolOutput, ToolSpec


class ExportInput(SubjectArgs):
    output: str = Field(description="New dir in an output root")
    prefix: str = Field(default="", description="Path prefix")
    # overwrite: only a directory whose marker the state directory recorded writing, never a repository, a
    # root, a protected path or a tracked file (core/foundation/policy.py); replaced once the new copy is whole
    overwrite: bool = Field(default=False, description="Replace this server's own export")


class ExportOutput(ToolOutput):
    subject: str = ""
    tree_hash: str = Field(default="", description="Identity of the exported subject, comparable across subjects.")
    files: int = Field(default=0, description="Files of the subject written (the marker not counted).")
    output: str = ""
    marker: str = Field(default=EXPORT_MARKER, description="The one file added: names this export for overwrite.")


def export_snapshot(args: ExportInput, env: ToolEnv) -> ExportOutput:
    """Write a plugin subject (e.g. the staged index) to a new directory, atomically, plus a marker file."""
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
    return ExportOutput(
        subject=subject.label,
        tree_hash=tree_hash,
        files=count,
        output=args.output,
        next_step=NextCall(
            tool="diff_model",
            arguments={"plugin_repo": args.plugin_repo, "subject": "directory", "directory": args.output},
            why="Compare exactly this snapshot with upstream (or put it first on PYTHONPATH to import or test it).",
        ),
    )


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
