"""The Python module index: per file, what it imports (under which guard), defines and uses.

Adding a tree lists its files and blob ids; a module's full record (`scanner`, `ast`) is made
when a call first looks into it, so a call parses only what it reads. Walks over a whole tree
read the outline instead (`outline`: top-level classes and functions, import lines; no `ast`),
made for every file of a side at once. Both depend only on a file's bytes, so both are cached in
the state directory by blob sha (`blob_store`); the bulk of a record (definitions, names used) is
decoded on first use. Relative imports are kept raw in the record and resolved against the
module's name when the index is assembled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from ..foundation.errors import ToolFailure
from ..foundation.state import StateStore
from ..sources.subjects import SourceReader, Subject
from .blob_store import BUNDLE_THRESHOLD, BlobStore, bundle_key, collection_paused, scan_all
from .import_scan import Branch, ImportKind
from .outline import Outline, OutlineDefinition, OutlineImport, outline
from .scanner import DetailRow, GraphRow, scan_row

RECORD_VERSION = 7
OUTLINE_VERSION = 1

Side = Literal["plugin", "upstream"]
"""Which tree a module of an index comes from: the plugin subject or upstream vLLM."""
DefinitionKind = Literal["class", "function", "assignment"]


@dataclass
class ImportRecord:
    module: str
    """Target module as written (relative imports keep their leading dots until assembly)."""
    names: list[list[str]]
    """[name, alias] pairs of a from-import; empty for `import x` (kept as decoded from the row)."""
    alias: str | None
    line: int
    guard: str | None
    branch: Branch
    kind: ImportKind = "import"


@dataclass
class Definition:
    name: str
    kind: DefinitionKind
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


class ModuleRecord:
    """One file's record. The part a walk over the whole tree reads (imports, guards, exports,
    errors) is decoded when the record is loaded; definitions and names used are decoded, and every
    list becomes objects, on first use, so a tool pays for the modules it looks into."""

    __slots__ = ("_by_name", "_definitions", "_detail", "_detail_text", "_imports", "graph")

    def __init__(self, graph: GraphRow, detail: DetailRow | None = None, detail_text: str = "") -> None:
        self.graph = graph
        self._detail, self._detail_text = detail, detail_text
        self._imports: list[ImportRecord] | None = None
        self._definitions: list[Definition] | None = None
        self._by_name: dict[str, Definition] | None = None

    @property
    def detail(self) -> DetailRow:
        if self._detail is None:
            with collection_paused():
                self._detail = json.loads(self._detail_text)
        return self._detail

    def stored(self) -> str:
        """The record as the cache keeps it: both parts as JSON, tab-separated."""
        detail = self._detail_text or json.dumps(self._detail, separators=(",", ":"))
        return f"{json.dumps(self.graph, separators=(',', ':'))}\t{detail}"

    @property
    def imports(self) -> list[ImportRecord]:
        if self._imports is None:
            self._imports = [ImportRecord(*item) for item in self.graph[0]]
        return self._imports

    @property
    def dynamic_imports(self) -> list[ImportRecord]:
        """`importlib.import_module` / `__import__` calls whose module name the file's literals decide
        (kept apart from `imports`: they bind no name the way an import statement does)."""
        return [ImportRecord(*item) for item in self.graph[5]]

    @property
    def jit_kernels(self) -> list[str]:
        return self.graph[1]

    @property
    def exports(self) -> list[str] | None:
        return self.graph[2]

    @property
    def error(self) -> str | None:
        return self.graph[3]

    @property
    def guarded_names(self) -> list[str]:
        """Names bound only inside module-level if/try/with blocks (`if platform: def f(): ...`)."""
        return self.graph[4]

    @property
    def definitions(self) -> list[Definition]:
        if self._definitions is None:
            self._definitions = [Definition(*item) for item in self.detail[0]]
        return self._definitions

    @property
    def names_used(self) -> list[str]:
        return self.detail[1]

    @property
    def torch_ops(self) -> list[str]:
        return self.detail[2]

    def definition(self, name: str) -> Definition | None:
        """The first definition of `name` in the module (looked up often while resolving re-exports)."""
        if self._by_name is None:
            self._by_name = {}
            for definition in self.definitions:
                self._by_name.setdefault(definition.name, definition)
        return self._by_name.get(name)


def scan_source(source: bytes, answers: Mapping[str, bool] | None = None) -> ModuleRecord:
    """Scan one file; a file that does not parse gets a record with `error` set, not an exception."""
    return ModuleRecord(*scan_row(source, answers))


# -- the cache -------------------------------------------------------------------------------


def _decode(stored: str, whole: bool) -> ModuleRecord | None:
    """A stored record, or None when the text is not one (a line cut short by a crash or being
    appended right now). `whole` decodes the bulk now too, to find such a line; otherwise the bulk
    is decoded on first use."""
    graph_text, _, detail_text = stored.partition("\t")
    try:
        graph = json.loads(graph_text)
        detail = json.loads(detail_text) if whole else None
    except ValueError:
        return None
    if not (
        isinstance(graph, list) and len(graph) == 6 and isinstance(graph[0], list) and detail_text.startswith("[[")
    ):
        return None
    if whole and not (isinstance(detail, list) and len(detail) == 3 and isinstance(detail[0], list)):
        return None
    return ModuleRecord(graph, detail, detail_text)


def _scan(source: bytes, answers: dict[str, bool]) -> str:
    """Worker side: one blob's record as the cache stores it."""
    graph, detail = scan_row(source, answers)
    return f"{json.dumps(graph, separators=(',', ':'))}\t{json.dumps(detail, separators=(',', ':'))}"


def _outline_text(source: bytes) -> str:
    found = outline(source)
    definitions = [[d.name, d.kind, d.line, list(d.base_tails)] for d in found.definitions]
    imports = [[i.module, list(i.names), i.line] for i in found.imports]
    return json.dumps([definitions, imports, found.exact], separators=(",", ":"))


def _outline_of(text: str) -> Outline:
    definitions, imports, exact = json.loads(text)
    return Outline(
        [OutlineDefinition(name, kind, line, tuple(tails)) for name, kind, line, tails in definitions],
        [OutlineImport(module, tuple(names), line) for module, names, line in imports],
        exact,
    )


class RecordCache:
    """Module records and outlines keyed by blob sha (and, for records, the platform answers) in the
    state directory (`blob_store`). Records are parsed when first asked for, one module at a time or
    in parallel for a batch; outlines are made for whole trees and also kept as a bundle per tree.
    """

    def __init__(self, store: StateStore, answers: Mapping[str, bool] | None = None) -> None:
        self.store = store
        self.answers = dict(answers or {})
        salt = hashlib.sha1(json.dumps([RECORD_VERSION, sorted(self.answers.items())]).encode()).hexdigest()[:8]
        self.blobs = BlobStore(store.path(f"cache/pyindex/{salt}"))
        self.outline_blobs = BlobStore(store.path(f"cache/outlines-v{OUTLINE_VERSION}"))
        self.memory: dict[str, ModuleRecord] = {}
        """Records already loaded in this process, so trees sharing blobs (releases) read each once."""
        self._outlines: dict[str, Outline] = {}
        self.hits = 0
        self.misses = 0

    def get_many(self, subject: Subject, paths: list[str], workers: int = 2) -> dict[str, ModuleRecord]:
        entries = subject.entries()
        shas = {path: entry.sha if (entry := entries.get(path)) else subject.sha(path) for path in paths}
        self.load(subject, shas, workers)
        return {path: self.memory[sha] for path, sha in shas.items()}

    def load(
        self, subject: Subject, shas: Mapping[str, str], workers: int = 2, read: SourceReader | None = None
    ) -> None:
        """Have the record of every (path, sha) in memory: from the shards, else parsed (the bytes of
        the misses from `read`, by default the subject's)."""
        wanted = set(shas.values()) - self.memory.keys()
        if not wanted:
            self.hits += len(shas)
            return
        with collection_paused():
            self.blobs.read(wanted, accept=self._accept)
        parse = {sha: path for path, sha in shas.items() if sha in wanted and sha not in self.memory}
        if parse:
            sources = (read or subject.read_many)(list(parse.values()))
            items = [(sha, sources[path]) for sha, path in parse.items()]
            scanned = scan_all(items, partial(_scan, answers=self.answers), f"parsing {len(items)} modules", workers)
            self.blobs.append(scanned)
            with collection_paused():
                for sha, text in scanned.items():
                    graph, _, detail = text.partition("\t")
                    self.memory[sha] = ModuleRecord(json.loads(graph), detail_text=detail)
        misses = sum(1 for sha in shas.values() if sha in parse)
        self.misses += misses
        self.hits += len(shas) - misses

    def _accept(self, sha: str, text: str) -> bool:
        record = _decode(text, whole=True)
        if record is not None:
            self.memory[sha] = record
        return record is not None

    def outlines(
        self, subject: Subject, shas: Mapping[str, str], read: SourceReader | None = None
    ) -> dict[str, Outline]:
        """The outline of every (path, sha), by path: a tree's are read as one bundle once made (the
        bytes of the misses from `read`, by default the subject's)."""
        unique = set(shas.values()) - self._outlines.keys()
        if unique:
            key = bundle_key(unique) if len(unique) >= BUNDLE_THRESHOLD else None
            stored = self.outline_blobs.read(unique, key)
            missing = {sha: path for path, sha in shas.items() if sha in unique and sha not in stored}
            if missing:
                sources = (read or subject.read_many)(list(missing.values()))
                items = [(sha, sources[path]) for sha, path in missing.items()]
                scanned = scan_all(items, _outline_text, f"outlining {len(items)} modules")
                self.outline_blobs.append(scanned)
                stored.update(scanned)
            if key is not None and (missing or not self.outline_blobs.has_bundle(key)):
                self.outline_blobs.keep_bundle(key, stored)
            elif key is not None:
                self.outline_blobs.touch_bundle(key)
            with collection_paused():
                self._outlines.update((sha, _outline_of(text)) for sha, text in stored.items())
        return {path: self._outlines[sha] for path, sha in shas.items()}


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


def _record_outline(record: ModuleRecord) -> Outline:
    """The outline of a parsed file, for one the outline pass cannot vouch for."""
    definitions = [
        OutlineDefinition(d.name, d.kind, d.line, tuple(b.split("[")[0].rpartition(".")[2] for b in d.bases))
        for d in record.definitions
        if d.kind != "assignment"
    ]
    imports = [OutlineImport(i.module, tuple(n for n, _ in i.names), i.line) for i in record.imports]
    return Outline(definitions, imports)


class _Tree:
    """One subject added to an index: where its modules' records and outlines come from."""

    def __init__(self, subject: Subject, cache: RecordCache, shas: dict[str, str]) -> None:
        self.subject, self.cache, self.shas = subject, cache, shas
        self.modules: dict[str, IndexedModule] = {}
        self._sources: dict[str, bytes] | None = None

    def read(self, paths: list[str]) -> Mapping[str, bytes]:
        """The bytes of modules to parse. Where one read of many costs what one read of one does (a git
        subject: a process per read), the first read takes every module of the tree at once, so records
        made one at a time do not cost a read each; each module's bytes are let go once handed out (its
        record is then kept), and a tree that cannot be read whole (a partial clone) is read as asked."""
        return self._read(paths, keep=False)

    def read_kept(self, paths: list[str]) -> Mapping[str, bytes]:
        """`read` for whole-tree passes (the outlines, upstream's registry): the bytes stay for the records
        made after them, so the tree is read once for all."""
        return self._read(paths, keep=True)

    def _read(self, paths: list[str], keep: bool) -> Mapping[str, bytes]:
        if not self.subject.batched_reads:
            return self.subject.read_many(paths)
        if self._sources is None:
            try:
                self._sources = dict(self.subject.read_many(self.shas))
            except ToolFailure:
                self._sources = {}
        sources = self._sources
        found = {path: sources[path] if keep else sources.pop(path) for path in paths if path in sources}
        missing = [path for path in paths if path not in found]
        if missing:
            found |= self.subject.read_many(missing)
        return found

    def record(self, path: str) -> ModuleRecord:
        sha = self.shas[path]
        if sha not in self.cache.memory:
            self.cache.load(self.subject, {path: sha}, read=self.read)
        return self.cache.memory[sha]


class IndexedModule:
    """A module of an index. Its record is read or parsed when first used, so a call pays for the
    modules it looks into; `ModuleIndex.load` reads many at once."""

    __slots__ = ("_record", "_tree", "is_package", "name", "path", "side")

    def __init__(
        self,
        name: str,
        side: Side,
        path: str,
        is_package: bool,
        record: ModuleRecord | None = None,
        tree: _Tree | None = None,
    ) -> None:
        self.name, self.side, self.path, self.is_package = name, side, path, is_package
        self._record, self._tree = record, tree

    @property
    def record(self) -> ModuleRecord:
        if self._record is None:
            assert self._tree is not None, "a module is built with its record or its tree"
            self._record = self._tree.record(self.path)
        return self._record

    @property
    def is_read(self) -> bool:
        """Whether the record is in this process already (reading it costs nothing more)."""
        tree = self._tree
        return self._record is not None or tree is None or tree.shas[self.path] in tree.cache.memory

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
        self._trees: dict[Side, list[_Tree]] = {}

    def add_tree(self, side: Side, subject: Subject, cache: RecordCache, prefixes: Iterable[str] = ("",)) -> None:
        """Add a subject's modules (a name already added wins). The plugin's records are read now
        (a plugin is small and its parse errors are reported); upstream's when first used."""
        entries = subject.entries()
        names = {path: name for prefix in prefixes for path in subject.list(prefix) if (name := module_name(path))}
        tree = _Tree(subject, cache, {path: entries[path].sha for path in names})
        self._trees.setdefault(side, []).append(tree)
        if side == "plugin":
            cache.load(subject, tree.shas)
        for path, name in sorted(names.items()):
            tree.modules[path] = IndexedModule(name, side, path, path.endswith("__init__.py"), tree=tree)
            self.modules.setdefault(name, tree.modules[path])

    def reader(self, side: Side, subject: Subject) -> SourceReader:
        """How a whole-tree pass over `subject` reads it: through its tree in this index when it has one
        (one read of the tree serves that pass, the outlines and the records), else the subject itself."""
        for tree in self._trees.get(side, []):
            if tree.subject is subject:
                return tree.read_kept
        return subject.read_many

    def load(self, modules: Iterable[IndexedModule]) -> None:
        """Read or parse the records of many modules at once (in parallel where they need parsing)."""
        by_tree: dict[int, tuple[_Tree, dict[str, str]]] = {}
        for module in modules:
            if module._record is None and module._tree is not None:
                tree = module._tree
                by_tree.setdefault(id(tree), (tree, {}))[1][module.path] = tree.shas[module.path]
        for tree, shas in by_tree.values():
            tree.cache.load(tree.subject, shas, read=tree.read)

    def side(self, side: Side | None = None) -> list[IndexedModule]:
        """The modules of one side (or all), their records read or parsed now in one batch: for walks
        that read every record (the outline answers the cheaper ones)."""
        modules = [m for m in self.modules.values() if side is None or m.side == side]
        self.load(modules)
        return modules

    def loaded(self) -> list[IndexedModule]:
        """The modules whose records this process has read or parsed so far."""
        return [m for m in self.modules.values() if m.is_read]

    def outlines(self, side: Side) -> dict[str, Outline]:
        """The outline of every module of `side`, by module name (see `outline`); a file the outline
        cannot vouch for gets one from its full record."""
        found: dict[str, Outline] = {}
        for tree in self._trees.get(side, []):
            by_path = tree.cache.outlines(tree.subject, tree.shas, read=tree.read_kept)
            for path, module in tree.modules.items():
                if self.modules.get(module.name) is module:
                    found[module.name] = by_path[path] if by_path[path].exact else _record_outline(module.record)
        return found

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
