"""`smoke_cases.yaml`: the one format trims write and smoke tests read — parser, validator, writer.

The format (DESIGN.md, "Smoke cases have one format")::

    serve:                      # how the server is started (all optional)
      load_format: dummy        # vLLM's --load-format
      max_model_len: 4096
      extra_args: [--enforce-eager]
      speculative_config: {method: mtp, num_speculative_tokens: 1}
    cases:                      # at least one
      - name: dense-and-moe     # unique
        kind: completion        # completion | chat | image
        prompt: "The capital of France is"
        expect_keywords: [Paris]  # optional; never checked with dummy weights
        covers: "MoE layer 1"   # the coverage target the request triggers
        max_tokens: 16          # optional (default 16)
      - name: chat
        kind: chat
        messages: [{role: user, content: "Hello"}]
      - name: picture
        kind: image
        image: cat.png          # relative to the YAML file, or absolute
        prompt: "What is in the image?"

The plugin's `tools/batched_test` YAML files are read too (`read_case_file`). Their exact shape
is not known here, so the reader is tolerant and reports what it assumed:

* a *models* file: a list of models, or `{models: [...]}`, or a mapping `name -> model`; each
  model has `name` (or its key), a path (`path` | `model` | `model_path` | `model_dir`), serve
  arguments (`args` | `serve_args` | `extra_args` | `vllm_args` | `launch_args`: a list, one
  shell-quoted string, or a mapping `flag -> value`), optional `env` (mapping or `K=V` list) and
  optional `cases` (inline, or one or more case-file paths relative to the models file);
* a *cases* file: a list of cases, or `{cases: [...]}`, or a mapping `name -> case`; each case
  has a prompt (`prompt` | `text` | `input` | `question`), or `messages`, or an image
  (`image` | `image_path` | `image_file`), an optional kind (`kind` | `type` | `api` | `mode`),
  keywords (`expect_keywords` | `keywords` | `expected_keywords` | `expect` | `expected`) and a
  token budget (`max_tokens` | `max_new_tokens` | `max_completion_tokens`).

Paths inside the files are returned as written (resolved against the file's directory); the
caller checks them against the server's roots.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..foundation.atomic import write_bytes_atomic
from ..foundation.errors import bad_input
from ..foundation.policy import open_resolved
from ..foundation.safe_load import load_yaml_bounded

FILE_NAME = "smoke_cases.yaml"
DEFAULT_MAX_TOKENS = 16
MAX_CASES = 64
CaseKind = Literal["completion", "chat", "image"]


class SmokeCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, description="Unique within the file.")
    kind: CaseKind
    prompt: str | None = Field(default=None, description="completion: the prompt; image: the question (optional).")
    messages: list[dict[str, Any]] | None = Field(default=None, description="chat: OpenAI-style messages.")
    image: str | None = Field(default=None, description="image: a file (relative to the YAML file) or a data: URL.")
    expect_keywords: list[str] = Field(
        default_factory=list, description="All must appear (case-insensitive); real weights only."
    )
    covers: str = Field(default="", description="The coverage target this request triggers.")
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=4096)

    @field_validator("expect_keywords", mode="before")
    @classmethod
    def _one_keyword(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _fields_match_kind(self) -> SmokeCase:
        if self.kind == "completion" and (not self.prompt or self.messages or self.image):
            raise ValueError(f"case {self.name!r}: a completion case takes prompt only")
        if self.kind == "chat":
            if not self.messages or self.image or self.prompt:
                raise ValueError(f"case {self.name!r}: a chat case takes messages only")
            for message in self.messages:
                if not isinstance(message, dict) or "role" not in message or "content" not in message:
                    raise ValueError(f"case {self.name!r}: every message needs role and content")
        if self.kind == "image" and (not self.image or self.messages):
            raise ValueError(f"case {self.name!r}: an image case takes image (and an optional prompt)")
        return self


class ServeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    load_format: str | None = Field(default=None, description="vLLM --load-format (dummy, auto, safetensors, ...).")
    max_model_len: int | None = Field(default=None, ge=16)
    extra_args: list[str] = Field(
        default_factory=list, description="More serve arguments (checked against the allow-list)."
    )
    speculative_config: dict[str, Any] | None = None


class SmokeCases(BaseModel):
    model_config = ConfigDict(extra="forbid")

    serve: ServeSettings = Field(default_factory=ServeSettings)
    cases: list[SmokeCase] = Field(min_length=1, max_length=MAX_CASES)

    @model_validator(mode="after")
    def _unique_names(self) -> SmokeCases:
        seen: set[str] = set()
        for case in self.cases:
            if case.name in seen:
                raise ValueError(f"case name {case.name!r} appears twice")
            seen.add(case.name)
        return self


def default_cases() -> SmokeCases:
    """One completion and one chat case: what a smoke test sends when nothing else is given."""
    return SmokeCases(
        cases=[
            SmokeCase(
                name="completion", kind="completion", prompt="The capital of France is", covers="text generation"
            ),
            SmokeCase(
                name="chat",
                kind="chat",
                messages=[{"role": "user", "content": "Say hello in one word."}],
                covers="chat template and text generation",
            ),
        ]
    )


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors())


def parse_smoke_cases(document: Any, source: str = "smoke cases") -> SmokeCases:
    """Validate a parsed `smoke_cases.yaml` document (or the equivalent dict)."""
    try:
        return SmokeCases.model_validate(document)
    except ValidationError as exc:
        raise bad_input(f"{source} is not a valid smoke_cases document: {_problems(exc)}.") from None


def parse_cases(items: list[Any], source: str = "cases") -> list[SmokeCase]:
    return parse_smoke_cases({"cases": items}, source).cases


def dump_smoke_cases(document: SmokeCases) -> str:
    """YAML text of a smoke_cases document (defaults and empty fields left out)."""
    body: dict[str, Any] = {}
    serve = document.serve.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    if serve:
        body["serve"] = serve
    body["cases"] = [
        {
            "name": c.name,
            "kind": c.kind,
            **c.model_dump(mode="json", exclude_none=True, exclude_defaults=True, exclude={"name", "kind"}),
        }
        for c in document.cases
    ]
    return yaml.safe_dump(body, sort_keys=False, allow_unicode=True)


def write_smoke_cases(path: Path, document: SmokeCases) -> None:
    """Write `smoke_cases.yaml` atomically (the trim tools call this)."""
    write_bytes_atomic(path, dump_smoke_cases(document).encode())


# -- reading any accepted case file ----------------------------------------------------------


@dataclass
class BatchedModel:
    """One model entry of a `tools/batched_test` models file, as far as it could be read."""

    name: str
    path: str | None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cases: list[SmokeCase] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)


@dataclass
class CaseFile:
    """What a case file held: `format` is smoke_cases, batched_test_models or batched_test_cases."""

    format: str
    path: Path
    serve: ServeSettings = field(default_factory=ServeSettings)
    cases: list[SmokeCase] = field(default_factory=list)
    models: list[BatchedModel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def load_yaml(path: Path, name: str | None = None) -> Any:
    """A YAML document from an already checked, resolved path (read_case_file checks it first)."""
    name = name or path.name
    try:
        with open_resolved(path) as handle:
            return load_yaml_bounded(handle.read().decode("utf-8"), name)
    except FileNotFoundError:
        raise bad_input(f"{name} does not exist.") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise bad_input(f"{name} is not valid YAML: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise bad_input(f"{name} cannot be read ({exc.strerror or exc}).") from None


def _first(entry: dict[str, Any], *names: str) -> Any:
    for name in names:
        if name in entry and entry[name] is not None:
            return entry[name]
    return None


_PATH_KEYS = ("path", "model", "model_path", "model_dir")
_ARG_KEYS = ("args", "serve_args", "extra_args", "vllm_args", "launch_args")
_PROMPT_KEYS = ("prompt", "text", "input", "question")
_IMAGE_KEYS = ("image", "image_path", "image_file")
_KIND_KEYS = ("kind", "type", "api", "mode")
_KEYWORD_KEYS = ("expect_keywords", "keywords", "expected_keywords", "expect", "expected")
_TOKEN_KEYS = ("max_tokens", "max_new_tokens", "max_completion_tokens")
_KINDS = {
    "completion": "completion",
    "completions": "completion",
    "generate": "completion",
    "text": "completion",
    "chat": "chat",
    "chat_completion": "chat",
    "chat_completions": "chat",
    "chat/completions": "chat",
    "image": "image",
    "vision": "image",
    "multimodal": "image",
    "mm": "image",
}


def _entries(document: Any, key: str) -> list[tuple[str | None, Any]]:
    """(name-or-None, entry) pairs from a list, `{key: list}`, `{key: mapping}` or a plain mapping."""
    if isinstance(document, dict) and key in document:
        document = document[key]
    if isinstance(document, list):
        return [(None, item) for item in document]
    if isinstance(document, dict):
        return [(str(name), item) for name, item in document.items()]
    return []


def _args_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise bad_input(f"{where}: serve arguments are not valid shell words ({exc}).") from None
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, dict):
        args: list[str] = []
        for flag, flag_value in value.items():
            name = str(flag) if str(flag).startswith("-") else f"--{str(flag).replace('_', '-')}"
            if flag_value is True:
                args.append(name)
            elif flag_value is False or flag_value is None:
                continue
            else:
                args += [
                    name,
                    yaml.safe_dump(flag_value, default_flow_style=True).strip()
                    if isinstance(flag_value, (dict, list))
                    else str(flag_value),
                ]
        return args
    raise bad_input(f"{where}: serve arguments must be a list, a string or a mapping.")


def _env_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        return dict(v.split("=", 1) for v in value)
    raise bad_input(f"{where}: env must be a mapping or a list of NAME=value strings.")


def tolerant_case(name: str | None, entry: Any, index: int, base: Path) -> SmokeCase:
    """A batched_test-style case, normalised to a SmokeCase."""
    where = f"case {name or index}"
    if isinstance(entry, str):
        entry = {"prompt": entry}
    if not isinstance(entry, dict):
        raise bad_input(f"{where}: a case must be a mapping or a prompt string.")
    messages = entry.get("messages")
    prompt = _first(entry, *_PROMPT_KEYS)
    image = _first(entry, *_IMAGE_KEYS)
    raw_kind = _first(entry, *_KIND_KEYS)
    if raw_kind is not None:
        kind = _KINDS.get(str(raw_kind).lower())
        if kind is None:
            raise bad_input(f"{where}: unknown kind {raw_kind!r}; use completion, chat or image.")
    else:
        kind = "image" if image else "chat" if messages else "completion"
    if kind == "chat" and not messages and prompt:
        messages, prompt = [{"role": "user", "content": str(prompt)}], None
    if image and not str(image).startswith("data:") and not Path(str(image)).is_absolute():
        image = str(base / str(image))
    keywords = _first(entry, *_KEYWORD_KEYS)
    body = {
        "name": str(entry.get("name") or name or f"case-{index}"),
        "kind": kind,
        "prompt": None if prompt is None else str(prompt),
        "messages": messages,
        "image": None if image is None else str(image),
        "expect_keywords": [] if keywords is None else keywords,
        "covers": str(_first(entry, "covers", "description", "target") or ""),
    }
    tokens = _first(entry, *_TOKEN_KEYS)
    if tokens is not None:
        body["max_tokens"] = tokens
    try:
        return SmokeCase.model_validate(body)
    except ValidationError as exc:
        raise bad_input(f"{where}: {_problems(exc)}.") from None


def _tolerant_cases(document: Any, base: Path) -> list[SmokeCase]:
    return [tolerant_case(name, entry, i, base) for i, (name, entry) in enumerate(_entries(document, "cases"))]


def _is_models(document: Any) -> bool:
    if isinstance(document, dict) and "models" in document:
        return True
    entries = _entries(document, "models")
    return bool(entries) and all(isinstance(e, dict) and _first(e, *_PATH_KEYS) is not None for _, e in entries)


def _is_ours(document: Any) -> bool:
    if not isinstance(document, dict) or "cases" not in document or "models" in document:
        return False
    if "serve" in document:
        return True
    cases = document.get("cases")
    return (
        isinstance(cases, list)
        and bool(cases)
        and all(isinstance(c, dict) and c.get("kind") in ("completion", "chat", "image") for c in cases)
    )


def _read_models(document: Any, path: Path, notes: list[str], readable: Callable[[Path], Path]) -> list[BatchedModel]:
    models = []
    known = {"name", "env", "envs", "environment", "cases", *_PATH_KEYS, *_ARG_KEYS}
    for index, (name, entry) in enumerate(_entries(document, "models")):
        where = f"{path.name}: model {name or index}"
        if not isinstance(entry, dict):
            raise bad_input(f"{where} must be a mapping.")
        model_path = _first(entry, *_PATH_KEYS)
        if model_path is not None and not Path(str(model_path)).is_absolute():
            model_path = str(path.parent / str(model_path))
        raw_cases = entry.get("cases")
        if isinstance(raw_cases, str):
            raw_cases = [raw_cases]
        cases: list[SmokeCase] = []
        if (
            isinstance(raw_cases, list)
            and raw_cases
            and all(isinstance(c, str) and c.endswith((".yaml", ".yml")) for c in raw_cases)
        ):
            for item in raw_cases:
                case_path = readable(Path(item) if Path(item).is_absolute() else path.parent / item)
                cases += read_case_file(case_path, readable).cases
        elif raw_cases:
            cases = _tolerant_cases({"cases": raw_cases}, path.parent)
        ignored = sorted(str(k) for k in entry if k not in known)
        if ignored:
            notes.append(f"{where}: keys not understood and ignored: {', '.join(ignored)}")
        models.append(
            BatchedModel(
                name=str(entry.get("name") or name or f"model-{index}"),
                path=None if model_path is None else str(model_path),
                args=_args_list(_first(entry, *_ARG_KEYS), where),
                env=_env_map(_first(entry, "env", "envs", "environment"), where),
                cases=cases,
                ignored_keys=ignored,
            )
        )
    return models


def read_case_file(path: Path, readable: Callable[[Path], Path] = lambda p: p) -> CaseFile:
    """Read a `smoke_cases.yaml` (strictly) or a batched_test models/cases file (tolerantly).

    `readable` checks (and resolves) the file itself and every further file a models file refers to:
    a case file that links outside the readable places is refused before it is read.
    """
    name = path.name
    path = readable(path)
    document = load_yaml(path, name)
    if _is_ours(document):
        parsed = parse_smoke_cases(document, name)
        cases = [
            c.model_copy(update={"image": str(path.parent / c.image)})
            if c.image and not c.image.startswith("data:") and not Path(c.image).is_absolute()
            else c
            for c in parsed.cases
        ]
        return CaseFile("smoke_cases", path, serve=parsed.serve, cases=cases)
    notes = [f"{name} is not in the smoke_cases format; read as a tools/batched_test file (tolerant reader)."]
    if _is_models(document):
        models = _read_models(document, path, notes, readable)
        if not models:
            raise bad_input(f"{name} lists no models.")
        return CaseFile("batched_test_models", path, models=models, notes=notes)
    cases = _tolerant_cases(document, path.parent)
    if not cases:
        raise bad_input(
            f"{name} holds neither smoke cases nor batched_test models or cases; see the smoke_cases format "
            "(serve + cases) in the run_smoke_test description."
        )
    return CaseFile("batched_test_cases", path, cases=cases, notes=notes)
