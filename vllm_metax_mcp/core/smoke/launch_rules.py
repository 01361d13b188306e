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

The rules read the roots and the mode from the policy whose `readable` method they are given.

Which values could name a file. Any string without NUL is a valid path name, so no value is
"text" by its look (a `{`, a missing `./`): a value is judged by what the launched process could
open with it. The smoke server runs with its working directory set to its run directory
(`core/smoke/run.py`: `cwd=<state>/smoke/<run_id>`), created fresh for the run and holding only
what the server itself writes there (its caches, log, report and the exported subject: plain
directories and files, no symlinks). Each value has *readings*, the strings a consumer might
open, and every reading of a reading is one too:

* the value itself; for env values and strings inside JSON also each part of it read as a list
  (split at `:`, `,`, `;`, `=` and whitespace: `a:b`, `KEY=value`), since a consumer may split
  it so (a URL `https://host/x` thus reads `//host/x`, an absolute path, and is refused there);
* JSON is walked recursively, every key and string leaf read as above (a string that itself
  parses as a JSON object or array is walked too); env values that are JSON objects or arrays
  likewise; numbers, booleans and null name nothing;
* a `file:` URL also reads as its path (raw and percent-decoded; a host other than `localhost`
  is refused); a leading `~` or `~user` also reads home-expanded;
* a reading with a variable reference (`$NAME`, `${NAME}`: what `os.path.expandvars` expands,
  as huggingface_hub does for `HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN_PATH`, ...) also reads
  expanded against the environment the launched server will have: the server's own, less what
  the launcher sets, removes or never passes, plus the call's env values. A reference to any
  other variable (unset, set per run such as `TMPDIR`, or shell syntax such as `${X:-/etc}`)
  could expand to anything and is refused (`bad_input`: spell the path out); so is expansion
  nested more than a few levels deep. `%NAME%` is Windows syntax, expanded by nothing on the
  Linux hosts the server launches on, and stays text.

A reading that is absolute (or becomes absolute that way) is a path: it must pass
`policy.readable` (inside the read roots after resolving symlinks), else `outside_roots`. A
relative reading resolves against the run directory, lexically normalised (exact there, since
nothing in it is a symlink; conservative elsewhere, since no missing directory can be climbed
through). If it climbs out of the run directory (`../x`, `tmp/../../x`) it
could name any file and is refused (`outside_roots`); if it is spelt as an explicit relative path
(`./x`, `.`) it is refused (`bad_input`: the caller means a file, and it would be looked up in
the run directory, so pass an absolute path). Every other relative reading stays inside the run
directory, where it can name nothing but the server's own files: that, precisely, is *text* (a
hub id like `Qwen/Qwen3-0.6B`, `auto`, `float16`, `3`, an inline Jinja template). NUL is refused.

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
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ..foundation.errors import ErrorCode, ToolFailure, bad_input
from ..foundation.policy import Mode, Policy, is_within

Readable = Callable[[str], Path]
"""A `Policy.readable` method: the rules also read that policy's roots and mode."""

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


# -- values that could name a file -----------------------------------------------------------

_LIST_SPLIT = re.compile(r"[:,;=\s]")
_FILE_URL = re.compile(r"^file:", re.IGNORECASE)
_JSON_START = ("{", "[")
_REFERENCE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)  # what os.path.expandvars expands (POSIX)
_MAX_EXPANSIONS = 4  # nested expansions of one reading
_MAX_EXPANDED_CHARS = 65_536

_PART, _URL, _HOME, _VARS = (
    "part of its value read as a list",
    "as a file URL",
    "with ~ expanded",
    "with variables expanded",
)


@dataclass(frozen=True)
class _Rules:
    readable: Readable
    reviewed: tuple[Path, ...]
    """Review mode: the read roots, which only read-only values may name; empty in edit mode."""
    variables: Mapping[str, str]
    """What a variable reference expands to in the launched server."""


def _known_in_launch(name: str) -> bool:
    """Whether the launched server has this variable with the value it has here: not one the
    launcher sets per run, removes (PYTHONPATH, ...) or never passes."""
    return name not in ENV_RESERVED and not ENV_DENIED_PATTERN.search(name)


def _rules(readable: Readable, env: Mapping[str, str] | None = None) -> _Rules:
    policy = getattr(readable, "__self__", None)
    if not isinstance(policy, Policy):
        raise TypeError("the launch rules take a Policy's readable method: they also need its roots and mode")
    variables = {name: value for name, value in os.environ.items() if _known_in_launch(name)}
    variables.update(env or {})
    return _Rules(readable, tuple(policy.roots) if policy.mode is Mode.REVIEW else (), variables)


@dataclass(frozen=True)
class _Reading:
    text: str
    """What a consumer could open."""
    shown: str
    """The caller's spelling it comes from (quoted in messages)."""
    steps: tuple[str, ...] = ()
    """How it comes from that spelling."""
    depth: int = 0
    """Variable expansions it took."""

    @property
    def how(self) -> str:
        return f" ({', '.join(self.steps)})" if self.steps else ""

    def then(self, text: str, step: str, shown: str | None = None, depth: int = 0) -> _Reading:
        steps = self.steps if step in self.steps else (*self.steps, step)
        return _Reading(text, self.shown if shown is None else shown, steps, self.depth + depth)


def _shown(reading: str, limit: int = 200) -> str:
    """The caller's spelling, quoted (cut short when long, e.g. an inline template)."""
    return repr(reading) if len(reading) <= limit else repr(reading[:limit]) + "..."


def _outside(where: str, reading: str, how: str = "") -> ToolFailure:
    return ToolFailure(
        ErrorCode.OUTSIDE_ROOTS,
        f"{where} names {_shown(reading)}{how}, which is outside the server's roots; a value that could name a file "
        "must name one under the roots (start the server with --root covering it).",
    )


def _reviewed(where: str, reading: str, how: str) -> ToolFailure:
    return ToolFailure(
        ErrorCode.REVIEW_MODE,
        f"{where} names {_shown(reading)}{how}, a path in a reviewed tree (a read root); in review mode nothing may "
        "be written there, and the launched server may write wherever an environment variable, a plain option or "
        "a JSON option such as --compilation-config points (a log, a cache, a dump). Pass a file it only reads as "
        "a file option (--tokenizer, --chat-template, --hf-config-path, ...), leave the value out, or run the "
        "server in edit mode.",
    )


def _expand(reading: _Reading, where: str, rules: _Rules) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)[1:-1] if match.group(1).startswith("{") else match.group(1)
        if name not in rules.variables:
            raise bad_input(
                f"{where} names {_shown(reading.shown)}, which refers to {_shown(match.group(0))}, a variable the "
                "launched server is not known to have with a fixed value (unset here, set by the smoke test per "
                "run, or not a plain name), so expanded it could name any file; spell the path out instead."
            )
        return rules.variables[name]

    if reading.depth >= _MAX_EXPANSIONS:
        raise bad_input(
            f"{where} names {_shown(reading.shown)}, whose variable references nest too deeply; spell the path out instead."
        )
    expanded = _REFERENCE.sub(value, reading.text)
    if len(expanded) > _MAX_EXPANDED_CHARS:
        raise bad_input(
            f"{where} names {_shown(reading.shown)}, whose variable references expand too far; spell the path out instead."
        )
    return expanded


def _next_readings(reading: _Reading, where: str, rules: _Rules, lists: bool, expand: bool) -> Iterator[_Reading]:
    """The readings one step from a reading: its list parts, a file URL's path, ~ and variables expanded."""
    text = reading.text
    if lists:
        for part in _LIST_SPLIT.split(text):
            if part and part != text:
                spelt = reading.steps in ((), (_PART,))  # a part of the caller's own text
                yield reading.then(part, _PART, shown=part if spelt else None)
    if _FILE_URL.match(text):
        rest = text[len("file:") :]
        if rest.startswith("//"):
            host, slash, tail = rest[2:].partition("/")
            if host.lower() not in ("", "localhost"):
                raise bad_input(
                    f"{where} names {_shown(reading.shown)}{reading.how}, a file URL on another host; only local files "
                    "under the roots are allowed."
                )
            rest = slash + tail
        for path in (rest, unquote(rest)):
            yield reading.then(path, _URL)
    if text.startswith("~") and os.path.expanduser(text) != text:
        yield reading.then(os.path.expanduser(text), _HOME)
    if expand and _REFERENCE.search(text):
        yield reading.then(_expand(reading, where, rules), _VARS, depth=1)


def _readings(value: str, where: str, rules: _Rules, lists: bool, expand: bool = True) -> list[_Reading]:
    """Every reading of a value (the value first), each once."""
    found, seen, index = [_Reading(value, value)], {value}, 0
    while index < len(found):
        for reading in _next_readings(found[index], where, rules, lists, expand):
            if reading.text not in seen:
                seen.add(reading.text)
                found.append(reading)
        index += 1
    return found


def _check_reading(reading: _Reading, where: str, rules: _Rules) -> Path | None:
    """Refuse a reading that could name a file outside the roots (see the module docstring); the
    resolved path when it is one."""
    form, shown, how = reading.text, reading.shown, reading.how
    if not form:
        return None
    if os.path.isabs(form):
        try:
            return rules.readable(form)
        except ToolFailure as failure:
            raise _outside(where, shown, how) from failure
    normal = posixpath.normpath(form)
    if normal == ".." or normal.startswith("../"):
        raise ToolFailure(
            ErrorCode.OUTSIDE_ROOTS,
            f"{where} names {_shown(shown)}{how}, a relative path that climbs out of the smoke server's working "
            "directory (a fresh run directory the server creates), so it could name any file; pass a path "
            "under the roots instead.",
        )
    if form == "." or form.startswith("./"):
        raise bad_input(
            f"{where} names {_shown(shown)}{how}, a relative path; the smoke server runs in its own fresh "
            "directory, so pass an absolute path under the roots."
        )
    return None


def _check_paths(readings: list[_Reading], where: str, rules: _Rules, read_only: bool) -> None:
    """Every reading inside the roots, then (review mode, a value vLLM may write to) none in or
    above a read root."""
    paths = [(reading, _check_reading(reading, where, rules)) for reading in readings]
    if read_only or not rules.reviewed:
        return
    for reading, resolved in paths:
        if resolved is not None and any(is_within(resolved, r) or is_within(r, resolved) for r in rules.reviewed):
            raise _reviewed(where, reading.shown, reading.how)


def _check_text(value: str, where: str, rules: _Rules, lists: bool, read_only: bool) -> None:
    if "\0" in value:
        raise bad_input(f"{where} contains a NUL byte.")
    _check_paths(_readings(value, where, rules, lists), where, rules, read_only)


def _load_json(text: str, where: str) -> tuple[bool, Any]:
    """(parsed, value): JSON when the text is JSON, else the text itself."""
    try:
        return True, json.loads(text)
    except RecursionError:
        raise bad_input(f"{where} holds JSON nested too deeply.") from None
    except ValueError:
        return False, text


def _check_json(value: Any, where: str, rules: _Rules, read_only: bool) -> None:
    """Every key and string leaf of a JSON value, walked without recursion."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, at = stack.pop()
        label = f"{where} at {at}" if at else where
        if isinstance(item, dict):
            for key, child in item.items():
                _check_text(str(key), f"{label} (a key)", rules, True, read_only)
                stack.append((child, f"{at}[{json.dumps(key)}]"))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{index}]") for index, child in enumerate(item))
        elif isinstance(item, str):
            _check_text(item, label, rules, True, read_only)
            if item.lstrip().startswith(_JSON_START):
                parsed, inner = _load_json(item, label)
                if parsed and isinstance(inner, (dict, list)):
                    stack.append((inner, at + " (its JSON)"))


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
                f"env {name} is not on the allow-list (prefixes {', '.join(ENV_ALLOWED_PREFIXES)}); loader, interpreter "
                "and shell variables such as LD_PRELOAD or PYTHONPATH are never passed."
            )
        if "\0" in value or "\n" in value:
            raise bad_input(f"env {name} contains a NUL or newline.")
    rules = _rules(readable, env)
    for name, value in env.items():
        _check_text(value, f"env {name}", rules, lists=True, read_only=False)
        if value.lstrip().startswith(_JSON_START):
            parsed, loaded = _load_json(value, f"env {name}")
            if parsed:
                _check_json(loaded, f"env {name}", rules, read_only=False)
    return dict(env)


# -- serve arguments -------------------------------------------------------------------------

FLAG, VALUE, FILE, JSON, JSON_OUT = "flag", "value", "file", "json", "json naming outputs"
"""FILE and JSON options are only read by vLLM; JSON_OUT ones may also name where it writes."""

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


# vLLM's own keywords for a file option: never opened as files.
FILE_KEYWORDS: dict[str, frozenset[str]] = {"--generation-config": frozenset({"auto", "vllm"})}


def check_json_value(text: str, where: str, readable: Readable, *, names_outputs: bool = False) -> Any:
    """A JSON-valued option's value (or its text, when it is not JSON: `-O 3`; vLLM decides), if no
    string in it could name a file outside the roots (nor, in review mode when the option may name
    where vLLM writes, a path in a read root)."""
    rules = _rules(readable)
    parsed, value = _load_json(text, where)
    if parsed:
        _check_json(value, where, rules, read_only=not names_outputs)
    else:
        _check_text(text, where, rules, lists=True, read_only=not names_outputs)
    return value


def _spelt_as_path(value: str) -> bool:
    """Absolute, home-relative, a file URL, or explicitly relative: the caller means a file."""
    return (
        os.path.isabs(value)
        or value.startswith(("~", "./", "../"))
        or value in (".", "..")
        or bool(_FILE_URL.match(value))
    )


def _check_file_option(name: str, value: str, rules: _Rules) -> str:
    """The word to pass for a file option: the resolved file under the roots, or the text unchanged."""
    where = f"serve argument {name}"
    if value in FILE_KEYWORDS.get(name, ()):
        return value
    if "\0" in value:
        raise bad_input(f"{where} contains a NUL byte.")
    if _spelt_as_path(value):
        readings = _readings(value, where, rules, lists=False)
        # vLLM expands no variables, a consumer of the path might
        _check_paths([r for r in readings if r.depth and os.path.isabs(r.text)], where, rules, read_only=True)
        literal = [reading.text for reading in readings if not reading.depth]
        target = next((f for f in reversed(literal) if os.path.isabs(f)), literal[-1])
    else:
        target = value
    try:
        resolved = rules.readable(target)  # relative: against the first root
    except ToolFailure as failure:
        raise _outside(where, value) from failure
    if _spelt_as_path(value) or os.path.lexists(resolved):
        return str(resolved)
    _check_text(value, where, rules, lists=False, read_only=True)  # passed unchanged: read from the run directory
    return value


def split_args(args: list[str]) -> list[tuple[str, str | None]]:
    """(option, value) pairs: `--a=b`, `--a b`, `--flag`; a bare word without an option is refused."""
    pairs: list[tuple[str, str | None]] = []
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("-") or token in ("-", "--"):
            raise bad_input(
                f"serve argument {token!r} is not an option; extra_args takes options (e.g. --enforce-eager, --dtype float32)."
            )
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
    """The caller's extra serve arguments, if every option is allowed and no value could name a
    file outside the roots.

    Returned as `--option=value` words; a file option naming a file under the roots is resolved to
    its absolute path (the server runs in its own directory, so a relative path would mean
    something else there).
    """
    rules = _rules(readable)
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
        if kind == FILE:
            value = _check_file_option(name, value, rules)
        elif kind in (JSON, JSON_OUT):
            check_json_value(value, f"serve argument {name}", readable, names_outputs=kind == JSON_OUT)
        else:
            _check_text(value, f"serve argument {name}", rules, lists=False, read_only=False)
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
