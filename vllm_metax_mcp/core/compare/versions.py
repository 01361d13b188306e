"""The three versions of a changed file the difference matrix reads, each parsed and indexed by line.

Local (L), target (T) and base (B: the counterpart at the file's closest release, else T). A
`SourceView` knows each symbol's lines, the AST nodes on each line and the comments, so the
classification rules look only at the nodes on the lines that differ.
"""

from __future__ import annotations

import ast
import difflib
import io
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..code.module_index import Definition, IndexedModule, ModuleRecord
from ..foundation.evidence import FileEvidence
from .textdiff import split_lines


@dataclass(frozen=True)
class Version:
    """One version of a file: where it is, its blob, its index record and its bytes."""

    path: str
    sha: str
    record: ModuleRecord
    data: bytes


@dataclass(frozen=True)
class FileVersions:
    local: Version
    target: Version
    base: Version
    base_label: str | None
    local_module: IndexedModule
    target_module: IndexedModule
    extends: Mapping[str, str] = field(default_factory=dict)
    """Subclass pairs: local class -> upstream class it extends."""


@dataclass(frozen=True)
class ChangedLines:
    """The lines of one symbol that differ between two versions (compared stripped, blank lines dropped)."""

    minus: list[int]
    """Lines only in the earlier version."""
    plus: list[int]
    """Lines only in the later version."""


class SourceView:
    """A parsed version, indexed by line, so rules look only at the nodes on the differing lines."""

    def __init__(self, version: Version) -> None:
        self.version = version
        self.lines = split_lines(version.data)
        tree = ast.parse(version.data)
        self.spans = _spans(tree)
        self.nodes: dict[int, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Call, ast.Attribute, ast.Name, ast.Constant, ast.Import, ast.ImportFrom)):
                self.nodes.setdefault(node.lineno, []).append(node)
        self.comments = _comments(version.data)

    def cite(self, line: int) -> FileEvidence:
        return FileEvidence(path=self.version.path, line=max(1, line), rev=self.version.sha)

    def at(self, lines: Iterable[int]) -> list[ast.AST]:
        return [node for line in sorted(lines) for node in self.nodes.get(line, [])]

    def leads(self, lines: Iterable[int]) -> list[str]:
        return [f"{self.version.path}:{n}: {self.comments[n]}" for n in sorted(set(lines)) if n in self.comments]

    def comments_above(self, symbol: str | None) -> dict[int, str]:
        """The comment-only lines directly above a symbol (its header comment block)."""
        found: dict[int, str] = {}
        line = self.spans[symbol][0] - 1 if symbol in self.spans else 0
        while line >= 1 and self.lines[line - 1].strip().startswith("#"):
            found[line] = self.lines[line - 1].strip()
            line -= 1
        return found


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([d.lineno for d in decorators] + [node.lineno])


def _spans(tree: ast.Module) -> dict[str, list[int]]:
    """Lines of each top-level symbol and `Class.method` (a class without its methods' lines)."""
    spans: dict[str, list[int]] = {}
    for node in tree.body:
        whole = list(range(_first_line(node), (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            inner: set[int] = set()
            for method in methods:
                lines = list(range(_first_line(method), (method.end_lineno or method.lineno) + 1))
                spans.setdefault(f"{node.name}.{method.name}", lines)
                inner.update(lines)
            spans.setdefault(node.name, [n for n in whole if n not in inner])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.setdefault(node.name, whole)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        spans.setdefault(name.id, whole)
    return spans


def _comments(data: bytes) -> dict[int, str]:
    found: dict[int, str] = {}
    try:
        for token in tokenize.tokenize(io.BytesIO(data).readline):
            if token.type == tokenize.COMMENT:
                found.setdefault(token.start[0], token.string)
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def symbol_digest(record: ModuleRecord, symbol: str) -> str | None:
    """The body identity the symbol diff compares: class own hash, function/assignment body, method."""
    owner, _, method = symbol.partition(".")
    definition: Definition | None = record.definition(owner)
    if definition is None:
        return None
    if method:
        return definition.members.get(method)
    return definition.own_hash if definition.kind == "class" else definition.body_hash


def changed_lines(
    before: SourceView, before_symbol: str | None, after: SourceView, after_symbol: str | None
) -> ChangedLines:
    """The lines that differ between `before`'s symbol and `after`'s, compared stripped."""
    old = before.spans.get(before_symbol or "", [])
    new = after.spans.get(after_symbol or "", [])
    a = [before.lines[n - 1].strip() for n in old]
    b = [after.lines[n - 1].strip() for n in new]
    minus: list[int] = []
    plus: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            minus += [old[i] for i in range(i1, i2) if a[i]]
            plus += [new[j] for j in range(j1, j2) if b[j]]
    return ChangedLines(minus, plus)
