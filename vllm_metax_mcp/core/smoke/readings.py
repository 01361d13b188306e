"""Which values could name a file: the readings of a value and the check that none of them names one
outside the roots (the launch rules, `launch_rules.py`, apply it to env values and serve arguments).

Any string without NUL is a valid path name, so no value is "text" by its look (a `{`, a missing
`./`): a value is judged by what the launched process could open with it. The smoke server runs
with its working directory set to its run directory (`core/smoke/run.py`: `cwd=<state>/smoke/<run_id>`),
created fresh for the run and holding only what the server itself writes there (its caches, log,
report and the exported subject: plain directories and files, no symlinks). Each value has
*readings*, the strings a consumer might open, and every reading of a reading is one too:

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

In review mode a value vLLM may write to (`read_only=False`) may not name a path in or above a
read root either (`review_mode`): see `launch_rules.py` for which values those are.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

from ..foundation.errors import ErrorCode, ToolFailure, bad_input
from ..foundation.policy import Mode, Policy, is_within

Readable = Callable[[str], Path]
"""A `Policy.readable` method: the rules also read that policy's roots and mode."""

FILE_URL = re.compile(r"^file:", re.IGNORECASE)
JSON_START = ("{", "[")
_LIST_SPLIT = re.compile(r"[:,;=\s]")
_REFERENCE = re.compile(r"\$(\w+|\{[^}]*\})", re.ASCII)  # what os.path.expandvars expands (POSIX)
_MAX_EXPANSIONS = 4  # nested expansions of one reading
_MAX_EXPANDED_CHARS = 65_536

Step = Literal["part of its value read as a list", "as a file URL", "with ~ expanded", "with variables expanded"]
"""How a reading comes from the one before it (shown in messages)."""
_PART: Step = "part of its value read as a list"
_URL: Step = "as a file URL"
_HOME: Step = "with ~ expanded"
_VARS: Step = "with variables expanded"


@dataclass(frozen=True)
class ValueRules:
    """What the checks of one call's values need to know."""

    readable: Readable
    reviewed: tuple[Path, ...]
    """Review mode: the read roots, which only read-only values may name; empty in edit mode."""
    variables: Mapping[str, str]
    """What a variable reference expands to in the launched server."""

    @classmethod
    def of(cls, readable: Readable, variables: Mapping[str, str]) -> ValueRules:
        policy = getattr(readable, "__self__", None)
        if not isinstance(policy, Policy):
            raise TypeError("the launch rules take a Policy's readable method: they also need its roots and mode")
        return cls(readable, tuple(policy.roots) if policy.mode is Mode.REVIEW else (), variables)


@dataclass(frozen=True)
class Reading:
    text: str
    """What a consumer could open."""
    shown: str
    """The caller's spelling it comes from (quoted in messages)."""
    steps: tuple[Step, ...] = ()
    """How it comes from that spelling."""
    depth: int = 0
    """Variable expansions it took."""

    @property
    def how(self) -> str:
        return f" ({', '.join(self.steps)})" if self.steps else ""

    def then(self, text: str, step: Step, shown: str | None = None, depth: int = 0) -> Reading:
        steps = self.steps if step in self.steps else (*self.steps, step)
        return Reading(text, self.shown if shown is None else shown, steps, self.depth + depth)


@dataclass(frozen=True)
class Json:
    """A text that parsed as JSON, and its value (which may be null)."""

    value: Any


def _shown(reading: str, limit: int = 200) -> str:
    """The caller's spelling, quoted (cut short when long, e.g. an inline template)."""
    return repr(reading) if len(reading) <= limit else repr(reading[:limit]) + "..."


def outside_roots(where: str, reading: str, how: str = "") -> ToolFailure:
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


def _expand(reading: Reading, where: str, rules: ValueRules) -> str:
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
            f"{where} names {_shown(reading.shown)}, whose variable references nest too deeply; "
            "spell the path out instead."
        )
    expanded = _REFERENCE.sub(value, reading.text)
    if len(expanded) > _MAX_EXPANDED_CHARS:
        raise bad_input(
            f"{where} names {_shown(reading.shown)}, whose variable references expand too far; "
            "spell the path out instead."
        )
    return expanded


def _next_readings(reading: Reading, where: str, rules: ValueRules, lists: bool, expand: bool) -> Iterator[Reading]:
    """The readings one step from a reading: its list parts, a file URL's path, ~ and variables expanded."""
    text = reading.text
    if lists:
        for part in _LIST_SPLIT.split(text):
            if part and part != text:
                spelt = reading.steps in ((), (_PART,))  # a part of the caller's own text
                yield reading.then(part, _PART, shown=part if spelt else None)
    if FILE_URL.match(text):
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


def readings(value: str, where: str, rules: ValueRules, lists: bool, expand: bool = True) -> list[Reading]:
    """Every reading of a value (the value first), each once."""
    found, seen, index = [Reading(value, value)], {value}, 0
    while index < len(found):
        for reading in _next_readings(found[index], where, rules, lists, expand):
            if reading.text not in seen:
                seen.add(reading.text)
                found.append(reading)
        index += 1
    return found


def _check_reading(reading: Reading, where: str, rules: ValueRules) -> Path | None:
    """Refuse a reading that could name a file outside the roots (see the module docstring); the
    resolved path when it is one."""
    form, shown, how = reading.text, reading.shown, reading.how
    if not form:
        return None
    if os.path.isabs(form):
        try:
            return rules.readable(form)
        except ToolFailure as failure:
            raise outside_roots(where, shown, how) from failure
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


def check_paths(found: list[Reading], where: str, rules: ValueRules, read_only: bool) -> None:
    """Every reading inside the roots, then (review mode, a value vLLM may write to) none in or
    above a read root."""
    paths = [(reading, _check_reading(reading, where, rules)) for reading in found]
    if read_only or not rules.reviewed:
        return
    for reading, resolved in paths:
        if resolved is not None and any(is_within(resolved, r) or is_within(r, resolved) for r in rules.reviewed):
            raise _reviewed(where, reading.shown, reading.how)


def check_text(value: str, where: str, rules: ValueRules, lists: bool, read_only: bool) -> None:
    if "\0" in value:
        raise bad_input(f"{where} contains a NUL byte.")
    check_paths(readings(value, where, rules, lists), where, rules, read_only)


def load_json(text: str, where: str) -> Json | None:
    """The text's JSON value, or None when it is not JSON."""
    try:
        return Json(json.loads(text))
    except RecursionError:
        raise bad_input(f"{where} holds JSON nested too deeply.") from None
    except ValueError:
        return None


def check_json(value: Any, where: str, rules: ValueRules, read_only: bool) -> None:
    """Every key and string leaf of a JSON value, walked without recursion."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, at = stack.pop()
        label = f"{where} at {at}" if at else where
        if isinstance(item, dict):
            for key, child in item.items():
                check_text(str(key), f"{label} (a key)", rules, True, read_only)
                stack.append((child, f"{at}[{json.dumps(key)}]"))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{index}]") for index, child in enumerate(item))
        elif isinstance(item, str):
            check_text(item, label, rules, True, read_only)
            if item.lstrip().startswith(JSON_START):
                inner = load_json(item, label)
                if inner is not None and isinstance(inner.value, (dict, list)):
                    stack.append((inner.value, at + " (its JSON)"))
