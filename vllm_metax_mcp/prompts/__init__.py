"""Prompt templates for the upgrade, review, trim and smoke-test workflows.

Each prompt names the tools in order and the rules that apply, and fills in what the
environment record already knows (interpreter, upstream, target, confirmation, instruction
files) so the agent does not ask the user again. Templates are markdown files beside this
module; tool mentions follow the guides' convention and are checked against the real schemas.

Arguments are declared with descriptions (the SDK lists them from the signature) and checked
before rendering: a missing, unknown or malformed argument answers JSON-RPC invalid params
(-32602) naming the argument, never an internal error.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources as package_files
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.prompts.base import Message, Prompt
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, InputRequiredResult
from pydantic import Field, ValidationError

from ..core.foundation.errors import ToolFailure
from ..core.sources.environment import load_record
from ..core.sources.git import open_repository
from ..tools.spec import Runtime


def template(name: str) -> str:
    return package_files.files(__package__).joinpath(f"{name}.md").read_text(encoding="utf-8")


def known_environment(runtime: Runtime, plugin_repo: str) -> str:
    """What the environment record says, as lines for a prompt (or how to create it)."""
    try:
        record = load_record(runtime.store, open_repository(plugin_repo, runtime.policy))
    except ToolFailure as failure:
        return f"- No environment record: {failure.message}"
    if record is None:
        return (
            "- No environment record yet: call `environment(action=establish, plugin_repo, subject, upstream, "
            "target, python)` first, then ask the user to confirm the upstream and target."
        )
    upstream = record.upstream
    modules = record.probe.modules
    versions = ", ".join(f"{name} {info.version or 'not importable'}" for name, info in sorted(modules.items()))
    confirmation = record.confirmation
    lines = [
        f"- Interpreter: {record.python} ({versions})",
        f"- Runtime imports vllm_metax from: {record.runtime_source}",
        f"- Upstream: {upstream.path if upstream else 'none recorded'}"
        + (f" at {upstream.target} ({upstream.target_commit[:12]})" if upstream and upstream.target_commit else ""),
        "- Target confirmed: "
        + (
            f"yes, by the {confirmation.confirmed_by}; do not ask again"
            if confirmation
            else "no: ask the user once, then `environment(action=confirm, upstream, target)`"
        ),
    ]
    if record.instruction_files:
        lines.append("- Read first: " + ", ".join(record.instruction_files))
    return "\n".join(lines)


class CheckedPrompt(Prompt):
    """A prompt whose bad arguments are the caller's error (invalid params), named precisely."""

    async def render(self, arguments: dict[str, Any] | None, context: Any) -> list[Message] | InputRequiredResult:
        given = dict(arguments or {})
        declared = {argument.name: argument for argument in self.arguments or []}
        problems = [f"{name}: required" for name, arg in declared.items() if arg.required and name not in given]
        problems += [f"{name}: not an argument of {self.name}" for name in sorted(set(given) - set(declared))]
        if not problems:
            try:
                return await super().render(given, context)
            except ValueError as exc:
                if not isinstance(exc.__cause__, ValidationError):
                    raise
                problems = [_problem(error) for error in exc.__cause__.errors()]
        expected = ", ".join(f"{n}{'' if a.required else '?'}" for n, a in declared.items())
        raise MCPError(INVALID_PARAMS, f"Invalid arguments for prompt {self.name} ({expected}): {'; '.join(problems)}.")


def _problem(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "arguments"
    return f"{where}: {error['msg']} (got {error['input']!r})" if "input" in error else f"{where}: {error['msg']}"


PluginRepo = Annotated[str, Field(description="vLLM-MetaX repository (relative to the first --root).")]


def _add(server: MCPServer, function: Callable[..., str], title: str) -> None:
    server.add_prompt(CheckedPrompt.from_function(function, name=function.__name__, title=title))


def register_prompts(server: MCPServer, runtime: Runtime) -> None:
    def upgrade_model(
        models: Annotated[str, Field(description="Architecture names, comma-separated (e.g. DeepseekV3ForCausalLM).")],
        target: Annotated[str, Field(description="Upstream revision (tag or commit); default: the record's.")] = "",
        plugin_repo: PluginRepo = ".",
    ) -> str:
        """Upgrade plugin models to a target upstream release: the tools in order, with what the record knows."""
        return template("upgrade_model").format(
            models=models,
            target=target or "the recorded target",
            plugin_repo=plugin_repo,
            environment=known_environment(runtime, plugin_repo),
        )

    def review_upgrade(
        subject: Annotated[
            Literal["index", "worktree", "installed"],
            Field(description="Code reviewed: index (staged, before a commit), worktree, or installed."),
        ] = "index",
        plugin_repo: PluginRepo = ".",
    ) -> str:
        """Review an upgrade read-only: pairs, commits, dependencies and the checks still open."""
        return template("review_upgrade").format(
            subject=subject, plugin_repo=plugin_repo, environment=known_environment(runtime, plugin_repo)
        )

    def trim_model(
        source: Annotated[str, Field(description="Checkpoint directory to trim (config.json inside).")],
        goal: Annotated[str, Field(description="Features or paths to keep; default: every distinct path.")] = "",
        output_mode: Annotated[
            Literal["dummy", "real"], Field(description="dummy: config and assets only; real: copy the weights too.")
        ] = "dummy",
    ) -> str:
        """Trim a checkpoint into a small model that keeps every execution path, then smoke-test it."""
        return template("trim_model").format(source=source, goal=goal or "every distinct path", output_mode=output_mode)

    def smoke_test(
        model: Annotated[str, Field(description="Model directory to serve (e.g. a trim_model output).")],
        tp: Annotated[int, Field(ge=1, le=64, description="Tensor-parallel size (devices per pipeline stage).")] = 1,
        pp: Annotated[int, Field(ge=1, le=64, description="Pipeline-parallel size (stages).")] = 1,
        plugin_repo: PluginRepo = ".",
    ) -> str:
        """Smoke-test a (trimmed) model on a real vLLM server and read its verdict and evidence."""
        return template("smoke_test").format(
            model=model, tp=tp, pp=pp, environment=known_environment(runtime, plugin_repo)
        )

    _add(server, upgrade_model, "Upgrade plugin models to a target upstream release")
    _add(server, review_upgrade, "Review an upgrade (read-only)")
    _add(server, trim_model, "Trim a checkpoint into a small model that keeps every path")
    _add(server, smoke_test, "Smoke-test a (trimmed) model on a real vLLM server")
