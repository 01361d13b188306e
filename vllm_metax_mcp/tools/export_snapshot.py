"""Tool `export_snapshot`: write one subject (e.g. the staged index) to a directory for import or tests."""

from __future__ import annotations

from pydantic import Field

from ..core.atomic import staged_directory
from ..core.policy import Effect
from .base import ToolEnv, ToolOutput, ToolSpec
from .common import SubjectArgs, open_plugin_repo, open_plugin_subject


class ExportInput(SubjectArgs):
    output: str = Field(description="New directory under an output root that receives the snapshot.")
    prefix: str = Field(default="", description="Only paths under this repository-relative prefix (e.g. vllm_metax/).")
    overwrite: bool = Field(default=False, description="Replace an existing output directory (only once the new copy is complete).")


class ExportOutput(ToolOutput):
    subject: str = ""
    tree_hash: str = Field(default="", description="Identity of the exported subject, comparable across subjects.")
    files: int = 0
    output: str = ""


def export_snapshot(args: ExportInput, env: ToolEnv) -> ExportOutput:
    """Export a subject of the plugin repository — typically the staged index — to a fresh directory,
    so code can be imported or tested from exactly that snapshot (put the directory first on PYTHONPATH).

    The repository itself is never touched; the output appears whole or not at all.
    """
    repo = open_plugin_repo(args, env)
    subject = open_plugin_subject(args, env, repo)
    target = env.policy.writable(args.output)
    with staged_directory(target, replace=args.overwrite) as staging:
        count = subject.export(staging, args.prefix)
    return ExportOutput(subject=subject.label, tree_hash=subject.tree_hash(), files=count, output=args.output)


SPEC = ToolSpec(
    name="export_snapshot",
    effect=Effect.WRITES,
    run=export_snapshot,
    input_model=ExportInput,
    output_model=ExportOutput,
    title="Export a subject snapshot",
    idempotent=False,
    destructive=False,
)
