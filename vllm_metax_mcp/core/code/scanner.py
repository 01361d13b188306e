"""One Python file's index record as plain lists, strings and numbers (`scan_row`).

This runs once per file of a whole upstream tree when the cache is cold, inside worker
processes, so it is written for speed: one `ast.parse`, one pass over the expression nodes of
each top-level statement (the children of each node type are looked up once, not discovered by
`ast.iter_child_nodes`), source-line hashing from a list of significant lines computed once, and
`ast.unparse` only where text is really recorded (the guard of an `if` or `try` is rendered only
when an import sits under it; `import_scan` reads the statements that import). The row, in two
parts (what a walk over the whole tree reads, and the bulk), is what worker processes store and
send back; `module_index` turns it into objects.
"""

from __future__ import annotations

import ast
import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from .dispatch import dotted
from .import_scan import ModuleNames, StatementScanner

# The rows below are positional JSON lists, not records, on purpose: they are the cache format and
# what worker processes send back, and decoding a tree's worth of them is the hot path of a warm index.
DefinitionRow = list[Any]
"""[name, kind, line, end_line, bases, names_used, body_hash, signature, members, member_signatures, own_hash]"""
GraphRow = list[Any]
"""[imports, jit_kernels, exports, error, guarded_names, dynamic_imports]: what walks over a whole tree read."""
DetailRow = list[Any]
"""[definitions, names_used, torch_ops]: the bulk of a record, read for the modules a tool looks into."""

# -- expression nodes ------------------------------------------------------------------------

_NOT_CHILDREN = frozenset(
    {
        "ctx",
        "id",
        "attr",
        "name",
        "arg",
        "asname",
        "module",
        "level",
        "type_comment",
        "is_async",
        "conversion",
        "kind",
        "tag",
        "rest",
        "simple",
        "op",
        "ops",
        "lineno",
        "type_ignores",
        "kwd_attrs",
    }
)
"""Fields that never hold a node that can contain a loaded name (identifiers, flags, operators)."""


def _child_fields(kind: type) -> tuple[str, ...]:
    fields = [f for f in kind._fields if f not in _NOT_CHILDREN]  # type: ignore[attr-defined]
    if kind in (ast.Constant, ast.MatchSingleton):
        fields.remove("value")
    if kind in (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal):
        fields.remove("names")
    return tuple(fields)


_CHILDREN: dict[type, tuple[str, ...]] = {
    kind: _child_fields(kind) for kind in vars(ast).values() if isinstance(kind, type) and issubclass(kind, ast.AST)
}
_CHILDREN[type(None)] = ()


def _uses(node: ast.AST, ops: list[str]) -> set[str]:
    """Names loaded under `node`; `torch.ops.<ns>.<op>` uses are appended to `ops` on the way.

    Breadth-first like `ast.walk`, so ops keep the order `ast.walk` finds them in.
    """
    used: set[str] = set()
    queue: list[Any] = [node]
    append, extend = queue.append, queue.extend
    for current in queue:
        kind = current.__class__
        if kind is ast.Name:
            if current.ctx.__class__ is ast.Load:
                used.add(current.id)
            continue
        if kind is ast.Attribute:
            namespace = current.value
            ops_node = namespace.value if namespace.__class__ is ast.Attribute else None
            if (
                ops_node.__class__ is ast.Attribute
                and ops_node.attr == "ops"
                and ops_node.value.__class__ is ast.Name
                and ops_node.value.id == "torch"
            ):
                op = f"{namespace.attr}.{current.attr}"
                if op not in ops:
                    ops.append(op)
            append(namespace)
            continue
        fields = _CHILDREN.get(kind)
        if fields is None:
            if not isinstance(current, ast.AST):
                continue
            fields = _CHILDREN[kind] = tuple(current._fields)
        for name in fields:
            value = getattr(current, name, None)
            if value.__class__ is list:
                extend(value)
            else:
                append(value)
    return used


def _plain(node: Any) -> str | None:
    """`ast.unparse` of the expressions most annotations, defaults and bases are made of (names,
    constants, subscripts, `|` unions, lists and tuples); None for anything else, which
    `ast.unparse` then renders."""
    kind = node.__class__
    if kind is ast.Name:
        return node.id
    if kind is ast.Attribute:
        return dotted(node)
    if kind is ast.Constant:
        value = node.value
        if value is ...:
            return "..."
        if value.__class__ is float:
            return repr(value) if math.isfinite(value) else None
        return (
            repr(value) if node.kind is None and (value is None or value.__class__ in (str, int, bool, bytes)) else None
        )
    if kind is ast.Subscript:
        elements = node.slice.elts if node.slice.__class__ is ast.Tuple else [node.slice]
        head, parts = dotted(node.value), [_plain(e) for e in elements]
        if head is None or None in parts or (node.slice.__class__ is ast.Tuple and len(parts) < 2):
            return None  # a one-element or empty tuple is written with a comma or parentheses
        return f"{head}[{', '.join(parts)}]"  # type: ignore[arg-type]
    if kind is ast.BinOp and node.op.__class__ is ast.BitOr and node.right.__class__ is not ast.BinOp:
        left, right = _plain(node.left), _plain(node.right)
        return None if left is None or right is None else f"{left} | {right}"
    if kind is ast.List or kind is ast.Tuple:
        parts = [_plain(e) for e in node.elts]
        if None in parts:
            return None
        text = ", ".join(parts) + ("," if kind is ast.Tuple and len(parts) == 1 else "")  # type: ignore[arg-type]
        return f"[{text}]" if kind is ast.List else f"({text})"
    if kind is ast.UnaryOp and node.op.__class__ is ast.USub and node.operand.__class__ is ast.Constant:
        return f"-{node.operand.value!r}" if node.operand.value.__class__ is int else None
    return None


def _text(node: ast.expr) -> str:
    return _plain(node) or ast.unparse(node)


def _plain_parameter(arg: ast.arg, default: ast.expr | None, prefix: str = "") -> str | None:
    text = prefix + arg.arg
    if arg.annotation:
        annotation = _plain(arg.annotation)
        if annotation is None:
            return None
        text += f": {annotation}"
    if default:
        value = _plain(default)
        return None if value is None else f"{text}={value}"
    return text


def _plain_arguments(args: ast.arguments) -> str | None:
    """`ast.unparse(args)` when every annotation and default is `_plain`; None otherwise."""
    parts: list[str | None] = []
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    for index, (arg, default) in enumerate(zip(positional, defaults + args.defaults, strict=True), 1):  # type: ignore[operator]
        parts.append(_plain_parameter(arg, default))
        if index == len(args.posonlyargs):
            parts.append("/")
    if args.vararg:
        parts.append(_plain_parameter(args.vararg, None, "*"))
    elif args.kwonlyargs:
        parts.append("*")
    parts += [_plain_parameter(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        parts.append(_plain_parameter(args.kwarg, None, "**"))
    return None if None in parts else ", ".join(parts)  # type: ignore[arg-type]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """`(<parameters>) -> <return annotation>` as `ast.unparse` writes them."""
    parameters = _plain_arguments(node.args)
    text = f"({ast.unparse(node.args) if parameters is None else parameters})"
    return text + (f" -> {_text(node.returns)}" if node.returns else "")


# -- source-line hashes ----------------------------------------------------------------------


def _significant(lines: list[str]) -> list[str]:
    """Per line: its text without trailing whitespace and with a newline, or '' for blank and
    comment-only lines; a body hash is then the digest of a joined slice."""
    stripped = [line.rstrip() for line in lines]
    return [text + "\n" if text and text.lstrip()[0] != "#" else "" for text in stripped]


def _docstring_span(node: ast.AST) -> tuple[int, int] | None:
    body = getattr(node, "body", None)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[0].lineno, body[0].end_lineno or body[0].lineno
    return None


def _hash_lines(kept: list[str], first: int, last: int, skipped: Iterable[tuple[int, int]] = ()) -> str:
    """Digest of the significant lines first..last (1-based, inclusive) outside the skipped spans."""
    pieces: list[str] = []
    at = first
    for start, end in sorted(skipped):
        if start > at:
            pieces.append("".join(kept[at - 1 : min(start - 1, last)]))
        at = max(at, end + 1)
    if at <= last:
        pieces.append("".join(kept[at - 1 : last]))
    return hashlib.sha1("".join(pieces).encode()).hexdigest()[:16]


def _body_hash(node: ast.stmt, kept: list[str]) -> str:
    """Identity of a definition's code: its source lines without the docstring, blank lines,
    comment-only lines and trailing whitespace (so re-indentation inside a line still counts)."""
    docstring = _docstring_span(node)
    return _hash_lines(kept, node.lineno, node.end_lineno or node.lineno, [docstring] if docstring else [])


def _class_own_hash(node: ast.ClassDef, kept: list[str]) -> str:
    """`_body_hash` of a class with its methods' lines (decorators included) left out."""
    skipped = [span] if (span := _docstring_span(node)) else []
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in item.decorator_list] + [item.lineno])
            skipped.append((start, item.end_lineno or item.lineno))
    return _hash_lines(kept, node.lineno, node.end_lineno or node.lineno, skipped)


# -- definitions -----------------------------------------------------------------------------


def _definitions(node: ast.stmt, kept: list[str], ops: list[str], used: set[str]) -> list[DefinitionRow]:
    """Rows for what a top-level statement defines; every name it loads is added to `used`."""
    end = node.end_lineno or node.lineno
    if isinstance(node, ast.ClassDef):
        methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        members = {item.name: _body_hash(item, kept) for item in methods}
        signatures = {item.name: _signature(item) for item in methods}
        bases = [_text(b) for b in node.bases]
        names = _uses(node, ops)
        used |= names
        return [
            [
                node.name,
                "class",
                node.lineno,
                end,
                bases,
                sorted(names),
                _body_hash(node, kept),
                "",
                members,
                signatures,
                _class_own_hash(node, kept),
            ]
        ]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names = _uses(node, ops)
        used |= names
        return [
            [
                node.name,
                "function",
                node.lineno,
                end,
                [],
                sorted(names),
                _body_hash(node, kept),
                _signature(node),
                {},
                {},
                "",
            ]
        ]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    bound = [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
    names = _uses(node, ops)
    used |= names
    if not bound:
        return []
    digest, loaded = _body_hash(node, kept), sorted(names)
    return [[name, "assignment", node.lineno, end, [], loaded, digest, "", {}, {}, ""] for name in bound]


def _exports(node: ast.stmt) -> list[str] | None:
    """The names of a module-level `__all__ = [...]`, None for any other statement."""
    if (
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        and isinstance(node.value, (ast.List, ast.Tuple))
    ):
        return [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def _guarded_names(statements: list[ast.stmt], nested: bool = False) -> set[str]:
    """Functions, classes and plain assignments inside module-level compound statements."""
    names: set[str] = set()
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names |= {statement.name} if nested else set()
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)) and nested:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        else:
            for child in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(statement, child, None)
                if isinstance(block, list):
                    inner = [s for b in block for s in (b.body if isinstance(b, ast.ExceptHandler) else [b])]
                    names |= _guarded_names([s for s in inner if isinstance(s, ast.stmt)], True)
    return names


# -- one file --------------------------------------------------------------------------------


def scan_row(source: bytes, answers: Mapping[str, bool] | None = None) -> tuple[GraphRow, DetailRow]:
    """Scan one file; a file that does not parse gets a row with its error set, not an exception."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        error = f"{type(exc).__name__}: {getattr(exc, 'msg', exc)} (line {getattr(exc, 'lineno', '?')})"
        return [[], [], None, error, [], []], [[], [], []]
    loads = b"import_module" in source or b"__import__" in source
    statements = StatementScanner(answers or {}, ModuleNames(tree) if loads else None)
    statements.block(tree.body)
    kept = _significant(source.decode("utf-8", errors="replace").splitlines())
    definitions: list[DefinitionRow] = []
    used: set[str] = set()
    ops: list[str] = []
    exports: list[str] | None = None
    for statement in tree.body:
        definitions += _definitions(statement, kept, ops, used)
        found = _exports(statement)
        exports = exports if found is None else found
    guarded = sorted(_guarded_names(tree.body))
    graph = [statements.imports, statements.jit_kernels, exports, None, guarded, statements.dynamic]
    return graph, [definitions, sorted(used), ops]
