"""The checkpoint tools stay within the result budget at any arguments (issue 23), on the real configs of
tests/data/hf_configs (with the tensor tables of DeepSeek-V3, DeepSeek-V4 and GLM-5) and on a real config
deepened far past any real model (so the size pager and the plan's cut have something to cut): every list
at the largest limit, every cursor followed to the end (the pages together are the list exactly once),
and each next_step called (it succeeds, or fails only for what lies outside the tool: no interpreter)."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from test_inspect_config import FIXTURES, deepseek_tensors, deepseek_v4_tensors, fixture, glm5_tensors, write_model
from workbench import git

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.core.smoke.answers import RequestRecord
from vllm_metax_mcp.core.smoke.evidence import SmokeEvidence, output_of
from vllm_metax_mcp.tools import ALL_TOOLS, inspect_config
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(600)

SPECS = {spec.name: spec for spec in ALL_TOOLS}
DEEP = 3000
"""Layers of the deepened Llama config: more rows than one page can hold at any limit."""


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("budget-checkpoint")
    for name in sorted(FIXTURES):
        write_model(root / name, fixture(name))
    write_model(root / "v3t", fixture("v3"), deepseek_tensors(61, 1, 3))
    write_model(root / "glm5t", fixture("glm5"), glm5_tensors(fixture("glm5")))
    write_model(root / "v4t", fixture("v4"), deepseek_v4_tensors(fixture("v4")))
    write_model(root / "deep", fixture("llama") | {"num_hidden_layers": DEEP})
    state = tmp_path_factory.mktemp("budget-checkpoint-state")
    return {"runtime": Runtime.create([str(root)], mode="edit", state_dir=str(state)), "root": root}


WITH_TENSORS = {"v3t": "v3", "glm5t": "glm5", "v4t": "v4"}
MODELS = [*sorted(FIXTURES), *WITH_TENSORS, "deep"]


def call(ws: dict[str, Any], tool: str, arguments: dict[str, Any]) -> Any:
    env = ToolEnv(runtime=ws["runtime"], tool=tool)
    result = anyio.run(lambda: invoke(SPECS[tool], arguments, env))
    assert len(text_of(result)) <= RESULT_BUDGET, (tool, arguments, len(text_of(result)))
    return result


def layers_of(model: str) -> int:
    config = {"num_hidden_layers": DEEP} if model == "deep" else fixture(WITH_TENSORS.get(model, model))
    return int(config.get("num_hidden_layers") or config["text_config"]["num_hidden_layers"])


@pytest.mark.parametrize("model", MODELS)
def test_inspect_config_pages_by_size_to_the_end(ws: dict[str, Any], model: str) -> None:
    arguments = {"model": model, "construct": False, "limit": inspect_config.LIMIT_MAX}
    first = call(ws, "inspect_config", arguments)
    pages, result = [first], first
    while result.next_cursor:
        step = result.next_step
        assert step.tool == "inspect_config" and step.arguments == {**arguments, "cursor": result.next_cursor}
        result = call(ws, "inspect_config", step.arguments)
        assert not (result.arrays or result.rules or result.checkpoint or result.quantization or result.findings)
        pages.append(result)
    ids = [row.id for page in pages for row in page.layers]
    assert ids == sorted(set(ids)) and len(ids) == first.layers_total
    assert (len(pages) > 1) == (model == "deep")
    assert result.next_step.tool == "plan_trim" and result.next_step.arguments["model"] == model


@pytest.mark.parametrize("model", MODELS)
def test_plan_and_trim_at_every_layer_fit_and_name_the_next_call(ws: dict[str, Any], model: str) -> None:
    everything = {"model": model, "layers": list(range(layers_of(model)))}
    planned = call(ws, "plan_trim", everything)
    if model == "deep":
        assert planned.truncated and planned.truncated.get("coverage", 0) + planned.truncated.get("layer_map", 0)
    else:
        assert not planned.truncated and len(planned.layer_map) >= layers_of(model)
    step = planned.next_step
    echoed = everything if model != "deep" else {"model": model}  # 3000 ids: the caller passes its own list
    assert step.tool == "trim_model" and step.arguments == {**echoed, "output": f"{model}-trim"}
    trimmed = call(ws, "trim_model", {**everything, **step.arguments})
    manifest = json.loads((ws["root"] / trimmed.output / "trim_manifest.json").read_text())
    assert len(manifest["plan"]["layer_map"]) == len(planned.layer_map) + sum(
        total - len(planned.layer_map) for name, total in planned.truncated.items() if name == "layer_map"
    )
    smoke = trimmed.next_step
    assert smoke.tool == "run_smoke_test" and smoke.arguments == {"model": trimmed.output, "load_format": "dummy"}
    with pytest.raises(ToolFailure) as info:  # the one thing outside the tool: no interpreter recorded
        call(ws, "run_smoke_test", smoke.arguments)
    assert info.value.code is ErrorCode.NOT_FOUND and "environment action=establish" in info.value.message


def test_the_default_plan_names_a_fresh_output(ws: dict[str, Any]) -> None:
    first = call(ws, "plan_trim", {"model": "gemma3"})
    call(ws, "trim_model", first.next_step.arguments)
    again = call(ws, "plan_trim", {"model": "gemma3"})
    assert first.next_step.arguments["output"] != again.next_step.arguments["output"]
    call(ws, "trim_model", again.next_step.arguments)


@pytest.mark.parametrize(
    ("tool", "arguments", "words"),
    [
        ("inspect_config", {"model": "v3", "limit": inspect_config.LIMIT_MAX + 1}, "less than or equal"),
        ("inspect_config", {"model": "v3", "construct": False, "hf_overrides": {"a": 1}}, "needs construct"),
        ("inspect_config", {"model": "v3", "construct": False, "page": "differences"}, "needs construct"),
        ("inspect_config", {"model": "v3", "num_speculative_tokens": 2}, "needs speculative"),
        ("plan_trim", {"model": "v3", "allow_narrowing": True}, "needs device_memory_gb"),
        ("plan_trim", {"model": "v3", "tp": 4096}, "tp is at most"),
        ("plan_trim", {"model": "v3", "model_revision": "main"}, "omit it"),
        ("trim_model", {"model": "v3", "output": "x", "max_shard_bytes": 9}, "output_mode=real"),
        ("run_smoke_test", {"model": "v3", "tp": 65}, "tp is between 1 and 64"),
        ("environment", {"action": "show", "target": "v1"}, "establish and confirm"),
        ("environment", {"action": "establish", "target": "v1"}, "pass upstream"),
    ],
)
def test_ignored_or_unbounded_arguments_are_refused(
    ws: dict[str, Any], tool: str, arguments: dict[str, Any], words: str
) -> None:
    with pytest.raises(ToolFailure) as info:
        call(ws, tool, arguments)
    assert info.value.code is ErrorCode.BAD_INPUT and words in info.value.message, info.value.message


def test_environment_without_a_record_names_establish(ws: dict[str, Any]) -> None:
    plugin = ws["root"] / "plugin"
    if not plugin.exists():
        (plugin / "vllm_metax").mkdir(parents=True)
        (plugin / "vllm_metax/__init__.py").write_text("")
        git(ws["root"], "init", "-q", str(plugin))
        git(plugin, "add", "-A")
        git(plugin, "commit", "-qm", "plugin")
    shown = call(ws, "environment", {"plugin_repo": "plugin"})
    assert not shown.record_exists and shown.next_step.tool == "environment"
    assert shown.next_step.arguments == {"plugin_repo": "plugin", "action": "establish"}


def test_a_smoke_output_with_long_answers_fits_failed_requests_first() -> None:
    evidence = SmokeEvidence("run", "m", "dummy", "inline", None, "f", "python", 0.0, None, [], verdict="failed")
    long_ids = list(range(100_000, 100_400))
    evidence.requests = [
        RequestRecord(f"case{i}", "completion", "first", ok=i % 5 != 0, text="x" * 400, token_ids=long_ids)
        for i in range(40)
    ]
    output = output_of(evidence)
    assert len(json.dumps(output, separators=(",", ":"))) <= RESULT_BUDGET
    assert output["requests_total"] == 40 and 0 < len(output["requests"]) < 24
    assert all(not r["ok"] for r in output["requests"][:8])
    assert output["next_step"]["tool"] == "inspect_config" and output["next_step"]["arguments"] == {"model": "m"}
