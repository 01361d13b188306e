"""Limits on what the server parses, enforced before any work: tool arguments, JSON files, YAML files.

Hostile input answers `bad_input` with a precise message, never an exception from deep inside
the standard library: Python's json raises RecursionError on deep nesting and ValueError on
integers past 4300 digits, PyYAML expands aliases (a case file whose `cases` refers to itself),
an argument with a NUL byte or a 300-byte name fails in `os.stat`, one of 128 KiB fails `exec`
(E2BIG). The limits:

- arguments: no NUL byte; at most MAX_STRING_CHARS characters per string; no run of more than
  MAX_NAME_BYTES bytes without a separator in a string without whitespace (a path component or
  a name longer than any file system allows); integers within 64 bits; nesting at most MAX_DEPTH;
  at most MAX_ARGUMENT_BYTES in all;
- JSON files (`load_json_bounded`): nesting at most MAX_DEPTH, integers at most MAX_INT_DIGITS
  digits, an optional size cap, checked before `json.loads` builds anything;
- YAML files (`load_yaml_bounded`): no anchors or aliases at all, nesting at most MAX_DEPTH,
  integers at most MAX_INT_DIGITS digits, a size cap.

JSON syntax errors and undecodable bytes still raise `json.JSONDecodeError` / `UnicodeDecodeError`
(and `yaml.YAMLError`), so each caller keeps its own wording for a broken file.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from .errors import ErrorCode, ToolFailure

MAX_DEPTH = 64
MAX_STRING_CHARS = 16 * 1024
MAX_NAME_BYTES = 255
MAX_INT_BITS = 64
MAX_INT_DIGITS = 20
MAX_ARGUMENT_BYTES = 1 << 20
MAX_YAML_BYTES = 4 << 20

_NAME_SEPARATORS = re.compile(r"[/=,:;\"'{}\[\]()<>|&]")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class InputLimit(ToolFailure):
    """An input past one of the limits: always `bad_input`."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.BAD_INPUT, message)


# -- tool arguments ----------------------------------------------------------------------------


def check_arguments(arguments: Any, tool: str) -> None:
    """Refuse arguments past the limits, naming the argument (`entries[2].evidence[0].text`)."""
    budget = [MAX_ARGUMENT_BYTES]
    _check_value(arguments, "", 0, budget, tool)


def _where(location: str) -> str:
    if len(location) > 120:
        location = f"{location[:117]}..."
    return f"argument {location}" if location else "the arguments"


def _spend(budget: list[int], amount: int, tool: str) -> None:
    budget[0] -= amount
    if budget[0] < 0:
        raise InputLimit(
            f"The arguments of {tool} are larger than {MAX_ARGUMENT_BYTES // 1024} KiB in all; pass less per call."
        )


def _check_value(value: Any, location: str, depth: int, budget: list[int], tool: str) -> None:
    if depth > MAX_DEPTH:
        raise InputLimit(f"{_where(location)} of {tool} nests deeper than {MAX_DEPTH} levels.")
    if isinstance(value, str):
        _check_string(value, location, budget, tool)
    elif isinstance(value, bool) or value is None:
        _spend(budget, 4, tool)
    elif isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise InputLimit(
                f"{_where(location)} of {tool} is an integer of {value.bit_length()} bits; integers are limited to "
                f"{MAX_INT_BITS} bits."
            )
        _spend(budget, 8, tool)
    elif isinstance(value, float):
        _spend(budget, 8, tool)
    elif isinstance(value, dict):
        for key, item in value.items():
            key_text = str(key)
            _check_string(key_text, location, budget, tool, key=True)
            _check_value(item, f"{location}.{key_text}" if location else key_text, depth + 1, budget, tool)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _spend(budget, 1, tool)
            _check_value(item, f"{location}[{index}]", depth + 1, budget, tool)


def _check_string(text: str, location: str, budget: list[int], tool: str, key: bool = False) -> None:
    what = f"a key in {_where(location)}" if key else _where(location)
    if len(text) > MAX_STRING_CHARS:
        raise InputLimit(
            f"{what} of {tool} is {len(text)} characters long; a single argument is limited to "
            f"{MAX_STRING_CHARS} characters."
        )
    _spend(budget, len(text) + 2, tool)
    if "\0" in text:
        raise InputLimit(f"{what} of {tool} contains a NUL byte, which no path, name or text here may hold.")
    if not any(c.isspace() for c in text):
        for part in _NAME_SEPARATORS.split(text):
            size = len(part.encode("utf-8", errors="surrogatepass"))
            if size > MAX_NAME_BYTES:
                raise InputLimit(
                    f'{what} of {tool} holds a name of {size} bytes ("{part[:24]}..."); a file or path component has '
                    f"at most {MAX_NAME_BYTES} bytes."
                )


# -- JSON files --------------------------------------------------------------------------------


def json_depth(data: bytes, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a JSON document (strings ignored), counting no further than `limit` + 1."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        if byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        else:
            depth -= 1
    return deepest


def load_json_bounded(
    data: bytes | str, what: str, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH, **hooks: Any
) -> Any:
    """`json.loads` with the limits checked first; `what` names the input in messages (e.g. `config.json`).

    Bytes are UTF-8, as vLLM and transformers read these files: the depth scan runs over the same
    bytes the parser reads (json would otherwise guess UTF-16 or UTF-32, whose bytes the scan
    cannot read). Raises InputLimit (bad_input) past a limit; JSONDecodeError / UnicodeDecodeError
    for a broken file."""
    text = data if isinstance(data, str) else data.decode("utf-8")
    raw = data.encode("utf-8", errors="surrogatepass") if isinstance(data, str) else data
    if max_bytes is not None and len(raw) > max_bytes:
        raise InputLimit(f"{what} is {len(raw)} bytes, more than the {max_bytes} bytes accepted.")
    depth = json_depth(raw, max_depth)
    if depth > max_depth:
        raise InputLimit(f"{what} nests deeper than {max_depth} levels; no real file does, so it is refused.")

    def bounded_int(text: str) -> int:
        digits = len(text) - (text[:1] == "-")
        if digits > MAX_INT_DIGITS:
            raise InputLimit(
                f"{what} holds an integer of {digits} digits; integers are limited to {MAX_INT_DIGITS} digits."
            )
        return int(text)

    try:
        return json.loads(text, parse_int=bounded_int, **hooks)
    except RecursionError:
        raise InputLimit(f"{what} nests too deeply to parse.") from None


# -- YAML files --------------------------------------------------------------------------------


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases, deep nesting and huge integers."""

    what = "the YAML file"
    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise InputLimit(
                f"{self.what} uses the YAML alias *{event.anchor} (line {event.start_mark.line + 1}); anchors and "
                "aliases are not accepted: write the value out."
            )
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:
            raise InputLimit(
                f"{self.what} defines the YAML anchor &{event.anchor} (line {event.start_mark.line + 1}); anchors and "
                "aliases are not accepted: write the value out."
            )
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InputLimit(f"{self.what} nests deeper than {MAX_DEPTH} levels.")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _bounded_yaml_int(loader: _BoundedLoader, node: yaml.ScalarNode) -> int:
    """Limited by its spelling in any base (`0x`, `0o`, `0b`, sexagesimal), before it is built."""
    spelled = str(node.value).replace("_", "").lstrip("+-")
    if len(spelled) > MAX_INT_DIGITS + 2:  # room for a base prefix
        raise InputLimit(
            f"{loader.what} holds an integer spelled with {len(spelled)} characters; integers are limited to "
            f"{MAX_INT_DIGITS} digits."
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_yaml_int)


def load_yaml_bounded(text: str, what: str, *, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """`yaml.safe_load` without anchors or aliases, with nesting, integer and size limits.

    Raises InputLimit (bad_input) past a limit; yaml.YAMLError for a broken file."""
    if len(text) > max_bytes:
        raise InputLimit(f"{what} is {len(text)} characters long, more than the {max_bytes} accepted.")
    loader = _BoundedLoader(text)
    loader.what = what
    try:
        return loader.get_single_data()
    except RecursionError:
        raise InputLimit(f"{what} nests too deeply to parse.") from None
    finally:
        loader.dispose()
