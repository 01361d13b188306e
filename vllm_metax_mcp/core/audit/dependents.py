"""Which plugin symbols depend on an upstream symbol, so an upstream commit names what it affects.

Four ways a plugin symbol depends on upstream code: it is a *copy* (a definition of the same name,
vendor affix such as `Maca` dropped, in the plugin file paired with the upstream file), a *subclass* (its class
chain, resolved through imports, reaches the upstream class; `override` when it redefines the
changed method), an *importer* (a plugin definition uses a name imported from there; a
`module_importer` imports the module itself), or a *patch* / *registration* that replaces it
(`core/code/overrides.py`). Indexes are built once per call from the plugin and target trees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..code.codebase import Codebase, Outcome, Ref
from ..code.module_index import Definition, IndexedModule, module_name
from ..code.overrides import Overrides, class_chain
from ..compare.affixes import VendorAffixes
from ..compare.pairs import Pair
from .commits import IMPORT_PREFIX, WHOLE_MODULE, SymbolChange
from .symbols import UPSTREAM_ROOT

DependencyKind = Literal["copy", "subclass", "override", "importer", "module_importer", "patch", "registration"]
Add = Callable[[str, DependencyKind], None]


@dataclass(frozen=True)
class Dependent:
    plugin_symbol: str
    how: DependencyKind
    upstream_symbol: str


@dataclass(frozen=True)
class Subclass:
    """A plugin class whose chain reaches an upstream class."""

    module: str
    definition: Definition


@dataclass(frozen=True)
class Importer:
    """A plugin module importing an upstream name (or module) under `alias`."""

    module: IndexedModule
    alias: str


def _upstream(name: str) -> bool:
    return name == UPSTREAM_ROOT or name.startswith(UPSTREAM_ROOT + ".")


class Dependents:
    """Answers `of(module, qualified)` for upstream symbols named as at the target."""

    def __init__(self, code: Codebase, pairs: list[Pair], found: Overrides, affixes: VendorAffixes) -> None:
        self.code = code
        self.affixes = affixes
        self.found = found
        self.plugin = [m for m in code.index.modules.values() if m.side == "plugin"]
        self.copies: dict[str, list[IndexedModule]] = {}
        for pair in pairs:
            local = code.get(module_name(pair.local) or "")
            if pair.upstream and local is not None:
                self.copies.setdefault(module_name(pair.upstream) or "", []).append(local)
        self.subclasses: dict[tuple[str, str], list[Subclass]] = {}
        """(upstream module, class) -> plugin subclasses."""
        self.importers: dict[tuple[str, str | None], list[Importer]] = {}
        """(upstream module, name or None for the module itself) -> plugin importers."""
        for module in self.plugin:
            self._index_classes(module)
            self._index_imports(module)

    def _index_classes(self, module: IndexedModule) -> None:
        for definition in module.record.definitions:
            if definition.kind != "class":
                continue
            for owner, base in class_chain(self.code, module.name, definition.name)[1:]:
                if _upstream(owner):
                    self.subclasses.setdefault((owner, base.name), []).append(Subclass(module.name, definition))

    def _index_imports(self, module: IndexedModule) -> None:
        for record in module.record.imports:
            if record.branch == "not_taken":
                continue
            target = module.absolute(record.module)
            if not record.names:
                if _upstream(target):
                    self.importers.setdefault((target, None), []).append(
                        Importer(module, record.alias or target.split(".")[0])
                    )
                continue
            for original, alias in record.names:
                found = self.code.resolve(target, None if original == "*" else original)
                if not _upstream(found.module):
                    continue
                key = (found.module, found.name) if found.outcome is Outcome.DEFINED else (found.module, None)
                self.importers.setdefault(key, []).append(Importer(module, alias))

    def of_changes(self, changes: list[SymbolChange], targets: Mapping[str, str]) -> list[Dependent]:
        """Dependents of every symbol a commit changed; `targets` maps a path at the commit to the
        file's path at the target, where the plugin's imports and copies point."""
        found: dict[tuple[str, str], Dependent] = {}
        for change in changes:
            module = module_name(targets.get(change.path, change.path)) or change.path
            for dependent in self.of(module, change.qualified, change.symbol):
                found.setdefault((dependent.plugin_symbol, dependent.how), dependent)
        return sorted(found.values(), key=lambda d: (d.how, d.plugin_symbol))

    def of(self, module: str, qualified: str, named: str) -> list[Dependent]:
        """Plugin symbols depending on `module:qualified` (at the target); `named` is how the
        result cites the upstream symbol (its name at the commit)."""
        owner, _, member = qualified.partition(".")
        found: dict[tuple[str, str], Dependent] = {}

        def add(symbol: str, how: DependencyKind) -> None:
            found.setdefault((symbol, how), Dependent(symbol, how, named))

        if qualified == WHOLE_MODULE:
            for local in self.copies.get(module, []):
                add(local.name, "copy")
            for (where, _), users in self.importers.items():
                if where == module:
                    for user in users:
                        add(user.module.name, "importer")
        elif owner.startswith(IMPORT_PREFIX):
            name = qualified[len(IMPORT_PREFIX) :]
            for local in self.copies.get(module, []):
                if any(alias == name for item in local.record.imports for _, alias in item.names):
                    add(f"{local.name}:{qualified}", "copy")
        else:
            self._copies(module, owner, member, add)
            self._subclasses(module, owner, member, add)
            self._importers(module, owner, add)
        self._replacements(module, owner, member, qualified == WHOLE_MODULE, add)
        return sorted(found.values(), key=lambda d: (d.how, d.plugin_symbol))

    def _copies(self, module: str, owner: str, member: str, add: Add) -> None:
        for local in self.copies.get(module, []):
            for definition in local.record.definitions:
                if self.affixes.upstream_name(definition.name) != owner or definition.kind == "assignment" and member:
                    continue
                if not member:
                    add(f"{local.name}:{definition.name}", "copy")
                elif member in definition.members:
                    add(f"{local.name}:{definition.name}.{member}", "copy")

    def _subclasses(self, module: str, owner: str, member: str, add: Add) -> None:
        for subclass in self.subclasses.get((module, owner), []):
            name = f"{subclass.module}:{subclass.definition.name}"
            if member and member in subclass.definition.members:
                add(f"{name}.{member}", "override")
            else:
                add(name, "subclass")

    def _importers(self, module: str, owner: str, add: Add) -> None:
        for importer in self.importers.get((module, owner), []):
            users = [d.name for d in importer.module.record.definitions if importer.alias in d.names_used]
            for user in users:
                add(f"{importer.module.name}:{user}", "importer")
            if not users:
                add(importer.module.name, "importer")
        for importer in self.importers.get((module, None), []):
            add(importer.module.name, "module_importer")

    def _replacements(self, module: str, owner: str, member: str, whole: bool, add: Add) -> None:
        def hits(ref: Ref) -> bool:
            if ref.module != module:
                return False
            if whole or not ref.path:
                return True
            return ref.path[0] == owner and (len(ref.path) == 1 or not member or ref.path[1] == member)

        for patch in self.found.patches:
            if hits(patch.target.ref):
                replacement = (
                    patch.replacement if patch.replacement and not _upstream(patch.replacement.split(":")[0]) else None
                )
                add(replacement or patch.module, "patch")
        for override in self.found.overrides:
            if any(hits(target.ref) for target in override.replaces):
                add(override.name, "registration")
