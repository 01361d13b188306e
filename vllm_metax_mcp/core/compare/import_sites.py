"""The import-site rule: a paired file's imports pair the modules it imports from.

Where a local file paired with upstream B imports a name from local module L, and B imports the
corresponding name (vendor affixes dropped) from upstream module U on the out-of-tree branch, L
corresponds to U; when B defines that name itself, L was split out of B. Renamed files and packages
moved under the plugin's model tree are paired from their callers' side, with both import lines as
evidence. The rule runs to a fixed point: a file it pairs is an importer in the next round.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..code.module_index import IndexedModule
from ..foundation.evidence import NoteEvidence
from .affixes import ONE_WORD, boundaries
from .pairing_context import PairingContext, shared_count
from .pairs import EvidenceItem, Pair, Rule

MAX_ROUNDS = 6
TRUSTED = frozenset(
    {
        Rule.OVERRIDE,
        Rule.REGISTRY,
        Rule.SAME_PATH,
        Rule.PLATFORM_BRANCH,
        Rule.SHARED_DIR,
        Rule.RENAMED,
        Rule.UPSTREAM_ORIGINAL,
        Rule.IMPORT_SITE,
        Rule.PACKAGE,
    }
)
"""Rules whose pairs are evidence enough to pair what they import."""
MERGE_MIN_SHARED = 2
"""Top-level names a decided file must share with another voted upstream file to be said to carry it."""
UNDECIDED = frozenset({Rule.NONE})
"""Rules the import-site rule may replace: nothing found (a decided pair is confirmed or contested)."""


@dataclass(frozen=True)
class _UpstreamName:
    path: str
    """The upstream file the name comes from (or is defined in)."""
    line: int
    site: str
    """The upstream file whose import (or definition) binds it."""


@dataclass(frozen=True)
class SiteVote:
    """One imported name that ties a local module to an upstream file."""

    upstream: str
    local_name: str
    upstream_name: str
    importer: str
    importer_line: int
    site: str
    site_line: int


def _upstream_names(context: PairingContext, paths: Iterable[str]) -> dict[str, _UpstreamName]:
    """Names the upstream files bind on the out-of-tree path: imported (resolved to their defining file)
    or defined there."""
    index = context.trees.index
    found: dict[str, _UpstreamName] = {}
    for path in paths:
        module = context.trees.upstream_modules.get(path)
        if module is None:
            continue
        for definition in module.record.definitions:
            found.setdefault(definition.name, _UpstreamName(path, definition.line, path))
        for record in module.record.imports:
            if record.branch == "not_taken":
                continue
            target = module.absolute(record.module)
            for original, alias in record.names:
                defining, _ = index.resolve_symbol(target, original)
                source = index.get(defining)
                if source is not None and source.side == "upstream":
                    found.setdefault(alias, _UpstreamName(source.path, record.line, path))
    return found


def _match(context: PairingContext, name: str, names: dict[str, _UpstreamName]) -> str | None:
    """The upstream name a local name stands for: itself, affix-stripped, or one word off a name the
    counterpart binds (`DeepseekV2MLAAttentionFusion` where the counterpart defines `DeepseekV2MLAAttention`)."""
    for form in context.affixes.forms(name):
        if form in names:
            return form
    for affix in boundaries(name):
        rest = affix.strip(name)
        if rest and rest in names and ONE_WORD.match(affix.text) and len(rest) >= len(affix.text):
            return rest
    return None


def _local_target(context: PairingContext, module: IndexedModule, target: str, name: str) -> str | None:
    """The compared local file a `from target import name` reads from (re-exports followed)."""
    index = context.trees.index
    defining, _ = index.resolve_symbol(target, name)
    source = index.get(defining)
    if source is None or source.side != "plugin" or source.path == module.path:
        return None
    return source.path if source.path in context.local_data else None


def votes_of(context: PairingContext, pair: Pair) -> list[tuple[str, SiteVote]]:
    """(local module path, vote) for every plugin import of a paired file that its counterpart matches."""
    module = context.trees.local_modules.get(pair.local)
    if module is None or pair.upstream is None:
        return []
    names = _upstream_names(context, [pair.upstream, *pair.merged_from])
    found: list[tuple[str, SiteVote]] = []
    for record in module.record.imports:
        target = module.absolute(record.module)
        if record.branch == "not_taken" or not context.trees.package.holds(target):
            continue
        for original, _ in record.names:
            if module.record.definition(original) is not None:
                continue  # shadowed by the importer's own definition
            local = _local_target(context, module, target, original)
            matched = _match(context, original, names) if local else None
            if local and matched:
                theirs = names[matched]
                vote = SiteVote(theirs.path, original, matched, pair.local, record.line, theirs.site, theirs.line)
                found.append((local, vote))
    return found


def site_note(votes: list[SiteVote]) -> str:
    """`A imports X, Y from it where its counterpart B imports them from U` (or defines them)."""
    first = votes[0]
    names = sorted({v.local_name for v in votes})
    listed = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
    them = "it" if len(names) == 1 else "them"
    how = f"defines {them}" if first.site == first.upstream else f"imports {them} from {first.upstream}"
    return f"{first.importer} imports {listed} from it where its counterpart {first.site} {how}"


def last_note(pair: Pair) -> str:
    """The pair's last note: what its rule found."""
    notes = [e.text for e in pair.evidence if isinstance(e, NoteEvidence)]
    return notes[-1] if notes else pair.rule.value


def site_evidence(context: PairingContext, votes: list[SiteVote]) -> list[EvidenceItem]:
    first = votes[0]
    return [
        context.cite(first.importer, first.importer_line, local=True),
        context.cite(first.site, first.site_line),
        NoteEvidence(text=site_note(votes)),
    ]


def _decide(context: PairingContext, pair: Pair, votes: list[SiteVote]) -> None:
    """Pair an undecided file with the upstream file most of its names come from among those its
    importers point to; the others it also carries are `merged_from`; a decided pair that disagrees
    gets the import site as an alternative."""
    by_upstream: dict[str, list[SiteVote]] = {}
    for vote in votes:
        by_upstream.setdefault(vote.upstream, []).append(vote)
    scores = context.symbol_scores(context.local_names(pair.local))
    shared = {u: shared_count(scores, u) for u in by_upstream}
    ranked = sorted(by_upstream, key=lambda u: (-shared[u], -len(by_upstream[u]), u))
    primary = ranked[0]
    if pair.rule in UNDECIDED or pair.rule is Rule.IMPORT_SITE:
        strong = len(by_upstream[primary]) > 1 or shared[primary] > 0
        pair.upstream, pair.rule, pair.confidence = primary, Rule.IMPORT_SITE, 0.75 if strong else 0.6
        pair.evidence = site_evidence(context, by_upstream[primary])
        pair.extends = {}
        pair.merged_from = ranked[1:]
        return
    carried = [u for u in ranked if u != pair.upstream and shared[u] >= MERGE_MIN_SHARED]
    pair.merged_from += [u for u in carried if u not in pair.merged_from]
    contested = primary != pair.upstream and pair.upstream not in by_upstream and len(by_upstream[primary]) > 1
    if contested and pair.rule not in (Rule.OVERRIDE, Rule.REGISTRY):
        pair.alternative(primary, f"import site: {site_note(by_upstream[primary])}")
        pair.flag("conflict", 0.1)


def _read_ahead(context: PairingContext, pairs: list[Pair]) -> None:
    """The upstream records a round's votes read, parsed in two batches (in parallel) rather than one at a
    time as the votes reach them: the counterparts, then the modules they import names from (a name that
    is a submodule needs no record of its package)."""
    index, upstream_modules = context.trees.index, context.trees.upstream_modules
    counterparts = [
        module
        for pair in pairs
        for path in (pair.upstream, *pair.merged_from)
        if path is not None and (module := upstream_modules.get(path)) is not None
    ]
    index.load(counterparts)
    targets: set[str] = set()
    for module in counterparts:
        for record in module.record.imports:
            target = module.absolute(record.module)
            names = [name for name, _ in record.names if f"{target}.{name}" not in index.modules]
            if record.branch != "not_taken" and names:
                targets.add(target)
    index.load(module for name in sorted(targets) if (module := index.get(name)) is not None)


def apply_import_sites(context: PairingContext, pairs: list[Pair]) -> None:
    """Pair (or confirm, or contest) files from the imports of trusted pairs, to a fixed point."""
    by_local = {p.local: p for p in pairs}
    consulted: set[str] = set()
    votes: dict[str, list[SiteVote]] = {}
    for _ in range(MAX_ROUNDS):
        fresh: set[str] = set()
        due = [p for p in pairs if p.local not in consulted and p.rule in TRUSTED and p.upstream is not None]
        _read_ahead(context, due)
        for pair in due:
            consulted.add(pair.local)
            for local, vote in votes_of(context, pair):
                if local in by_local and vote not in votes.get(local, []):
                    votes.setdefault(local, []).append(vote)
                    fresh.add(local)
        if not fresh:
            return
        for local in sorted(fresh):
            _decide(context, by_local[local], votes[local])
