"""The diff_model workflow: pair the plugin's files with the target, measure them against the
releases, and report one detail level, paged (pairs, one file's unified diff, or matrix rows)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ..code.module_index import RecordCache
from ..code.plugin_facts import plugin_facts
from ..foundation.errors import not_found
from ..foundation.policy import Policy
from ..foundation.results import paginate
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

Detail = Literal["summary", "symbols", "releases", "matrix", "diff"]
DEFAULT_LIMITS: dict[Detail, int] = {"summary": 12, "symbols": 5, "releases": 20, "matrix": 15, "diff": 200}
MAX_PAIRS = 500
MAX_DIFF_LINES = 5000
MAX_ROWS = 2000

NO_RELEASES = (
    "No releases: each file's base is the target, so upstream changes and overrides of symbols the target "
    "removed read as MACA edits (upstream_changed is null); pass releases."
)


@dataclass(frozen=True)
class ModelDiffRequest:
    """What a diff_model call asks for, its paging included (`fingerprint` binds the cursor)."""

    paths: list[str]
    mapping_overrides: Mapping[str, str | None]
    releases: list[str]
    detail: Detail
    file: str | None
    cursor: str | None
    limit: int | None
    fingerprint: str


@dataclass(frozen=True)
class _Page:
    """The part of the result that depends on the detail level."""

    total: int
    next_cursor: str | None
    pairs: list[PairReport] = field(default_factory=list)
    target_only: list[TargetOnly] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)
    matrix: list[MatrixRow] = field(default_factory=list)
    matrix_counts: dict[str, int] = field(default_factory=dict)
    unknowns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ModelDiff:
    pairs: list[PairReport]
    """This page of pairs (the one pair of detail=diff; none with detail=matrix)."""
    total: int
    next_cursor: str | None
    counts: dict[str, int]
    """Pairs per status over all pages, and target_only files."""
    target_only: list[TargetOnly]
    diff: list[str]
    releases: list[Release]
    families: list[FamilyReleases]
    matrix: list[MatrixRow]
    matrix_counts: dict[str, int]
    parse_errors: list[str]
    unknowns: list[str]
    modules_indexed: int
    cache_hits: int
    parsed: int


@dataclass(frozen=True)
class _Compared:
    """What every detail level reads: the trees, the pairs and their distances to the releases."""

    request: ModelDiffRequest
    trees: Trees
    pairing: Pairing
    cache: RecordCache
    releases: list[Release]
    closest: dict[str, FileReleases]
    describer: PairDescriber


def compare_models(
    plugin: Subject, upstream: Subject, request: ModelDiffRequest, policy: Policy, store: StateStore
) -> ModelDiff:
    """Pair the files under the request's paths with the upstream target and report its detail level."""
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
    labels = [r.label for r in releases]
    describer = PairDescriber(trees, stats, pairing.pairs, closest, labels)
    compared = _Compared(request, trees, pairing, cache, releases, closest, describer)
    if request.detail == "diff":
        page = _diff_page(compared)
    elif request.detail == "matrix":
        page = _matrix_page(compared)
    else:
        page = _pairs_page(compared)
    rules = {p.local: p.rule.value for p in pairing.pairs}
    counts = dict(sorted(Counter(p.status.value for p in pairing.pairs).items()))
    counts["target_only"] = sum(t.files for t in pairing.target_only)
    return ModelDiff(
        pairs=page.pairs,
        total=page.total,
        next_cursor=page.next_cursor,
        counts=counts,
        target_only=page.target_only,
        diff=page.diff,
        releases=releases,
        families=family_summaries(closest, rules, labels, trees.package) if releases else [],
        matrix=page.matrix,
        matrix_counts=page.matrix_counts,
        parse_errors=_parse_errors(trees, pairing, inputs.local_files),
        unknowns=[*pairing.unknowns, *page.unknowns],
        modules_indexed=len(trees.index.modules),
        cache_hits=cache.hits,
        parsed=cache.misses,
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


def _diff_page(compared: _Compared) -> _Page:
    """detail=diff: one pair, fully described, and a page of its unified diff."""
    request = compared.request
    pair = find_pair(compared.pairing.pairs, request.file or "")
    page = paginate(
        compared.describer.diff_lines(pair),
        cursor=request.cursor,
        limit=request.limit,
        fingerprint=request.fingerprint,
        default_limit=DEFAULT_LIMITS["diff"],
        max_limit=MAX_DIFF_LINES,
    )
    return _Page(page.total, page.next_cursor, pairs=[compared.describer.describe(pair, symbols=True)], diff=page.items)


def _matrix_page(compared: _Compared) -> _Page:
    """detail=matrix: the rows (of `file` only, when given), paged, with counts per class and the gaps met."""
    request, trees, pairs = compared.request, compared.trees, compared.pairing.pairs
    only = {find_pair(pairs, request.file).local} if request.file else None
    facts = plugin_facts(trees.local, trees.package.name)
    rows, gaps = difference_matrix(trees, pairs, facts, compared.cache, compared.closest, compared.releases, only)
    page = paginate(
        rows,
        cursor=request.cursor,
        limit=request.limit,
        fingerprint=request.fingerprint,
        default_limit=DEFAULT_LIMITS["matrix"],
        max_limit=MAX_ROWS,
    )
    return _Page(
        page.total,
        page.next_cursor,
        matrix=page.items,
        matrix_counts=dict(sorted(Counter(r.proposed_class.value for r in rows).items())),
        unknowns=([] if compared.releases else [NO_RELEASES]) + gaps,
    )


def _pairs_page(compared: _Compared) -> _Page:
    """detail=summary, symbols or releases: a page of pairs, and the target-only files."""
    request = compared.request
    page = paginate(
        compared.pairing.pairs,
        cursor=request.cursor,
        limit=request.limit,
        fingerprint=request.fingerprint,
        default_limit=DEFAULT_LIMITS[request.detail],
        max_limit=MAX_PAIRS,
    )
    symbols = request.detail == "symbols"
    reports = [compared.describer.describe(p, symbols=symbols) for p in page.items]
    return _Page(page.total, page.next_cursor, pairs=reports, target_only=list(compared.pairing.target_only))


def _parse_errors(trees: Trees, pairing: Pairing, local_files: list[str]) -> list[str]:
    """`path: error` for the compared files and their paired upstream files that do not parse."""
    paired_upstream = {p.upstream for p in pairing.pairs if p.upstream}
    return sorted(
        f"{path}: {module.record.error}"
        for modules, wanted in ((trees.local_modules, set(local_files)), (trees.upstream_modules, paired_upstream))
        for path, module in modules.items()
        if module.record.error and path in wanted
    )
