"""Tool `port_model`: the forked files merged onto the target release, verified, written to a new
directory (never into the repository)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ..core.compare.inputs import target_label
from ..core.compare.releases import MAX_RELEASES
from ..core.foundation.atomic import PORT_REPORT
from ..core.foundation.policy import Effect
from ..core.foundation.results import RESULT_BUDGET
from ..core.port.port import FilePort, FileStatus, PortRequest, port_files
from ..core.port.report import MARKDOWN, PATCH, report_document, summary, write_port
from .arguments import UpstreamArgs, open_plugin_repo, open_plugin_subject, open_upstream
from .output import size_of
from .spec import ToolEnv, ToolOutput, ToolSpec

ATTENTION_FIRST: dict[FileStatus, int] = {"unverified": 0, "parse_error": 1, "conflicts": 2, "no_base": 3}


class PortModelInput(UpstreamArgs):
    output: str = Field(description="New dir in an output root.")
    releases: list[str] = Field(
        min_length=1, max_length=MAX_RELEASES, description="Base candidates (tags, dirs), oldest first."
    )
    paths: list[str] = Field(default_factory=lambda: ["vllm_metax/models/"], max_length=256)
    mapping_overrides: dict[str, str | None] = Field(default_factory=dict, max_length=256)
    bases: dict[str, str] = Field(default_factory=dict, max_length=256, description="Plugin path -> base.")
    overwrite: bool = False


class PortedFile(BaseModel):
    local: str
    status: FileStatus
    base: str | None = None
    conflicts: int = 0
    contract_applied: int = 0
    problems: list[str] = Field(default_factory=list)


class PortModelOutput(ToolOutput):
    output: str = ""
    report: str = Field(default="", description=f"Every decision; {MARKDOWN}, {PATCH} beside.")
    summary: dict[str, int | dict[str, int]] = Field(default_factory=dict)
    files: list[PortedFile] = Field(default_factory=list, description="Needing attention first.")
    more: int = Field(default=0, description="Files only in the report.")


def _problems(file: FilePort) -> list[str]:
    check = file.verification
    if check is None:
        return [file.note] if file.note and file.status in ATTENTION_FIRST else []
    if not check.parses:
        return [f"does not parse: {check.error}"]
    named = [*check.unresolved, *(f"used before bound: {x}" for x in check.used_before_bound)]
    named += [f"undefined: {x}" for x in check.undefined]
    named += [f"unaccounted {k}" for k in check.unaccounted]
    named += [f"lost local: {line}" for line in check.lost_local] + [f"lost upstream: {x}" for x in check.lost_upstream]
    return named[:3]


def _listed(files: list[FilePort], output: PortModelOutput) -> PortModelOutput:
    """The files, those needing attention first, as many as the result budget holds."""
    ordered = sorted(files, key=lambda f: (ATTENTION_FIRST.get(f.status, 9), f.local))
    for file in ordered:
        merge = file.merge
        row = PortedFile(
            local=file.local,
            status=file.status,
            base=file.base,
            conflicts=len(merge.conflicts) if merge else 0,
            contract_applied=len(merge.applied) if merge else 0,
            problems=_problems(file),
        )
        if size_of(output) + size_of(row) + 100 > RESULT_BUDGET:
            break
        output.files.append(row)
    output.more = len(files) - len(output.files)
    return output


def port_model(args: PortModelInput, env: ToolEnv) -> PortModelOutput:
    """Merge forks onto the target per symbol (base: closest release), MetaX deltas re-applied,
    conflicts kept both ways, all verified; writes a new dir + port_report.json."""
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    path = env.policy.writable(args.output, overwrite=args.overwrite)
    request = PortRequest(args.paths, args.mapping_overrides, args.releases, args.bases)
    port = port_files(plugin, upstream, request, env.policy, env.store)
    head = {"target": target_label(upstream, mapping), "subject": plugin.label}
    document = report_document(port, head)
    write_port(port, document, path, args.overwrite, env.policy.display(args.output), env.policy)
    output = PortModelOutput(output=args.output, report=f"{args.output.rstrip('/')}/{PORT_REPORT}")
    output.summary = summary(port)
    return _listed(port.files, output)


SPEC = ToolSpec(
    name="port_model",
    effect=Effect.WRITES,
    run=port_model,
    input_model=PortModelInput,
    output_model=PortModelOutput,
    title="Merge forked model files onto the target release (structural three-way, verified)",
    idempotent=False,
    destructive=True,
    cpu_heavy=True,
)
