"""The plugin's own history over a range of its commits: what each commit changed, which modules it
moved or deleted while plugin code still imports the old location, and which op registrations it
dropped while Python still calls the op.

One `log -M --raw` run lists every commit of the range with its files (renames paired by git's
similarity). What still refers to an old location is read at the range's end: the plugin's import
records (cached by blob id) and the string literals naming dotted module paths (class paths,
connector tables). A dropped binding compares the registrations of a native or Python file at the
commit's parent and at the commit; the calls are the `torch.ops.<ns>.<name>` uses at the range's end.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Literal, cast

from ..code.module_index import ModuleIndex, RecordCache, module_name
from ..code.op_scanners import NATIVE_SUFFIXES, PythonOpFacts, scan_native, scan_python
from ..foundation.errors import bad_input
from ..sources.git import Repository
from ..sources.subjects import RevisionSubject, read_blobs
from .commits import LOG_FORMAT, is_production, log_records

ChangeKind = Literal["A", "M", "D", "R", "T", "C"]
ReferenceKind = Literal["import", "guarded_import", "string"]
"""An import statement, one under a `try` that catches ImportError (it fails quietly: the feature
is lost), or a string literal naming the module as a dotted path."""
PRODUCTION_SHOWN = 10
TORCH_OPS = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)")
DOTTED = re.compile(r"[A-Za-z_][\w.]*(?::[\w.]+)?")
REGISTERING = (b"TORCH_LIBRARY", b"custom_op", b"torch.library", b"Library(", b".define(")
"""What a file that registers ops contains; any other file is not scanned for registrations."""


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: ChangeKind
    old_blob: str | None
    new_blob: str | None
    previous: str | None = None
    """The path before a rename or copy."""
    similarity: int | None = None


@dataclass(frozen=True)
class Reference:
    """A place at the range's end that still names a module the range moved or deleted."""

    where: str
    kind: ReferenceKind
    text: str


@dataclass
class Move:
    """A module a commit renamed (`to` set) or deleted (`to` None), with what still refers to it."""

    module: str
    path: str
    to: str | None
    similarity: int | None
    dangling: list[Reference] = field(default_factory=list)


@dataclass(frozen=True)
class DroppedBinding:
    """An op whose registration a commit removed while Python at the range's end still calls it."""

    op: str
    registered_at: str
    """file:line of the registration at the commit's parent."""
    parent: str
    called_at: list[str]


@dataclass
class LocalCommit:
    """One plugin commit as audit_commits shows it (the tool's output rows are these)."""

    sha: str
    author: str
    date: str
    subject: str
    mapped: list[str] = field(default_factory=list)
    """Audited files (under the call's paths) it touched, at their new paths."""
    production: list[str] = field(default_factory=list)
    """The first PRODUCTION_SHOWN other production files; `production_total` counts them all."""
    production_total: int = 0
    native: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    dropped: list[DroppedBinding] = field(default_factory=list)


@dataclass
class Logged:
    """A commit as the log lists it: the row, and every file it touched."""

    commit: LocalCommit
    changes: list[FileChange] = field(default_factory=list)


@dataclass
class LocalHistory:
    commits: list[LocalCommit]
    """Oldest first."""
    unknowns: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        moves = [m for c in self.commits for m in c.moves]
        dropped = sum(len(c.dropped) for c in self.commits)
        return {"commits": len(self.commits), "moves": len(moves), "dangling": sum(1 for m in moves if m.dangling)} | {
            "dropped_bindings": dropped
        }


# -- the log ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalRange:
    """The plugin commits of START..END, and the files each touched: what a plugin-side decision
    (its commit, its file) and a `commit` evidence item of it must lie in."""

    label: str
    commits: frozenset[str]
    touched: dict[str, frozenset[str]]


def local_range(repo: Repository, text: str) -> LocalRange:
    start, end = resolved_range(repo, text)
    raw = repo.run("log", "--no-merges", "--name-only", "-z", "--format=%x1e%H", f"{start}..{end}")
    touched = {}
    for record in raw.split(b"\x1e")[1:]:
        sha, _, names = record.decode(errors="replace").partition("\n")
        touched[sha.strip("\0\n")] = frozenset(n.strip("\n") for n in names.split("\0") if n.strip("\n"))
    return LocalRange(text, frozenset(touched), touched)


def resolved_range(repo: Repository, text: str) -> tuple[str, str]:
    """START..END as two full commit ids (an option-like or unknown revision is refused)."""
    start, dots, end = text.partition("..")
    if not dots or not start or not end or end.startswith("."):
        raise bad_input(f"local_range {text!r} is not START..END (two revisions of the plugin repository).")
    return repo.resolve_commit(start), repo.resolve_commit(end)


def parse_renaming_log(raw: bytes) -> list[Logged]:
    """Commits of a `log -z -M --raw --no-abbrev` run with LOG_FORMAT, newest first."""
    logged = []
    for record in log_records(raw):
        changes = [
            FileChange(
                c.path,
                cast(ChangeKind, c.status[0]),
                c.old_blob,
                c.new_blob,
                c.previous,
                int(c.status[1:]) if c.previous and c.status[1:].isdigit() else None,
            )
            for c in record.changes
        ]
        logged.append(Logged(LocalCommit(record.sha, record.author, record.date, record.subject), changes))
    return logged


def _classify(logged: Logged, audited: list[str]) -> None:
    commit = logged.commit
    for change in logged.changes:
        path = change.path
        if any(path == p or path.startswith(p.rstrip("/") + "/") for p in audited):
            commit.mapped.append(path)
        elif path.endswith(NATIVE_SUFFIXES):
            commit.native.append(path)
        elif is_production(path):
            commit.production.append(path)
        else:
            commit.other.append(path)
    commit.production_total = len(commit.production)
    del commit.production[PRODUCTION_SHOWN:]


# -- what still refers to a moved module --------------------------------------------------------


def _moves(logged: Logged) -> list[Move]:
    moves = []
    for change in logged.changes:
        old = change.previous if change.kind == "R" else change.path if change.kind == "D" else None
        if old is None or not old.endswith(".py") or not (name := module_name(old)):
            continue
        moves.append(Move(name, old, change.path if change.kind == "R" else None, change.similarity))
    return moves


def _import_references(index: ModuleIndex, gone: set[str]) -> dict[str, list[Reference]]:
    """Per gone module: the plugin imports at the range's end that still name it (`from pkg import
    mod` only when `pkg` does not define `mod` itself now)."""
    found: dict[str, list[Reference]] = {}
    for indexed in index.modules.values():
        for record in [*indexed.record.imports, *indexed.record.dynamic_imports]:
            target = indexed.absolute(record.module)
            package = index.get(target)
            written = ", ".join(n for n, _ in record.names)
            named = [(target, f"from {record.module} import {written}" if written else f"import {record.module}")]
            named = named if target in gone else []
            for name, _alias in record.names:
                defined = package is not None and package.record.definition(name) is not None
                if f"{target}.{name}" in gone and not defined:
                    named.append((f"{target}.{name}", f"from {record.module} import {name}"))
            kind: ReferenceKind = "guarded_import" if record.guard and "try" in record.guard else "import"
            for module, text in named:
                found.setdefault(module, []).append(Reference(f"{indexed.path}:{record.line}", kind, text))
    return found


def _named_module(text: str, gone: set[str]) -> str | None:
    """The gone module a dotted-path literal names: `pkg.mod`, `pkg.mod:Cls` or `pkg.mod.Cls`."""
    if not DOTTED.fullmatch(text):
        return None
    module = text.partition(":")[0]
    if module in gone:
        return module
    parent = module.rpartition(".")[0]
    return parent if ":" not in text and parent in gone else None


def _string_references(sources: dict[str, bytes], gone: set[str]) -> dict[str, list[Reference]]:
    """Per gone module: string literals that are a dotted path naming it (class paths, tables)."""
    found: dict[str, list[Reference]] = {}
    for path, source in sorted(sources.items()):
        if not any(name.encode() in source for name in gone):
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                module = _named_module(node.value, gone)
                if module is not None:
                    found.setdefault(module, []).append(Reference(f"{path}:{node.lineno}", "string", node.value))
    return found


# -- dropped bindings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Registration:
    op: str
    line: int


def registrations(path: str, source: bytes) -> list[_Registration]:
    """The ops a file defines: C++ `TORCH_LIBRARY*` defs, Python custom ops in a namespace it names."""
    if not any(marker in source for marker in REGISTERING):
        return []
    if path.endswith(NATIVE_SUFFIXES):
        items = scan_native(source).get("registrations", [])
        return [_Registration(f"{i['ns']}.{i['name']}", i["line"]) for i in items]
    if path.endswith(".py"):
        return [_Registration(s.op, s.line) for s in PythonOpFacts.from_json(scan_python(source)).local_ops()]
    return []


def _calls(sources: dict[str, bytes]) -> dict[str, list[str]]:
    """`ns.name` -> file:line of every `torch.ops.ns.name` in the plugin's Python at the range's end."""
    found: dict[str, list[str]] = {}
    for path, source in sorted(sources.items()):
        if b"torch.ops." not in source:
            continue
        for number, line in enumerate(source.decode(errors="replace").splitlines(), 1):
            for match in TORCH_OPS.finditer(line):
                found.setdefault(f"{match.group(1)}.{match.group(2)}", []).append(f"{path}:{number}")
    return found


class _RegisteredAtEnd:
    """The ops some file at the range's end registers, read once and only when a commit dropped one."""

    def __init__(self, subject: RevisionSubject, python: dict[str, bytes]) -> None:
        self.subject, self.python = subject, python
        self._ops: set[str] | None = None

    def __contains__(self, op: object) -> bool:
        if self._ops is None:
            native = self.subject.read_many([p for p in self.subject.list() if p.endswith(NATIVE_SUFFIXES)])
            sources = {**self.python, **native}
            self._ops = {item.op for path, source in sources.items() for item in registrations(path, source)}
        return op in self._ops


def _dropped(
    repo: Repository, logged: Logged, calls: dict[str, list[str]], at_end: _RegisteredAtEnd
) -> list[DroppedBinding]:
    """Ops the commit's registering files defined at its parent, that no file it touched defines
    after it and no file at the range's end registers, while the end still calls them."""
    commit = logged.commit
    touched = [c for c in logged.changes if c.path.endswith((*NATIVE_SUFFIXES, ".py"))]
    shas = sorted({b for c in touched for b in (c.old_blob, c.new_blob) if b})
    if not shas:
        return []
    blobs = read_blobs(repo, shas)
    before: dict[str, str] = {}
    after: set[str] = set()
    for change in touched:
        old_path = change.previous or change.path
        if change.old_blob and change.old_blob in blobs:
            for item in registrations(old_path, blobs[change.old_blob]):
                before.setdefault(item.op, f"{old_path}:{item.line}")
        if change.new_blob and change.new_blob in blobs:
            after |= {item.op for item in registrations(change.path, blobs[change.new_blob])}
    lost = [(op, where) for op, where in sorted(before.items()) if op not in after and op in calls]
    return [DroppedBinding(op, where, f"{commit.sha}^", calls[op]) for op, where in lost if op not in at_end]


# -- the whole range ----------------------------------------------------------------------------


def local_history(repo: Repository, cache: RecordCache, range_text: str, audited: list[str]) -> LocalHistory:
    """Every non-merge commit of START..END in the plugin repository, oldest first, with its moves
    and dropped bindings checked against the plugin at END."""
    start_sha, end_sha = resolved_range(repo, range_text)
    raw = repo.run("log", "--no-merges", "-M", "--raw", "--no-abbrev", "-z", LOG_FORMAT, f"{start_sha}..{end_sha}")
    logged = parse_renaming_log(raw)[::-1]
    at_end = RevisionSubject(repo, end_sha)
    python = at_end.read_many([p for p in at_end.list() if p.endswith(".py")])
    index = ModuleIndex()
    index.add_tree("plugin", at_end, cache)
    for item in logged:
        _classify(item, audited)
        item.commit.moves = _moves(item)
    commits = [item.commit for item in logged]
    gone = {m.module for c in commits for m in c.moves if index.get(m.module) is None}
    references = _import_references(index, gone)
    for module, found in _string_references(python, gone).items():
        references.setdefault(module, []).extend(found)
    calls, registered = _calls(python), _RegisteredAtEnd(at_end, python)
    for item in logged:
        for move in item.commit.moves:
            move.dangling = sorted(references.get(move.module, []), key=lambda r: r.where)
        item.commit.dropped = _dropped(repo, item, calls, registered)
    history = LocalHistory(commits)
    if repo.text("merge-base", start_sha, end_sha).strip() != start_sha:
        history.unknowns.append(
            f"START of {range_text} is not an ancestor of END: the commits listed are those of END not in START."
        )
    return history
