"""Prompts through a real MCP client in both protocol eras: every argument described, required ones
marked, and bad arguments answered as JSON-RPC invalid params naming the argument."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools.spec import Runtime

pytestmark = pytest.mark.parametrize("mode", ["auto", "legacy"])

REQUIRED = {"upgrade_model": {"models"}, "review_upgrade": set(), "trim_model": {"source"}, "smoke_test": {"model"}}


def with_client(tmp_path: Path, mode: str, body: Any) -> Any:
    async def main() -> Any:
        runtime = Runtime.create([str(tmp_path)], state_dir=str(tmp_path.parent / f"{tmp_path.name}-state"))
        async with Client(build_server(runtime), mode=mode) as client:
            return await body(client)

    return anyio.run(main)


def test_every_prompt_argument_is_described_and_required_ones_marked(tmp_path: Path, mode: str) -> None:
    prompts = with_client(tmp_path, mode, lambda c: c.list_prompts()).prompts
    assert {p.name for p in prompts} == set(REQUIRED)
    for prompt in prompts:
        assert prompt.description, prompt.name
        assert {a.name for a in prompt.arguments if a.required} == REQUIRED[prompt.name], prompt.name
        undescribed = [a.name for a in prompt.arguments if not (a.description and len(a.description) > 10)]
        assert not undescribed, (prompt.name, undescribed)


BAD_CALLS = [
    ("trim_model", {}, "source: required"),
    ("trim_model", {"source": "ckpt", "output_mode": "nope"}, "output_mode: Input should be 'dummy' or 'real'"),
    ("smoke_test", {"model": "m", "tp": "x"}, "tp: Input should be a valid integer"),
    ("smoke_test", {"model": "m", "pp": "0"}, "pp: Input should be greater than or equal to 1"),
    ("smoke_test", {"model": "m", "tensor_parallel": "2"}, "tensor_parallel: not an argument of smoke_test"),
    ("review_upgrade", {"subject": "HEAD"}, "subject: Input should be 'index', 'worktree' or 'installed'"),
    ("upgrade_model", {"target": "v0.26.0"}, "models: required"),
]


def test_bad_prompt_arguments_are_invalid_params_naming_the_argument(tmp_path: Path, mode: str) -> None:
    async def body(client: Client) -> list[MCPError]:
        errors = []
        for name, arguments, _ in BAD_CALLS:
            with pytest.raises(MCPError) as info:
                await client.get_prompt(name, arguments)
            errors.append(info.value)
        return errors

    for (name, _, expected), error in zip(BAD_CALLS, with_client(tmp_path, mode, body), strict=True):
        assert error.error.code == INVALID_PARAMS, (name, error.error)
        assert expected in error.error.message, (name, error.error.message)
        assert f"prompt {name}" in error.error.message and "Traceback" not in error.error.message


def test_string_arguments_are_converted_to_the_declared_types(tmp_path: Path, mode: str) -> None:
    async def body(client: Client) -> tuple[str, str]:
        smoke = await client.get_prompt("smoke_test", {"model": "out/tiny", "tp": "2", "pp": "4"})
        trim = await client.get_prompt("trim_model", {"source": "ckpt", "output_mode": "real"})
        return smoke.messages[0].content.text, trim.messages[0].content.text

    smoke, trim = with_client(tmp_path, mode, body)
    assert "run_smoke_test(model=out/tiny, tp=2, pp=4)" in smoke
    assert "output_mode=real" in trim and "every distinct path" in trim
