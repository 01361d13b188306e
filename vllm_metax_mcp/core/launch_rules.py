"""What a caller may pass to a process the server launches: environment variables and serve
arguments, each checked against one allow-list (defined here, once).

Rules:
* Environment variables: only names with a known, harmless prefix or name; never loader,
  interpreter or shell variables (`LD_PRELOAD`, `PYTHONPATH`, `PATH`, ...), never a variable the
  launcher sets itself (caches, ports, offline mode, device visibility, its own markers).
* Serve arguments: only listed vLLM options; options the tool owns as typed inputs (model, port,
  parallelism, load format, ...) are refused with the input to use instead.
* Every value that names a file (a path-looking value, or a path inside a JSON value) must be
  readable under the server's roots — no media or model files from elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import bad_input

Readable = Callable[[str], Path]

# -- environment -----------------------------------------------------------------------------

ENV_ALLOWED_PREFIXES = (
    "VLLM_", "MACA_", "MCCL_", "MCPYTORCH_", "MXLOG_", "NCCL_", "CUDA_", "TORCH_", "TORCHINDUCTOR_",
    "PYTORCH_", "OMP_", "MKL_", "KMP_", "GLOO_", "TRITON_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "RAY_",
)
ENV_ALLOWED_NAMES = frozenset({"TZ", "LANG", "LC_ALL"})
ENV_RESERVED = frozenset({
    # set by the launcher for every run
    "TMPDIR", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_HOST_IP", "VLLM_PORT", "VLLM_NO_USAGE_STATS",
    "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRITON_CACHE_DIR",
    "TORCHINDUCTOR_CACHE_DIR", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "RAY_ADDRESS",
    # device visibility follows the occupancy check (pass devices instead)
    "CUDA_VISIBLE_DEVICES", "MACA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
    # credentials have no place in an offline smoke test
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY",
})
ENV_DENIED_PATTERN = re.compile(r"^(LD_|DYLD_|PYTHON|BASH_|VLLM_METAX_MCP_)|PRELOAD|AUDIT")
_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "~", "./", "../", "file:")) or value in (".", "..")


def _check_path_value(value: str, where: str, readable: Readable) -> Path:
    path = value[len("file://") :] if value.startswith("file://") else value[len("file:") :] if value.startswith("file:") else value
    if not Path(path).expanduser().is_absolute():
        raise bad_input(f"{where} names {value!r}: use an absolute path (the server runs in its own directory).")
    return readable(path)  # refuses with outside_roots


def check_env(env: dict[str, str], readable: Readable) -> dict[str, str]:
    """The caller's variables, if every name is allowed and every path-like value is readable."""
    for name, value in env.items():
        if not _NAME.match(name):
            raise bad_input(f"env name {name!r} is not a plain upper-case variable name.")
        if name in ENV_RESERVED:
            raise bad_input(
                f"env {name} is set by the smoke test itself (caches, offline mode, ports, devices, PYTHONPATH "
                "from the subject); use the matching input (devices, subject, ray_address) instead."
            )
        if ENV_DENIED_PATTERN.search(name) or not (name in ENV_ALLOWED_NAMES or name.startswith(ENV_ALLOWED_PREFIXES)):
            raise bad_input(
                f"env {name} is not on the allow-list (prefixes {', '.join(ENV_ALLOWED_PREFIXES)}); loader, interpreter "
                "and shell variables such as LD_PRELOAD or PYTHONPATH are never passed."
            )
        if "\0" in value or "\n" in value:
            raise bad_input(f"env {name} contains a NUL or newline.")
        for part in re.split(r"[:,;]", value) if not value.startswith("file:") else [value]:
            if _looks_like_path(part):
                _check_path_value(part, f"env {name}", readable)
    return dict(env)


# -- serve arguments -------------------------------------------------------------------------

FLAG, VALUE, PATH, JSON, PATH_OR_TEXT = "flag", "value", "path", "json", "path_or_text"

SERVE_ARGS: dict[str, str] = {
    # switches
    "--enforce-eager": FLAG,
    "--disable-log-stats": FLAG,
    "--enable-log-requests": FLAG,
    "--enable-prefix-caching": FLAG,
    "--no-enable-prefix-caching": FLAG,
    "--enable-chunked-prefill": FLAG,
    "--no-enable-chunked-prefill": FLAG,
    "--disable-custom-all-reduce": FLAG,
    "--disable-sliding-window": FLAG,
    "--disable-cascade-attn": FLAG,
    "--enable-auto-tool-choice": FLAG,
    "--enable-eplb": FLAG,
    "--async-scheduling": FLAG,
    "--no-async-scheduling": FLAG,
    # plain values
    "--dtype": VALUE,
    "--kv-cache-dtype": VALUE,
    "--quantization": VALUE,
    "-q": VALUE,
    "--max-num-seqs": VALUE,
    "--max-num-batched-tokens": VALUE,
    "--block-size": VALUE,
    "--kv-cache-memory-bytes": VALUE,
    "--num-gpu-blocks-override": VALUE,
    "--swap-space": VALUE,
    "--cpu-offload-gb": VALUE,
    "--seed": VALUE,
    "--tokenizer-mode": VALUE,
    "--max-logprobs": VALUE,
    "--model-impl": VALUE,
    "--attention-backend": VALUE,
    "--reasoning-parser": VALUE,
    "--tool-call-parser": VALUE,
    "--chat-template-content-format": VALUE,
    "--revision": VALUE,
    "--tokenizer-revision": VALUE,
    "--code-revision": VALUE,
    "--max-parallel-loading-workers": VALUE,
    "--mm-encoder-tp-mode": VALUE,
    "--safetensors-load-strategy": VALUE,
    "--uvicorn-log-level": VALUE,
    "--max-num-partial-prefills": VALUE,
    "--data-parallel-size-local": VALUE,
    "--data-parallel-backend": VALUE,
    # files (must be readable under the roots)
    "--tokenizer": PATH,
    "--allowed-local-media-path": PATH,
    "--hf-config-path": PATH,
    "--chat-template": PATH_OR_TEXT,
    "--generation-config": PATH_OR_TEXT,
    # JSON values (paths inside them are checked too)
    "--hf-overrides": JSON,
    "--override-generation-config": JSON,
    "--limit-mm-per-prompt": JSON,
    "--mm-processor-kwargs": JSON,
    "--compilation-config": JSON,
    "-O": JSON,
    "--additional-config": JSON,
}

OWNED_ARGS: dict[str, str] = {
    "--model": "model",
    "--load-format": "load_format",
    "--max-model-len": "max_model_len",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--data-parallel-size": "dp",
    "-dp": "dp",
    "--enable-expert-parallel": "ep",
    "--trust-remote-code": "trust_remote_code",
    "--speculative-config": "speculative_config",
    "--distributed-executor-backend": "ray_address",
    "--host": "(chosen by the tool: 127.0.0.1)",
    "--port": "(chosen by the tool: a free port)",
    "--served-model-name": "(chosen by the tool)",
}
OWNED_VALUELESS = frozenset({"--enable-expert-parallel", "--trust-remote-code"})


def _json_paths(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if _looks_like_path(value) else []
    if isinstance(value, dict):
        return [p for v in value.values() for p in _json_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _json_paths(v)]
    return []


def check_json_value(text: str, where: str, readable: Readable) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = text  # e.g. `-O 3`; vLLM decides
    for path in _json_paths(value):
        _check_path_value(path, where, readable)
    return value


def split_args(args: list[str]) -> list[tuple[str, str | None]]:
    """(option, value) pairs: `--a=b`, `--a b`, `--flag`; a bare word without an option is refused."""
    pairs: list[tuple[str, str | None]] = []
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("-") or token in ("-", "--"):
            raise bad_input(f"serve argument {token!r} is not an option; extra_args takes options (e.g. --enforce-eager, --dtype float32).")
        name, eq, inline = token.partition("=")
        if name.startswith("-O") and name != "-O" and not name.startswith("--"):
            name, eq, inline = "-O", "=", name[2:]
        kind = SERVE_ARGS.get(name)
        takes_value = kind not in (FLAG, None) or (kind is None and name in OWNED_ARGS and name not in OWNED_VALUELESS)
        if eq:
            pairs.append((name, inline))
        elif takes_value:
            if index + 1 >= len(args):
                raise bad_input(f"serve argument {name} needs a value.")
            pairs.append((name, args[index + 1]))
            index += 1
        else:
            pairs.append((name, None))
        index += 1
    return pairs


def check_serve_args(args: list[str], readable: Readable) -> list[str]:
    """The caller's extra serve arguments, if every option is allowed and every file readable.

    Returned as `--option=value` words, file values resolved to absolute paths (the server runs
    in its own directory, so a relative path would mean something else there).
    """
    checked: list[str] = []
    for name, value in split_args(args):
        if name in OWNED_ARGS:
            raise bad_input(f"serve argument {name} is owned by the tool: use its input {OWNED_ARGS[name]} instead.")
        kind = SERVE_ARGS.get(name)
        if kind is None:
            raise bad_input(
                f"serve argument {name} is not on the allow-list; allowed: {', '.join(sorted(SERVE_ARGS))}."
            )
        if kind == FLAG:
            if value is not None:
                raise bad_input(f"serve argument {name} is a switch and takes no value.")
            checked.append(name)
            continue
        assert value is not None
        if "\0" in value or "\n" in value:
            raise bad_input(f"serve argument {name} contains a NUL or newline.")
        is_text = kind == PATH_OR_TEXT and ("{" in value or value in ("auto", "vllm"))
        if kind == PATH or (kind == PATH_OR_TEXT and not is_text):
            resolved = readable(value if Path(value).expanduser().is_absolute() else str(Path(value)))
            value = str(resolved)
        elif kind == JSON:
            check_json_value(value, f"serve argument {name}", readable)
        checked.append(f"{name}={value}")
    return checked


def lift_owned_args(args: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Split a batched_test entry's arguments into owned settings, the rest, and notes on what was dropped.

    Example files carry their own `--tensor-parallel-size`, `--max-model-len` or `--port`; the
    settings become typed inputs, host/port/served name are the tool's choice.
    """
    owned: dict[str, Any] = {}
    rest: list[str] = []
    notes: list[str] = []
    for name, value in split_args(args):
        field = OWNED_ARGS.get(name)
        if field is None:
            rest += [name] if value is None else [f"{name}={value}"]
        elif field.startswith("("):
            notes.append(f"dropped {name} {value or ''} from the example: {field[1:-1]}".rstrip())
        elif name in OWNED_VALUELESS:
            owned[field] = True if name == "--trust-remote-code" else "expert_parallel"
        elif field == "ray_address":
            notes.append(f"dropped {name} {value}: pass ray_address to use Ray")
        elif field == "speculative_config":
            owned[field] = json.loads(value) if value else None
        elif field in ("max_model_len", "tp", "pp", "dp"):
            owned[field] = int(value) if value and value.isdigit() else value
        elif field == "gpu_memory_utilization":
            owned[field] = float(value) if value else None
        else:
            owned[field] = value
    return owned, rest, notes
