"""`make demo`: build a small workspace, start the server over stdio, call every tool, print the results.

The workspace is a plugin-like git repository (with a staged and a different unstaged edit), an
upstream-like git repository with two tagged releases, and a tiny safetensors model.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

GIT = ["git", "-c", "user.name=demo", "-c", "user.email=demo@example.invalid", "-c", "init.defaultBranch=main"]

PLUGIN_FILES = {
    "vllm_metax/__init__.py": "def register():\n    return 'vllm_metax.platform.MacaPlatform'\n",
    "vllm_metax/models/__init__.py": (
        "from vllm import ModelRegistry\n\n\n"
        "def register_model():\n"
        '    ModelRegistry.register_model("DeepseekV2ForCausalLM", '
        '"vllm_metax.models.deepseek_v2:DeepseekV2ForCausalLM")\n'
    ),
    "vllm_metax/models/deepseek_v2.py": (
        "class DeepseekV2ForCausalLM:\n    dtype = 'bfloat16'  # MetaX: keep the BF16 path\n"
    ),
    "AGENTS.md": "Read docs/developer_guide.md before changing models.\n",
}
REGISTRY = '_TEXT_GENERATION_MODELS = {"DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM")}\n'
UPSTREAM_RELEASES = {
    "v0.1.0": {
        "vllm/__init__.py": "",
        "vllm/model_executor/__init__.py": "",
        "vllm/model_executor/models/__init__.py": "",
        "vllm/model_executor/models/registry.py": REGISTRY,
        "vllm/model_executor/models/deepseek_v2.py": "class DeepseekV2ForCausalLM:\n    dtype = 'bfloat16'\n",
    },
    "v0.2.0": {"vllm/model_executor/models/deepseek_v2.py": "class DeepseekV2ForCausalLM:\n    dtype = 'fp8'\n"},
}
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 4,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


def git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True)


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def tiny_safetensors(path: Path) -> None:
    """Two F32 tensors written byte by byte in the safetensors layout (8-byte header length, JSON, data)."""
    tensors = {"model.embed_tokens.weight": (4, 2), "model.layers.0.mlp.down_proj.weight": (2, 2)}
    header, data, offset = {}, b"", 0
    for name, shape in tensors.items():
        count = shape[0] * shape[1]
        blob = struct.pack(f"<{count}f", *[float(i) for i in range(count)])
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        data, offset = data + blob, offset + len(blob)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def build_workspace(root: Path) -> dict[str, Path]:
    plugin, upstream, model = root / "vllm-metax", root / "vllm", root / "tiny-model"
    for repo in (plugin, upstream):
        repo.mkdir()
        git(repo, "init", "-q")
    write_files(plugin, PLUGIN_FILES)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "initial plugin")
    write_files(
        plugin, {"vllm_metax/models/deepseek_v2.py": "class DeepseekV2ForCausalLM:\n    dtype = 'int8'  # staged\n"}
    )
    git(plugin, "add", "-A")
    write_files(
        plugin, {"vllm_metax/models/deepseek_v2.py": "class DeepseekV2ForCausalLM:\n    dtype = 'fp8'  # unstaged\n"}
    )
    for tag, files in UPSTREAM_RELEASES.items():
        write_files(upstream, files)
        git(upstream, "add", "-A")
        git(upstream, "commit", "-qm", f"release {tag}")
        git(upstream, "tag", tag)
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIG, indent=1))
    tiny_safetensors(model / "model.safetensors")
    return {"plugin": plugin, "upstream": upstream, "model": model}


def compact(value):
    """Long lists shrink to their length so every result fits on a screen."""
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} items]"
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items() if v not in (None, [], {})}
    return value


def summarise(name: str, result) -> None:
    body = result.structured_content if result.structured_content is not None else result.content[0].text
    print(f"\n== {name}{' (error)' if result.is_error else ''}")
    print(json.dumps(compact(body), indent=1) if not isinstance(body, str) else body)


def demo_calls() -> list[tuple[str, str, dict[str, Any]]]:
    """The calls the demo makes, in the order of the upgrade workflow: (title, tool, arguments)."""
    plugin = {"plugin_repo": "vllm-metax"}
    return [
        ("environment show", "environment", {**plugin, "action": "show"}),
        (
            "environment establish",
            "environment",
            {
                **plugin,
                "action": "establish",
                "subject": "index",
                "upstream": "vllm",
                "target": "v0.2.0",
                "python": sys.executable,
            },
        ),
        (
            "environment confirm",
            "environment",
            {**plugin, "action": "confirm", "upstream": "vllm", "target": "v0.2.0"},
        ),
        ("diff_model of the staged model", "diff_model", {**plugin, "subject": "index", "detail": "symbols"}),
        (
            "trace_dependency from the registration",
            "trace_dependency",
            {**plugin, "arch": "DeepseekV2ForCausalLM"},
        ),
        ("audit_commits of the release range", "audit_commits", {**plugin, "action": "list", "base": "v0.1.0"}),
        ("inspect_config of the tiny model", "inspect_config", {**plugin, "model": "tiny-model"}),
        ("plan_trim of the tiny model", "plan_trim", {**plugin, "model": "tiny-model"}),
        (
            "trim_model (dummy)",
            "trim_model",
            {**plugin, "model": "tiny-model", "output": "tiny-trimmed", "output_mode": "dummy"},
        ),
        (
            "trim_model (real weights: copied, verified, extract.py proven)",
            "trim_model",
            {**plugin, "model": "tiny-model", "output": "tiny-trimmed-real", "output_mode": "real"},
        ),
        (
            "export_snapshot of the staged index",
            "export_snapshot",
            {**plugin, "subject": "index", "output": "staged-snapshot"},
        ),
        (
            "run_smoke_test (needs a vLLM in the recorded interpreter)",
            "run_smoke_test",
            {**plugin, "model": "tiny-trimmed"},
        ),
        ("jobs", "jobs", {"action": "list"}),
    ]


async def drive(paths: dict[str, Path], state: Path) -> None:
    script = Path(sys.executable).parent / "vllm-metax-mcp"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "vllm_metax_mcp"]
    params = StdioServerParameters(
        command=command[0],
        # --python: the interpreter the server may run (probes, smoke tests); here the demo's own
        args=[
            *command[1:],
            "serve",
            "--root",
            str(paths["plugin"].parent),
            "--state-dir",
            str(state),
            "--python",
            sys.executable,
        ],
    )
    async with Client(params) as client:
        tools = await client.list_tools()
        print("tools:", ", ".join(f"{t.name} (read-only={t.annotations.read_only_hint})" for t in tools.tools))
        for title, tool, arguments in demo_calls():
            summarise(title, await client.call_tool(tool, arguments))
        staged = (paths["plugin"].parent / "staged-snapshot/vllm_metax/models/deepseek_v2.py").read_text()
        print("\nexported staged file:", staged.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="vllm-metax-mcp-demo-") as tmp:
        paths = build_workspace(Path(tmp))
        anyio.run(drive, paths, Path(tmp) / "state")


if __name__ == "__main__":
    main()
