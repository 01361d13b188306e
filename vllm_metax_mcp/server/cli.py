"""Command line: `serve` (stdio or loopback HTTP), `tools` (what a mode serves), `call` (one tool, scripted).

Exit codes: 0 success, 1 tool error or failed verdict, 2 usage, 3 blocked.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import math
import sys
from typing import Any

import anyio

from ..core.errors import ErrorCode, ToolFailure
from ..core.policy import Mode
from ..tools import ALL_TOOLS, served_tools
from ..tools.base import Runtime, ToolEnv, invoke
from .app import annotations_for, build_server

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BLOCKED = 0, 1, 2, 3


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.EDIT.value)
    parser.add_argument("--root", action="append", default=None, help="readable root (repeatable; default: cwd)")
    parser.add_argument("--output-root", action="append", default=None, help="where outputs may go (default: the roots)")
    parser.add_argument("--state-dir", default=None, help="server state (default: $XDG_STATE_HOME/vllm-metax-mcp)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-metax-mcp", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the MCP server")
    _common(serve)
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--auth-token", default=None, help="bearer token; required to bind a non-loopback address")
    tools = commands.add_parser("tools", help="list the tools a mode serves")
    tools.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.EDIT.value)
    call = commands.add_parser("call", help="run one tool through the server's policy and print its result")
    call.add_argument("tool")
    call.add_argument("--args", default="{}", help="JSON object of tool arguments")
    call.add_argument("--no-wait", action="store_true", help="for job tools: print the job id instead of waiting")
    _common(call)
    return parser


def _fail(message: str, code: int) -> int:
    print(message, file=sys.stderr)
    return code


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    try:
        arguments = json.loads(options.args)
    except json.JSONDecodeError as exc:
        return _fail(f"--args is not valid JSON: {exc}", EXIT_USAGE)
    if not isinstance(arguments, dict):
        return _fail("--args must be a JSON object", EXIT_USAGE)

    async def progress(done: float, total: float | None, message: str | None) -> None:
        print(f"progress: {done}/{total if total is not None else '?'} {message or ''}".rstrip(), file=sys.stderr)

    try:
        runtime = Runtime.create(options.root, options.output_root, options.mode, options.state_dir)
        env = ToolEnv(runtime=runtime, tool=spec.name, progress=progress)
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
    if options.transport == "http" and not _is_loopback(options.host) and not options.auth_token:
        return _fail(f"refusing to bind {options.host}: a non-loopback address needs --auth-token", EXIT_USAGE)
    try:
        runtime = Runtime.create(options.root, options.output_root, options.mode, options.state_dir)
    except ToolFailure as failure:
        return _fail(failure.message, EXIT_USAGE)
    reaped = runtime.jobs.reap_stale()
    if reaped:
        logging.getLogger("vllm_metax_mcp").warning("reaped jobs whose worker stopped: %s", ", ".join(reaped))
    server = build_server(runtime)
    if options.transport == "stdio":
        server.run("stdio")
    else:
        from .http import serve_http

        serve_http(server, options.host, options.port, options.auth_token)
    return EXIT_OK


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = _parser().parse_args(argv)
    if options.command == "tools":
        sys.exit(cmd_tools(Mode(options.mode)))
    if options.command == "call":
        sys.exit(cmd_call(options))
    sys.exit(cmd_serve(options))
