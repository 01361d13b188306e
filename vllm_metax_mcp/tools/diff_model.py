"""Tool `diff_model`: every plugin model file against its true upstream counterpart, by symbol."""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.code.module_index import RecordCache
from ..core.code.plugin_facts import plugin_facts
from ..core.code.registration import plugin_registrations
from ..core.compare.matrix import DiffClass, MatrixRow, difference_matrix
from ..core.compare.pairing import (
    Pair,
    Pairing,
    Rule,
    Status,
    Trees,
    build_trees,
    pair_files,
    paired_modules,
)
from ..core.compare.releases import (
    MAX_RELEASES,
    FileReleases,
    PairingInputs,
    Release,
    closest_releases,
    family_summaries,
    resolve_releases,
)
from ..core.compare.symdiff import (
    SymbolDiff,
    diff_extension,
    diff_symbols,
    import_swaps,
)
from ..core.compare.textdiff import StatsCache, split_lines, unified_diff
from ..core.foundation.errors import bad_input, not_found
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import Page, inputs_fingerprint, paginate
from ..core.sources.subjects import RevisionSubject, Subject, clean_path
from .arguments import (
    UpstreamArgs,
    open_plugin_repo,
    open_plugin_subject,
    open_upstream,
)
from .spec import ToolEnv, ToolOutput, ToolSpec

DEFAULT_LIMITS = {"summary": 20, "symbols": 5, "releases": 20, "matrix": 15, "diff": 200}
MAX_PAIRS = 500
MAX_DIFF_LINES = 5000
MAX_ROWS = 2000


class DiffModelInput(UpstreamArgs):
    paths: list[str] = Field(
        default_factory=lambda: ["vllm_metax/models/"],
        description="Plugin paths (files or directories) whose Python files are compared.",
    )
    mapping_overrides: dict[str, str | None] = Field(
        default_factory=dict,
        description="Plugin path -> upstream path (null: no counterpart); wins over every pairing rule.",
    )
    releases: list[str] = Field(
        default_factory=list,
        max_length=MAX_RELEASES,
        description="Upstream releases, oldest first: revisions of the upstream repository (tags such as v0.25.0) "
        "or directories containing vllm/. Each pair then gets its closest release (the newest with the fewest "
        "differing lines), the matrix's base.",
    )
    detail: Literal["summary", "symbols", "releases", "matrix", "diff"] = Field(
        default="summary",
        description="summary: pairs with status, rule, flags, stats; symbols: plus the symbol diff and import "
        "swaps; releases: pairs with differing lines per release and family summaries (needs releases); "
        "matrix: the MACA/upstream difference matrix, one proposed class per differing symbol, paged by rows; "
        "diff: the unified diff of `file`, paged by lines.",
    )
    file: str | None = Field(
        default=None,
        description="detail=diff: the plugin (or upstream) path of one pair; detail=matrix: only its rows.",
    )
    cursor: str | None = None
    limit: int | None = Field(
        default=None,
        description=f"Pairs per page (default {DEFAULT_LIMITS['summary']}, {DEFAULT_LIMITS['symbols']} with "
        f"detail=symbols; max {MAX_PAIRS}), matrix rows (default {DEFAULT_LIMITS['matrix']}, max {MAX_ROWS}) "
        f"or diff lines (default {DEFAULT_LIMITS['diff']}, max {MAX_DIFF_LINES}).",
    )


class Stats(BaseModel):
    added: int = Field(description="Lines only in the local file.")
    removed: int = Field(description="Lines only in the upstream file.")
    hunks: int = Field(description="Change blocks of a zero-context unified diff.")


class RenamedSymbol(BaseModel):
    local: str
    upstream: str
    how: Literal["maca_prefix", "body", "subclass"]
    similarity: float = Field(description="Body similarity without the header line (0 for subclass links).")


class SignatureChange(BaseModel):
    symbol: str
    local: str
    upstream: str


class BaseChange(BaseModel):
    symbol: str
    local: list[str]
    upstream: list[str]


class Symbols(BaseModel):
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[str] = Field(
        default_factory=list, description="Body differs (docstrings, comments, blank lines ignored)."
    )
    renamed: list[RenamedSymbol] = Field(default_factory=list)
    signatures: list[SignatureChange] = Field(default_factory=list)
    bases: list[BaseChange] = Field(default_factory=list)


class ImportSwap(BaseModel):
    name: str
    local_module: str
    upstream_module: str
    line: int = Field(description="Line of the local import.")
    paired: bool = Field(
        description="The local module is the pair of the upstream module (a copy follows its original)."
    )
    upstream_line: int = Field(description="Line of the upstream import.")


class Candidate(BaseModel):
    upstream: str
    similarity: float = Field(description="Dice coefficient of the files' meaningful lines.")
    shared_symbols: int


class PairResult(BaseModel):
    local: str
    upstream: str | None
    status: Literal["identical", "changed", "local_only", "removed"]
    rule: str = Field(description="The pairing rule that decided: " + ", ".join(r.value for r in Rule) + ".")
    confidence: float
    flags: list[str] = Field(
        default_factory=list,
        description="content_matches_other, content_candidate, ambiguous, other_platform, unreferenced_dir, "
        "conditional_branch, moved, parse_error.",
    )
    evidence: list[Evidence] = Field(default_factory=list)
    candidates: list[Candidate] = Field(
        default_factory=list, description="Alternatives content or a tie proposes; never decisive."
    )
    stats: Stats | None = None
    symbols: Symbols | None = None
    import_swaps: list[ImportSwap] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why a side could not be parsed.")
    closest_release: str | None = Field(
        default=None, description="With releases: the newest release with the fewest differing lines (the file's base)."
    )
    per_release: dict[str, int | None] = Field(
        default_factory=dict,
        description="With releases: differing lines (added + removed) against each release's counterpart; null: none there.",
    )


class TargetOnly(BaseModel):
    upstream: str = Field(description="A file, or a directory (trailing /) standing for `files` files.")
    kind: Literal["family", "branch", "shared", "other_platform", "unreferenced", "directory"]
    files: int
    guard: str | None = Field(default=None, description="For other_platform: the dispatch condition that selects it.")


class ReleaseInfo(BaseModel):
    label: str
    commit: str | None = Field(description="Null for a release directory.")


class FamilyRelease(BaseModel):
    family: str = Field(description="Local family directory, e.g. vllm_metax/models/deepseek_v4/.")
    files: dict[str, int] = Field(description="Closest release -> how many of the family's files it is closest for.")
    newest: str
    by_rule: dict[str, list[str]] = Field(
        description="Pairing rule -> the closest releases of the files it paired (oldest first)."
    )
    lagging: list[str] = Field(description="Files whose closest release is older than `newest`.")


class MatrixEntry(BaseModel):
    """A baseline row audit_commits imports: keyed by (local, symbol); the shape is stable."""

    local: str = Field(description="Plugin path.")
    symbol: str = Field(
        description="Top-level name or Class.method (local names; upstream-only symbols by upstream name), "
        "import:<name> for an import swap, * for the whole file."
    )
    upstream: str | None = Field(description="Upstream path at the target.")
    upstream_symbol: str | None
    change: Literal[
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
    proposed_class: DiffClass = Field(description="A proposal, never a decision.")
    also: list[str] = Field(default_factory=list, description="Other classes whose rules also applied.")
    upstream_changed: bool | None = Field(
        description="The target changed this symbol since the base release; null without releases."
    )
    base: str | None = Field(description="The release the MACA edit was measured against; null: the target.")
    evidence: list[Evidence]
    leads: list[str] = Field(
        default_factory=list, description="Comments on the differing lines: leads to read, never proof."
    )
    rationale: str


class DiffModelOutput(ToolOutput):
    subject: str = ""
    upstream_target: str = Field(default="", description="The upstream revision (or directory) compared against.")
    pairs: list[PairResult] = Field(default_factory=list)
    total: int = Field(default=0, description="Pairs in all pages, or diff lines with detail=diff.")
    next_cursor: str | None = None
    counts: dict[str, int] = Field(
        default_factory=dict, description="Pairs per status over all pages, and target_only files."
    )
    target_only: list[TargetOnly] = Field(default_factory=list, description="Not repeated with detail=diff.")
    diff: list[str] = Field(
        default_factory=list, description="detail=diff: this page of the unified diff (upstream -> local)."
    )
    releases: list[ReleaseInfo] = Field(default_factory=list, description="The releases compared, oldest first.")
    families: list[FamilyRelease] = Field(
        default_factory=list, description="With releases: the closest releases per local family."
    )
    matrix: list[MatrixEntry] = Field(
        default_factory=list, description="detail=matrix: this page of rows, sorted by (local, symbol)."
    )
    matrix_counts: dict[str, int] = Field(
        default_factory=dict, description="detail=matrix: rows per proposed class over all pages."
    )
    parse_errors: list[str] = Field(default_factory=list)
    unknowns: list[str] = Field(default_factory=list)
    modules_indexed: int = 0
    cache_hits: int = 0
    parsed: int = 0


def _overrides(raw: dict[str, str | None], local_files: list[str]) -> dict[str, str | None]:
    checked: dict[str, str | None] = {}
    for local, upstream in raw.items():
        path = clean_path(local)
        if path not in local_files:
            raise bad_input(
                f"mapping_overrides names {local}, which is not a Python file under paths; use a path from a summary call."
            )
        checked[path] = clean_path(upstream) if upstream else None
    return checked


def _registrations(plugin: Subject, prefixes: list[str]) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for prefix in prefixes:
        for registration in plugin_registrations(plugin, prefix):
            line, count = found.get(registration.path, (registration.line, 0))
            found[registration.path] = (min(line, registration.line), count + 1)
    return found


def _symbols(diff: SymbolDiff) -> Symbols:
    return Symbols(
        added=diff.added,
        removed=diff.removed,
        changed=diff.changed,
        renamed=[RenamedSymbol(**vars(r)) for r in diff.renamed],
        signatures=[SignatureChange(**vars(s)) for s in diff.signatures],
        bases=[BaseChange(symbol=b.symbol, local=list(b.local), upstream=list(b.upstream)) for b in diff.bases],
    )


class _Describer:
    """Turns core pairs into results: statistics (cached by blob pair), symbols and swaps on request."""

    def __init__(self, trees: Trees, stats: StatsCache, pairs: list[Pair]) -> None:
        self.trees = trees
        self.stats = stats
        self.paired = paired_modules(pairs)

    def _error(self, pair: Pair) -> str | None:
        sides = [("local", self.trees.local_modules.get(pair.local))]
        if pair.upstream and pair.upstream in self.trees.upstream_files:
            sides.append(("upstream", self.trees.upstream_modules.get(pair.upstream)))
        problems = [
            f"{side}: {module.record.error}" for side, module in sides if module is not None and module.record.error
        ]
        return "; ".join(problems) or None

    def describe(self, pair: Pair, symbols: bool) -> PairResult:
        result = PairResult(
            local=pair.local,
            upstream=pair.upstream,
            status=pair.status.value,
            rule=pair.rule.value,
            confidence=pair.confidence,
            flags=list(pair.flags),
            evidence=list(pair.evidence),
            candidates=[Candidate(**vars(c)) for c in pair.candidates],
            error=self._error(pair),
        )
        if result.error:
            result.flags.append("parse_error")
        if pair.status not in (Status.CHANGED, Status.IDENTICAL) or pair.upstream is None:
            return result
        upstream_sha, local_sha = self.trees.upstream.sha(pair.upstream), self.trees.local.sha(pair.local)
        line_stats = self.stats.get(upstream_sha, local_sha, lambda: self._texts(pair))
        result.stats = Stats(**vars(line_stats))
        if symbols and not result.error:
            self._add_symbols(pair, result)
        return result

    def _texts(self, pair: Pair) -> tuple[bytes, bytes]:
        assert pair.upstream is not None
        return self.trees.upstream.read(pair.upstream), self.trees.local.read(pair.local)

    def _add_symbols(self, pair: Pair, result: PairResult) -> None:
        mine = self.trees.local_modules.get(pair.local)
        theirs = self.trees.upstream_modules.get(pair.upstream or "")
        if mine is None or theirs is None:
            result.error = "not an importable module path: no symbol diff"
            return
        if pair.rule is Rule.SUBCLASS:
            diff = diff_extension(mine.record, theirs.record, pair.extends)
        else:
            upstream_text, local_text = self._texts(pair)
            diff = diff_symbols(mine.record, theirs.record, split_lines(local_text), split_lines(upstream_text))
        result.symbols = _symbols(diff)
        result.import_swaps = [
            ImportSwap(**vars(s)) for s in import_swaps(mine, theirs, "vllm_metax", "vllm", self.paired)
        ]

    def diff_lines(self, pair: Pair) -> list[str]:
        if pair.upstream is None or pair.status not in (Status.CHANGED, Status.IDENTICAL):
            raise bad_input(
                f"{pair.local} has no counterpart at the target (status {pair.status.value}): there is nothing to diff."
            )
        upstream_text, local_text = self._texts(pair)
        return unified_diff(upstream_text, local_text, pair.upstream, pair.local)


def _find(pairs: list[Pair], file: str) -> Pair:
    path = clean_path(file)
    for pair in pairs:
        if path in (pair.local, pair.upstream):
            return pair
    raise not_found(
        f"{file} is neither a compared plugin file nor a paired upstream file; list the pairs with detail=summary."
    )


def _target_label(upstream: Subject, target: str | None, commit: str | None) -> str:
    if commit:
        return f"{target} ({commit[:12]})" if target and target != commit else commit[:12]
    return f"{upstream.label} (no revision)"


def _check_detail(args: DiffModelInput) -> None:
    if args.detail == "diff" and not args.file:
        raise bad_input("detail=diff needs file: a plugin (or upstream) path from a summary call.")
    if args.file and args.detail not in ("diff", "matrix"):
        raise bad_input("file is only used with detail=diff or detail=matrix.")
    if args.detail == "releases" and not args.releases:
        raise bad_input("detail=releases needs releases: upstream tags (oldest first) or release directories.")


def _releases(
    args: DiffModelInput,
    env: ToolEnv,
    plugin: Subject,
    upstream: Subject,
    inputs: PairingInputs,
    cache: RecordCache,
    stats: StatsCache,
    pairs: list[Pair],
) -> tuple[list[Release], dict[str, FileReleases]]:
    """The releases asked for and each file's distance to them (the target's pairs reused where it is one)."""
    if not args.releases:
        return [], {}
    repo = upstream.repo if isinstance(upstream, RevisionSubject) else None
    releases = resolve_releases(env.policy, args.releases, repo)
    known = {upstream.commit: pairs} if isinstance(upstream, RevisionSubject) else {}
    return releases, closest_releases(plugin, releases, cache, stats, inputs, known)


def _matrix_entry(row: MatrixRow) -> MatrixEntry:
    fields = vars(row) | {"also": [c.value for c in row.also], "evidence": list(row.evidence), "leads": list(row.leads)}
    return MatrixEntry(**fields)


NO_RELEASES = (
    "No releases: each file's base is the target, so upstream changes and overrides of symbols the target removed "
    "read as MACA edits (upstream_changed is null); pass releases."
)


def _matrix_page(
    args: DiffModelInput,
    output: DiffModelOutput,
    trees: Trees,
    pairs: list[Pair],
    cache: RecordCache,
    closest: dict[str, FileReleases],
    releases: list[Release],
    fingerprint: str,
) -> Page[MatrixRow]:
    """detail=matrix: the rows (of `file` only, when given), paged, with counts per class and the gaps met."""
    only = {_find(pairs, args.file).local} if args.file else None
    rows, gaps = difference_matrix(trees, pairs, plugin_facts(trees.local), cache, closest, releases, only)
    page = paginate(
        rows,
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=fingerprint,
        default_limit=DEFAULT_LIMITS["matrix"],
        max_limit=MAX_ROWS,
    )
    output.matrix = [_matrix_entry(r) for r in page.items]
    output.matrix_counts = dict(sorted(Counter(r.proposed_class.value for r in rows).items()))
    output.unknowns += ([] if releases else [NO_RELEASES]) + gaps
    return page


def _add_releases(
    output: DiffModelOutput, pairs: list[Pair], closest: dict[str, FileReleases], labels: list[str]
) -> None:
    """Closest release and per-release counts on the listed pairs; the family summaries."""
    rules = {p.local: p.rule.value for p in pairs}
    output.families = [FamilyRelease(**vars(f)) for f in family_summaries(closest, rules, labels)]
    for result in output.pairs:
        if result.local in closest:
            result.closest_release = closest[result.local].closest
            result.per_release = closest[result.local].per_release(labels)


def _parse_errors(trees: Trees, pairing: Pairing, local_files: list[str]) -> list[str]:
    paired_upstream = {p.upstream for p in pairing.pairs if p.upstream}
    return sorted(
        f"{path}: {module.record.error}"
        for modules, wanted in ((trees.local_modules, set(local_files)), (trees.upstream_modules, paired_upstream))
        for path, module in modules.items()
        if module.record.error and path in wanted
    )


def diff_model(args: DiffModelInput, env: ToolEnv) -> DiffModelOutput:
    """Pair every plugin model file with its true upstream counterpart and diff them by symbol.

    Pairing follows evidence, never a same-name guess: the caller's mapping_overrides, the plugin's
    registration module (plugin-only), the same relative path, the platform branch the family's
    upstream `__init__` dispatch gives an out-of-tree platform (platform and shared directories
    flattened), shared top-level symbols (renamed files, upstream originals outside the model
    directories), upstream class bases (subclassing files), and the upstream history (removed
    counterparts). Content similarity only proposes candidates and raises flags. Each pair has a
    status, rule, confidence, evidence and line stats; detail=symbols adds the symbol diff and import
    swaps, detail=diff the paged unified diff of one file. target_only lists upstream files of the
    mapped directories nothing pairs with (other platforms' directories as such).

    With releases (oldest first), every pair gets its closest release — paired against each release
    by the same rules, differing lines counted per release — and families summarise which files lag
    (detail=releases). detail=matrix proposes a class for every differing symbol (import_swap,
    maca_kernel, platform_predicate, dtype_path, capability_predicate, obsolete_override,
    upstream_change, unverified) from the code of the lines the plugin changed since that base, with
    file/line evidence; comments are quoted as leads, never proof. Its rows, keyed by (local,
    symbol), are the baseline audit_commits imports.
    """
    _check_detail(args)
    prefixes = [clean_path(p) for p in args.paths]
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    local_files = sorted({p for prefix in prefixes for p in plugin.list(prefix) if p.endswith(".py")})
    if not local_files:
        raise not_found(
            f"No Python files under {', '.join(args.paths)} in the {plugin.label} subject; pass paths such as vllm_metax/models/."
        )
    overrides = _overrides(args.mapping_overrides, local_files)
    inputs = PairingInputs(local_files, prefixes, overrides, _registrations(plugin, prefixes))
    cache, stats = RecordCache(env.store), StatsCache(env.store)
    trees = build_trees(plugin, upstream, cache, prefixes, [u for u in overrides.values() if u])
    pairing = pair_files(trees, local_files, overrides, inputs.registrations)
    releases, closest = _releases(args, env, plugin, upstream, inputs, cache, stats, pairing.pairs)
    describer = _Describer(trees, stats, pairing.pairs)
    fingerprint = inputs_fingerprint("diff_model", args.model_dump(mode="json"))
    output = DiffModelOutput(
        subject=plugin.label,
        upstream_target=_target_label(upstream, mapping.target, mapping.target_commit),
        unknowns=pairing.unknowns,
        releases=[ReleaseInfo(label=r.label, commit=r.commit) for r in releases],
    )
    page: Page[Any]
    if args.detail == "diff":
        pair = _find(pairing.pairs, args.file or "")
        page = paginate(
            describer.diff_lines(pair),
            cursor=args.cursor,
            limit=args.limit,
            fingerprint=fingerprint,
            default_limit=DEFAULT_LIMITS["diff"],
            max_limit=MAX_DIFF_LINES,
        )
        output.pairs, output.diff = [describer.describe(pair, symbols=True)], page.items
    elif args.detail == "matrix":
        page = _matrix_page(args, output, trees, pairing.pairs, cache, closest, releases, fingerprint)
    else:
        page = paginate(
            pairing.pairs,
            cursor=args.cursor,
            limit=args.limit,
            fingerprint=fingerprint,
            default_limit=DEFAULT_LIMITS[args.detail],
            max_limit=MAX_PAIRS,
        )
        output.pairs = [describer.describe(p, symbols=args.detail == "symbols") for p in page.items]
        output.target_only = [TargetOnly(**vars(t)) for t in pairing.target_only]
    if releases:
        _add_releases(output, pairing.pairs, closest, [r.label for r in releases])
    output.total, output.next_cursor = page.total, page.next_cursor
    output.counts = dict(sorted(Counter(p.status.value for p in pairing.pairs).items()))
    output.counts["target_only"] = sum(t.files for t in pairing.target_only)
    output.parse_errors = _parse_errors(trees, pairing, local_files)
    output.modules_indexed, output.cache_hits, output.parsed = len(trees.index.modules), cache.hits, cache.misses
    return output


SPEC = ToolSpec(
    name="diff_model",
    effect=Effect.READS,
    run=diff_model,
    input_model=DiffModelInput,
    output_model=DiffModelOutput,
    title="Pair plugin model files with upstream and diff them by symbol",
    cpu_heavy=True,
)
