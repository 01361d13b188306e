"""Who reads a config field: the code of source trees, plus what a membership test proves.

A file that mentions the field's name is parsed, and only code that can read the field counts:
an attribute (`config.x`, `self.x = x` in a config class), a key (`d["x"]`, `d.get("x")`), a
`getattr`/`hasattr` by name, a parameter of that name, or the name as a string constant (key
lists). Comments, docstrings and unrelated words do not; a file that does not parse falls back to
its word matches. For layer-id lists the consuming expression also gives the base:
`layer_idx in config.x` means 0-based ids, `(layer_idx + 1) in config.x` 1-based — evidence from
the code that runs, not from the list's values.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..foundation.policy import is_within, real
from ..sources.subjects import Subject

LAYER_INDEX_NAME = re.compile(r"^(layer_?(idx|id|index|num|number|i)|idx|layer)$")
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")


@dataclass(frozen=True)
class Location:
    tree: str
    path: str
    line: int
    text: str


@dataclass(frozen=True)
class SourceTree:
    """A labelled set of `.py` files: (repository-relative path, bytes)."""

    label: str
    files: tuple[tuple[str, bytes], ...]


def directory_tree(label: str, top: Path, package: str) -> SourceTree:
    """`.py` files of `top/package`, symlinks leaving `top` not followed."""
    found: list[tuple[str, bytes]] = []
    start, resolved_top = top / package, real(top)
    for directory, dirs, names in os.walk(start):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = Path(directory) / name
            if not is_within(real(path), resolved_top):
                continue
            found.append((path.relative_to(top).as_posix(), path.read_bytes()))
    return SourceTree(label, tuple(found))


def subject_tree(label: str, subject: Subject, prefix: str) -> SourceTree:
    paths = [p for p in subject.list(prefix) if p.endswith(".py")]
    contents = subject.read_many(paths)
    return SourceTree(label, tuple((p, contents[p]) for p in paths))


@dataclass(frozen=True)
class _Mention:
    """A file of a source tree whose text names the field as a whole word."""

    tree: str
    path: str
    text: str


def _mentions(trees: Iterable[SourceTree], name: str) -> Iterator[_Mention]:
    word = re.compile(rf"\b{re.escape(name)}\b")
    needle = name.encode()
    for tree in trees:
        for path, data in tree.files:
            if needle in data:
                text = data.decode(errors="replace")
                if word.search(text):
                    yield _Mention(tree.label, path, text)


def _reads(node: ast.AST, name: str) -> bool:
    """Whether this node is code that can read the field `name`."""
    if isinstance(node, ast.Attribute):
        return node.attr == name
    if isinstance(node, ast.Constant):
        return node.value == name
    if isinstance(node, ast.arg):
        return node.arg == name
    if isinstance(node, ast.keyword):
        return node.arg == name
    return False


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (never code that reads a field)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _reading_lines(text: str, name: str) -> list[int] | None:
    """Line numbers of code reading the field; None when the file does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    skip = _docstrings(tree)
    return sorted({n.lineno for n in ast.walk(tree) if hasattr(n, "lineno") and id(n) not in skip and _reads(n, name)})


def find_consumers(trees: list[SourceTree], name: str, limit: int) -> tuple[list[Location], int]:
    """Lines of code that read the field (see the module docstring), first `limit` of them, and the total."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    found: list[Location] = []
    total = 0
    for mention in _mentions(trees, name):
        lines = mention.text.splitlines()
        numbers = _reading_lines(mention.text, name)
        if numbers is None:
            numbers = [n for n, line in enumerate(lines, 1) if word.search(line)]
        for number in numbers:
            total += 1
            if len(found) < limit and number <= len(lines):
                found.append(Location(mention.tree, mention.path, number, lines[number - 1].strip()[:160]))
    return found, total


# -- id-list base from the consuming expression -----------------------------------------------


@dataclass(frozen=True)
class BaseEvidence:
    base: int
    location: Location


def _refers_to(node: ast.AST, name: str, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == name:
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == name:
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == name
    return isinstance(node, ast.Name) and node.id in aliases


def _aliases(function: ast.AST, name: str) -> set[str]:
    """Local names assigned from an expression that reads the field."""
    found: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(_refers_to(n, name, set()) for n in ast.walk(node.value)):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return found


def _layer_operand(node: ast.AST) -> int | None:
    """0 for `layer_idx`, 1 for `layer_idx + 1`; None for anything else."""
    if isinstance(node, ast.Name) and LAYER_INDEX_NAME.match(node.id):
        return 0
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and LAYER_INDEX_NAME.match(node.left.id)
        and isinstance(node.right, ast.Constant)
        and node.right.value == 1
    ):
        return 1
    return None


def bases_from_code(trees: list[SourceTree], name: str, limit: int = 10) -> list[BaseEvidence]:
    """Membership tests of a layer index in the field: which numbering the consumer uses."""
    leaf = name.rsplit(".", 1)[-1]
    if not FIELD_NAME.match(leaf):
        return []
    evidence: list[BaseEvidence] = []
    seen: set[tuple[str, str, int]] = set()
    for mention in _mentions(trees, leaf):
        label, path = mention.tree, mention.path
        try:
            tree = ast.parse(mention.text)
        except (SyntaxError, ValueError):
            continue
        lines = mention.text.splitlines()
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            aliases = _aliases(function, leaf)
            for node in ast.walk(function):
                if (
                    not isinstance(node, ast.Compare)
                    or len(node.ops) != 1
                    or not isinstance(node.ops[0], (ast.In, ast.NotIn))
                ):
                    continue
                base = _layer_operand(node.left)
                if (
                    base is not None
                    and _refers_to(node.comparators[0], leaf, aliases)
                    and (label, path, node.lineno) not in seen
                ):
                    seen.add((label, path, node.lineno))
                    text_line = lines[node.lineno - 1].strip()[:160] if node.lineno <= len(lines) else ""
                    evidence.append(BaseEvidence(base, Location(label, path, node.lineno, text_line)))
                    if len(evidence) >= limit:
                        return evidence
    return evidence
