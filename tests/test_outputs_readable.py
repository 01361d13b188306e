"""Outputs are readable by the server that wrote them: a trim into an output root outside every read
root can be inspected and smoke-tested by the same server, and no read makes it writable."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import snapshot
from pydantic import BaseModel
from tiny_models import build_model

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Effect
from vllm_metax_mcp.tools import inspect_config, run_smoke_test, trim_model
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv, ToolOutput, ToolSpec

pytestmark = pytest.mark.timeout(180)


def call(spec: ToolSpec, arguments: dict[str, Any], rt: Runtime) -> Any:
    return anyio.run(lambda: invoke(spec, arguments, ToolEnv(rt, spec.name)))


def server(tmp_path: Path, mode: str = "edit") -> Runtime:
    return Runtime.create(
        [str(tmp_path / "root")],
        output_roots=[str(tmp_path / "outputs")],
        mode=mode,
        state_dir=str(tmp_path / "state"),
        interpreters=[sys.executable],
    )


@pytest.fixture()
def trimmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Runtime, Path]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    build_model(tmp_path / "root" / "llama")
    (tmp_path / "outputs").mkdir()
    rt = server(tmp_path)
    out = tmp_path / "outputs" / "llama-tiny"
    result = call(trim_model.SPEC, {"model": "llama", "output": str(out)}, rt)
    assert (out / "config.json").is_file() and result.output_mode == "dummy"
    return rt, out


def test_a_trim_outside_the_roots_is_inspected_and_smoke_tested_by_the_same_server(
    trimmed: tuple[Runtime, Path],
) -> None:
    rt, out = trimmed
    before = snapshot(out)
    inspected = call(inspect_config.SPEC, {"model": str(out), "construct": False}, rt)
    assert inspected.result_id.startswith("r-")
    # the test's interpreter has no vLLM: the run gets past every path check and is blocked there
    smoke = call(run_smoke_test.SPEC, {"model": str(out), "python": sys.executable}, rt)
    assert smoke.verdict == "blocked" and "no vLLM server" in smoke.reasons[0], smoke.reasons
    assert snapshot(out) == before, "reading an output changes nothing in it"


def test_reading_an_output_root_never_makes_anything_writable(tmp_path: Path, trimmed: tuple[Runtime, Path]) -> None:
    """Review mode on the same output root: the output reads, trim_model is refused before any work and
    the output stays byte-identical; the policy's write check is unchanged by readability."""
    _, out = trimmed
    before = snapshot(out)
    review = server(tmp_path, "review")
    assert review.policy.readable(out / "config.json") == (out / "config.json").resolve()
    call(inspect_config.SPEC, {"model": str(out), "construct": False}, review)
    with pytest.raises(ToolFailure) as info:
        call(trim_model.SPEC, {"model": str(out), "output": str(out / "again"), "overwrite": True}, review)
    assert info.value.code is ErrorCode.REVIEW_MODE
    assert snapshot(out) == before and not (out / "again").exists()
    for place, code in ((tmp_path / "outputs", ErrorCode.PROTECTED_PATH), (tmp_path / "hf-cache" / "x", None)):
        with pytest.raises(ToolFailure) as refusal:
            review.policy.writable(place)
        assert code is None or refusal.value.code is code, refusal.value.to_dict()


class _Probe(BaseModel):
    output: str


def _read_tool_that_writes(args: _Probe, env: ToolEnv) -> ToolOutput:
    """A reads tool gone wrong: it asks the policy for an output path and would write a canary there."""
    (env.policy.writable(args.output) / "canary").parent.mkdir(parents=True)
    return ToolOutput()


@pytest.mark.parametrize("effect", [Effect.READS, Effect.VALIDATES])
@pytest.mark.parametrize("cpu_heavy", [False, True])
def test_a_tool_that_does_not_write_gets_no_output_path(tmp_path: Path, effect: Effect, cpu_heavy: bool) -> None:
    """Output roots are readable to every tool, so the write check itself refuses inside a non-writes call
    (core/foundation/policy.py writes_refused, set by tools/dispatch.py), in a thread and in a worker."""
    (tmp_path / "root").mkdir()
    (tmp_path / "outputs").mkdir()
    rt = server(tmp_path)
    spec = ToolSpec("probe", effect, _read_tool_that_writes, _Probe, ToolOutput, "probe", cpu_heavy=cpu_heavy)
    with pytest.raises(ToolFailure) as info:
        call(spec, {"output": str(tmp_path / "outputs" / "canary-dir")}, rt)
    assert info.value.code is ErrorCode.FAILED and "does not write files" in info.value.message
    assert not (tmp_path / "outputs" / "canary-dir").exists()
    # the same call through a writes tool gets its path: the refusal is the effect class, not the place
    writes = ToolSpec("probe", Effect.WRITES, _read_tool_that_writes, _Probe, ToolOutput, "probe")
    call(writes, {"output": str(tmp_path / "outputs" / "canary-dir")}, rt)
    assert (tmp_path / "outputs" / "canary-dir").is_dir()


def test_an_output_root_does_not_open_the_state_directory_inside_it(tmp_path: Path) -> None:
    """--output-root ~ with the state under ~/.local/state: the outputs read, the server's records do not."""
    (tmp_path / "root").mkdir()
    outputs = tmp_path / "outputs"
    (outputs / "trim").mkdir(parents=True)
    (outputs / "trim" / "config.json").write_text("{}")
    state = outputs / "state"
    rt = Runtime.create([str(tmp_path / "root")], output_roots=[str(outputs)], state_dir=str(state))
    rt.store.write("results/r-canary.json", {"canary": True})
    assert rt.policy.readable(outputs / "trim" / "config.json") == (outputs / "trim" / "config.json").resolve()
    with pytest.raises(ToolFailure) as refused:
        rt.policy.readable(state / "results" / "r-canary.json")
    assert refused.value.code is ErrorCode.OUTSIDE_ROOTS
