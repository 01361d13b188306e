"""What the pairing rules share: family layouts, the upstream symbol table, the local bytes.

Built once per pairing, so the path, symbol, subclass, history, content and target-only steps
read the same family layouts (evaluated on first use) and the same symbol table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..code.module_index import Definition, IndexedModule
from ..code.registration import Registration
from ..foundation.evidence import FileEvidence
from .affixes import VendorAffixes, discover_affixes
from .family import FamilyLayout, family_layout
from .pairs import FAMILIES, MODEL_DIRS, UPSTREAM_ROOT, Trees
from .textdiff import line_profile, similarity


@dataclass(frozen=True)
class UpstreamBase:
    """A base of a local class that resolves to a class defined in the upstream tree."""

    symbol: str
    module: str
    path: str
    line: int


@dataclass(frozen=True)
class SymbolScore:
    """How much of a local file's top-level names one upstream file defines."""

    shared: int
    rarity: float
    """Summed 1/n over the shared names, n the upstream files defining each."""
    first: str
    """The first shared name (sorted)."""


class PairingContext:
    """The lookups every pairing step reads, over one pair of trees."""

    def __init__(
        self,
        trees: Trees,
        local_data: Mapping[str, bytes],
        answers: Mapping[str, bool],
        registered: Sequence[Registration] = (),
    ) -> None:
        self.trees = trees
        self.registered = list(registered)
        self.local_data = local_data
        self.answers = answers
        self.layouts: dict[str, FamilyLayout] = {}
        self._fan_in: dict[str, int] | None = None
        self._local_names: dict[str, dict[str, Definition]] = {}
        self.families: dict[str, list[str]] = {}
        for path in sorted(trees.upstream_files):
            if path.startswith(FAMILIES) and path[len(FAMILIES) :].count("/"):
                self.families.setdefault(path[len(FAMILIES) :].split("/")[0], []).append(path)
        self.outlines = {trees.index.modules[name].path: o for name, o in trees.index.outlines("upstream").items()}
        """Upstream path -> its outline (top-level classes and functions, no full parse)."""
        self.symbols: dict[str, dict[str, int]] = {}
        """Upstream top-level function and class name -> upstream path -> line."""
        for path, outline in self.outlines.items():
            for definition in outline.definitions:
                if not definition.name.startswith("__"):
                    self.symbols.setdefault(definition.name, {}).setdefault(path, definition.line)
        self.registry: dict[str, list[Registration]] = {}
        """Upstream's model registry: architecture -> its table entries whose module is a model module
        (tables of tokenizers, renderers or configs name other modules)."""
        for entry in trees.registry:
            target = trees.index.get(entry.module)
            if target is not None and target.side == "upstream" and target.path.startswith(MODEL_DIRS):
                self.registry.setdefault(entry.arch, []).append(entry)
        self.model_files = self._model_files()
        local_names = [
            (m.path, d.name)
            for m in trees.local_modules.values()
            for d in m.record.definitions
            if d.kind in ("class", "function")
        ]
        self.affixes: VendorAffixes = discover_affixes(
            local_names, self.symbols, [(r.arch, r.symbol) for r in self.registered]
        )
        trees.affixes = self.affixes  # the symbol diff and the matrix read the same affixes

    def _model_files(self) -> frozenset[str]:
        """Upstream files that hold models: the modules the registry names, and every family file."""
        found = {p for p in self.trees.upstream_files if p.startswith(FAMILIES)}
        for entries in self.registry.values():
            for entry in entries:
                module = self.trees.index.get(entry.module)
                if module is not None:
                    found.add(module.path)
        return frozenset(found)

    def base_fan_in(self, name: str) -> int:
        """How many upstream files define a class extending a base called `name` (by its last part)."""
        if self._fan_in is None:
            users: dict[str, set[str]] = {}
            for path, outline in self.outlines.items():
                for definition in outline.definitions:
                    for tail in definition.base_tails:
                        users.setdefault(tail, set()).add(path)
            self._fan_in = {base: len(paths) for base, paths in users.items()}
        return self._fan_in.get(name, 0)

    def cite(self, path: str, line: int, local: bool = False) -> FileEvidence:
        subject = self.trees.local if local else self.trees.upstream
        return FileEvidence(path=path, line=max(1, line), rev=subject.sha(path))

    def layout(self, family: str) -> FamilyLayout:
        if family not in self.layouts:
            self.layouts[family] = family_layout(
                self.trees.index, FAMILIES + family, self.families[family], self.answers
            )
        return self.layouts[family]

    def local_family(self, local: str) -> str | None:
        """The upstream family a local file's directory mirrors (`<package>/models/F/...`)."""
        models = self.trees.package.models
        if not local.startswith(models):
            return None
        family, _, within = local[len(models) :].partition("/")
        return family if within and family in self.families else None

    def similarities(self, local: str, upstream: list[str]) -> dict[str, float]:
        mine = line_profile(self.local_data[local])
        data = self.trees.upstream.read_many(upstream)
        return {path: round(similarity(mine, line_profile(data[path])), 2) for path in upstream}

    def bindings(self, module: IndexedModule) -> dict[str, str]:
        """Import-bound names of a module -> the absolute dotted target they stand for."""
        bound: dict[str, str] = {}
        for record in module.record.imports:
            if record.branch == "not_taken":
                continue
            target = module.absolute(record.module)
            if record.names:
                for original, alias in record.names:
                    bound.setdefault(alias, f"{target}.{original}")
            elif record.alias:
                bound.setdefault(record.alias, target)
            else:
                top = target.split(".")[0]
                bound.setdefault(top, top)
        return bound

    def upstream_bases(self, module: IndexedModule, definition: Definition) -> list[UpstreamBase]:
        """The bases of a local class that resolve to classes defined in the upstream tree."""
        bindings = self.bindings(module)
        refs = []
        for base in definition.bases:
            head, *rest = base.split("[")[0].split(".")
            if head not in bindings:
                continue
            owner, _, symbol = ".".join([bindings[head], *rest]).rpartition(".")
            if owner != UPSTREAM_ROOT and not owner.startswith(UPSTREAM_ROOT + "."):
                continue
            defining, name = self.trees.index.resolve_symbol(owner, symbol)
            found = self.trees.index.get(defining)
            target = found.record.definition(name) if found is not None and found.side == "upstream" and name else None
            if found is not None and target is not None and target.kind == "class":
                refs.append(UpstreamBase(target.name, defining, found.path, target.line))
        return refs

    def local_names(self, local: str) -> dict[str, Definition]:
        """Top-level functions and classes of a local file by upstream name (vendor affixes dropped),
        without classes that extend the upstream class of that name (an extension, not a copy)."""
        if local in self._local_names:
            return self._local_names[local]
        module = self.trees.local_modules.get(local)
        names: dict[str, Definition] = {}
        self._local_names[local] = names  # every rule asks for a file's names: resolve its bases once
        if module is None or module.record.error:
            return names
        for definition in module.record.definitions:
            if definition.kind not in ("function", "class") or definition.name.startswith("__"):
                continue
            name = self.affixes.upstream_name(definition.name)
            if definition.kind == "class" and any(b.symbol == name for b in self.upstream_bases(module, definition)):
                continue
            names.setdefault(name, definition)
        return names

    def symbol_scores(self, names: Mapping[str, Definition]) -> dict[str, SymbolScore]:
        """Upstream path -> the names it shares with `names`."""
        scores: dict[str, SymbolScore] = {}
        for name in sorted(names):
            places = self.symbols.get(name, {})
            for path in places:
                seen = scores.get(path)
                if seen is None:
                    scores[path] = SymbolScore(1, 1 / len(places), name)
                else:
                    scores[path] = SymbolScore(seen.shared + 1, seen.rarity + 1 / len(places), seen.first)
        return scores


def shared_count(scores: Mapping[str, SymbolScore], path: str) -> int:
    """How many names `path` shares (0 when it shares none)."""
    return scores[path].shared if path in scores else 0
