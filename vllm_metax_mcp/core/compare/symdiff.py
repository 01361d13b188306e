"""Symbol-level comparison of a local module with its upstream counterpart, from index records.

Top-level functions, classes and assignments and `Class.method` are compared by body hash
(docstrings, comments and blank lines ignored), so a reformatted comment is no change and a
one-line edit in a method marks that method — not its whole class — as changed. Renames are
recognised from the plugin's vendor affixes (`Maca<X>` or `Ascend<X>` for upstream `<X>`, read
from the plugin by `core/compare/affixes.py`) or, failing that, from near-identical bodies. Import
swaps are the same name bound from the plugin package (`vllm_metax.*`) locally and from `vllm.*`
upstream, or the same name imported under another alias (`from … import A as B`): the usual,
intentional MetaX difference, reported apart from code changes. Same-name symbols the comparison
finds nothing in are counted as unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..code.module_index import Definition, IndexedModule, ModuleRecord
from .affixes import VendorAffixes
from .textdiff import line_profile, similarity

BODY_RENAME_THRESHOLD = 0.8
MAX_RENAME_COMPARISONS = 4000
"""Bound on body comparisons between added and removed symbols of one file."""


RenameHow = Literal["vendor_affix", "body", "subclass"]


@dataclass(frozen=True)
class Rename:
    local: str
    upstream: str
    how: RenameHow
    similarity: float


@dataclass(frozen=True)
class SignatureChange:
    symbol: str
    local: str
    upstream: str


@dataclass(frozen=True)
class BaseChange:
    symbol: str
    local: tuple[str, ...]
    upstream: tuple[str, ...]


@dataclass(frozen=True)
class ImportSwap:
    """One upstream import the local module takes from the plugin instead.

    The local import reads `from local_module import (local_name or name) as (local_alias or name)`,
    the upstream one `from upstream_module import name as (upstream_alias or name)`. A module import
    (`import m as x`) has `m` as its module and no name of its own: upstream, `name` is then `x`.
    """

    name: str
    """What upstream imports (the name before `as`); for an upstream `import m as x`, x."""
    local_module: str
    upstream_module: str
    line: int
    paired: bool
    """The local module is itself paired with the upstream module in this comparison."""
    upstream_line: int
    """Line of the upstream import."""
    local_name: str | None = None
    """What the local import takes instead of `name`, where the plugin binds another name in its place."""
    local_alias: str | None = None
    """The name the local import binds, where it is not `name`."""
    upstream_alias: str | None = None
    """The name the upstream import binds, where it is not `name`."""


@dataclass(frozen=True)
class Binding:
    """What an imported name stands for (an absolute dotted module, or `module.name`) and the import's line."""

    target: str
    line: int


@dataclass(frozen=True)
class _Match:
    """A local definition taken for a renamed upstream one."""

    local: Definition
    upstream: Definition
    how: RenameHow
    similarity: float


@dataclass
class SymbolDiff:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    renamed: list[Rename] = field(default_factory=list)
    signatures: list[SignatureChange] = field(default_factory=list)
    bases: list[BaseChange] = field(default_factory=list)
    unchanged: int = 0
    """Top-level symbols under the same name on both sides that the comparison found nothing in."""

    def entries(self) -> int:
        """How many differences are recorded, so a comparison can tell whether it found any."""
        return len(self.added) + len(self.removed) + len(self.changed) + len(self.signatures) + len(self.bases)

    def differing(self) -> int:
        """Top-level symbols with any entry (their own or a method's), each counted once under its local name."""
        local_of = {r.upstream: r.local for r in self.renamed}
        owners = {entry.partition(".")[0] for entry in [*self.added, *self.changed]}
        owners |= {local_of.get(owner, owner) for owner in (entry.partition(".")[0] for entry in self.removed)}
        owners |= {r.local for r in self.renamed} | {b.symbol for b in self.bases}
        return len(owners | {s.symbol.partition(".")[0] for s in self.signatures})

    def sort(self) -> SymbolDiff:
        self.added.sort()
        self.removed.sort()
        self.changed.sort()
        self.renamed.sort(key=lambda r: r.local)
        self.signatures.sort(key=lambda s: s.symbol)
        self.bases.sort(key=lambda b: b.symbol)
        return self


def _by_name(definitions: Iterable[Definition]) -> dict[str, Definition]:
    found: dict[str, Definition] = {}
    for definition in definitions:
        found.setdefault(definition.name, definition)
    return found


def _body_profile(definition: Definition, lines: list[str]) -> Counter[str]:
    """Line multiset of a definition without its header line (where the name is)."""
    return line_profile("\n".join(lines[definition.line : definition.end_line]))


def _compare_members(
    local_name: str, local: Definition, upstream: Definition, diff: SymbolDiff, removed_too: bool = True
) -> None:
    for method, digest in local.members.items():
        qualified = f"{local_name}.{method}"
        if method not in upstream.members:
            diff.added.append(qualified)
            continue
        if digest != upstream.members[method]:
            diff.changed.append(qualified)
        mine, theirs = local.member_signatures.get(method, ""), upstream.member_signatures.get(method, "")
        if mine != theirs:
            diff.signatures.append(SignatureChange(qualified, mine, theirs))
    if removed_too:
        diff.removed += [f"{upstream.name}.{m}" for m in upstream.members if m not in local.members]


def _compare_same_name(local: Definition, upstream: Definition, diff: SymbolDiff) -> None:
    """`_compare` of a symbol both sides define under one name, counted as unchanged where nothing differs."""
    before = diff.entries()
    _compare(local, upstream, diff)
    diff.unchanged += diff.entries() == before


def _compare(local: Definition, upstream: Definition, diff: SymbolDiff, local_name: str | None = None) -> None:
    """Differences of two definitions taken to be the same symbol (possibly renamed)."""
    name = local_name or local.name
    if local.kind != upstream.kind:
        diff.changed.append(name)
        return
    if local.kind == "class":
        if local.own_hash != upstream.own_hash and local_name is None:
            diff.changed.append(name)
        if local.bases != upstream.bases:
            diff.bases.append(BaseChange(name, tuple(local.bases), tuple(upstream.bases)))
        _compare_members(name, local, upstream, diff)
        return
    if local.body_hash != upstream.body_hash and local_name is None:
        diff.changed.append(name)
    if local.kind == "function" and local.signature != upstream.signature:
        diff.signatures.append(SignatureChange(name, local.signature, upstream.signature))


def _renames(
    added: dict[str, Definition],
    removed: dict[str, Definition],
    local_lines: list[str],
    upstream_lines: list[str],
    affixes: VendorAffixes,
) -> list[_Match]:
    """Renamed definitions: the plugin's vendor affixes first (`MacaFoo`, `AscendFoo`), then near-identical bodies."""
    found: list[_Match] = []
    for name in sorted(added):
        original = next((f for f in affixes.forms(name)[1:] if f in removed), None)
        if original is not None and removed[original].kind == added[name].kind:
            local, upstream = added.pop(name), removed.pop(original)
            score = similarity(_body_profile(local, local_lines), _body_profile(upstream, upstream_lines))
            found.append(_Match(local, upstream, "vendor_affix", score))
    if len(added) * len(removed) > MAX_RENAME_COMPARISONS:
        return found
    scored = sorted(
        (
            (similarity(_body_profile(a, local_lines), _body_profile(r, upstream_lines)), a.name, r.name)
            for a in added.values()
            for r in removed.values()
            if a.kind == r.kind and a.kind != "assignment"
        ),
        reverse=True,
    )
    for score, local_name, upstream_name in scored:
        if score < BODY_RENAME_THRESHOLD:
            break
        if local_name in added and upstream_name in removed:
            found.append(_Match(added.pop(local_name), removed.pop(upstream_name), "body", score))
    return found


def diff_symbols(
    local: ModuleRecord,
    upstream: ModuleRecord,
    local_lines: list[str],
    upstream_lines: list[str],
    affixes: VendorAffixes | None = None,
) -> SymbolDiff:
    """The symbol diff of a local copy against its upstream original (`affixes`: the plugin's vendor
    affixes, `Maca` alone when not given)."""
    diff = SymbolDiff()
    mine, theirs = _by_name(local.definitions), _by_name(upstream.definitions)
    for name in sorted(set(mine) & set(theirs)):
        _compare_same_name(mine[name], theirs[name], diff)
    added = {n: d for n, d in mine.items() if n not in theirs}
    removed = {n: d for n, d in theirs.items() if n not in mine}
    for match in _renames(added, removed, local_lines, upstream_lines, affixes or VendorAffixes()):
        diff.renamed.append(Rename(match.local.name, match.upstream.name, match.how, round(match.similarity, 2)))
        _compare(match.local, match.upstream, diff, local_name=match.local.name)
    diff.added += sorted(added)
    diff.removed += sorted(removed)
    return diff.sort()


def diff_extension(local: ModuleRecord, upstream: ModuleRecord, extends: Mapping[str, str]) -> SymbolDiff:
    """The symbol diff of a local file that subclasses upstream classes instead of copying them.

    `extends` maps local class names to the upstream classes (in `upstream`) they subclass. What
    the local class overrides is `changed`, what it adds is `added`; what it inherits unchanged
    is not `removed`.
    """
    diff = SymbolDiff()
    theirs = _by_name(upstream.definitions)
    for definition in _by_name(local.definitions).values():
        base = theirs.get(extends.get(definition.name, ""))
        if base is not None:
            diff.renamed.append(Rename(definition.name, base.name, "subclass", 0.0))
            _compare_members(definition.name, definition, base, diff, removed_too=False)
        elif definition.name in theirs:
            _compare_same_name(definition, theirs[definition.name], diff)
        else:
            diff.added.append(definition.name)
    return diff.sort()


@dataclass(frozen=True)
class _Bound:
    """A name an import binds: `imported` (the name before `as`) from the absolute module `target`."""

    name: str
    imported: str | None
    """None for `import target as name`."""
    target: str
    line: int


def _bindings(module: IndexedModule, root: str) -> dict[str, _Bound]:
    """Names bound by imports from `root` (or its sub-modules), by the name bound."""
    bound: dict[str, _Bound] = {}
    for record in module.record.imports:
        if record.branch == "not_taken":
            continue
        target = module.absolute(record.module)
        if target != root and not target.startswith(root + "."):
            continue
        if record.names:
            for original, alias in record.names:
                if alias != "*":
                    bound.setdefault(alias, _Bound(alias, original, target, record.line))
        elif record.alias:
            bound.setdefault(record.alias, _Bound(record.alias, None, target, record.line))
    return bound


def _swapped(
    local: IndexedModule, upstream: IndexedModule, local_root: str, upstream_root: str
) -> list[tuple[_Bound, _Bound]]:
    """(local, upstream) imports of one thing: the same name bound on both sides, else — aliases
    followed — the same name imported, where the local module no longer binds upstream's name from vLLM."""
    mine, theirs = _bindings(local, local_root), _bindings(upstream, upstream_root)
    kept = _bindings(local, upstream_root)
    found = [(mine[name], theirs[name]) for name in sorted(set(mine) & set(theirs))]
    unbound: dict[str, _Bound] = {}
    for name, binding in sorted(theirs.items()):
        if binding.imported and name not in mine and name not in kept:
            unbound.setdefault(binding.imported, binding)
    for name, binding in sorted(mine.items()):
        if binding.imported and name not in theirs and binding.imported in unbound:
            found.append((binding, unbound.pop(binding.imported)))
    return found


def import_swaps(
    local: IndexedModule, upstream: IndexedModule, local_root: str, upstream_root: str, paired: Mapping[str, str]
) -> list[ImportSwap]:
    """Names imported from the plugin locally where upstream imports the same one from vLLM.

    `paired` maps local module names to the upstream modules they are paired with, so a swap
    that merely follows a copied module (`.attention` -> `vllm_metax…attention`) is told apart
    from one that routes to a plugin override.
    """
    swaps = []
    for mine, theirs in _swapped(local, upstream, local_root, upstream_root):
        name = theirs.imported or theirs.name
        swaps.append(
            ImportSwap(
                name,
                mine.target,
                theirs.target,
                mine.line,
                paired.get(mine.target) == theirs.target,
                theirs.line,
                local_name=mine.imported if mine.imported not in (None, name) else None,
                local_alias=mine.name if mine.name != name else None,
                upstream_alias=theirs.name if theirs.name != name else None,
            )
        )
    return sorted(swaps, key=lambda s: (s.name, s.line))
