"""What a caller may pass to a process the server launches: environment variables and serve
arguments, each checked against one allow-list (defined here, once).

Rules:
* Environment variables: only names with a known, harmless prefix or name; never loader,
  interpreter or shell variables (`LD_PRELOAD`, `PYTHONPATH`, `PATH`, ...), never a variable the
  launcher sets itself (caches, ports, offline mode, device visibility, its own markers).
* Serve arguments: only listed vLLM options; options the tool owns as typed inputs (model, port,
  parallelism, load format, ...) are refused with the input to use instead.
* Every value that could name a file must name one readable under the server's roots.
* In review mode, a value may name a path in (or above) a read root only where vLLM merely reads
  it: the file options and the read-only JSON options. An environment variable is as likely to
  name where to write (a log, a cache, a dump: `NCCL_DEBUG_FILE`, `VLLM_TORCH_PROFILER_DIR`) as
  what to read, and so are the plain-value options and the JSON options that may hold output
  directories (`--compilation-config`/`-O`: `debug_dump_path`, `cache_dir`; `--additional-config`,
  defined by the platform plugin): there it is refused (`review_mode`), since review mode promises
  nothing is written into the reviewed trees. Files to read go in as file options. (vLLM options
  that name a write destination themselves, such as `--download-dir`, are not on the allow-list.)

The rules read the roots and the mode from the policy whose `readable` method they are given;
which values could name a file, and how each is read, is `readings.py`.

File options (`--tokenizer`, `--chat-template`, ...) are rewritten where they name a file, since
the launched server would look relative paths up in its run directory: a value spelt as a path
(absolute, `~`, `file:`, `./`, `../`), or a bare relative one naming an existing entry under the
first root, must pass `policy.readable` (relative ones against the first root, so `tmp/../../x`
or a symlink leading out is refused) and is passed as that resolved absolute path (vLLM expands
no variables: a `$` in it stays literal, and its expanded readings are checked as well). Any
other value is passed unchanged and read as above (a hub id, an inline template); vLLM's
keywords (`--generation-config auto|vllm`) name no file. Messages quote the caller's spelling,
never a resolved or expanded path.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, NamedTuple, TypedDict

from ..foundation.errors import ToolFailure, bad_input
from .readings import (
    FILE_URL,
    JSON_START,
    Readable,
    ValueRules,
    check_json,
    check_paths,
    check_text,
    load_json,
    outside_roots,
    readings,
)

# -- environment -----------------------------------------------------------------------------

ENV_ALLOWED_PREFIXES = (
    "VLLM_",
    "MACA_",
    "MCCL_",
    "MCPYTORCH_",
    "MXLOG_",
    "NCCL_",
    "CUDA_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GLOO_",
    "TRITON_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "RAY_",
)
ENV_ALLOWED_NAMES = frozenset({"TZ", "LANG", "LC_ALL"})
ENV_RESERVED = frozenset(
    {
        # set by the launcher for every run
        "TMPDIR",
        "VLLM_CACHE_ROOT",
        "VLLM_CONFIG_ROOT",
        "VLLM_HOST_IP",
        "VLLM_PORT",
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "DO_NOT_TRACK",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONPATH",
        "RAY_ADDRESS",
        # Ray's job config and runtime-env hooks run code and set variables in the driver and every worker
        # (runtime_env env_vars, setup hooks, pip): the run sets the job config itself, with its tag only
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        "RAY_RUNTIME_ENV_HOOK",
        "RAY_OVERRIDE_JOB_RUNTIME_ENV",
        "RAY_RUNTIME_ENV_SETUP_HOOK",
        # device visibility follows the occupancy check (pass devices instead)
        "CUDA_VISIBLE_DEVICES",
        "MACA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        # credentials have no place in an offline smoke test
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "VLLM_API_KEY",
    }
)
ENV_DENIED_PATTERN = re.compile(r"^(LD_|DYLD_|PYTHON|BASH_|VLLM_METAX_MCP_)|PRELOAD|AUDIT")
_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def _known_in_launch(name: str) -> bool:
    """Whether the launched server has this variable with the value it has here: not one the
    launcher sets per run, removes (PYTHONPATH, ...) or never passes."""
    return name not in ENV_RESERVED and not ENV_DENIED_PATTERN.search(name)


def _rules(readable: Readable, env: Mapping[str, str] | None = None) -> ValueRules:
    variables = {name: value for name, value in os.environ.items() if _known_in_launch(name)}
    variables.update(env or {})
    return ValueRules.of(readable, variables)


def check_env(env: dict[str, str], readable: Readable) -> dict[str, str]:
    """The caller's variables, if every name is allowed and no value could name a file outside the
    roots (nor, in review mode, a path in a read root: any variable may name a write destination)."""
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
                f"env {name} is not on the allow-list (prefixes {', '.join(ENV_ALLOWED_PREFIXES)}); loader, "
                "interpreter and shell variables such as LD_PRELOAD or PYTHONPATH are never passed."
            )
        if "\0" in value or "\n" in value:
            raise bad_input(f"env {name} contains a NUL or newline.")
    rules = _rules(readable, env)
    for name, value in env.items():
        check_text(value, f"env {name}", rules, lists=True, read_only=False)
        if value.lstrip().startswith(JSON_START):
            loaded = load_json(value, f"env {name}")
            if loaded is not None:
                check_json(loaded.value, f"env {name}", rules, read_only=False)
    return dict(env)


# -- serve arguments -------------------------------------------------------------------------


class ArgKind(Enum):
    """FILE and JSON options are only read by vLLM; JSON_OUT ones may also name where it writes."""

    FLAG = "flag"
    VALUE = "value"
    FILE = "file"
    JSON = "json"
    JSON_OUT = "json naming outputs"


FLAG, VALUE, FILE, JSON, JSON_OUT = ArgKind.FLAG, ArgKind.VALUE, ArgKind.FILE, ArgKind.JSON, ArgKind.JSON_OUT

SERVE_ARGS: dict[str, ArgKind] = {
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
    # files, or text (a hub id, an inline template, a keyword): see the module docstring
    "--tokenizer": FILE,
    "--allowed-local-media-path": FILE,
    "--hf-config-path": FILE,
    "--chat-template": FILE,
    "--generation-config": FILE,
    # JSON values (every string inside is read too)
    "--hf-overrides": JSON,
    "--override-generation-config": JSON,
    "--limit-mm-per-prompt": JSON,
    "--mm-processor-kwargs": JSON,
    # JSON values that may name output directories (debug_dump_path, cache_dir; the plugin's own)
    "--compilation-config": JSON_OUT,
    "-O": JSON_OUT,
    "--additional-config": JSON_OUT,
}

OwnedInput = Literal[
    "model",
    "load_format",
    "max_model_len",
    "gpu_memory_utilization",
    "tp",
    "pp",
    "dp",
    "ep",
    "trust_remote_code",
    "speculative_config",
    "ray_address",
]
"""The tool input that sets what an owned option would."""

OWNED_ARGS: dict[str, OwnedInput] = {
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
}
OWNED_VALUELESS = frozenset({"--enable-expert-parallel", "--trust-remote-code"})
CHOSEN_BY_TOOL: dict[str, str] = {
    "--host": "chosen by the tool: 127.0.0.1",
    "--port": "chosen by the tool: a free port",
    "--served-model-name": "chosen by the tool",
}
"""Options no input sets: the tool decides them for every run."""

# vLLM's own keywords for a file option: never opened as files.
FILE_KEYWORDS: dict[str, frozenset[str]] = {"--generation-config": frozenset({"auto", "vllm"})}


@dataclass(frozen=True)
class Option:
    """One serve option as given: `--a=b`, `--a b` (value b) or `--flag` (no value)."""

    name: str
    value: str | None


class OwnedSettings(TypedDict, total=False):
    """The owned options of a batched_test entry, by the input they stand for (only those it sets)."""

    model: str
    load_format: str
    max_model_len: int | str
    """A number, or vLLM's human-readable form (`4k`), passed on as it is."""
    gpu_memory_utilization: float
    tp: int
    pp: int
    dp: int
    ep: bool
    trust_remote_code: bool
    speculative_config: dict[str, Any]


class LiftedArgs(NamedTuple):
    """A batched_test entry's arguments split: owned settings, the rest (as given), notes on what was dropped."""

    owned: OwnedSettings
    rest: list[str]
    notes: list[str]


def check_json_value(text: str, where: str, readable: Readable, *, names_outputs: bool = False) -> Any:
    """A JSON-valued option's value (or its text, when it is not JSON: `-O 3`; vLLM decides), if no
    string in it could name a file outside the roots (nor, in review mode when the option may name
    where vLLM writes, a path in a read root)."""
    rules = _rules(readable)
    loaded = load_json(text, where)
    if loaded is None:
        check_text(text, where, rules, lists=True, read_only=not names_outputs)
        return text
    check_json(loaded.value, where, rules, read_only=not names_outputs)
    return loaded.value


def _spelt_as_path(value: str) -> bool:
    """Absolute, home-relative, a file URL, or explicitly relative: the caller means a file."""
    return (
        os.path.isabs(value)
        or value.startswith(("~", "./", "../"))
        or value in (".", "..")
        or bool(FILE_URL.match(value))
    )


def _check_file_option(name: str, value: str, rules: ValueRules) -> str:
    """The word to pass for a file option: the resolved file under the roots, or the text unchanged."""
    where = f"serve argument {name}"
    if value in FILE_KEYWORDS.get(name, ()):
        return value
    if "\0" in value:
        raise bad_input(f"{where} contains a NUL byte.")
    if _spelt_as_path(value):
        found = readings(value, where, rules, lists=False)
        # vLLM expands no variables, a consumer of the path might
        check_paths([r for r in found if r.depth and os.path.isabs(r.text)], where, rules, read_only=True)
        literal = [reading.text for reading in found if not reading.depth]
        target = next((f for f in reversed(literal) if os.path.isabs(f)), literal[-1])
    else:
        target = value
    try:
        resolved = rules.readable(target)  # relative: against the first root
    except ToolFailure as failure:
        raise outside_roots(where, value) from failure
    if _spelt_as_path(value) or os.path.lexists(resolved):
        return str(resolved)
    check_text(value, where, rules, lists=False, read_only=True)  # passed unchanged: read from the run directory
    return value


def split_args(args: list[str]) -> list[Option]:
    """The options of a list of words: `--a=b`, `--a b`, `--flag`; a bare word without an option is refused."""
    options: list[Option] = []
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("-") or token in ("-", "--"):
            raise bad_input(
                f"serve argument {token!r} is not an option; extra_args takes options "
                "(e.g. --enforce-eager, --dtype float32)."
            )
        name, eq, inline = token.partition("=")
        if name.startswith("-O") and name != "-O" and not name.startswith("--"):
            name, eq, inline = "-O", "=", name[2:]
        kind = SERVE_ARGS.get(name)
        owned = name in OWNED_ARGS or name in CHOSEN_BY_TOOL
        takes_value = kind not in (FLAG, None) or (kind is None and owned and name not in OWNED_VALUELESS)
        if eq:
            options.append(Option(name, inline))
        elif takes_value:
            if index + 1 >= len(args):
                raise bad_input(f"serve argument {name} needs a value.")
            options.append(Option(name, args[index + 1]))
            index += 1
        else:
            options.append(Option(name, None))
        index += 1
    return options


def check_serve_args(args: list[str], readable: Readable) -> list[str]:
    """The caller's extra serve arguments, if every option is allowed and no value could name a
    file outside the roots.

    Returned as `--option=value` words; a file option naming a file under the roots is resolved to
    its absolute path (the server runs in its own directory, so a relative path would mean
    something else there).
    """
    rules = _rules(readable)
    checked: list[str] = []
    for option in split_args(args):
        name, value = option.name, option.value
        owned_by = OWNED_ARGS.get(name) or (f"({CHOSEN_BY_TOOL[name]})" if name in CHOSEN_BY_TOOL else None)
        if owned_by:
            raise bad_input(f"serve argument {name} is owned by the tool: use its input {owned_by} instead.")
        kind = SERVE_ARGS.get(name)
        if kind is None:
            raise bad_input(
                f"serve argument {name} is not on the allow-list; allowed: {', '.join(sorted(SERVE_ARGS))}."
            )
        if kind is FLAG:
            if value is not None:
                raise bad_input(f"serve argument {name} is a switch and takes no value.")
            checked.append(name)
            continue
        assert value is not None
        if "\0" in value or "\n" in value:
            raise bad_input(f"serve argument {name} contains a NUL or newline.")
        if kind is FILE:
            value = _check_file_option(name, value, rules)
        elif kind in (JSON, JSON_OUT):
            check_json_value(value, f"serve argument {name}", readable, names_outputs=kind is JSON_OUT)
        else:
            check_text(value, f"serve argument {name}", rules, lists=False, read_only=False)
        checked.append(f"{name}={value}")
    return checked


def _whole_number(name: str, value: str) -> int:
    if not value.isdigit():
        raise bad_input(f"the example's {name} {value!r} is not a whole number.")
    return int(value)


def _share(name: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise bad_input(f"the example's {name} {value!r} is not a number.") from None


def _json_object(name: str, value: str) -> dict[str, Any]:
    try:
        loaded = json.loads(value)
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict):
        raise bad_input(f"the example's {name} is not a JSON object.")
    return loaded


def lift_owned_args(args: list[str]) -> LiftedArgs:
    """Split a batched_test entry's arguments into owned settings, the rest, and notes on what was dropped.

    Example files carry their own `--tensor-parallel-size`, `--max-model-len` or `--port`; the
    settings become typed inputs, host/port/served name are the tool's choice. An owned option
    given an empty value sets nothing.
    """
    owned = OwnedSettings()
    rest: list[str] = []
    notes: list[str] = []
    for option in split_args(args):
        name, value = option.name, option.value
        field = OWNED_ARGS.get(name)
        if name in CHOSEN_BY_TOOL:
            notes.append(f"dropped {name} {value or ''} from the example: {CHOSEN_BY_TOOL[name]}".rstrip())
        elif field is None:
            rest += [name] if value is None else [f"{name}={value}"]
        elif field == "ep":
            owned["ep"] = True
        elif field == "trust_remote_code":
            owned["trust_remote_code"] = True
        elif field == "ray_address":
            notes.append(f"dropped {name} {value}: pass ray_address to use Ray")
        elif not value:
            continue
        elif field == "speculative_config":
            owned["speculative_config"] = _json_object(name, value)
        elif field == "max_model_len":
            owned["max_model_len"] = int(value) if value.isdigit() else value
        elif field == "tp":
            owned["tp"] = _whole_number(name, value)
        elif field == "pp":
            owned["pp"] = _whole_number(name, value)
        elif field == "dp":
            owned["dp"] = _whole_number(name, value)
        elif field == "gpu_memory_utilization":
            owned["gpu_memory_utilization"] = _share(name, value)
        elif field == "load_format":
            owned["load_format"] = value
        else:
            owned["model"] = value  # the tool's model input decides: dropped
    return LiftedArgs(owned, rest, notes)
