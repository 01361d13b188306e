"""The MACA/upstream difference matrix: every differing symbol with a proposed class and its evidence.

A row is keyed by (local path, symbol); `symbol` is a top-level name or `Class.method` as the
symbol diff names them (local names; an upstream-only symbol by its upstream name),
`import:<name>` for a module-level import swap, or `*` for the whole file. Rows are what
audit_commits imports as its baseline, so their shape is stable: see `MatrixRow`.

Each file has three versions (`core/compare/versions.py`): local (L), target (T) and base (B: the
counterpart at the file's closest release; T when no releases were given). A symbol that differs
between L and T is
- `upstream_change` when L equals B (the plugin left it alone; upstream changed it since), or when
  T has it and B did not (upstream added it);
- `obsolete_override` when B had it and T removed it (the local copy overrides something gone),
  when the whole file equals T, or when a subclass overrides a method with the target's own body;
- otherwise a MACA edit, classified from the AST of the lines that differ between B and L
  (`core/compare/classify.py`: maca_kernel, platform_predicate, capability_predicate, dtype_path,
  import_swap, else unverified).
Module-level import swaps (`import:<name>`) are `import_swap`, or `unverified` when the plugin has
no such module (the import would fail). Comments on the differing lines (and a new comment block
above a symbol) are quoted as leads and never decide. Every row is a proposal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ..code.module_index import ModuleRecord, RecordCache, module_name
from ..code.plugin_facts import PluginFacts
from ..foundation.evidence import FileEvidence
from ..sources.subjects import Subject
from .affixes import VendorAffixes
from .classify import DiffClass, Hit, RuleContext, classify, plugin_bindings
from .pairs import UPSTREAM_ROOT, EvidenceItem, Pair, PluginPackage, Rule, Status, Trees, paired_modules
from .releases import FileReleases, Release
from .symdiff import SymbolDiff, diff_extension, diff_symbols, import_swaps
from .textdiff import split_lines
from .versions import FileVersions, SourceView, Version, changed_lines, symbol_digest

FILE_SYMBOL = "*"
IMPORT_PREFIX = "import:"
MAX_LEADS = 3

MatrixChange = Literal[
    "added",
    "removed",
    "changed",
    "renamed",
    "subclass",
    "import_swap",
    "identical_file",
    "removed_file",
    "identical_override",
]
"""How the symbol differs between L and T (the whole-file changes for `*` rows)."""


@dataclass(frozen=True)
class MatrixRow:
    """One difference between a plugin file and its target counterpart, with a proposed class.

    Key: (`local`, `symbol`).
    """

    local: str
    symbol: str
    upstream: str | None
    upstream_symbol: str | None
    change: MatrixChange
    proposed_class: DiffClass
    also: tuple[DiffClass, ...]
    upstream_changed: bool | None
    """T differs from B for this symbol; None when no base release is known."""
    base: str | None
    """Release label of B; None when B is the target."""
    evidence: tuple[EvidenceItem, ...]
    leads: tuple[str, ...]
    """Comments on the differing lines, quoted `path:line: # text` — leads to read, never proof."""
    rationale: str


# -- rows of one file -------------------------------------------------------------------------


class _FileRows:
    """Builds the rows of one changed pair from its three versions."""

    def __init__(self, versions: FileVersions, context: RuleContext) -> None:
        self.v = versions
        self.context = context
        self.local = SourceView(versions.local)
        self.target = SourceView(versions.target)
        self.base = self.target if versions.base.sha == versions.target.sha else SourceView(versions.base)
        self.rows: list[MatrixRow] = []

    def row(
        self,
        symbol: str,
        upstream_symbol: str | None,
        change: MatrixChange,
        hits: list[Hit],
        evidence: Sequence[EvidenceItem],
        leads: list[str],
        upstream_changed: bool | None,
        why: str,
    ) -> None:
        cls = hits[0].cls if hits else DiffClass.UNVERIFIED
        rationale = "; ".join(h.why for h in hits) if hits else why
        cited = [*evidence, *(item for hit in hits for item in hit.evidence)]
        unique = list({item.model_dump_json(): item for item in cited}.values())
        self.rows.append(
            MatrixRow(
                local=self.v.local.path,
                symbol=symbol,
                upstream=self.v.target.path,
                upstream_symbol=upstream_symbol,
                change=change,
                proposed_class=cls,
                also=tuple(h.cls for h in hits[1:]),
                upstream_changed=upstream_changed,
                base=self.v.base_label,
                evidence=tuple(unique),
                leads=tuple(leads[:MAX_LEADS]),
                rationale=f"proposal: {rationale}",
            )
        )

    def _upstream_changed(self, upstream_symbol: str) -> bool | None:
        if self.v.base_label is None:
            return None
        return symbol_digest(self.v.base.record, upstream_symbol) != symbol_digest(
            self.v.target.record, upstream_symbol
        )

    def _def_line(self, source: SourceView, symbol: str | None) -> list[FileEvidence]:
        lines = source.spans.get(symbol or "")
        return [source.cite(lines[0])] if lines else []

    def maca_edit(self, symbol: str | None, upstream_symbol: str | None, change: MatrixChange) -> None:
        """A symbol the plugin changed (or added, or dropped) relative to B: classified from the differing lines."""
        in_base = upstream_symbol is not None and upstream_symbol in self.base.spans
        before = self.base if in_base else self.target
        lines = changed_lines(before, upstream_symbol, self.local, symbol)
        hits = classify(before, self.local, lines, self.v.local_module, self.context)
        evidence = self._def_line(self.local, symbol) or self._def_line(before, upstream_symbol)
        known = set(before.comments_above(upstream_symbol).values())
        header = [n for n, text in self.local.comments_above(symbol).items() if text not in known]
        leads = self.local.leads(lines.plus + header) + before.leads(lines.minus)
        upstream_changed = self._upstream_changed(upstream_symbol) if upstream_symbol else None
        self.row(
            symbol or upstream_symbol or "",
            upstream_symbol,
            change,
            hits,
            evidence,
            leads,
            upstream_changed,
            "no rule applies to the differing lines; read them",
        )

    def upstream_change(self, symbol: str, upstream_symbol: str, change: MatrixChange, added: bool) -> None:
        evidence = self._def_line(self.target, upstream_symbol) + (
            [] if added else self._def_line(self.base, upstream_symbol)
        )
        since = self.v.base_label or "the base"
        why = (
            f"the target added {upstream_symbol} since {since}"
            if added
            else f"the plugin kept {since}'s {upstream_symbol}; the target changed it"
        )
        self.row(symbol, upstream_symbol, change, [Hit(DiffClass.UPSTREAM_CHANGE, [], why)], evidence, [], True, why)

    def obsolete(
        self,
        symbol: str,
        upstream_symbol: str,
        change: MatrixChange,
        why: str,
        evidence: Sequence[EvidenceItem],
        removed: bool,
    ) -> None:
        changed = True if removed else self._upstream_changed(upstream_symbol)
        self.row(
            symbol, upstream_symbol, change, [Hit(DiffClass.OBSOLETE_OVERRIDE, [], why)], evidence, [], changed, why
        )

    # -- the symbol diff, entry by entry ------------------------------------------------------

    def build(self, diff: SymbolDiff, paired: Mapping[str, str]) -> list[MatrixRow]:
        renamed = {r.local: r.upstream for r in diff.renamed}
        for rename in diff.renamed:
            self.changed(rename.local, rename.upstream, "subclass" if rename.how == "subclass" else "renamed")
        for symbol in diff.changed:
            owner, _, method = symbol.partition(".")
            upstream = f"{renamed.get(owner, owner)}.{method}" if method else renamed.get(owner, owner)
            self.changed(symbol, upstream, "changed")
        for symbol in diff.added:
            owner, _, method = symbol.partition(".")
            upstream = f"{renamed.get(owner, owner)}.{method}" if method else symbol
            if upstream in self.base.spans and self.v.base_label is not None:
                why = (
                    f"{self.v.base_label} had {upstream}; the target removed it, "
                    "so the local copy overrides something gone"
                )
                self.obsolete(
                    symbol,
                    upstream,
                    "added",
                    why,
                    self._def_line(self.local, symbol) + self._def_line(self.base, upstream),
                    True,
                )
            else:
                self.maca_edit(symbol, None, "added")
        for upstream in diff.removed:
            if self.v.base_label is not None and upstream not in self.base.spans:
                self.upstream_change(upstream, upstream, "removed", added=True)
            else:
                self.maca_edit(None, upstream, "removed")
        self.import_swaps(paired)
        self.identical_overrides()
        return self.rows

    def changed(self, symbol: str, upstream_symbol: str, change: MatrixChange) -> None:
        mine = symbol_digest(self.v.local.record, symbol)
        based = symbol_digest(self.v.base.record, upstream_symbol)
        if self.v.base_label is not None and based is not None and mine == based:
            self.upstream_change(symbol, upstream_symbol, change, added=False)
        else:
            self.maca_edit(symbol, upstream_symbol, change)

    def import_swaps(self, paired: Mapping[str, str]) -> None:
        package = self.context.package.name
        for swap in import_swaps(self.v.local_module, self.v.target_module, package, UPSTREAM_ROOT, paired):
            follows = "follows the paired copy of" if swap.paired else "routes to the plugin's own"
            why = f"{swap.name} {follows} {swap.local_module} instead of {swap.upstream_module}"
            evidence: list[EvidenceItem] = [self.local.cite(swap.line), self.target.cite(swap.upstream_line)]
            hits = [Hit(DiffClass.IMPORT_SWAP, [], why)]
            if swap.local_module not in self.context.plugin_modules:
                hits = []
                why = (
                    f"{swap.name} is imported from {swap.local_module}, which the plugin does not have: "
                    "the import fails"
                )
            bound = swap.upstream_alias or swap.name  # the name upstream binds: audit_commits keys imports by it
            self.row(
                f"{IMPORT_PREFIX}{bound}",
                f"{IMPORT_PREFIX}{bound}",
                "import_swap",
                hits,
                evidence,
                self.local.leads([swap.line]),
                None,
                why,
            )

    def identical_overrides(self) -> None:
        """Methods a subclass overrides with exactly the target's body: the override is redundant."""
        for local_class, upstream_class in self.v.extends.items():
            mine = self.v.local.record.definition(local_class)
            theirs = self.v.target.record.definition(upstream_class)
            if mine is None or theirs is None:
                continue
            for method, digest in sorted(mine.members.items()):
                if theirs.members.get(method) == digest:
                    symbol, upstream = f"{local_class}.{method}", f"{upstream_class}.{method}"
                    why = f"{symbol} repeats the target's {upstream} unchanged"
                    evidence = self._def_line(self.local, symbol) + self._def_line(self.target, upstream)
                    self.obsolete(symbol, upstream, "identical_override", why, evidence, False)


def file_rows(
    versions: FileVersions,
    facts: PluginFacts,
    package: PluginPackage,
    paired: Mapping[str, str],
    plugin_modules: frozenset[str],
    affixes: VendorAffixes | None = None,
) -> list[MatrixRow]:
    """The rows of one changed pair (both sides parse); `affixes`: the plugin's vendor affixes."""
    context = RuleContext(facts, package, plugin_bindings(versions.local_module, paired, package), plugin_modules)
    builder = _FileRows(versions, context)
    lines_local, lines_target = split_lines(versions.local.data), split_lines(versions.target.data)
    if versions.extends:
        diff = diff_extension(versions.local.record, versions.target.record, versions.extends)
    else:
        diff = diff_symbols(versions.local.record, versions.target.record, lines_local, lines_target, affixes)
    return sorted(builder.build(diff, paired), key=lambda r: r.symbol)


def file_level_row(
    local: str, upstream: str | None, change: MatrixChange, cls: DiffClass, evidence: Sequence[EvidenceItem], why: str
) -> MatrixRow:
    """A row about the whole file (`*`): identical to the target, removed by it, or not parseable."""
    return MatrixRow(
        local=local,
        symbol=FILE_SYMBOL,
        upstream=upstream,
        upstream_symbol=None,
        change=change,
        proposed_class=cls,
        also=(),
        upstream_changed=None,
        base=None,
        evidence=tuple(evidence),
        leads=(),
        rationale=f"proposal: {why}",
    )


# -- the whole matrix ---------------------------------------------------------------------------


def _version(subject: Subject, path: str, record: ModuleRecord) -> Version:
    return Version(path, subject.sha(path), record, subject.read(path))


def _whole_file(trees: Trees, pair: Pair) -> MatrixRow | None:
    """The `*` row of a pair without symbol rows: identical (and defining something), removed, unparseable."""
    cite = FileEvidence(path=pair.local, line=1, rev=trees.local.sha(pair.local))
    local = trees.local_modules.get(pair.local)
    if pair.status is Status.IDENTICAL:
        if local is None or not local.record.definitions or pair.upstream is None:
            return None
        why = "the local file is byte-identical to the target's (same blob): the copy overrides nothing"
        evidence: list[EvidenceItem] = [cite, FileEvidence(path=pair.upstream, line=1, rev=cite.rev)]
        return file_level_row(pair.local, pair.upstream, "identical_file", DiffClass.OBSOLETE_OVERRIDE, evidence, why)
    if pair.status is Status.REMOVED:
        why = f"the target no longer has {pair.upstream}: the local file overrides something removed"
        evidence = [cite, *(e for e in pair.evidence if e.kind == "commit")]
        return file_level_row(pair.local, pair.upstream, "removed_file", DiffClass.OBSOLETE_OVERRIDE, evidence, why)
    target = trees.upstream_modules.get(pair.upstream or "")
    if local is None or target is None or local.record.error or target.record.error:
        why = "a side is not an importable module or does not parse: no symbol rows; read the diff"
        return file_level_row(pair.local, pair.upstream, "changed", DiffClass.UNVERIFIED, [cite], why)
    return None


def difference_matrix(
    trees: Trees,
    pairs: list[Pair],
    facts: PluginFacts,
    cache: RecordCache,
    closest: Mapping[str, FileReleases],
    releases: list[Release],
    only: set[str] | None = None,
) -> tuple[list[MatrixRow], list[str]]:
    """Rows for every compared pair (or the local paths in `only`) and the gaps met on the way.

    Local-only files and files that define nothing (package markers identical to upstream's) have
    no rows. B is each file's closest release (`closest`, over `releases`); without one, the target.
    """
    paired = paired_modules(pairs)
    plugin_modules = frozenset(name for path in trees.local.entries() if (name := module_name(path)))
    by_label = {release.label: release for release in releases}
    rows: list[MatrixRow] = []
    unknowns: list[str] = []
    for pair in pairs:
        if pair.status is Status.LOCAL_ONLY or pair.upstream is None or (only is not None and pair.local not in only):
            continue
        whole = _whole_file(trees, pair)
        if whole is not None or pair.status is not Status.CHANGED:
            rows += [whole] if whole else []
            continue
        local, target = trees.local_modules[pair.local], trees.upstream_modules[pair.upstream]
        target_version = _version(trees.upstream, pair.upstream, target.record)
        base, label = target_version, None
        found = closest.get(pair.local)
        if found is not None and found.closest:
            release, path = by_label[found.closest], found.counterparts[found.closest].path
            record = cache.get_many(release.subject, [path])[path]
            if record.error:
                unknowns.append(
                    f"{path} at {release.label} does not parse: {pair.local} is compared with the target only."
                )
            else:
                base, label = _version(release.subject, path, record), release.label
        versions = FileVersions(
            _version(trees.local, pair.local, local.record),
            target_version,
            base,
            label,
            local,
            target,
            pair.extends if pair.rule is Rule.SUBCLASS else {},
        )
        rows += file_rows(versions, facts, trees.package, paired, plugin_modules, trees.affixes)
    return rows, unknowns
