"""The MCP server: tool registration from the tool list, and the policy middleware."""

from __future__ import annotations

import inspect
import json
import logging
from contextvars import ContextVar
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import (
    AcceptedElicitation,
    Context,
    Elicit,
    ElicitationResult,
    MCPServer,
    Resolve,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from mcp_types import Tool as MCPTool
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from .. import __version__
from ..core.foundation.errors import ErrorCode, ToolFailure
from ..core.foundation.policy import Effect
from ..prompts import register_prompts
from ..resources import register_resources
from ..tools import ALL_TOOLS, served_tools
from ..tools.dispatch import invoke, parse_input
from ..tools.output import sent
from ..tools.spec import Runtime, ToolEnv, ToolSpec, UserAnswer
from .schemas import input_schema, output_schema

log = logging.getLogger("vllm_metax_mcp")

REVIEW_MODE_RPC_CODE = -32003
"""JSON-RPC error code for a *writes* tool called in review mode (data.code is "review_mode")."""

_CLIENT_ARGUMENTS: ContextVar[frozenset[str] | None] = ContextVar("client_arguments", default=None)
"""The argument names of the tools/call being handled, as the client sent them."""

ANSWER_PARAMETER = "user_answer"
NOT_ASKED = "not_asked"

INSTRUCTIONS = """\
Tools for upgrading vLLM-MetaX model code to a newer upstream vLLM and for trimming checkpoints.
Start with `environment` (action=show, then establish) to record the plugin repository
(`plugin_repo`, relative to the first --root), the upstream source, the target revision and the
interpreter; later tools reuse that record (`upstream`/`target` arguments override it).
`subject` says which plugin code a tool reads: worktree (files on disk), index (the staged
snapshot), revision (with `revision`: a commit, tag or branch), directory (with `directory`: a plain
source tree) or installed (where the recorded interpreter imports vllm_metax from).
In review mode (--mode review) tools that write files are not offered and nothing in the reviewed
repository changes. Results are compact JSON of at most 20,000 characters: a longer list is paged
(pass `next_cursor` back as `cursor`), and `next_step` names the call to make next. Long work
answers with a job: poll it with `jobs` after `poll_after_s`; stop it with `cancel_job`.
Cite `result_id` values of earlier results as evidence."""


def error_result(failure: ToolFailure) -> CallToolResult:
    """A tool error as the client sees it: is_error, and text that is exactly the error JSON."""
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps({"error": failure.to_dict()}))], is_error=True
    )


def annotations_for(spec: ToolSpec) -> ToolAnnotations:
    """The effect class decides the hints; a tool adds only idempotence and destructiveness."""
    return ToolAnnotations(
        read_only_hint=spec.effect is Effect.READS,
        destructive_hint=spec.destructive if spec.effect is Effect.WRITES else False,
        idempotent_hint=spec.idempotent,
        open_world_hint=False,
    )


class Confirmation(BaseModel):
    confirm: bool = Field(description="Yes to confirm.")


def _question_resolver(spec: ToolSpec, runtime: Runtime):
    """Ask the tool's question through elicitation (both protocol eras), where the client can answer."""
    question = spec.question
    assert question is not None

    async def ask(ctx: Context, **arguments: Any) -> Any:
        capabilities = ctx.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            return NOT_ASKED
        try:
            args = parse_input(spec, arguments)
            text = await anyio.to_thread.run_sync(question, args, ToolEnv(runtime=runtime, tool=spec.name))
        except Exception:  # the tool itself answers with the precise error
            log.debug("question for %s not asked", spec.name, exc_info=True)
            return NOT_ASKED
        return NOT_ASKED if text is None else Elicit(text, Confirmation)

    fields = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in spec.input_model.model_fields]
    ask.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context), *fields]
    )
    ask.__annotations__ = {"ctx": Context}
    ask.__qualname__ = f"ask_{spec.name}"
    return ask


def _user_answer(outcome: Any) -> UserAnswer:
    if isinstance(outcome, AcceptedElicitation):
        if isinstance(outcome.data, Confirmation):
            return "accepted" if outcome.data.confirm else "declined"
        return "not_asked"
    return "declined"


def _field_metadata(info: FieldInfo) -> tuple[Any, ...]:
    """A tool input field as `Annotated` arguments: its type, pydantic's constraints, its description."""
    return (info.annotation, *info.metadata, Field(description=info.description))


def _handler(spec: ToolSpec, runtime: Runtime):
    """An MCP handler whose signature is the tool's input model, so clients get its schema."""

    async def handler(ctx: Context, **arguments: Any) -> Any:
        async def progress(done: float, total: float | None, message: str | None) -> None:
            await ctx.report_progress(done, total, message)

        outcome = arguments.pop(ANSWER_PARAMETER, None)
        sent_by_client = _CLIENT_ARGUMENTS.get()
        if sent_by_client is not None:  # the SDK fills in every default; a tool sees what the client sent
            arguments = {name: value for name, value in arguments.items() if name in sent_by_client}
        env = ToolEnv(runtime=runtime, tool=spec.name, progress=progress, user_answer=_user_answer(outcome))
        try:
            output = await invoke(spec, arguments, env)
        except ToolFailure as failure:
            return error_result(failure)
        reply = sent(output)
        return CallToolResult(content=[TextContent(type="text", text=reply.text)], structured_content=reply.structured)

    parameters = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if info.is_required() else info.get_default(call_default_factory=True),
            annotation=Annotated[_field_metadata(info)],
        )
        for name, info in spec.input_model.model_fields.items()
    ]
    parameters.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    if spec.question is not None:
        answer_type = Annotated[ElicitationResult[Confirmation], Resolve(_question_resolver(spec, runtime))]
        parameters.append(inspect.Parameter(ANSWER_PARAMETER, inspect.Parameter.KEYWORD_ONLY, annotation=answer_type))
    handler.__signature__ = inspect.Signature(parameters, return_annotation=spec.output_model)  # type: ignore[attr-defined]
    handler.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": spec.output_model}
    handler.__name__ = spec.name
    return handler


def _policy_middleware(served: set[str], tools: tuple[ToolSpec, ...]):
    known = {t.name: t for t in tools}

    async def middleware(ctx: Any, call_next: Any) -> Any:
        if ctx.method == "tools/call":
            name = (ctx.params or {}).get("name")
            if name not in served:
                if name in known and known[name].effect is Effect.WRITES:
                    raise MCPError(
                        code=REVIEW_MODE_RPC_CODE,
                        message=f"{name} writes files and this server runs in review mode; it is refused.",
                        data={"code": ErrorCode.REVIEW_MODE.value, "tool": name},
                    )
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=f"Unknown tool: {name!r}. Call tools/list for the tools this server offers.",
                    data={"code": ErrorCode.NOT_FOUND.value},
                )
            arguments = (ctx.params or {}).get("arguments") or {}
            try:  # our own validation first, so a bad argument is a bad_input error, not pydantic's text
                parse_input(known[name], arguments)
            except ToolFailure as failure:
                return error_result(failure)
            token = _CLIENT_ARGUMENTS.set(frozenset(arguments))
            try:
                return await call_next(ctx)
            finally:
                _CLIENT_ARGUMENTS.reset(token)
        return await call_next(ctx)

    return middleware


class ToolServer(MCPServer):
    """The SDK's server, listing each tool with its lean schemas (server/schemas.py)."""

    def __init__(self, tools: tuple[ToolSpec, ...], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lean = {t.name: (input_schema(t.input_model), output_schema(t.output_model)) for t in tools}

    async def list_tools(self) -> list[MCPTool]:
        listed = await super().list_tools()
        return [
            tool.model_copy(
                update={"input_schema": self._lean[tool.name][0], "output_schema": self._lean[tool.name][1]}
            )
            if tool.name in self._lean
            else tool
            for tool in listed
        ]


def build_server(runtime: Runtime, tools: tuple[ToolSpec, ...] = ALL_TOOLS) -> MCPServer:
    served = served_tools(runtime.policy.mode, tools)
    server = ToolServer(
        served,
        "vllm-metax-mcp",
        title="vLLM-MetaX upgrade and trim tools",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
    )
    for spec in served:
        server.add_tool(
            _handler(spec, runtime),
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=annotations_for(spec),
            structured_output=True,
        )
    server.middleware.append(_policy_middleware({t.name for t in served}, tools))
    register_resources(server, runtime)
    register_prompts(server, runtime)
    return server
