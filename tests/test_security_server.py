"""Issue 18, classes 2, 7, 8 and 9: interpreters, HTTP binds and headers, hostile input, the state directory.

Each promise is tried the way an attacker would, through the CLI and through a real MCP client,
with a canary that proves nothing ran (a shell-script "interpreter" that touches a file) or
nothing was written (the reviewed tree's bytes before and after).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import REPO_ROOT, console_script, free_port, make_repo, snapshot
from mcp import Client, StdioServerParameters

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.foundation.safe_load import (
    load_json_bounded,
    load_yaml_bounded,
)
from vllm_metax_mcp.core.sources.environment import EnvironmentRecord
from vllm_metax_mcp.core.sources.interpreters import Interpreters
from vllm_metax_mcp.core.trace.checks import probe_target
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.server.http import BindRefused, resolve_bind
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(120)
SPECS = {spec.name: spec for spec in ALL_TOOLS}
INSTALL_PATHS = sorted(
    {str(REPO_ROOT), sysconfig.get_paths()["purelib"], sys.prefix, os.path.dirname(os.__file__)}, key=len
)


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(console_script()), *args], capture_output=True, text=True, timeout=90, cwd=cwd, env=env, input=stdin
    )


def assert_clean(*texts: str) -> None:
    """No traceback and no install path (the package, site-packages, the interpreter's prefix) in output."""
    for text in texts:
        assert "Traceback" not in text, text[-2000:]
        assert "Error executing tool" not in text, text[-2000:]
        for path in INSTALL_PATHS:
            assert path not in text, (path, text[-2000:])


def cli_error(proc: subprocess.CompletedProcess[str], code: str, exit_code: int = 1) -> dict[str, Any]:
    assert proc.returncode == exit_code, (proc.returncode, proc.stdout[-1000:], proc.stderr[-2000:])
    assert proc.stdout == ""
    assert_clean(proc.stdout, proc.stderr)
    error = json.loads(proc.stderr)["error"]
    assert error["code"] == code, error
    return error


def mcp_calls(runtime: Runtime, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    async def main() -> list[Any]:
        async with Client(build_server(runtime)) as client:
            return [await client.call_tool(tool, arguments) for tool, arguments in calls]

    return anyio.run(main)


def mcp_error(result: Any, code: str) -> dict[str, Any]:
    assert result.is_error, result.structured_content
    (content,) = result.content
    assert_clean(content.text)
    error = json.loads(content.text)["error"]
    assert error["code"] == code, error
    return error


# -- class 2: interpreters -------------------------------------------------------------------


def canary_interpreter(path: Path, canary: Path) -> Path:
    """A shell script posing as an interpreter: it touches `canary`, then runs the real one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\ntouch "{canary}"\nexec "{sys.executable}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def ws(tmp_path: Path) -> dict[str, Path]:
    """A read root holding a plugin repository, a model and a canary interpreter; the state outside it."""
    root = tmp_path / "root"
    plugin = make_repo(root / "plugin")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2})
    )
    canary = tmp_path / "CANARY"
    inside = canary_interpreter(root / "venv" / "bin" / "python", canary)
    outside = canary_interpreter(tmp_path / "elsewhere" / "bin" / "python", canary)
    return {
        "root": root,
        "plugin": plugin,
        "state": tmp_path / "state",
        "canary": canary,
        "inside": inside,
        "outside": outside,
    }


def runtime(ws: dict[str, Path], mode: str, interpreters: list[str] | None = None) -> Runtime:
    return Runtime.create([str(ws["root"])], mode=mode, state_dir=str(ws["state"]), interpreters=interpreters)


def call(rt: Runtime, tool: str, arguments: dict[str, Any]) -> Any:
    return anyio.run(lambda: invoke(SPECS[tool], arguments, ToolEnv(runtime=rt, tool=tool)))


def refused(rt: Runtime, tool: str, arguments: dict[str, Any]) -> ToolFailure:
    with pytest.raises(ToolFailure) as failure:
        call(rt, tool, arguments)
    return failure.value


ESTABLISH = {"plugin_repo": "plugin", "action": "establish"}


@pytest.mark.parametrize("which", ["inside", "outside"])
def test_review_mode_never_runs_a_named_interpreter_the_operator_did_not_allow(ws: dict[str, Path], which: str) -> None:
    python = str(ws[which])
    before = snapshot(ws["plugin"])
    rt = runtime(ws, "review")
    failure = refused(rt, "environment", {**ESTABLISH, "python": python})
    assert failure.code is ErrorCode.REVIEW_MODE and "--python" in failure.message
    for tool, arguments in (
        ("run_smoke_test", {"model": "model", "python": python}),
        ("inspect_config", {"model": "model", "python": python, "construct": True}),
    ):
        assert refused(rt, tool, arguments).code is ErrorCode.REVIEW_MODE
    # through a real MCP client, and through the CLI
    (result,) = mcp_calls(rt, [("environment", {**ESTABLISH, "python": python})])
    mcp_error(result, "review_mode")
    proc = cli(
        "call",
        "environment",
        "--mode",
        "review",
        "--root",
        str(ws["root"]),
        "--state-dir",
        str(ws["state"]),
        "--args",
        json.dumps({**ESTABLISH, "python": python}),
    )
    cli_error(proc, "review_mode")
    assert not ws["canary"].exists()
    assert snapshot(ws["plugin"]) == before


def test_a_record_made_in_edit_mode_does_not_run_in_review_mode(ws: dict[str, Path]) -> None:
    edit = runtime(ws, "edit")
    made = call(edit, "environment", {**ESTABLISH, "python": str(ws["inside"])})
    assert made.python_accepted == "inside_roots"  # edit mode: a call may name one inside the roots
    assert ws["canary"].exists()  # it really ran there
    ws["canary"].unlink()

    review = runtime(ws, "review")
    shown = call(review, "environment", {"plugin_repo": "plugin", "action": "show"})
    assert shown.python == str(ws["inside"]) and shown.python_accepted == "inside_roots"
    smoke = refused(review, "run_smoke_test", {"model": "model", "plugin_repo": "plugin"})
    assert smoke.code is ErrorCode.REVIEW_MODE and "environment record" in smoke.message
    inspected = call(review, "inspect_config", {"model": "model", "plugin_repo": "plugin", "construct": True})
    assert any("cannot run" in gap for gap in inspected.evidence_gaps), inspected.evidence_gaps
    record = EnvironmentRecord.from_json(json.loads(next((ws["state"] / "environments").iterdir()).read_text()))
    probe = probe_target(None, review.policy, review.interpreters, record, True)
    assert probe.python is None and "did not allow" in (probe.gap or "")
    smoke_mcp, inspect_mcp = mcp_calls(
        review,
        [
            ("run_smoke_test", {"model": "model", "plugin_repo": "plugin"}),
            ("inspect_config", {"model": "model", "plugin_repo": "plugin", "construct": True}),
        ],
    )
    mcp_error(smoke_mcp, "review_mode")
    assert not inspect_mcp.is_error
    proc = cli(
        "call",
        "run_smoke_test",
        "--mode",
        "review",
        "--root",
        str(ws["root"]),
        "--state-dir",
        str(ws["state"]),
        "--args",
        json.dumps({"model": "model", "plugin_repo": "plugin"}),
    )
    cli_error(proc, "review_mode")
    assert not ws["canary"].exists()


def test_the_operator_allows_an_interpreter_with_python(ws: dict[str, Path]) -> None:
    review = runtime(ws, "review", interpreters=[str(ws["outside"])])
    made = call(review, "environment", {**ESTABLISH, "python": str(ws["outside"])})
    assert made.python_accepted == "operator" and ws["canary"].exists()
    ws["canary"].unlink()
    # without a python argument, establish probes the operator's first interpreter
    again = call(review, "environment", ESTABLISH)
    assert again.python == str(ws["outside"]) and again.python_accepted == "operator"
    record = json.loads(next((ws["state"] / "environments").iterdir()).read_text())
    assert record["python_accepted"]["reason"] == "operator" and record["python_accepted"]["why"]
    # naming --python replaces the default: the server's own interpreter is no longer allowed
    assert refused(review, "environment", {**ESTABLISH, "python": sys.executable}).code is ErrorCode.REVIEW_MODE
    proc = cli(
        "serve", "--python", str(ws["root"] / "missing"), "--root", str(ws["root"]), "--state-dir", str(ws["state"])
    )
    assert proc.returncode == 2 and "--python" in proc.stderr and proc.stdout == ""
    assert_clean(proc.stderr)


def test_edit_mode_accepts_only_allowed_interpreters_and_ones_inside_the_roots(ws: dict[str, Path]) -> None:
    edit = runtime(ws, "edit")
    failure = refused(edit, "environment", {**ESTABLISH, "python": str(ws["outside"])})
    assert failure.code is ErrorCode.OUTSIDE_ROOTS and "--python" in failure.message
    assert (
        refused(edit, "run_smoke_test", {"model": "model", "python": str(ws["outside"])}).code
        is ErrorCode.OUTSIDE_ROOTS
    )
    assert not ws["canary"].exists()
    # the server's own interpreter is the default allowed one, in any spelling of its directory
    made = call(edit, "environment", {**ESTABLISH, "python": sys.executable})
    assert made.python_accepted == "server_interpreter"
    proc = cli(
        "call",
        "environment",
        "--root",
        str(ws["root"]),
        "--state-dir",
        str(ws["state"]),
        "--args",
        json.dumps({**ESTABLISH, "python": str(ws["outside"])}),
    )
    cli_error(proc, "outside_roots")
    assert not ws["canary"].exists()


def test_a_python3_on_path_inside_a_read_root_is_no_default_in_review_mode(
    ws: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = canary_interpreter(ws["root"] / "bin" / "python3", ws["canary"])
    env = dict(os.environ, PATH=os.pathsep.join([str(fake.parent), "bin", os.environ.get("PATH", "")]))
    args = ["--mode", "review", "--root", str(ws["root"]), "--state-dir", str(ws["state"])]
    for arguments in (ESTABLISH, {**ESTABLISH, "python": "python3"}):
        proc = cli("call", "environment", *args, "--args", json.dumps(arguments), cwd=ws["root"], env=env)
        if "python" in arguments:
            cli_error(proc, "review_mode")
        else:
            assert proc.returncode == 0, proc.stderr
            result = json.loads(proc.stdout)
            assert result["python_accepted"] == "server_interpreter", result
    assert not ws["canary"].exists()
    monkeypatch.setenv("PATH", env["PATH"])
    reasons = {
        item.path: item.reason
        for item in Interpreters.create(None, Policy.create([str(ws["root"])], mode="review")).allowed
    }
    assert fake not in reasons and "path_default" not in reasons.values()
    edit = {item.path: item.reason for item in Interpreters.create(None, Policy.create([str(ws["root"])])).allowed}
    assert edit.get(fake) == "path_default"  # edit mode: the operator's PATH, which may point into a root


# -- class 7: HTTP binds, Host and Origin ------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.2", "0x7f000002", "0177.0.0.2", "::ffff:127.0.0.1", "0.0.0.0", "::", "10.1.2.3", "example.com"]
)
def test_without_a_token_only_the_three_loopback_addresses_may_be_bound(host: str, tmp_path: Path) -> None:
    with pytest.raises(BindRefused):
        resolve_bind(host, 8765, None)
    root = tmp_path / "root"
    root.mkdir()
    proc = cli(
        "serve",
        "--transport",
        "http",
        "--host",
        host,
        "--port",
        str(free_port()),
        "--root",
        str(root),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert proc.returncode == 2 and "--auth-token" in proc.stderr and proc.stdout == "", proc.stderr
    assert_clean(proc.stderr)


@pytest.mark.parametrize(
    ("host", "bound"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.000.000.001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("::1", "::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("[::1]", "::1"),
        ("LOCALHOST", None),
    ],
)
def test_loopback_spellings_bind_the_address_they_parse_to_with_header_checks(host: str, bound: str | None) -> None:
    bind = resolve_bind(host, 8765, None)
    assert bind.loopback and (bound is None or bind.address == bound)
    assert bind.security.enable_dns_rebinding_protection
    assert "evil.example:8765" not in bind.security.allowed_hosts


def test_a_token_bind_checks_headers_too_and_0000_needs_allowed_hosts() -> None:
    bind = resolve_bind("127.0.0.2", 8765, "t")
    assert not bind.loopback and bind.security.enable_dns_rebinding_protection
    assert "127.0.0.2:8765" in bind.security.allowed_hosts
    with pytest.raises(BindRefused, match="--allowed-host"):
        resolve_bind("0.0.0.0", 8765, "t")
    bind = resolve_bind("0.0.0.0", 8765, "t", ["mcp.example.org"])
    assert {"mcp.example.org", "mcp.example.org:*"} <= set(bind.security.allowed_hosts)
    with pytest.raises(BindRefused):
        resolve_bind("0.0.0.0", 8765, "t", ["evil.example/path"])


INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "probe", "version": "0"},
        },
    }
).encode()


def post(address: str, port: int, host_header: str, extra: dict[str, str]) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    connect = f"[{address}]" if family == socket.AF_INET6 else address
    request = urllib.request.Request(
        f"http://{connect}:{port}/mcp",
        data=INITIALIZE,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Host": host_header,
            **extra,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def serve_http(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], int]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(console_script()),
            "serve",
            "--transport",
            "http",
            "--port",
            str(port),
            "--root",
            str(root),
            "--state-dir",
            str(tmp_path / "state"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    return proc, port


def wait_listening(proc: subprocess.Popen[str], address: str, port: int) -> None:
    deadline = time.monotonic() + 30
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect((address, port))
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the HTTP server did not start listening")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return err


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize(
    ("host", "address", "token"),
    [
        ("127.000.000.001", "127.0.0.1", None),
        ("0:0:0:0:0:0:0:1", "::1", None),
        ("[::1]", "::1", None),
        ("127.0.0.2", "127.0.0.2", "s3cret"),
        ("0.0.0.0", "127.0.0.1", "s3cret"),
    ],
)
def test_foreign_host_and_origin_are_refused_on_every_bind(
    tmp_path: Path, host: str, address: str, token: str | None
) -> None:
    if ":" in address and not ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    extra = ["--host", host, *(["--auth-token", token] if token else [])]
    if host == "0.0.0.0":
        extra += ["--allowed-host", "mcp.example.org"]
    proc, port = serve_http(tmp_path, *extra)
    try:
        wait_listening(proc, address, port)
        auth = {"Authorization": f"Bearer {token}"} if token else {}
        own = (
            "mcp.example.org"
            if host == "0.0.0.0"
            else (f"[{address}]:{port}" if ":" in address else f"{address}:{port}")
        )
        assert post(address, port, own, auth) == 200
        assert post(address, port, f"evil.example:{port}", auth) == 421
        assert post(address, port, own, {**auth, "Origin": "http://evil.example"}) == 403
        assert post(address, port, f"evil.example:{port}", {**auth, "Origin": "http://evil.example"}) == 421
        if token:
            assert post(address, port, own, {}) == 401
    finally:
        err = stop(proc)
    assert_clean(err)


# -- class 8: hostile input ---------------------------------------------------------------------


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def safetensors_with_header(path: Path, header: bytes) -> None:
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, Path]:
    """Model directories and a case file that an attacker controls."""
    root = tmp_path / "root"
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}
    for name, config in {
        "deep_config": '{"architectures": ["LlamaForCausalLM"], "x": ' + deep(100_000) + "}",
        "big_int_config": '{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": ' + "9" * 5000 + "}",
        "deep_header": json.dumps(base),
        "deep_index": json.dumps(base),
        "m": json.dumps(base),
    }.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text(config)
    safetensors_with_header(root / "deep_header" / "model.safetensors", b'{"a": ' + deep(100_000).encode() + b"}")
    (root / "deep_index" / "model.safetensors.index.json").write_text('{"weight_map": ' + deep(100_000) + "}")
    (root / "cases.yaml").write_text("cases: &c\n  - *c\n")
    (root / "deep.yaml").write_text("cases: " + deep(100_000) + "\n")
    return {"root": root, "state": tmp_path / "state"}


HOSTILE_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("nul in a path", "inspect_config", {"model": "m\u0000/../etc", "construct": False}),
    ("nul in a repo path", "diff_model", {"plugin_repo": "a\u0000b", "upstream": ".", "target": "HEAD"}),
    ("300-character name", "inspect_config", {"model": "x" * 300, "construct": False}),
    ("300-character output", "export_snapshot", {"output": "o" * 300}),
    ("argument over the length limit", "diff_model", {"upstream": ".", "target": "a" * 20_000}),
    ("argument nested 100 deep", "inspect_config", {"model": "m", "hf_overrides": {"x": json.loads(deep(100))}}),
    ("5000-digit integer argument", "plan_trim", {"model": "m", "tp": 10**5000}),
    ("config.json nested 100k deep", "inspect_config", {"model": "deep_config", "construct": False}),
    ("5000-digit integer in config.json", "inspect_config", {"model": "big_int_config", "construct": False}),
    ("safetensors header nested 100k deep", "inspect_config", {"model": "deep_header", "construct": False}),
    ("index nested 100k deep", "inspect_config", {"model": "deep_index", "construct": False}),
    (
        "case file whose cases refer to themselves",
        "run_smoke_test",
        {"model": "m", "cases": "cases.yaml", "python": sys.executable},
    ),
    ("case file nested 100k deep", "run_smoke_test", {"model": "m", "cases": "deep.yaml", "python": sys.executable}),
]


@pytest.mark.parametrize(("what", "tool", "arguments"), HOSTILE_CALLS, ids=[c[0] for c in HOSTILE_CALLS])
def test_hostile_input_answers_bad_input_through_the_cli(
    hostile: dict[str, Path], what: str, tool: str, arguments: dict[str, Any]
) -> None:
    text = json.dumps({k: "@BIG@" if isinstance(v, int) and v > 10**100 else v for k, v in arguments.items()})
    text = text.replace('"@BIG@"', "9" * 5000)  # json.dumps itself refuses a 5000-digit integer
    proc = cli(
        "call", tool, "--root", str(hostile["root"]), "--state-dir", str(hostile["state"]), "--args", "-", stdin=text
    )
    if what.startswith("safetensors header"):  # the checkpoint's own problem: a finding, not a crash
        assert proc.returncode == 0, proc.stderr
        assert_clean(proc.stdout, proc.stderr)
        assert "bad_header" in proc.stdout and "not valid JSON" in proc.stdout
        return
    error = cli_error(proc, "bad_input")
    assert error["message"] and len(error["message"]) < 400


@pytest.mark.parametrize("mode", ["edit", "review"])
def test_hostile_input_answers_bad_input_through_an_mcp_client(
    hostile: dict[str, Path], tmp_path: Path, mode: str
) -> None:
    state = tmp_path / f"state-{mode}"
    rt = Runtime.create([str(hostile["root"])], mode=mode, state_dir=str(state))
    calls = [
        (tool, arguments)
        for _, tool, arguments in HOSTILE_CALLS
        if not (mode == "review" and SPECS[tool].effect.value == "writes")
    ]
    calls.append(("inspect_config", {"model": "x " * (64 * 1024)}))  # one 128 KiB argument (E2BIG in an argv)
    results = mcp_calls(rt, calls)
    for (tool, arguments), result in zip(calls, results, strict=True):
        (content,) = result.content
        assert_clean(content.text)
        if tool == "inspect_config" and arguments.get("model") == "deep_header":
            assert not result.is_error and "bad_header" in content.text  # the checkpoint's problem: a finding
            continue
        if tool == "run_smoke_test" and mode == "review":
            mcp_error(result, "review_mode")  # the python override is refused before anything else
            continue
        mcp_error(result, "bad_input")


def test_hostile_input_over_stdio_with_the_console_script(hostile: dict[str, Path]) -> None:
    params = StdioServerParameters(
        command=str(console_script()),
        args=["serve", "--root", str(hostile["root"]), "--state-dir", str(hostile["state"])],
    )

    async def main() -> list[Any]:
        async with Client(params) as client:
            return [
                await client.call_tool("inspect_config", {"model": "deep_config", "construct": False}),
                await client.call_tool("inspect_config", {"model": "x" * 300, "construct": False}),
                await client.call_tool(
                    "run_smoke_test", {"model": "m", "cases": "cases.yaml", "python": sys.executable}
                ),
                await client.call_tool("jobs", {"action": "list"}),
            ]

    *bad, fine = anyio.run(main)
    for result in bad:
        mcp_error(result, "bad_input")
    assert not fine.is_error


def test_an_unexpected_exception_is_a_clean_failed_error(tmp_path: Path) -> None:
    from dataclasses import replace

    from helpers import JOB_TOOL

    def explode(args: Any, env: Any) -> Any:
        raise KeyError(str(REPO_ROOT / "secret" / "path"))

    spec = replace(JOB_TOOL, run=explode, name="explode")
    root = tmp_path / "root"
    root.mkdir()
    rt = Runtime.create([str(root)], state_dir=str(tmp_path / "state"))
    with pytest.raises(ToolFailure) as failure:
        anyio.run(lambda: invoke(spec, {}, ToolEnv(runtime=rt, tool="explode")))
    assert failure.value.code is ErrorCode.FAILED and "KeyError" in failure.value.message
    assert_clean(failure.value.message)

    async def main() -> Any:
        async with Client(build_server(rt, tools=(spec,))) as client:
            return await client.call_tool("explode", {})

    result = anyio.run(main)
    assert mcp_error(result, "failed")["message"].startswith("explode failed with an internal error (KeyError)")


def test_the_bounded_loaders() -> None:
    for bad in (deep(65), '{"a": ' + "1" * 21 + "}"):
        with pytest.raises(ToolFailure) as failure:
            load_json_bounded(bad, "x.json")
        assert failure.value.code is ErrorCode.BAD_INPUT and "x.json" in failure.value.message
    assert (
        load_json_bounded('{"s": "' + "[" * 1000 + '", "n": -12345678901234567890}', "x.json")["n"]
        == -12345678901234567890
    )
    with pytest.raises(json.JSONDecodeError):
        load_json_bounded("{", "x.json")
    for bad in ("a: &x 1\nb: *x\n", "a: *x\n", "<<: &m {a: 1}\n", "a: " + "1" * 30 + "\n", "a: " + deep(100) + "\n"):
        with pytest.raises(ToolFailure):
            load_yaml_bounded(bad, "c.yaml")
    assert (
        load_yaml_bounded("serve: {max_model_len: 256}\ncases: [{name: a, kind: chat}]\n", "c.yaml")["serve"][
            "max_model_len"
        ]
        == 256
    )


def test_json_files_are_utf8_and_yaml_integers_are_bounded_in_any_base() -> None:
    """A UTF-16 document hides its brackets from a byte scan (U+2241 is the bytes 41 22, a quote
    to the scan) while json would decode it anyway: files are read as UTF-8, as vLLM reads them.
    A hex integer of 5,000 digits is bounded by its spelling, not by its decimal digits."""
    deep = '{"k": ' * 900 + "1" + "}" * 900
    hidden = ('{"a": "\u2241", "rope_scaling": ' + deep + ', "c": "x"}').encode("utf-16-le")
    assert json.loads(hidden)["a"] == "\u2241"  # json alone guesses the encoding and would parse it
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):  # read as UTF-8: not JSON at all
        load_json_bounded(hidden, "config.json")
    for spelled in ("0x" + "f" * 5000, "0b" + "1" * 300, "-0" + "7" * 100, "1_000" * 10):
        with pytest.raises(ToolFailure) as failure:
            load_yaml_bounded(f"x: {spelled}\n", "c.yaml")
        assert failure.value.code is ErrorCode.BAD_INPUT and "integers are limited" in failure.value.message
    assert load_yaml_bounded("x: 0xff\ny: -12\n", "c.yaml") == {"x": 255, "y": -12}


# -- class 9: the state directory ------------------------------------------------------------


def test_the_state_directory_never_lies_in_a_reviewed_tree_or_a_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    repo = make_repo(root / "plugin")
    plain = root / "plain"
    plain.mkdir()
    before = snapshot(repo)
    cases = [
        ("review", root / "state", "read root"),
        ("review", repo / ".vmm-state", "read root"),
        ("edit", repo / "nested" / "state", "git repository"),
        ("edit", repo / ".git" / "vmm", "git repository"),
    ]
    for mode, state, why in cases:
        with pytest.raises(ToolFailure) as failure:
            Runtime.create([str(root)], mode=mode, state_dir=str(state))
        assert why in failure.value.message
        for command in (["serve"], ["call", "jobs", "--args", "{}"]):
            proc = cli(*command, "--mode", mode, "--root", str(root), "--state-dir", str(state))
            assert proc.returncode == 2, (command, proc.stderr)
            assert why in proc.stderr and proc.stdout == ""
            assert_clean(proc.stderr)
        assert not state.exists()
    # a link that leads into the repository is the repository
    link = tmp_path / "link"
    link.symlink_to(repo)
    with pytest.raises(ToolFailure):
        Runtime.create([str(root)], state_dir=str(link / "state"))
    # the HF cache is protected
    hub = tmp_path / "hf"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    with pytest.raises(ToolFailure, match="protected"):
        Runtime.create([str(root)], state_dir=str(hub / "state"))
    monkeypatch.delenv("HF_HUB_CACHE")
    # allowed: edit mode inside a root that is no repository; review mode outside the roots
    Runtime.create([str(root)], mode="edit", state_dir=str(plain / "state"))
    Runtime.create([str(root)], mode="review", state_dir=str(tmp_path / "state"))
    proc = cli(
        "call", "jobs", "--mode", "review", "--root", str(root), "--state-dir", str(tmp_path / "state2"), "--args", "{}"
    )
    assert proc.returncode == 0, proc.stderr
    assert snapshot(repo) == before


def test_the_state_directory_never_contains_a_read_root_or_an_output_root(tmp_path: Path) -> None:
    """`--root s/scratch --state-dir s`: the store's jobs/, results/, outputs/ would share a tree with the
    reviewed one (review mode) or hold the roots every output is refused in (edit mode). Refused in both
    modes, through the constructor, `serve` and `call`; nothing is created and the root is untouched."""
    top = tmp_path / "s"
    scratch = make_repo(top / "scratch")
    (tmp_path / "o").mkdir()
    before = snapshot(scratch)
    cases = [
        ("review", [str(scratch)], None, top, "read root"),
        ("edit", [str(scratch)], None, top, "read root"),
        ("review", [str(scratch)], None, scratch.parent.parent, "read root"),
        ("edit", [str(scratch)], [str(tmp_path / "o" / "out")], tmp_path / "o", "output root"),
    ]
    for mode, roots, outputs, state, why in cases:
        with pytest.raises(ToolFailure) as failure:
            Runtime.create(roots, output_roots=outputs, mode=mode, state_dir=str(state))
        assert f"contains the {why}" in failure.value.message, failure.value.message
        extra = ["--output-root", outputs[0]] if outputs else []
        for command in (["serve"], ["call", "jobs", "--args", "{}"]):
            proc = cli(*command, "--mode", mode, "--root", roots[0], *extra, "--state-dir", str(state))
            assert proc.returncode == 2, (command, proc.stderr)
            assert why in proc.stderr and proc.stdout == ""
            assert_clean(proc.stderr)
        assert not (state / "jobs").exists() and not (state / ".lock").exists()
    # beside the roots is fine, in both modes
    for mode in ("review", "edit"):
        Runtime.create(
            [str(scratch)], output_roots=[str(tmp_path / "o" / "out")], mode=mode, state_dir=str(tmp_path / "state")
        )
    assert snapshot(scratch) == before
