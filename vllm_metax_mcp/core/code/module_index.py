"""The Python module index: per file, what it imports (under which guard), defines and uses.

Scanning is `ast` only (`scanner`). A file's record depends only on its bytes, so records are
cached in the state directory by blob sha, as the JSON rows `scanner` produces, and misses are
parsed in worker processes. A request for a whole tree also keeps one bundle of all its records,
keyed by the set of blob shas, so indexing the same tree again reads one file instead of one per
module, and decodes the bulk of a record (definitions, names used) only for the modules a tool
looks into. Relative imports are kept raw in the record and resolved against the module's name
when the index is assembled.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from ..foundation.atomic import write_bytes_atomic
from ..foundation.progress import advancing
from ..foundation.state import StateStore
from ..sources.subjects import Subject
from .import_scan import Branch, ImportKind
from .scanner import DetailRow, GraphRow, scan_row

RECORD_VERSION = 7
PARALLEL_THRESHOLD = 64
BUNDLE_THRESHOLD = 64
"""Requests for at least this many blobs (a tree, not a lookup) are also kept as one bundle."""
MAX_BUNDLES = 8
"""Bundles kept, most recently used first (one is about 14 MB for the vLLM tree); a tree whose bundle
was pruned reads its records from the shards again."""

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


@contextmanager
def _collection_paused() -> Iterator[None]:
    """Decoding many small containers makes the cycle collector run over and over for nothing
    (rows and syntax trees hold no cycles); pause it meanwhile."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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
            with _collection_paused():
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
    appended right now). `whole` decodes the bulk now too, for text that was not written in one
    atomic rename; a bundle's lines leave it for first use."""
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


def _scan(item: tuple[str, bytes], answers: dict[str, bool]) -> str:
    """Worker side: one blob's record as the cache stores it."""
    graph, detail = scan_row(item[1], answers)
    return f"{json.dumps(graph, separators=(',', ':'))}\t{json.dumps(detail, separators=(',', ':'))}"


def _append(path: Path, data: bytes) -> None:
    """Append in one write to an O_APPEND file, which keeps concurrent appenders' lines apart; a
    line that still comes out damaged (a crash, a short write) only reads back as a miss."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(handle, data) :]
    finally:
        os.close(handle)


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # pruned meanwhile by another process: it is written again next time


def _prune(directory: Path, keep: int) -> None:
    """Remove all but the `keep` most recently used files of a directory."""
    dated = []
    for path in directory.iterdir():
        try:
            dated.append((path.stat().st_mtime, path))
        except OSError:
            continue
    for _, path in sorted(dated, reverse=True)[keep:]:
        path.unlink(missing_ok=True)


class RecordCache:
    """Module records keyed by (blob sha, platform answers) in the state directory.

    Records are appended to one of 256 shard files by the first two hex digits of the blob sha
    (`blobs/ab.rec`, lines of `sha<TAB>record`), not written one file per blob: creating 2,000
    small files took a tenth of a cold index of the vLLM tree. A request for a whole tree also
    writes a bundle of exactly its records (`trees/<key>.rec`), replaced atomically, which is all
    a second index of that tree reads.
    """

    def __init__(self, store: StateStore, answers: Mapping[str, bool] | None = None) -> None:
        self.store = store
        self.answers = dict(answers or {})
        salt = hashlib.sha1(json.dumps([RECORD_VERSION, sorted(self.answers.items())]).encode()).hexdigest()[:8]
        self.root = store.path(f"cache/pyindex/{salt}")
        self.memory: dict[str, ModuleRecord] = {}
        """Records already loaded in this process, so trees sharing blobs (releases) read each once."""
        self.hits = 0
        self.misses = 0

    def _shard(self, prefix: str) -> Path:
        return self.root / "blobs" / f"{prefix}.rec"

    def _bundle(self, shas: set[str]) -> Path:
        key = hashlib.sha1("\n".join(sorted(shas)).encode()).hexdigest()
        return self.root / "trees" / f"{key}.rec"

    def get_many(self, subject: Subject, paths: list[str], workers: int = 2) -> dict[str, ModuleRecord]:
        entries = subject.entries()
        shas = {path: entry.sha if (entry := entries.get(path)) else subject.sha(path) for path in paths}
        unique = set(shas.values())
        wanted = unique - self.memory.keys()
        bundle = self._bundle(unique) if len(unique) >= BUNDLE_THRESHOLD else None
        stored: dict[str, str] = {}
        """What this call read or scanned, as stored, so a new bundle needs no re-encoding."""
        with _collection_paused():
            if wanted and bundle is not None:
                self._read(bundle, wanted, stored, whole=False)
            bundled = wanted <= stored.keys()
            for prefix in sorted({sha[:2] for sha in wanted - stored.keys()}):
                self._read(self._shard(prefix), wanted, stored, whole=True)
            parse = {sha: path for path, sha in shas.items() if sha in wanted and sha not in stored}
            if parse:
                self._parse(subject, parse, workers, stored)
        if bundle is not None and bundled:
            _touch(bundle)
        elif bundle is not None:
            write_bytes_atomic(
                bundle,
                "".join(f"{sha}\t{self._stored(sha, stored)}\n" for sha in sorted(unique)).encode(),
                durable=False,
            )
            _prune(bundle.parent, MAX_BUNDLES)
        misses = sum(1 for sha in shas.values() if sha in parse)
        self.misses += misses
        self.hits += len(shas) - misses
        return {path: self.memory[sha] for path, sha in shas.items()}

    def _stored(self, sha: str, stored: dict[str, str]) -> str:
        return stored.get(sha) or self.memory[sha].stored()

    def _read(self, path: Path, wanted: set[str], stored: dict[str, str], whole: bool) -> None:
        """Take the wanted records from a bundle or shard file; a damaged line is a miss (records
        are written as ASCII JSON, so a byte cut short is replaced and fails to decode)."""
        try:
            lines = path.read_bytes().decode("ascii", errors="replace").split("\n")
        except OSError:
            return
        for line in lines:
            sha, _, text = line.partition("\t")
            if sha in wanted and sha not in stored and (record := _decode(text, whole)) is not None:
                self.memory[sha], stored[sha] = record, text

    def _parse(self, subject: Subject, parse: dict[str, str], workers: int, stored: dict[str, str]) -> None:
        """Scan the blobs no record was found for (biggest first, so the workers finish together)
        and append them to their shards."""
        sources = subject.read_many(parse.values())
        items = sorted(((sha, sources[path]) for sha, path in parse.items()), key=lambda item: -len(item[1]))
        scan = partial(_scan, answers=self.answers)
        what = f"parsing {len(items)} modules"
        if len(items) >= PARALLEL_THRESHOLD and workers > 1:
            with ProcessPoolExecutor(max_workers=workers, initializer=gc.disable) as pool:
                scanned = list(
                    advancing(pool.map(scan, items, chunksize=max(1, len(items) // (workers * 32))), len(items), what)
                )
        else:
            scanned = [scan(item) for item in advancing(items, len(items), what)]
        shards: dict[str, list[str]] = {}
        for (sha, _), text in zip(items, scanned, strict=True):
            graph, _, detail = text.partition("\t")
            self.memory[sha], stored[sha] = ModuleRecord(json.loads(graph), detail_text=detail), text
            shards.setdefault(sha[:2], []).append(f"{sha}\t{text}\n")
        for prefix, lines in shards.items():
            _append(self._shard(prefix), "".join(lines).encode())


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
    side: Side
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

    def add_tree(self, side: Side, subject: Subject, cache: RecordCache, prefixes: Iterable[str] = ("",)) -> None:
        names = {path: name for prefix in prefixes for path in subject.list(prefix) if (name := module_name(path))}
        records = cache.get_many(subject, sorted(names))
        for path, record in records.items():
            self.modules.setdefault(
                names[path], IndexedModule(names[path], side, path, path.endswith("__init__.py"), record)
            )

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
