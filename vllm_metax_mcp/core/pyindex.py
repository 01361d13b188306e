"""The Python module index: per file, what it imports (under which guard), defines and uses.

Scanning is `ast` only. A file's record depends only on its bytes, so records are cached in the
state directory by blob sha and a second scan of the same trees parses nothing; misses are
parsed in worker processes. Relative imports are kept raw in the record and resolved against
the module's name when the index is assembled.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .dispatch import dotted, evaluate
from .atomic import write_bytes_atomic
from .state import StateStore
from .subjects import Subject

RECORD_VERSION = 5
PARALLEL_THRESHOLD = 64
JIT_DECORATOR_MARKERS = ("jit", "autotune", "compile", "custom_op", "register_fake")


@dataclass
class ImportRecord:
    module: str
    """Target module as written (relative imports keep their leading dots until assembly)."""
    names: list[list[str]]
    """[name, alias] pairs of a from-import; empty for `import x`."""
    alias: str | None
    line: int
    guard: str | None
    branch: str
    """taken | conditional | not_taken | lazy (inside a function)."""


@dataclass
class Definition:
    name: str
    kind: str
    line: int
    end_line: int
    bases: list[str] = field(default_factory=list)
    names_used: list[str] = field(default_factory=list)
    body_hash: str = ""
    signature: str = ""
    members: dict[str, str] = field(default_factory=dict)
    """For classes: method name -> body hash."""
    member_signatures: dict[str, str] = field(default_factory=dict)
    """For classes: method name -> signature, so a symbol diff can report changed method signatures."""
    own_hash: str = ""
    """For classes: the class without its methods (header, bases, class attributes), so a changed
    method does not also mark its class as changed."""


@dataclass
class ModuleRecord:
    imports: list[ImportRecord] = field(default_factory=list)
    definitions: list[Definition] = field(default_factory=list)
    names_used: list[str] = field(default_factory=list)
    torch_ops: list[str] = field(default_factory=list)
    jit_kernels: list[str] = field(default_factory=list)
    exports: list[str] | None = None
    error: str | None = None
    guarded_names: list[str] = field(default_factory=list)
    """Names bound only inside module-level if/try/with blocks (`if platform: def f(): ...`)."""

    def definition(self, name: str) -> Definition | None:
        return next((d for d in self.definitions if d.name == name), None)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModuleRecord":
        return cls(
            imports=[ImportRecord(**i) for i in data["imports"]],
            definitions=[Definition(**d) for d in data["definitions"]],
            names_used=data["names_used"],
            torch_ops=data["torch_ops"],
            jit_kernels=data["jit_kernels"],
            exports=data["exports"],
            error=data["error"],
            guarded_names=data.get("guarded_names", []),
        )


# -- scanning one file -----------------------------------------------------------------------


def _docstring_lines(node: ast.AST) -> range:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1)
    return range(0)


def body_hash(node: ast.AST, lines: list[str]) -> str:
    """Identity of a definition's code: its source lines without the docstring, blank lines,
    comment-only lines and trailing whitespace (so re-indentation inside a line still counts)."""
    skip = _docstring_lines(node)
    digest = hashlib.sha1()
    for number in range(node.lineno, (getattr(node, "end_lineno", None) or node.lineno) + 1):
        if number in skip:
            continue
        text = lines[number - 1].rstrip()
        if text and not text.lstrip().startswith("#"):
            digest.update(text.encode() + b"\n")
    return digest.hexdigest()[:16]


def _class_own_hash(node: ast.ClassDef, lines: list[str]) -> str:
    """`body_hash` of a class with its methods' lines (decorators included) left out."""
    skip = set(_docstring_lines(node))
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in item.decorator_list] + [item.lineno])
            skip.update(range(start, (item.end_lineno or item.lineno) + 1))
    digest = hashlib.sha1()
    for number in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        text = lines[number - 1].rstrip()
        if number not in skip and text and not text.lstrip().startswith("#"):
            digest.update(text.encode() + b"\n")
    return digest.hexdigest()[:16]


def _uses(node: ast.AST, ops: list[str]) -> list[str]:
    """Names loaded under `node`; `torch.ops.<ns>.<op>` uses are appended to `ops` on the way."""
    used: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            if isinstance(child.ctx, ast.Load):
                used.add(child.id)
        elif isinstance(child, ast.Attribute):
            namespace = child.value
            if (
                isinstance(namespace, ast.Attribute)
                and isinstance(namespace.value, ast.Attribute)
                and namespace.value.attr == "ops"
                and isinstance(namespace.value.value, ast.Name)
                and namespace.value.value.id == "torch"
            ):
                op = f"{namespace.attr}.{child.attr}"
                if op not in ops:
                    ops.append(op)
    return sorted(used)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else "")


def _definitions(node: ast.stmt, lines: list[str], ops: list[str]) -> list[Definition]:
    end = getattr(node, "end_lineno", None) or node.lineno
    if isinstance(node, ast.ClassDef):
        methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
        members = {item.name: body_hash(item, lines) for item in methods}
        signatures = {item.name: _signature(item) for item in methods}
        bases = [ast.unparse(b) for b in node.bases]
        return [
            Definition(
                node.name, "class", node.lineno, end, bases, _uses(node, ops), body_hash(node, lines), "",
                members, signatures, _class_own_hash(node, lines),
            )
        ]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [Definition(node.name, "function", node.lineno, end, [], _uses(node, ops), body_hash(node, lines), _signature(node))]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    names = [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
    used = _uses(node, ops) if names else []
    return [Definition(n, "assignment", node.lineno, end, [], used, body_hash(node, lines)) for n in names]


class _StatementScanner:
    """Walks statements only (not expressions): imports with their guards, JIT-decorated functions."""

    def __init__(self, answers: Mapping[str, bool], record: ModuleRecord) -> None:
        self.answers = answers
        self.record = record
        self.guards: list[tuple[str, bool | None]] = []
        self.function_depth = 0

    def _guard(self) -> tuple[str | None, str]:
        if self.function_depth:
            branch = "lazy"
        elif any(answer is False for _, answer in self.guards):
            branch = "not_taken"
        elif any(answer is None for _, answer in self.guards):
            branch = "conditional"
        else:
            branch = "taken"
        return " and ".join(text for text, _ in self.guards) or None, branch

    def block(self, statements: Iterable[ast.stmt], guard: tuple[str, bool | None] | None = None) -> None:
        if guard:
            self.guards.append(guard)
        for statement in statements:
            self.statement(statement)
        if guard:
            self.guards.pop()

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            guard, branch = self._guard()
            for alias in node.names:
                self.record.imports.append(ImportRecord(alias.name, [], alias.asname, node.lineno, guard, branch))
        elif isinstance(node, ast.ImportFrom):
            guard, branch = self._guard()
            names = [[a.name, a.asname or a.name] for a in node.names]
            self.record.imports.append(ImportRecord("." * node.level + (node.module or ""), names, None, node.lineno, guard, branch))
        elif isinstance(node, ast.If):
            answer = evaluate(node.test, self.answers)
            test = ast.unparse(node.test)
            self.block(node.body, (test, answer))
            self.block(node.orelse, (f"not ({test})", None if answer is None else not answer))
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self._try(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                head = ast.unparse(decorator).split("(")[0]
                if any(marker in head.lower() for marker in JIT_DECORATOR_MARKERS):
                    self.record.jit_kernels.append(f"{node.name} @{head}")
            self.function_depth += 1
            self.block(node.body)
            self.function_depth -= 1
        elif isinstance(node, ast.ClassDef):
            self.block(node.body)
        else:
            for child in ("body", "orelse", "finalbody", "handlers"):
                nested = getattr(node, child, None)
                if isinstance(nested, list):
                    self.block(s for s in nested if isinstance(s, ast.stmt))

    def _try(self, node: ast.Try) -> None:
        catches_import = any(
            h.type is None or any(n in ast.unparse(h.type) for n in ("ImportError", "ModuleNotFoundError", "Exception"))
            for h in node.handlers
        )
        if catches_import:
            self.block(node.body, ("try (import may fail)", None))
            for handler in node.handlers:
                self.block(handler.body, (f"except {ast.unparse(handler.type) if handler.type else ''}".strip(), None))
        else:
            self.block(node.body)
            for handler in node.handlers:
                self.block(handler.body)
        self.block(node.orelse)
        self.block(node.finalbody)


def scan_source(source: bytes, answers: Mapping[str, bool] | None = None) -> ModuleRecord:
    """Scan one file; a file that does not parse gets a record with `error` set, not an exception."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        return ModuleRecord(error=f"{type(exc).__name__}: {getattr(exc, 'msg', exc)} (line {getattr(exc, 'lineno', '?')})")
    record = ModuleRecord()
    _StatementScanner(answers or {}, record).block(tree.body)
    lines = source.decode("utf-8", errors="replace").splitlines()
    used: set[str] = set()
    for statement in tree.body:
        definitions = _definitions(statement, lines, record.torch_ops)
        record.definitions.extend(definitions)
        if definitions:
            for definition in definitions:
                used.update(definition.names_used)
        else:
            used.update(_uses(statement, record.torch_ops))
        if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets):
            if isinstance(statement.value, (ast.List, ast.Tuple)):
                record.exports = [e.value for e in statement.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    record.names_used = sorted(used)
    record.guarded_names = sorted(_guarded_names(tree.body))
    return record


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


def _scan_to_dict(item: tuple[bytes, dict[str, bool]]) -> dict[str, Any]:
    return asdict(scan_source(*item))


# -- the cache -------------------------------------------------------------------------------


class RecordCache:
    """Module records keyed by (blob sha, platform answers) in the state directory."""

    def __init__(self, store: StateStore, answers: Mapping[str, bool] | None = None) -> None:
        self.answers = dict(answers or {})
        salt = hashlib.sha1(json.dumps([RECORD_VERSION, sorted(self.answers.items())]).encode()).hexdigest()[:8]
        self.root = store.path(f"cache/pyindex/{salt}")
        self.memory: dict[str, ModuleRecord] = {}
        """Records already loaded in this process, so trees sharing blobs (releases) read each once."""
        self.hits = 0
        self.misses = 0

    def _path(self, sha: str) -> Path:
        return self.root / sha[:2] / f"{sha}.json"

    def get_many(self, subject: Subject, paths: list[str], workers: int = 2) -> dict[str, ModuleRecord]:
        entries = subject.entries()
        records: dict[str, ModuleRecord] = {}
        missing: list[str] = []
        for path in paths:
            try:
                sha = entries[path].sha
                if sha not in self.memory:
                    self.memory[sha] = ModuleRecord.from_dict(json.loads(self._path(sha).read_text()))
                records[path] = self.memory[sha]
                self.hits += 1
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                missing.append(path)
        if missing:
            self.misses += len(missing)
            sources = subject.read_many(missing)
            items = [(sources[p], self.answers) for p in missing]
            if len(items) >= PARALLEL_THRESHOLD and workers > 1:
                with ProcessPoolExecutor(max_workers=workers) as pool:
                    scanned = list(pool.map(_scan_to_dict, items, chunksize=32))
            else:
                scanned = [_scan_to_dict(item) for item in items]
            for path, data in zip(missing, scanned):
                self._store(entries[path].sha, data)
                records[path] = self.memory[entries[path].sha] = ModuleRecord.from_dict(data)
        return records

    def _store(self, sha: str, data: dict[str, Any]) -> None:
        write_bytes_atomic(self._path(sha), json.dumps(data, separators=(",", ":")).encode(), durable=False)


# -- the assembled index ---------------------------------------------------------------------


def module_name(path: str) -> str | None:
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


@dataclass
class IndexedModule:
    name: str
    side: str
    path: str
    is_package: bool
    record: ModuleRecord

    def absolute(self, written: str) -> str:
        """Resolve a relative import target against this module's package."""
        level = len(written) - len(written.lstrip("."))
        if not level:
            return written
        package = self.name.split(".") if self.is_package else self.name.split(".")[:-1]
        base = package[: len(package) - (level - 1)] if level > 1 else package
        rest = written[level:]
        return ".".join([*base, rest] if rest else base)


class ModuleIndex:
    """Modules of one or more trees (plugin subject, upstream tree), by dotted name."""

    def __init__(self) -> None:
        self.modules: dict[str, IndexedModule] = {}

    def add_tree(self, side: str, subject: Subject, cache: RecordCache, prefixes: Iterable[str] = ("",)) -> None:
        paths = sorted({p for prefix in prefixes for p in subject.list(prefix) if module_name(p)})
        records = cache.get_many(subject, paths)
        for path in paths:
            name = module_name(path)
            assert name is not None
            self.modules.setdefault(name, IndexedModule(name, side, path, path.endswith("__init__.py"), records[path]))

    def get(self, name: str) -> IndexedModule | None:
        return self.modules.get(name)

    def resolve_symbol(self, module: str, name: str, hops: int = 8) -> tuple[str, str | None]:
        """Where `from module import name` really comes from: a submodule, a definition, or a re-export.

        Returns (defining module, symbol) — symbol None when `name` is a module.
        """
        for _ in range(hops):
            if f"{module}.{name}" in self.modules:
                return f"{module}.{name}", None
            indexed = self.modules.get(module)
            if indexed is None or indexed.record.definition(name) is not None:
                return module, name
            reexport = self._reexport(indexed, name)
            if reexport is None:
                return module, name
            module, name = reexport
        return module, name

    def _reexport(self, indexed: IndexedModule, name: str) -> tuple[str, str] | None:
        candidates = [i for i in indexed.record.imports if i.branch != "not_taken"]
        candidates.sort(key=lambda i: i.branch != "taken")
        for record in candidates:
            for original, alias in record.names:
                if alias == name:
                    return indexed.absolute(record.module), original
            if not record.names and (record.alias or record.module.split(".")[0]) == name:
                return record.module, ""
        return None
