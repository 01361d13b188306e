"""Command line: `serve` (stdio or loopback HTTP), `tools` (what a mode serves), `call` (one tool, scripted).

Exit codes: 0 success, 1 tool error or failed verdict, 2 usage, 3 blocked.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any

import anyio

from ..core.foundation.errors import ErrorCode, ToolFailure
from ..core.foundation.policy import Mode
from ..core.foundation.safe_load import MAX_ARGUMENT_BYTES, load_json_bounded
from ..tools import ALL_TOOLS, served_tools
from ..tools.dispatch import invoke
from ..tools.spec import Runtime, ToolEnv
from .app import annotations_for, build_server

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BLOCKED = 0, 1, 2, 3
log = logging.getLogger("vllm_metax_mcp")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.EDIT.value)
    parser.add_argument("--root", action="append", default=None, help="readable root (repeatable; default: cwd)")
    parser.add_argument(
        "--output-root", action="append", default=None, help="where outputs may go (default: the roots)"
    )
    parser.add_argument(
        "--state-dir",
        default=None,
        help="server state (default: $XDG_STATE_HOME/vllm-metax-mcp); never inside a repository or a protected "
        "path, nor inside a --root in review mode",
    )
    parser.add_argument(
        "--python",
        action="append",
        default=None,
        metavar="PATH",
        help="an interpreter the server may run (repeatable); in review mode only these run. Default: the "
        "server's own interpreter and python3 on PATH; in edit mode a call may also name one inside the roots",
    )
    parser.add_argument("--debug", action="store_true", help="log tracebacks of internal errors to stderr")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-metax-mcp", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the MCP server")
    _common(serve)
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument(
        "--auth-token", default=None, help="bearer token; required to bind anything but 127.0.0.1, ::1 or localhost"
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="HOST[:PORT]",
        help="another Host header (and its http/https Origin) to accept besides the loopback names and the bound "
        "address (repeatable); required when binding 0.0.0.0 or ::",
    )
    tools = commands.add_parser("tools", help="list the tools a mode serves")
    tools.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.EDIT.value)
    call = commands.add_parser("call", help="run one tool through the server's policy and print its result")
    call.add_argument("tool")
    call.add_argument("--args", default="{}", help="JSON object of tool arguments (`-`: read it from stdin)")
    call.add_argument("--no-wait", action="store_true", help="for job tools: print the job id instead of waiting")
    _common(call)
    return parser


def _fail(message: str, code: int) -> int:
    print(message, file=sys.stderr)
    return code


def cmd_tools(mode: Mode) -> int:
    listing = [
        {
            "name": spec.name,
            "effect": spec.effect.value,
            "title": spec.title,
            "annotations": annotations_for(spec).model_dump(exclude_none=True),
        }
        for spec in served_tools(mode)
    ]
    print(json.dumps(listing, indent=2))
    return EXIT_OK


def cmd_call(options: argparse.Namespace) -> int:
    specs = {spec.name: spec for spec in ALL_TOOLS}
    spec = specs.get(options.tool)
    if spec is None:
        return _fail(f"unknown tool {options.tool!r}; `vllm-metax-mcp tools` lists them", EXIT_USAGE)
    text = sys.stdin.read(MAX_ARGUMENT_BYTES + 1) if options.args == "-" else options.args
    try:
        arguments = load_json_bounded(text, "--args", max_bytes=MAX_ARGUMENT_BYTES)
    except (json.JSONDecodeError, UnicodeError) as exc:
        return _fail(f"--args is not valid JSON: {exc}", EXIT_USAGE)
    except ToolFailure as failure:  # past an input limit: the same bad_input an MCP client gets
        print(json.dumps({"error": failure.to_dict()}, indent=2), file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(arguments, dict):
        return _fail("--args must be a JSON object", EXIT_USAGE)

    async def progress(done: float, total: float | None, message: str | None) -> None:
        print(f"progress: {done}/{total if total is not None else '?'} {message or ''}".rstrip(), file=sys.stderr)

    try:
        runtime = Runtime.create(options.root, options.output_root, options.mode, options.state_dir, options.python)
    except ToolFailure as failure:
        return _fail(failure.message, EXIT_USAGE)
    try:
        # progress lines are for a person at a terminal; a script reads stderr as the error JSON
        env = ToolEnv(runtime=runtime, tool=spec.name, progress=progress if sys.stderr.isatty() else None)
        output = anyio.run(lambda: invoke(spec, arguments, env, job_wait_s=0 if options.no_wait else math.inf))
    except ToolFailure as failure:
        print(json.dumps({"error": failure.to_dict()}, indent=2), file=sys.stderr)
        return EXIT_BLOCKED if failure.code is ErrorCode.BLOCKED else EXIT_FAILED
    result: dict[str, Any] = output.model_dump(mode="json")
    print(json.dumps(result, indent=2))
    verdict = result.get("verdict")
    if verdict == "blocked":
        return EXIT_BLOCKED
    return EXIT_FAILED if verdict == "failed" else EXIT_OK


def cmd_serve(options: argparse.Namespace) -> int:
    bind = None
    if options.transport == "http":
        from .http import BindRefused, resolve_bind

        try:
            bind = resolve_bind(options.host, options.port, options.auth_token, options.allowed_host)
        except BindRefused as refused:
            return _fail(str(refused), EXIT_USAGE)
    elif options.allowed_host:
        return _fail("--allowed-host applies to --transport http only", EXIT_USAGE)
    try:
        runtime = Runtime.create(options.root, options.output_root, options.mode, options.state_dir, options.python)
    except ToolFailure as failure:
        return _fail(failure.message, EXIT_USAGE)
    reaped = runtime.jobs.reap_stale()
    if reaped:
        logging.getLogger("vllm_metax_mcp").warning("reaped jobs whose worker stopped: %s", ", ".join(reaped))
    server = build_server(runtime)
    if bind is None:
        server.run("stdio")
    else:
        from .http import serve_http

        serve_http(server, bind, options.port, options.auth_token)
    return EXIT_OK


class _NoTraceback(logging.Formatter):
    """Log lines without tracebacks (the SDK, uvicorn and asyncio attach them); --debug keeps them."""

    def format(self, record: logging.LogRecord) -> str:
        plain = logging.makeLogRecord(record.__dict__)
        plain.exc_info, plain.exc_text, plain.stack_info = None, None, None
        return super().format(plain)


def main(argv: list[str] | None = None) -> None:
    options = _parser().parse_args(argv)
    debug = getattr(options, "debug", False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter((logging.Formatter if debug else _NoTraceback)("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(handlers=[handler], level=logging.DEBUG if debug else logging.WARNING)
    try:
        if options.command == "tools":
            code = cmd_tools(Mode(options.mode))
        elif options.command == "call":
            code = cmd_call(options)
        else:
            code = cmd_serve(options)
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:  # the last resort: one line, no traceback or install path unless --debug
        log.debug("unexpected error", exc_info=True)
        print(
            f"vllm-metax-mcp: internal error ({type(exc).__name__}); rerun with --debug to see the traceback.",
            file=sys.stderr,
        )
        code = EXIT_FAILED
    sys.exit(code)
