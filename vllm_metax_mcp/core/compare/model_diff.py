"""The diff_model workflow: pair the plugin's files with the target, measure them against the
releases, and report one detail level, paged (pairs, one file's unified diff, or matrix rows)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from ..code.module_index import RecordCache
from ..code.plugin_facts import plugin_facts
from ..foundation.errors import not_found
from ..foundation.policy import Policy
from ..foundation.results import CURSOR_RESERVE, RESULT_BUDGET, Page, SizeBudget, paginate
from ..foundation.state import StateStore
from ..sources.subjects import RevisionSubject, Subject, clean_path
from .describe import PairDescriber, PairReport
from .inputs import PairingInputs, pairing_inputs
from .matrix import MatrixRow, difference_matrix
from .pairing import build_trees, pair_files
from .pairs import Pair, Pairing, TargetOnly, Trees
from .releases import FamilyReleases, FileReleases, Release, closest_releases, family_summaries, resolve_releases
from .target_only import with_new_at_target
from .textdiff import StatsCache

T = TypeVar("T")

Detail = Literal["summary", "symbols", "releases", "matrix", "diff"]
DEFAULT_LIMITS: dict[Detail, int] = {"summary": 40, "symbols": 10, "releases": 40, "matrix": 50, "diff": 1000}
"""Ceilings: a page also ends before the row that would cross the result budget."""
MAX_PAIRS = 500
MAX_DIFF_LINES = 5000
MAX_ROWS = 2000
MAX_LIMITS: dict[Detail, int] = {
    "summary": MAX_PAIRS,
    "symbols": MAX_PAIRS,
    "releases": MAX_PAIRS,
    "matrix": MAX_ROWS,
    "diff": MAX_DIFF_LINES,
}
LONG_LINE = 2000
"""A diff line longer than this is cut (a marker says how much), so one line never fills a page."""

NO_RELEASES = (
    "No releases: each file's base is the target, so upstream changes and overrides of symbols the target "
    "removed read as MACA edits (upstream_changed is null); pass releases."
)


@dataclass(frozen=True)
class ModelDiffRequest:
    """What a diff_model call compares: the plugin paths, the caller's mapping, the releases."""

    paths: list[str]
    mapping_overrides: Mapping[str, str | None]
    releases: list[str]


@dataclass(frozen=True)
class Ask:
    """The page a call asks for (`fingerprint` binds the cursor to the call's other inputs)."""

    detail: Detail
    file: str | None
    cursor: str | None
    limit: int | None
    fingerprint: str


@dataclass(frozen=True)
class Sizes:
    """How the caller measures what it sends, in chars (core knows no output model): the result
    with no rows, one pair, one matrix row, one diff line."""

    fixed: Callable[[ModelDiff], int]
    pair: Callable[[PairReport], int]
    row: Callable[[MatrixRow], int]
    line: Callable[[str], int]


@dataclass(frozen=True)
class ModelDiff:
    pairs: list[PairReport]
    """This page of pairs (the one pair of detail=diff, first page only; none with detail=matrix)."""
    total: int
    next_cursor: str | None
    counts: dict[str, int]
    """Pairs per status over all pages, and target_only files."""
    target_only: list[TargetOnly] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    families: list[FamilyReleases] = field(default_factory=list)
    matrix: list[MatrixRow] = field(default_factory=list)
    matrix_counts: dict[str, int] = field(default_factory=dict)
    parse_errors: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    modules_indexed: int = 0
    cache_hits: int = 0
    parsed: int = 0


@dataclass(frozen=True)
class Comparison:
    """What every detail level reads: the trees, the pairs and their distances to the releases."""

    trees: Trees
    pairing: Pairing
    cache: RecordCache
    releases: list[Release]
    closest: dict[str, FileReleases]
    describer: PairDescriber
    local_files: list[str]


def compare_models(
    plugin: Subject, upstream: Subject, request: ModelDiffRequest, policy: Policy, store: StateStore
) -> Comparison:
    """Pair the files under the request's paths with the upstream target, measured against the releases."""
    inputs = pairing_inputs(plugin, request.paths, request.mapping_overrides)
    cache, stats = RecordCache(store), StatsCache(store)
    extra = [u for u in inputs.overrides.values() if u]
    trees = build_trees(plugin, upstream, cache, inputs.package, inputs.prefixes, extra)
    pairing = pair_files(trees, inputs)
    releases, closest = _measure_releases(request.releases, policy, inputs, trees, cache, stats, pairing.pairs)
    _moved_between_releases(pairing.pairs, closest)
    if releases:
        listed = with_new_at_target(pairing.target_only, pairing.pairs, releases, closest)
        pairing = replace(pairing, target_only=listed)
    describer = PairDescriber(trees, stats, pairing.pairs, closest, [r.label for r in releases])
    return Comparison(trees, pairing, cache, releases, closest, describer, inputs.local_files)


def report(comparison: Comparison, ask: Ask, sizes: Sizes) -> ModelDiff:
    """One page of the detail level asked for, ended before the row that would cross the result budget;
    what is the same on every page (target-only files, families, a diff's pair, notes) on the first only."""
    pairing, trees = comparison.pairing, comparison.trees
    counts = dict(sorted(Counter(p.status.value for p in pairing.pairs).items()))
    counts["target_only"] = sum(t.files for t in pairing.target_only)
    first = ask.cursor is None
    skeleton = ModelDiff(
        pairs=[],
        total=0,
        next_cursor=None,
        counts=counts,
        releases=comparison.releases,
        parse_errors=_parse_errors(trees, pairing, comparison.local_files) if first else [],
        unknowns=list(pairing.unknowns) if first else [],
        modules_indexed=len(trees.index.modules),
        cache_hits=comparison.cache.hits,
        parsed=comparison.cache.misses,
    )
    if ask.detail == "diff":
        return _diff_page(comparison, ask, sizes, skeleton)
    if ask.detail == "matrix":
        return _matrix_page(comparison, ask, sizes, skeleton)
    return _pairs_page(comparison, ask, sizes, skeleton)


def _paged(items: Sequence[T], ask: Ask, size: Callable[[T], int], fixed: int) -> Page[T]:
    """A page of `items` in the room `fixed` chars leave of the result budget."""
    room = max(RESULT_BUDGET - fixed - CURSOR_RESERVE, 1)
    return paginate(
        items,
        cursor=ask.cursor,
        limit=ask.limit,
        fingerprint=ask.fingerprint,
        default_limit=DEFAULT_LIMITS[ask.detail],
        max_limit=MAX_LIMITS[ask.detail],
        budget=SizeBudget(size_of=size, chars=room),
    )


def _moved_between_releases(pairs: list[Pair], closest: dict[str, FileReleases]) -> None:
    """A counterpart the same rules find elsewhere at another release (a registry or family that
    moved) is named as an alternative with the release."""
    for pair in pairs:
        found = closest.get(pair.local)
        for label, counterpart in found.counterparts.items() if found else ():
            if pair.upstream and counterpart.path != pair.upstream:
                pair.alternative(counterpart.path, f"the counterpart at release {label}")


def _measure_releases(
    labels: list[str],
    policy: Policy,
    inputs: PairingInputs,
    trees: Trees,
    cache: RecordCache,
    stats: StatsCache,
    pairs: list[Pair],
) -> tuple[list[Release], dict[str, FileReleases]]:
    """The releases asked for and each file's distance to them (the target's pairs reused where it is one)."""
    if not labels:
        return [], {}
    upstream = trees.upstream
    repo = upstream.repo if isinstance(upstream, RevisionSubject) else None
    releases = resolve_releases(policy, labels, repo)
    known = {upstream.commit: pairs} if isinstance(upstream, RevisionSubject) else {}
    return releases, closest_releases(trees.local, releases, cache, stats, inputs, known)


def find_pair(pairs: list[Pair], file: str) -> Pair:
    """The pair whose plugin or upstream path is `file`."""
    path = clean_path(file)
    for pair in pairs:
        if path in (pair.local, pair.upstream):
            return pair
    raise not_found(
        f"{file} is neither a compared plugin file nor a paired upstream file; list the pairs with detail=summary."
    )


def _diff_page(comparison: Comparison, ask: Ask, sizes: Sizes, skeleton: ModelDiff) -> ModelDiff:
    """detail=diff: a page of one pair's unified diff, and (first page) the pair, fully described."""
    pair = find_pair(comparison.pairing.pairs, ask.file or "")
    lines = [_clipped(line) for line in comparison.describer.diff_lines(pair)]
    described = [comparison.describer.describe(pair, symbols=True)] if ask.cursor is None else []
    shown = replace(skeleton, pairs=described, total=len(lines))
    page = _paged(lines, ask, sizes.line, sizes.fixed(shown))
    return replace(shown, next_cursor=page.next_cursor, diff=page.items)


def _clipped(line: str) -> str:
    if len(line) <= LONG_LINE:
        return line
    return f"{line[:LONG_LINE]} [... {len(line) - LONG_LINE} more chars cut]"


def _matrix_page(comparison: Comparison, ask: Ask, sizes: Sizes, skeleton: ModelDiff) -> ModelDiff:
    """detail=matrix: the rows (of `file` only, when given), paged, with counts per class and the gaps met."""
    trees, pairs = comparison.trees, comparison.pairing.pairs
    only = {find_pair(pairs, ask.file).local} if ask.file else None
    facts = plugin_facts(trees.local, trees.package.name)
    rows, gaps = difference_matrix(trees, pairs, facts, comparison.cache, comparison.closest, comparison.releases, only)
    notes = ([] if comparison.releases else [NO_RELEASES]) + gaps if ask.cursor is None else []
    shown = replace(
        skeleton,
        total=len(rows),
        matrix_counts=dict(sorted(Counter(r.proposed_class.value for r in rows).items())),
        unknowns=[*skeleton.unknowns, *notes],
    )
    page = _paged(rows, ask, sizes.row, sizes.fixed(shown))
    return replace(shown, next_cursor=page.next_cursor, matrix=page.items)


def _pairs_page(comparison: Comparison, ask: Ask, sizes: Sizes, skeleton: ModelDiff) -> ModelDiff:
    """detail=summary, symbols or releases: a page of pairs; the target-only files and the families first."""
    pairing, symbols = comparison.pairing, ask.detail == "symbols"
    labels = [r.label for r in comparison.releases]
    rules = {p.local: p.rule.value for p in pairing.pairs}
    families = family_summaries(comparison.closest, rules, labels, comparison.trees.package) if labels else []
    first = ask.cursor is None
    shown = replace(
        skeleton,
        total=len(pairing.pairs),
        target_only=list(pairing.target_only) if first else [],
        families=families if first else [],
    )
    described: dict[str, PairReport] = {}

    def describe(pair: Pair) -> PairReport:
        if pair.local not in described:
            described[pair.local] = comparison.describer.describe(pair, symbols=symbols)
        return described[pair.local]

    page = _paged(pairing.pairs, ask, lambda pair: sizes.pair(describe(pair)), sizes.fixed(shown))
    return replace(shown, next_cursor=page.next_cursor, pairs=[describe(p) for p in page.items])


def _parse_errors(trees: Trees, pairing: Pairing, local_files: list[str]) -> list[str]:
    """`path: error` for the compared files and their paired upstream files that do not parse."""
    paired_upstream = {p.upstream for p in pairing.pairs if p.upstream}
    return sorted(
        f"{path}: {module.record.error}"
        for modules, wanted in ((trees.local_modules, set(local_files)), (trees.upstream_modules, paired_upstream))
        for path, module in modules.items()
        if path in wanted and module.record.error
    )
