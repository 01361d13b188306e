"""Prompt templates for the upgrade, review, trim and smoke-test workflows.

Each prompt names the tools in order and the rules that apply, and fills in what the
environment record already knows (interpreter, upstream, target, confirmation, instruction
files) so the agent does not ask the user again. Templates are markdown files beside this
module; tool mentions follow the guides' convention and are checked against the real schemas.
"""

from __future__ import annotations

from importlib import resources as package_files

from mcp.server.mcpserver import MCPServer

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


def register_prompts(server: MCPServer, runtime: Runtime) -> None:
    @server.prompt(name="upgrade_model", title="Upgrade plugin models to a target upstream release")
    def upgrade_model(models: str, target: str = "", plugin_repo: str = ".") -> str:
        """models: architecture names (comma-separated); target: upstream revision (default: the record's)."""
        return template("upgrade_model").format(
            models=models,
            target=target or "the recorded target",
            plugin_repo=plugin_repo,
            environment=known_environment(runtime, plugin_repo),
        )

    @server.prompt(name="review_upgrade", title="Review an upgrade (read-only)")
    def review_upgrade(subject: str = "index", plugin_repo: str = ".") -> str:
        """subject: index (staged, the usual review before a commit), worktree or revision."""
        return template("review_upgrade").format(
            subject=subject,
            plugin_repo=plugin_repo,
            environment=known_environment(runtime, plugin_repo),
        )

    @server.prompt(name="trim_model", title="Trim a checkpoint into a small model that keeps every path")
    def trim_model(source: str, goal: str = "", output_mode: str = "dummy") -> str:
        """source: checkpoint directory; goal: features or paths to keep; output_mode: dummy or real."""
        return template("trim_model").format(source=source, goal=goal or "every distinct path", output_mode=output_mode)

    @server.prompt(name="smoke_test", title="Smoke-test a (trimmed) model on a real vLLM server")
    def smoke_test(model: str, tp: int = 1, pp: int = 1, plugin_repo: str = ".") -> str:
        """model: model directory; tp/pp: parallelism."""
        return template("smoke_test").format(
            model=model,
            tp=tp,
            pp=pp,
            environment=known_environment(runtime, plugin_repo),
        )
