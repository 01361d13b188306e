"""A file's outline without `ast`: its top-level classes and functions, and its import statements.

The whole-tree pass of an index reads this for every file and parses fully only the modules a call
looks into (`module_index`). It is one regular-expression pass over the bytes, about a tenth of
`ast.parse`: a statement that defines or imports starts a line (after its indentation), and the
only such lines that are not statements lie inside triple-quoted strings, which the pass tracks.
The tests check the outline against `ast` on every file of several real vLLM releases and of the
real vendor plugins; a file that does not decode or leaves a string open gets `exact=False`, and
its readers parse it instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

OutlineKind = Literal["class", "function"]

_NEEDLES = ('"""', "'''", "import ", "class ", "def ")
"""What a defining or importing line holds, and the quotes that open and close multi-line strings:
`str.find` walks the text for these far faster than a pattern tried at every position."""
_QUOTES = _NEEDLES[:2]
_NAME = re.compile(r"(?:class|def)[ \t]+([A-Za-z_][A-Za-z0-9_]*)")
_COMMENT = re.compile(r"#[^\n]*")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class OutlineDefinition:
    name: str
    kind: OutlineKind
    line: int
    base_tails: tuple[str, ...] = ()
    """Per base of a class: its last dotted part before any subscript (`nn.Module` -> `Module`)."""


@dataclass(frozen=True)
class OutlineImport:
    module: str
    """As written: leading dots of a relative import kept, '' for `from . import x`."""
    names: tuple[str, ...]
    """Names of a from-import, in order; empty for `import a.b`."""
    line: int


@dataclass
class Outline:
    definitions: list[OutlineDefinition] = field(default_factory=list)
    imports: list[OutlineImport] = field(default_factory=list)
    exact: bool = True


def _statement(text: str, start: int) -> str:
    """The logical line that starts at `start`: up to a newline outside brackets and not escaped."""
    newline = text.find("\n", start)
    line = text[start:] if newline < 0 else text[start:newline]
    if (
        "#" not in line
        and "\\" not in line
        and line.count("(") + line.count("[") + line.count("{") == (line.count(")") + line.count("]") + line.count("}"))
    ):
        return line
    depth, at, end = 0, start, len(text)
    while at < end:
        char = text[at]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "#":
            newline = text.find("\n", at)
            at = end if newline < 0 else newline
            continue
        elif char == "\\" and text.startswith("\n", at + 1):
            at += 2
            continue
        elif char == "\n" and depth <= 0:
            break
        at += 1
    return text[start:at]


def _split_top(text: str) -> list[str]:
    """Comma-separated parts of `text` at bracket depth 0."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _base_tails(header: str) -> tuple[str, ...]:
    """The bases of a `class Name(...)` header, each as its tail; keywords and `*args` are not bases."""
    opening = header.find("(")
    if opening < 0 or header.find(":") < opening:
        return ()
    depth, closing = 0, -1
    for index in range(opening, len(header)):
        depth += {"(": 1, ")": -1}.get(header[index], 0)
        if depth == 0:
            closing = index
            break
    inner = _SPACE.sub("", _COMMENT.sub("", header[opening + 1 : closing]))
    tails = []
    for part in _split_top(inner):
        if part.startswith("*") or re.match(r"[A-Za-z_]\w*=(?!=)", part):
            continue
        tails.append(part.split("[")[0].rpartition(".")[2])
    return tuple(tails)


def _imports(statement: str, line: int) -> list[OutlineImport]:
    """The import statements of a logical line (`;` may join several): `import a, b as c` is one
    row per module, `from m import (x, y as z)` one row."""
    text = _SPACE.sub(" ", _COMMENT.sub("", statement.replace("\\\n", " "))).strip()
    rows = []
    for part in (p.strip() for p in text.split(";")):
        if part.startswith("import "):
            modules = [item.split(" as ")[0].strip() for item in part[len("import ") :].split(",")]
            rows += [OutlineImport(module.replace(" ", ""), (), line) for module in modules if module]
        elif part.startswith("from "):
            module, _, names = part[len("from ") :].partition(" import ")
            found = (item.split(" as ")[0].strip() for item in names.strip().strip("()").split(","))
            rows.append(OutlineImport(module.replace(" ", ""), tuple(n for n in found if n), line))
    return rows


def _positions(text: str) -> list[int]:
    found = []
    for needle in _NEEDLES:
        at = text.find(needle)
        while at >= 0:
            found.append(at)
            at = text.find(needle, at + len(needle))
    return sorted(found)


def _line_head(text: str, at: int) -> tuple[int, str]:
    """Where the logical line holding `at` starts (after its indentation, backslash continuations
    followed back), and its text up to `at`."""
    start = text.rfind("\n", 0, at) + 1
    while start >= 2 and text[start - 2] == "\\":
        start = text.rfind("\n", 0, start - 2) + 1
    while start < at and text[start] in " \t":
        start += 1
    return start, text[start:at].replace("\\\n", " ")


def outline(source: bytes) -> Outline:
    """The outline of one file (see the module docstring for what `exact` promises)."""
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError:
        return Outline(exact=False)
    result = Outline()
    open_quote: str | None = None
    line, counted, done = 1, 0, -1
    for at in _positions(text):
        line += text.count("\n", counted, at)
        counted = at
        quote = text[at : at + 3]
        if quote in _QUOTES:
            open_quote = None if open_quote == quote else open_quote or quote
            continue
        start, head = _line_head(text, at)
        if open_quote is not None or start <= done:
            continue
        top = text[start - 1] == "\n" if start else True
        if top and (text.startswith(("class ", "def "), at) and start == at or head == "async " and start == at - 6):
            done = start
            kind: OutlineKind = "class" if text.startswith("class ", at) else "function"
            name = _NAME.match(text, at)
            if name is not None:
                tails = _base_tails(_statement(text, at)) if kind == "class" else ()
                result.definitions.append(OutlineDefinition(name.group(1), kind, line, tails))
        elif text.startswith("import ", at) and (not head or head.startswith("from ")):
            done = start
            result.imports += _imports(_statement(text, start), line - text.count("\n", start, at))
    result.exact = open_quote is None
    return result
