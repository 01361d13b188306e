"""C/C++ op registrations read as text: every `TORCH_LIBRARY*` block (stable ABI included), its `.def`
schemas and `.impl` kernels with their dispatch keys.

`op_scanners` caches what `scan_native` returns (JSON, per blob) and turns it into registrations. The
text is made plain first (comments and char literals blanked, raw strings as plain ones) so brackets
and schemas are read from code only; a `PYBIND11_MODULE` registers no torch op and is not read.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

BUILD_NAMESPACE = "TORCH_EXTENSION_NAME"
"""The macro the build defines as the extension's name: the namespace is only known from the build."""
BLOCK = re.compile(r"\b((?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT|_IMPL_EXPAND|_IMPL|_EXPAND)?)\s*\(")
NATIVE_KEY = re.compile(r"(?:\w+::)*(?:DispatchKey|DeviceType)::(\w+)|(?:\w+::)*k([A-Z]\w*)")
"""A dispatch key argument of `.impl`: `c10::DispatchKey::CUDA`, `torch::kCUDA`."""
DISPATCH = re.compile(r"(?:\w+::)*dispatch\s*\((.*)\)", re.S)
"""`torch::dispatch(<key>, <kernel>)`: a kernel wrapped with its key."""
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[()\[\]{},]')
"""What bracket matching looks at (on blanked text): string literals (skipped whole), brackets, commas."""
LEXEME = re.compile(
    r'(?P<raw>\b(?:u8|[uUL])?R"(?P<delimiter>[^()\\\s"]{0,16})\((?P<body>.*?)\)(?P=delimiter)")'
    r'|(?P<string>"(?:[^"\\\n]|\\.)*")'
    r"|(?P<char>(?<!\d)'(?:\\[^\n]{1,9}?|[^'\\\n])')"
    r"|(?P<comment>//[^\n]*|/\*.*?\*/)",
    re.S,
)
"""What C/C++ text holds that is no code: raw strings, strings, char literals (not digit separators), comments."""
DEFINE = re.compile(r"#\s*define\s+(\w+)\s+(\w+)")
DefinitionHow = Literal["TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_EXPAND"]
ImplHow = Literal["TORCH_LIBRARY_IMPL", "TORCH_LIBRARY_IMPL_EXPAND"]
StableHow = Literal[
    "STABLE_TORCH_LIBRARY",
    "STABLE_TORCH_LIBRARY_FRAGMENT",
    "STABLE_TORCH_LIBRARY_EXPAND",
    "STABLE_TORCH_LIBRARY_IMPL",
    "STABLE_TORCH_LIBRARY_IMPL_EXPAND",
]
NativeHow = Literal[DefinitionHow, ImplHow, StableHow]
"""The native macro families `BLOCK` matches (`how` of a C/C++ registration)."""


def _balanced(text: str, start: int, opening: str, closing: str) -> int:
    """Index just past the bracket that closes the one at `start` (strings skipped)."""
    depth = 0
    for token in TOKEN.finditer(text, start):
        depth += (token[0] == opening) - (token[0] == closing)
        if depth == 0:
            return token.end()
    return len(text)


def _split_arguments(text: str) -> list[str]:
    """Top-level comma-separated arguments (brackets and string literals respected)."""
    parts, depth, begin = [], 0, 0
    for token in TOKEN.finditer(text):
        depth += (token[0] in "([{") - (token[0] in ")]}")
        if token[0] == "," and depth == 0:
            parts.append(text[begin : token.start()].strip())
            begin = token.end()
    parts.append(text[begin:].strip())
    return parts


def _namespace(expression: str, expand: bool, macros: dict[str, str]) -> str:
    """The library namespace a macro argument names; '*' stands for the build-defined part."""
    if not expand:
        return expression
    tokens = re.findall(r"\w+", expression)
    if tokens and tokens[0] == "CONCAT":
        tokens = tokens[1:]
    return "".join("*" if t == BUILD_NAMESPACE else macros.get(t, t) for t in tokens) or "*"


def _plain(lexeme: re.Match[str]) -> str:
    """A raw string as a plain one (its newlines moved after it, so lines stay), comments and char
    literals as blanks: bracket matching and schema reading then see code and plain strings only."""
    if lexeme["raw"] is not None:
        body = lexeme["body"].replace("\\", "\\\\").replace('"', '\\"')
        return '"' + re.sub(r"\s*\n\s*", " ", body) + '"' + "\n" * body.count("\n")
    if lexeme["string"] is not None:
        return lexeme[0]
    return re.sub(r"[^\n]", " ", lexeme[0])


class _Text:
    """One C/C++ file made plain (`_plain`), with where each line starts (a line number by bisection)."""

    def __init__(self, source: str) -> None:
        self.text = LEXEME.sub(_plain, source)
        self.starts = [0] + [m.end() for m in re.finditer("\n", self.text)]

    def line(self, index: int) -> int:
        return bisect_right(self.starts, index)


@dataclass(frozen=True)
class _Call:
    """A call in C/C++ text: a block macro, with the `{ ... }` body after it in [start, end) (a `#define`
    of the macro has none and is skipped), or a member call (`m.def(...)`) inside such a body."""

    name: str
    arguments: list[str]
    line: int
    start: int
    end: int


def _call(source: _Text, name: str, at: int, open_paren: int) -> _Call:
    text = source.text
    close = _balanced(text, open_paren, "(", ")")
    body = re.compile(r"\s*\{").match(text, close)
    start = body.end() - 1 if body else close
    end = _balanced(text, start, "{", "}") if body else close
    return _Call(name, _split_arguments(text[open_paren + 1 : close - 1]), source.line(at), start, end)


def _member_calls(source: _Text, block: _Call, receiver: str, methods: str) -> Iterator[_Call]:
    pattern = re.compile(rf"\b{re.escape(receiver)}\s*\.\s*({methods})\s*\(")
    for found in pattern.finditer(source.text, block.start, block.end):
        yield _call(source, found.group(1), found.end() - 1, found.end() - 1)


@dataclass(frozen=True)
class _NativeDef:
    """`.def("name(schema)")` in a block: the op, its schema as written (None: a name alone)."""

    ns: str
    name: str
    line: int
    schema: str | None


@dataclass(frozen=True)
class _NativeImpl:
    """`.impl("name", ...)`: a kernel, with its own dispatch key or else its IMPL block's."""

    ns: str
    name: str
    line: int
    dispatch_key: str | None


@dataclass(frozen=True)
class _NativeBlock:
    how: NativeHow
    line: int
    end: int


@dataclass
class NativeFacts:
    """What `scan_native` finds in one file; its JSON (the cached form) keeps these field names."""

    registrations: list[_NativeDef] = field(default_factory=list)
    impls: list[_NativeImpl] = field(default_factory=list)
    blocks: list[_NativeBlock] = field(default_factory=list)

    @classmethod
    def from_json(cls, facts: dict[str, Any]) -> NativeFacts:
        return cls(
            [_NativeDef(**item) for item in facts.get("registrations", [])],
            [_NativeImpl(**item) for item in facts.get("impls", [])],
            [_NativeBlock(**item) for item in facts.get("blocks", [])],
        )

    def how_at(self, line: int) -> NativeHow:
        """The macro of the block holding `line`."""
        return next((b.how for b in self.blocks if b.line <= line <= b.end), "TORCH_LIBRARY")


def _impl_key(arguments: list[str], block_key: str | None) -> str | None:
    """An impl's dispatch key: its second argument (`torch::kCUDA`, `torch::dispatch(c10::DispatchKey::CUDA,
    TORCH_FN(f))`), else the IMPL block's."""
    argument = arguments[1] if len(arguments) > 1 else ""
    wrapped = DISPATCH.fullmatch(argument)
    key = NATIVE_KEY.fullmatch(_split_arguments(wrapped.group(1))[0] if wrapped else argument)
    return (key.group(1) or key.group(2)) if key else block_key


def _library(source: _Text, block: _Call, macros: dict[str, str], facts: NativeFacts) -> None:
    """The defs and impls of one `TORCH_LIBRARY*` block; IMPL forms take (ns, dispatch key, receiver),
    and an impl's own key argument wins over the block's."""
    impl_block = "_IMPL" in block.name
    namespace = _namespace(block.arguments[0], block.name.endswith("_EXPAND"), macros)
    facts.blocks.append(_NativeBlock(cast(NativeHow, block.name), block.line, source.line(block.end - 1)))
    for call in _member_calls(source, block, block.arguments[2 if impl_block else 1], "def|impl"):
        literal = "".join(STRING.findall(call.arguments[0]))
        qualifier, _, name = literal.split("(")[0].strip().rpartition("::")
        if not name:
            continue
        if call.name == "def":
            schema = (literal.split("::", 1)[1] if qualifier else literal) if "(" in literal else None
            facts.registrations.append(_NativeDef(qualifier or namespace, name, call.line, schema))
            continue
        key = _impl_key(call.arguments, block.arguments[1] if impl_block else None)
        facts.impls.append(_NativeImpl(qualifier or namespace, name, call.line, key))


def scan_native(source: bytes) -> dict[str, Any]:
    """`TORCH_LIBRARY*` blocks of one C/C++ file, their `.def` schemas and `.impl` kernels, as the JSON
    the fact cache keeps (`NativeFacts`). A def or impl finds its macro in `blocks` by line."""
    if b"TORCH_LIBRARY" not in source:
        return {}
    text = _Text(source.decode("utf-8", errors="replace"))
    macros = dict(DEFINE.findall(text.text))
    facts = NativeFacts()
    for match in BLOCK.finditer(text.text):
        block = _call(text, match.group(1), match.start(), match.end() - 1)
        if block.start == block.end or len(block.arguments) < (3 if "_IMPL" in block.name else 2):
            continue  # no body: a `#define` of the macro
        _library(text, block, macros, facts)
    return asdict(facts)
