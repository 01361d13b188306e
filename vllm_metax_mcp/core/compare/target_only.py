"""The upstream files of the mapped directories that no plugin file pairs with, and why.

The mapped directories are the families the plugin mirrors or a pair reaches into (every file of
the family, by the kind of sub-directory it lies in) and the other upstream directories a pair
reaches into. A file whose code a local file carries (`Pair.merged_from`) is not target-only.

Each file gets a reason, apart from where it lies (its kind): `imported_by_local` when a compared
plugin file imports it as it is (an import statement, `from pkg import submodule`, or a load by
`import_from_path` / `importlib` whose path or name the file's literals decide; a load computed at
run time is an unknown, never a guess), `other_platform` in another platform's directory,
`new_at_target` when it is absent at its directory's base release (`with_new_at_target`, only when
the call names releases), else `not_ported`. Another platform's or an unreferenced sub-directory is
one entry per reason, with the dispatch condition that selects it; so are the files of one
(directory, kind, reason) beyond `DIR_COLLAPSE`. An imported file is always its own entry, with its
importer.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..code.literals import Literals, Scope, argument, callee
from ..code.module_index import ImportRecord, IndexedModule, ModuleIndex
from .family import SubdirKind
from .pairing_context import PairingContext
from .pairs import FAMILIES, Pair, TargetKind, TargetOnly, TargetReason

if TYPE_CHECKING:
    from .releases import FileReleases, Release

DIR_COLLAPSE = 8
"""Target-only files of one directory, kind and reason beyond this count are reported as one directory entry."""

_SUBDIR_KIND: dict[SubdirKind, TargetKind] = {
    SubdirKind.BRANCH: "branch",
    SubdirKind.SHARED: "shared",
    SubdirKind.OTHER_PLATFORM: "other_platform",
    SubdirKind.UNREFERENCED: "unreferenced",
}
_COLLAPSED: tuple[TargetKind, ...] = ("other_platform", "unreferenced")

LoadKind = Literal["path", "module"]
_LOADERS: dict[str, tuple[int, str, LoadKind]] = {
    "import_from_path": (1, "file_path", "path"),
    "spec_from_file_location": (1, "location", "path"),
    "import_module": (0, "name", "module"),
}
"""Calls that load a module by file path or dotted name: (argument position, keyword, what it names)."""


@dataclass(frozen=True)
class _Group:
    directory: str
    kind: TargetKind
    reason: TargetReason
    guard: str | None = None
    by: str | None = None


@dataclass(frozen=True)
class Importer:
    path: str
    line: int


@dataclass
class LocalImports:
    """The upstream files the compared plugin files import, and the loads no literal decides."""

    importers: dict[str, list[Importer]] = field(default_factory=dict)
    """Upstream path -> the plugin files (and lines) that import or load it."""
    unknowns: list[str] = field(default_factory=list)

    def add(self, upstream: str, path: str, line: int) -> None:
        self.importers.setdefault(upstream, []).append(Importer(path, line))

    def by(self, upstream: str) -> str | None:
        """`path:line` of the first importer, and how many other plugin files import the file."""
        found = self.importers.get(upstream)
        if not found:
            return None
        first = min(found, key=lambda i: (i.path, i.line))
        others = len({i.path for i in found}) - 1
        return f"{first.path}:{first.line}" + (f" (+{others} file{'s' if others > 1 else ''})" if others else "")


def _imported_modules(index: ModuleIndex, module: IndexedModule, record: ImportRecord) -> set[str]:
    """The modules an import statement names: the module, or the submodules a from-import names."""
    target = module.absolute(record.module)
    if not record.names:
        return {target}
    named = {f"{target}.{name}" for name, _ in record.names if index.get(f"{target}.{name}") is not None}
    if len(named) < len(record.names):
        named.add(target)
    return named


def local_imports(context: PairingContext) -> LocalImports:
    """The upstream files the compared plugin files import, by statement or by a literal load."""
    found = LocalImports()
    index = context.trees.index
    for path, module in sorted(context.trees.local_modules.items()):
        if path not in context.local_data:
            continue  # indexed for its names and registrations, not compared
        for record in module.record.imports:
            for name in sorted(_imported_modules(index, module, record)):
                target = index.get(name)
                if target is not None and target.side == "upstream":
                    found.add(target.path, path, record.line)
        source = context.local_data.get(path)
        if source is None or not any(loader.encode() in source for loader in _LOADERS):
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue  # reported as the pair's parse error
        _Loads(context, module, tree, found).scan()
    return found


class _Loads(Literals):
    """The modules one plugin file loads by path or name, evaluated from its literals.

    Beyond what `Literals` reads, a path is followed through `/`, `Path(...)`, `os.path.join`,
    `.parent`, `.resolve()` and `<module>.__file__` (an upstream module's file).
    """

    def __init__(self, context: PairingContext, module: IndexedModule, tree: ast.Module, found: LocalImports):
        super().__init__(tree)
        self.context, self.module, self.found = context, module, found
        self.bound: dict[str, str] = {}
        """Import-bound names -> the dotted module they may stand for."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    self.bound.setdefault(name, alias.name if alias.asname else name)
            elif isinstance(node, ast.ImportFrom):
                base = module.absolute("." * node.level + (node.module or ""))
                for alias in node.names:
                    self.bound.setdefault(alias.asname or alias.name, f"{base}.{alias.name}")

    def scan(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and (name := callee(node.func)) in _LOADERS:
                self._load(node, name)

    def _load(self, call: ast.Call, loader: str) -> None:
        position, keyword, kind = _LOADERS[loader]
        loaded = argument(call, position, keyword)
        if loaded is None:
            return
        values = self.values(loaded, call)
        resolved = [(value, line) for value, line in values if value is not None]
        for value, line in resolved:
            upstream = self._upstream(value, kind)
            if upstream:
                self.found.add(upstream, self.module.path, line)
        if len(resolved) < len(values) or not values:
            self.found.unknowns.append(
                f"{self.module.path}:{call.lineno} loads a module with {loader}() by a {kind} computed at run time: "
                "the upstream file it loads, if any, is not marked imported_by_local."
            )

    def _upstream(self, value: str, kind: LoadKind) -> str | None:
        if kind == "path":
            path = posixpath.normpath(value)
            return path if path in self.context.trees.upstream_files else None
        target = self.context.trees.index.get(value) if not value.startswith(".") else None
        return target.path if target is not None and target.side == "upstream" else None

    def _module_file(self, node: ast.expr) -> str | None:
        """The file of the module a dotted name stands for (`vllm.__file__` -> `vllm/__init__.py`)."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.bound:
            return None
        found = self.context.trees.index.get(".".join([self.bound[node.id], *parts]))
        return found.path if found is not None else None

    def name(self, name: str, scope: Scope, depth: int) -> str | None:
        return self.module.path if name == "__file__" else self.lookup(name, scope, depth)

    def other(self, node: ast.expr, scope: Scope, depth: int) -> str | None:
        """`a / b`, `<module>.__file__`, `.parent` and the path calls."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = self.eval(node.left, scope, depth + 1), self.eval(node.right, scope, depth + 1)
            return None if left is None or right is None else posixpath.join(left, right)
        if isinstance(node, ast.Attribute) and node.attr == "__file__":
            return self._module_file(node.value)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = self.eval(node.value, scope, depth + 1)
            return posixpath.dirname(inner) if inner is not None else None
        if isinstance(node, ast.Call) and not node.keywords:
            return self._call(node, scope, depth)
        return None

    def _call(self, node: ast.Call, scope: Scope, depth: int) -> str | None:
        """`Path(...)`, `os.path.join/dirname/abspath(...)`, `str(...)`, `.resolve()`, `.joinpath(...)`."""
        if any(isinstance(a, ast.Starred) for a in node.args):
            return None
        args = [self.eval(a, scope, depth + 1) for a in node.args]
        texts = [a for a in args if a is not None]
        if len(texts) < len(args):
            return None
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("resolve", "absolute", "expanduser", "joinpath"):
            base = self.eval(func.value, scope, depth + 1)
            return None if base is None or (texts and func.attr != "joinpath") else posixpath.join(base, *texts)
        name = callee(func)
        str_join = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Constant)
        if texts and (name in ("Path", "PurePath", "PosixPath") or (name == "join" and not str_join)):
            return posixpath.join(*texts)
        if len(texts) == 1 and name in ("str", "fspath", "abspath", "realpath", "normpath"):
            return texts[0]
        if len(texts) == 1 and name == "dirname":
            return posixpath.dirname(texts[0])
        return None


def _family_of(context: PairingContext, upstream: str) -> str | None:
    """The upstream family a file lies in (`vllm/models/F/...`), if any."""
    family, _, within = upstream[len(FAMILIES) :].partition("/") if upstream.startswith(FAMILIES) else ("", "", "")
    return family if within and family in context.families else None


def _mapped_files(
    context: PairingContext, families: list[str], reached: set[str]
) -> Iterator[tuple[str, TargetKind, str, str | None]]:
    """Every upstream file of the mapped directories: (path, kind, directory it is grouped in, guard)."""
    for family in families:
        layout = context.layout(family)
        for upstream in context.families[family]:
            subdir = layout.subdir_of(upstream)
            kind: TargetKind = _SUBDIR_KIND[layout.kinds[subdir]] if subdir else "family"
            directory = f"{layout.root}/{subdir}" if kind in _COLLAPSED else posixpath.dirname(upstream)
            decided = layout.evidence.get(subdir or "")
            yield upstream, kind, directory, decided.guard if decided is not None and kind == "other_platform" else None
    roots = tuple(FAMILIES + f + "/" for f in families)
    directories = {posixpath.dirname(u) for u in reached if not u.startswith(roots)}
    for upstream in sorted(context.trees.upstream_files):
        if posixpath.dirname(upstream) in directories:
            yield upstream, "directory", posixpath.dirname(upstream), None


def target_only(context: PairingContext, pairs: list[Pair], imports: LocalImports | None = None) -> list[TargetOnly]:
    """Upstream files of the mapped directories that no local file pairs with, each with its reason.

    `imports`: the compared files' imports (`local_imports`), computed here when not given.
    """
    imports = imports if imports is not None else local_imports(context)
    carried = {u for p in pairs for u in (p.upstream, *p.merged_from) if u}
    reached = carried & context.trees.upstream_files
    families = {f for p in pairs if (f := context.local_family(p.local))}
    families |= {f for u in reached if (f := _family_of(context, u))}
    groups: dict[_Group, list[str]] = {}
    for upstream, kind, directory, guard in _mapped_files(context, sorted(families), reached):
        if upstream in carried:
            continue
        by = imports.by(upstream)
        reason: TargetReason = (
            "imported_by_local" if by else "other_platform" if kind == "other_platform" else "not_ported"
        )
        groups.setdefault(_Group(directory, kind, reason, guard, by), []).append(upstream)
    return _entries(groups)


def _entries(groups: Mapping[_Group, list[str]]) -> list[TargetOnly]:
    entries: list[TargetOnly] = []
    for group, files in groups.items():
        members = tuple(sorted(files))
        if group.reason != "imported_by_local" and (group.kind in _COLLAPSED or len(files) > DIR_COLLAPSE):
            entries.append(
                TargetOnly(group.directory + "/", group.kind, group.reason, len(files), group.guard, group.by, members)
            )
        else:
            entries += [TargetOnly(f, group.kind, group.reason, 1, group.guard, group.by, (f,)) for f in members]
    return sorted(entries, key=_order)


def _directory(entry: TargetOnly) -> str:
    return entry.upstream[:-1] if entry.upstream.endswith("/") else posixpath.dirname(entry.upstream)


def _order(entry: TargetOnly) -> tuple[str, str, str, str]:
    """By directory and kind, a directory entry before its files, then by path (and reason)."""
    return _directory(entry), entry.kind, entry.upstream, entry.reason


def _mapped_dir(upstream: str) -> str:
    """The mapped directory a file counts in: its family, else its directory."""
    family, _, within = upstream[len(FAMILIES) :].partition("/") if upstream.startswith(FAMILIES) else ("", "", "")
    return FAMILIES + family if within else posixpath.dirname(upstream)


def base_releases(
    pairs: list[Pair], releases: list[Release], closest: Mapping[str, FileReleases]
) -> dict[str, Release]:
    """Per mapped directory: the newest release its plugin files are shown to be based on, at least.

    A file matches its counterpart best at a run of releases; the oldest of them is the newest one
    the evidence pins (a file upstream left unchanged matches all releases alike and pins only the
    oldest). A directory's base is the newest release one of its files pins.
    """
    order = {release.label: position for position, release in enumerate(releases)}
    pinned: dict[str, str] = {}
    for pair in pairs:
        found = closest.get(pair.local)
        if pair.upstream is None or found is None or not found.counterparts:
            continue
        least = min(c.lines for c in found.counterparts.values())
        earliest = min((label for label, c in found.counterparts.items() if c.lines == least), key=order.__getitem__)
        directory = _mapped_dir(pair.upstream)
        if directory not in pinned or order[earliest] > order[pinned[directory]]:
            pinned[directory] = earliest
    by_label = {release.label: release for release in releases}
    return {directory: by_label[label] for directory, label in pinned.items()}


def with_new_at_target(
    entries: list[TargetOnly], pairs: list[Pair], releases: list[Release], closest: Mapping[str, FileReleases]
) -> list[TargetOnly]:
    """The target-only list with the not-ported files absent at their directory's base release
    (`base_releases`) marked `new_at_target`, the base named in `by`; the rest as they were."""
    bases = base_releases(pairs, releases, closest)
    kept: list[TargetOnly] = []
    groups: dict[_Group, list[str]] = {}
    for entry in entries:
        base = bases.get(_mapped_dir(entry.members[0])) if entry.reason == "not_ported" and entry.members else None
        if base is None:
            kept.append(entry)
            continue
        present = base.subject.entries()
        for path in entry.members:
            new = path not in present
            reason: TargetReason = "new_at_target" if new else "not_ported"
            group = _Group(_directory(entry), entry.kind, reason, entry.guard, base.label if new else None)
            groups.setdefault(group, []).append(path)
    return sorted([*kept, *_entries(groups)], key=_order)
