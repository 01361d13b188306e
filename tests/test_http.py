"""Streamable HTTP: loopback only unless a bearer token is given; the token is enforced."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
from helpers import console_script, free_port
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.timeout(60)
TOKEN = "s3cret-test-token"


def serve_args(tmp_path: Path, *extra: str) -> list[str]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    return [str(console_script()), "serve", "--root", str(root), "--state-dir", str(tmp_path / "state"), *extra]


def test_non_loopback_bind_without_token_exits_2_at_once(tmp_path: Path) -> None:
    port = free_port()
    started = time.monotonic()
    proc = subprocess.run(
        serve_args(tmp_path, "--transport", "http", "--host", "0.0.0.0", "--port", str(port)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    assert "auth-token" in proc.stderr
    assert time.monotonic() - started < 30
    assert proc.stdout == ""


def wait_listening(proc: subprocess.Popen, port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early with {proc.returncode}: {proc.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the HTTP server did not start listening")


@pytest.fixture
def http_server(tmp_path: Path):
    port = free_port()
    proc = subprocess.Popen(
        serve_args(tmp_path, "--transport", "http", "--host", "127.0.0.1", "--port", str(port), "--auth-token", TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_listening(proc, port)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def post_status(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        url,
        data=b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}',
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_http_requires_the_bearer_token_and_serves_the_sdk_client(http_server) -> None:
    url, proc = http_server
    assert post_status(url, {}) == 401
    assert post_status(url, {"Authorization": "Bearer wrong"}) == 401
    assert post_status(url, {"Authorization": TOKEN}) == 401

    async def main() -> list[str]:
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            tools = [tool.name for tool in (await client.list_tools()).tools]
            result = await client.call_tool("jobs", {"action": "list"})
            assert not result.is_error and result.structured_content["total"] == 0
            return tools

    assert "jobs" in anyio.run(main)
    assert proc.poll() is None
