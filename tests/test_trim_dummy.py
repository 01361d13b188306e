"""trim_model output_mode=dummy: the rewritten config (checked by inspect_config, transformers and the real
vLLM CPU build), assets, manifest and smoke cases, written atomically and only where allowed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import snapshot
from mcp import Client, MCPError
from test_inspect_config import FIXTURES, fixture, glm5_tensors, write_model

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.trim.cases import read_case_file
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools import inspect_config as inspect_tool
from vllm_metax_mcp.tools import trim_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(120)

#: The new depth of every real config's trim, and the kept original layers in order.
KEPT = {
    "v3": [0, 3],
    "v32": [0, 3],
    "v4": [0, 2, 3],
    "qnext": [0, 3],
    "q3moe": [0],
    "llama": [0],
    "glm5": [0, 3],
    "gemma3": [0, 5],
}
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ messages[0]['content'] }}"}


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "root" / "hf-cache"))


def runtime(
    root: Path,
    mode: str = "edit",
    outputs: list[str] | None = None,
    state: Path | None = None,
    python: Path | None = None,
) -> Runtime:
    """`python`: an interpreter the operator allows (outside the roots, like the CPU vLLM's)."""
    return Runtime.create(
        [str(root)],
        output_roots=outputs,
        mode=mode,
        state_dir=str(state or root.parent / "state"),
        interpreters=[str(python)] if python else None,
    )


def trim(root: Path, arguments: dict[str, Any], rt: Runtime | None = None) -> tool.TrimModelOutput:
    env = ToolEnv(runtime=rt or runtime(root), tool="trim_model")
    return anyio.run(lambda: invoke(tool.SPEC, arguments, env))


def inspect(root: Path, arguments: dict[str, Any], rt: Runtime | None = None) -> inspect_tool.InspectConfigOutput:
    env = ToolEnv(runtime=rt or runtime(root), tool="inspect_config")
    return anyio.run(lambda: invoke(inspect_tool.SPEC, {"construct": False, **arguments}, env))


def refused(root: Path, arguments: dict[str, Any], code: ErrorCode, rt: Runtime | None = None) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        trim(root, arguments, rt)
    assert info.value.code is code, info.value.to_dict()
    assert "Traceback" not in info.value.message and str(root) not in info.value.message
    return info.value


def source_with_assets(root: Path, name: str) -> Path:
    """A real config beside the files a checkpoint directory holds: tokenizer in two formats, weights, docs."""
    model = write_model(root / name, fixture(name))
    (model / "tokenizer.json").write_text('{"version": "1.0"}')
    (model / "tokenizer.model").write_bytes(b"\x00sentencepiece")
    (model / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    (model / "generation_config.json").write_text('{"do_sample": false}')
    (model / "model-00001-of-000163.safetensors").write_bytes(b"\x00" * 16)
    (model / "README.md").write_text("# model card\n")
    (model / "configuration_deepseek.py").write_text("# remote config code named by auto_map\n")
    return model


def leftovers(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith((".partial", ".old"))
    )


# -- the written directory ------------------------------------------------------------------------


def test_dummy_trim_writes_config_one_tokenizer_format_manifest_and_smoke_cases(tmp_path: Path) -> None:
    root = tmp_path / "root"
    model = source_with_assets(root, "v3")
    before = snapshot(model)
    result = trim(root, {"model": "v3", "output": "trimmed/v3-tiny"})
    out = root / "trimmed" / "v3-tiny"
    assert result.files == sorted(
        [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "configuration_deepseek.py",
            "smoke_cases.yaml",
            "trim_manifest.json",
        ]
    )
    assert sorted(p.name for p in out.iterdir()) == result.files
    assert (result.output, result.output_mode, result.manifest) == (
        "trimmed/v3-tiny",
        "dummy",
        "trimmed/v3-tiny/trim_manifest.json",
    )
    assert "asset skipped: tokenizer.model (another format of tokenizer.json)" in result.notes
    assert "asset skipped: model-00001-of-000163.safetensors (weights (dummy mode loads none))" in result.notes
    config = json.loads((out / "config.json").read_text())
    assert list(config) == list(fixture("v3"))  # edited as JSON: the original key order, nothing added
    assert (config["num_hidden_layers"], config["first_k_dense_replace"], config["num_nextn_predict_layers"]) == (
        2,
        1,
        1,
    )
    assert config["auto_map"] == fixture("v3")["auto_map"]

    manifest = json.loads((out / "trim_manifest.json").read_text())
    assert (
        manifest["statement"].startswith("A trimmed model proves execution paths")
        and "accuracy" in manifest["statement"]
    )
    assert manifest["output_mode"] == "dummy" and manifest["source"]["model"] == "v3"
    assert set(manifest["source"]["sha256"]) == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "configuration_deepseek.py",
    }
    assert manifest["plan"]["layer_map"] == {"0": 0, "3": 1, "61": 2} and manifest["plan"]["uncovered"] == []
    assert {row["target"] for row in manifest["plan"]["coverage"]} >= {"dense", "moe", "mtp"}
    assert manifest["files"]["config.json"] == hashlib.sha256((out / "config.json").read_bytes()).hexdigest()
    assert result.manifest_sha256 == hashlib.sha256((out / "trim_manifest.json").read_bytes()).hexdigest()
    assert (
        str(tmp_path) not in (out / "trim_manifest.json").read_text() and str(tmp_path) not in result.model_dump_json()
    )

    cases = read_case_file(out / "smoke_cases.yaml")
    assert cases.format == "smoke_cases" and cases.serve.load_format == "dummy"
    assert cases.serve.speculative_config == {"method": "mtp", "num_speculative_tokens": 1}
    assert [c.name for c in cases.cases] == ["text", "chat", "mtp-draft"]
    assert cases.cases[0].covers == "backbone: dense, attn:full, moe"
    assert snapshot(model) == before and leftovers(root / "trimmed") == []


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_trimmed_config_reinspects_with_the_kinds_of_its_kept_layers(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    write_model(root / name, fixture(name))
    rt = runtime(root)
    result = trim(root, {"model": name, "output": "out"}, rt)
    original = {row.id: row.kinds for row in inspect(root, {"model": name}, rt).layers}
    trimmed = inspect(root, {"model": "out"}, rt)
    assert trimmed.findings == [], trimmed.findings
    kept = KEPT[name]
    assert result.kept_layers == kept and trimmed.backbone_layers == len(kept)
    for new, old in enumerate(kept):
        assert trimmed.layers[new].kinds == original[old], (new, old)
    assert trimmed.mtp_layers == fixture(name).get("num_nextn_predict_layers")


def test_glm5_ignore_list_in_the_written_config(tmp_path: Path) -> None:
    root = tmp_path / "root"
    config = fixture("glm5")
    write_model(root / "glm5", config, glm5_tensors(config), ["model-00001-of-00282.safetensors"], with_shards=False)
    trim(root, {"model": "glm5", "output": "glm5-tiny"})
    written = json.loads((root / "glm5-tiny" / "config.json").read_text())["quantization_config"][
        "modules_to_not_convert"
    ]
    original = config["quantization_config"]["modules_to_not_convert"]
    expected = (
        ["lm_head", "model.embed_tokens", "model.norm"]
        + [e for e in original if e.startswith("model.layers.0.")]
        + [e.replace("model.layers.3.", "model.layers.1.") for e in original if e.startswith("model.layers.3.")]
        + [e.replace("model.layers.78.", "model.layers.2.") for e in original if e.startswith("model.layers.78.")]
    )
    assert sorted(written) == sorted(expected) and len(written) == 32
    assert written.index("model.embed_tokens") < written.index("model.layers.0.input_layernorm")  # original order kept
    ignore = inspect(root, {"model": "glm5-tiny"}).quantization.ignore
    assert ignore.per_layer == [{"layers": "0", "count": 7}, {"layers": "1", "count": 9}, {"layers": "2", "count": 13}]
    assert ignore.beyond_declared == []


# -- refusals -------------------------------------------------------------------------------------


def test_output_outside_the_roots_into_the_source_or_a_protected_path_is_refused_with_nothing_written(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    source_with_assets(root, "llama")
    (root / "repo" / ".git").mkdir(parents=True)
    (root / "hf-cache").mkdir()
    before = snapshot(root)
    refused(root, {"model": "llama", "output": str(tmp_path / "elsewhere")}, ErrorCode.OUTSIDE_ROOTS)
    refused(root, {"model": "llama", "output": "llama/tiny"}, ErrorCode.PROTECTED_PATH)
    refused(root, {"model": "llama", "output": "llama"}, ErrorCode.PROTECTED_PATH)
    refused(root, {"model": "llama", "output": "."}, ErrorCode.PROTECTED_PATH)  # would contain the source
    refused(root, {"model": "llama", "output": "hf-cache/tiny"}, ErrorCode.PROTECTED_PATH)
    refused(root, {"model": "llama", "output": "repo/.git/tiny"}, ErrorCode.PROTECTED_PATH)
    outputs = runtime(root, outputs=[str(tmp_path / "outputs")])
    (tmp_path / "outputs").mkdir()
    refused(
        root, {"model": "llama", "output": "tiny"}, ErrorCode.OUTSIDE_ROOTS, outputs
    )  # roots are not output roots here
    assert snapshot(root) == before and not (tmp_path / "elsewhere").exists()
    assert trim(root, {"model": "llama", "output": str(tmp_path / "outputs" / "tiny")}, outputs).kept_layers == [0]
    assert (tmp_path / "outputs" / "tiny" / "config.json").is_file()


def test_existing_output_needs_overwrite_and_a_failed_plan_leaves_it_untouched(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_model(root / "v4", fixture("v4"))
    first = trim(root, {"model": "v4", "output": "tiny"})
    before = snapshot(root / "tiny")
    assert "already exists" in refused(root, {"model": "v4", "output": "tiny"}, ErrorCode.BAD_INPUT).message
    message = refused(
        root, {"model": "v4", "output": "tiny", "overwrite": True, "layers": [0, 3]}, ErrorCode.BAD_INPUT
    ).message
    assert "compress:4" in message and snapshot(root / "tiny") == before and leftovers(root) == []
    again = trim(
        root, {"model": "v4", "output": "tiny", "overwrite": True, "layers": [0, 3], "allow_drop": ["compress:4"]}
    )
    assert again.kept_layers == [0, 3] and first.kept_layers == [0, 2, 3]
    assert json.loads((root / "tiny" / "config.json").read_text())["compress_ratios"] == [0, 128, 0]
    assert leftovers(root) == []


def test_review_mode_hides_trim_model_and_refuses_it_by_name(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_model(root / "llama", fixture("llama"))
    assert tool.SPEC in ALL_TOOLS

    async def run() -> tuple[set[str], MCPError]:
        server = build_server(runtime(root, mode="review"))
        async with Client(server) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            with pytest.raises(MCPError) as info:
                await client.call_tool("trim_model", {"model": "llama", "output": "tiny"})
            return listed, info.value

    listed, error = anyio.run(run)
    assert "trim_model" not in listed and "plan_trim" in listed
    assert error.error.data["code"] == "review_mode"
    assert not (root / "tiny").exists()

    async def edit() -> Any:
        server = build_server(runtime(root))
        async with Client(server) as client:
            return {t.name: t for t in (await client.list_tools()).tools}["trim_model"]

    hints = anyio.run(edit).annotations
    assert (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint) == (False, True, False)


# -- transformers and the real vLLM CPU build ---------------------------------------------------


@pytest.fixture(scope="module")
def shared_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state directory for the slow tests, so vLLM's model-class cache is reused between them."""
    return tmp_path_factory.mktemp("state")


TRANSFORMERS_FOREIGN = {"v4": {"compress_ratios", "num_hash_layers"}}
"""Fields transformers' own class drops (vLLM's class keeps them; inspect_config reports it)."""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_trimmed_configs_load_in_transformers_and_the_real_vllm(
    tmp_path: Path, vllm_cpu_python: Path, shared_state: Path, name: str
) -> None:
    root = tmp_path / "root"
    write_model(root / name, fixture(name))
    rt = runtime(root, state=shared_state, python=vllm_cpu_python)
    changed = {c.field for c in trim(root, {"model": name, "output": "out"}, rt).config_changes}
    depth = len(KEPT[name])
    mtp = bool(fixture(name).get("num_nextn_predict_layers"))
    arguments = {
        "model": "out",
        "construct": True,
        "python": str(vllm_cpu_python),
        **({"speculative": "mtp"} if mtp else {}),
    }
    result = inspect(root, arguments, rt)
    built = result.constructed
    assert built.status == "complete", built.errors
    assert built.total_layers == depth and built.transformers_class is not None
    altered = {d.field for d in built.differences if d.config == "target" and d.change != "removed"} & changed
    assert altered == set(), (
        altered
    )  # vLLM's config keeps every rewritten field as written (or consumes it: layer_types)
    dropped = {d.field for d in built.differences if d.config == "transformers"} & changed
    assert dropped == TRANSFORMERS_FOREIGN.get(name, set())
    if mtp:
        assert (
            built.draft["num_hidden_layers"] == depth and built.draft["n_predict"] == 1
        )  # the MTP layer follows the backbone
    expected = [
        "full_attention"
        if "attn:full" in r.kinds
        else "sliding_attention"
        if "attn:sliding" in r.kinds
        else "linear_attention"
        for r in result.layers[:depth]
    ]
    layer_types = next(
        (d.constructed for d in built.differences if d.config == "target" and d.field == "layer_types"), None
    )
    if name in ("gemma3", "qnext"):
        assert layer_types == json.dumps(expected)
    assert [f.code for f in result.findings if f.code != "mtp_entries_dropped"] == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_dummy_trimmed_tiny_model_passes_run_smoke_test(tmp_path: Path, vllm_cpu_python: Path) -> None:
    from tiny_models import build_model

    from vllm_metax_mcp.tools import run_smoke_test as smoke_tool

    root = tmp_path / "root"
    build_model(root / "tiny-llama", layers=4)
    rt = runtime(root, python=vllm_cpu_python)
    result = trim(root, {"model": "tiny-llama", "output": "tiny-llama-trim"}, rt)
    assert (
        result.kept_layers == [0]
        and json.loads((root / "tiny-llama-trim" / "config.json").read_text())["num_hidden_layers"] == 1
    )
    arguments = {
        "model": "tiny-llama-trim",
        "python": str(vllm_cpu_python),
        "extra_args": ["--enforce-eager", "--kv-cache-memory-bytes", "64M", "--dtype", "float32"],
        "timeout_s": 600,
    }
    env = ToolEnv(runtime=rt, tool="run_smoke_test")
    out = anyio.run(lambda: invoke(smoke_tool.SPEC, arguments, env, job_wait_s=float("inf")))
    assert out.verdict == "passed", (out.reasons, out.log_tail[-2000:])
    assert out.cases_source == "smoke_cases:smoke_cases.yaml" and out.manifest_sha256 == result.manifest_sha256
    assert {r.case for r in out.requests} >= {"text", "chat"} and all(r.ok for r in out.requests)
    assert out.teardown["leftover_pids"] == []
