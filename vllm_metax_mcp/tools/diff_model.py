"""Tool `diff_model`: every plugin model file against its true upstream counterpart, by symbol."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..core.compare.classify import DiffClass
from ..core.compare.describe import PairReport
from ..core.compare.inputs import target_label
from ..core.compare.matrix import MatrixChange, MatrixRow
from ..core.compare.model_diff import (
    DEFAULT_LIMITS,
    MAX_DIFF_LINES,
    MAX_PAIRS,
    MAX_ROWS,
    Detail,
    ModelDiffRequest,
    compare_models,
)
from ..core.compare.pairs import Rule, TargetKind, TargetReason
from ..core.compare.pairs import TargetOnly as TargetOnlyEntry
from ..core.compare.releases import MAX_RELEASES
from ..core.compare.symdiff import RenameHow, SymbolDiff
from ..core.foundation.errors import bad_input
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import inputs_fingerprint
from .arguments import (
    UpstreamArgs,
    open_plugin_repo,
    open_plugin_subject,
    open_upstream,
)
from .spec import ToolEnv, ToolOutput, ToolSpec


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
    detail: Detail = Field(
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
    """The line diff of a pair with a counterpart at the target; local_only and removed pairs have none."""

    added: int = Field(description="Lines only in the local file.")
    removed: int = Field(description="Lines only in the upstream file.")
    hunks: int = Field(description="Change blocks of a zero-context unified diff.")
    local_lines: int = Field(
        description="Lines of the local file (a last line without newline counts); local_lines - added == "
        "upstream_lines - removed, the lines both share."
    )
    upstream_lines: int = Field(description="Lines of the upstream counterpart, counted the same way.")
    symbols_unchanged: int | None = Field(
        default=None,
        description="Top-level symbols equal on both sides (Symbols.unchanged); null where a side is not a "
        "module that parses.",
    )
    symbols_differing: int | None = Field(
        default=None,
        description="Top-level symbols the symbol diff lists (added, removed, changed, renamed, or with a "
        "changed method, signature or base), each once; null as symbols_unchanged.",
    )


class RenamedSymbol(BaseModel):
    local: str
    upstream: str
    how: RenameHow
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
    unchanged: int = Field(
        description="Top-level symbols under the same name on both sides whose code is equal (docstrings, "
        "comments, blank lines ignored; a class only when all its methods are); renamed ones are not counted.",
    )


class ImportSwap(BaseModel):
    """The local import reads `from local_module import <local_name or name> as <local_alias or name>`, the
    upstream one `from upstream_module import name as <upstream_alias or name>`; a module import
    (`import m as x`) has m as its module and no name of its own."""

    name: str = Field(
        description="What upstream imports (the name before `as`), matched by the name bound or, aliases "
        "followed, by the name imported; for an upstream `import m as x`, x."
    )
    local_module: str
    upstream_module: str
    line: int = Field(description="Line of the local import.")
    paired: bool = Field(
        description="The local module is the pair of the upstream module (a copy follows its original)."
    )
    upstream_line: int = Field(description="Line of the upstream import.")
    local_name: str | None = Field(
        default=None, description="What the local import takes instead, where the plugin binds another name."
    )
    local_alias: str | None = Field(default=None, description="The name the local import binds, where not name.")
    upstream_alias: str | None = Field(default=None, description="The name the upstream import binds, where not name.")


class Candidate(BaseModel):
    upstream: str
    similarity: float = Field(description="Dice coefficient of the files' meaningful lines.")
    shared_symbols: int


class Alternative(BaseModel):
    upstream: str
    reason: str


class PairResult(BaseModel):
    local: str
    upstream: str | None
    status: Literal["identical", "changed", "local_only", "removed"]
    rule: str = Field(description="The pairing rule that decided: " + ", ".join(r.value for r in Rule) + ".")
    confidence: float
    flags: list[str] = Field(
        default_factory=list,
        description="content_matches_other, content_candidate, ambiguous, other_platform, unreferenced_dir, "
        "conditional_branch, moved, name_only (same name, no shared top-level symbol), conflict (see "
        "alternatives), parse_error.",
    )
    evidence: list[Evidence] = Field(default_factory=list)
    candidates: list[Candidate] = Field(
        default_factory=list, description="Alternatives content or a tie proposes; never decisive."
    )
    alternatives: list[Alternative] = Field(
        default_factory=list, description="Counterparts other evidence names (another platform, another rule)."
    )
    merged_from: list[str] = Field(
        default_factory=list, description="Other upstream files whose code the local file also carries."
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
        description="With releases: differing lines (added + removed) against each release's counterpart; "
        "null: none there.",
    )


class TargetOnly(BaseModel):
    upstream: str = Field(description="A file, or a directory (trailing /) standing for `files` files.")
    kind: TargetKind = Field(
        description="Where it lies: family (root), branch/shared/other_platform/unreferenced (family "
        "sub-directory), directory (another directory a pair reaches into)."
    )
    reason: TargetReason = Field(
        description="Why no plugin file pairs with it: imported_by_local (a compared plugin file imports it as it "
        "is), other_platform, new_at_target (absent at its directory's base release; only with releases), "
        "not_ported."
    )
    files: int
    guard: str | None = Field(default=None, description="For other_platform: the dispatch condition that selects it.")
    by: str | None = Field(
        default=None,
        description="imported_by_local: the first importing plugin path:line (+N other files); "
        "new_at_target: the base release it is absent from.",
    )


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
    change: MatrixChange
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


def _symbols(diff: SymbolDiff) -> Symbols:
    return Symbols(
        added=diff.added,
        removed=diff.removed,
        changed=diff.changed,
        renamed=[RenamedSymbol(**vars(r)) for r in diff.renamed],
        signatures=[SignatureChange(**vars(s)) for s in diff.signatures],
        bases=[BaseChange(symbol=b.symbol, local=list(b.local), upstream=list(b.upstream)) for b in diff.bases],
        unchanged=diff.unchanged,
    )


def _pair_result(report: PairReport) -> PairResult:
    pair = report.pair
    return PairResult(
        local=pair.local,
        upstream=pair.upstream,
        status=pair.status.value,
        rule=pair.rule.value,
        confidence=pair.confidence,
        flags=list(report.flags),
        evidence=list(pair.evidence),
        candidates=[Candidate(**vars(c)) for c in pair.candidates],
        alternatives=[Alternative(**vars(a)) for a in pair.alternatives],
        merged_from=list(pair.merged_from),
        stats=Stats(**vars(report.stats)) if report.stats else None,
        symbols=_symbols(report.symbols) if report.symbols else None,
        import_swaps=[ImportSwap(**vars(s)) for s in report.import_swaps],
        error=report.error,
        closest_release=report.closest_release,
        per_release=report.per_release,
    )


def _target_only(entry: TargetOnlyEntry) -> TargetOnly:
    return TargetOnly(
        upstream=entry.upstream, kind=entry.kind, reason=entry.reason, files=entry.files, guard=entry.guard, by=entry.by
    )


def _matrix_entry(row: MatrixRow) -> MatrixEntry:
    fields = vars(row) | {"also": [c.value for c in row.also], "evidence": list(row.evidence), "leads": list(row.leads)}
    return MatrixEntry(**fields)


def _check_detail(args: DiffModelInput) -> None:
    if args.detail == "diff" and not args.file:
        raise bad_input("detail=diff needs file: a plugin (or upstream) path from a summary call.")
    if args.file and args.detail not in ("diff", "matrix"):
        raise bad_input("file is only used with detail=diff or detail=matrix.")
    if args.detail == "releases" and not args.releases:
        raise bad_input("detail=releases needs releases: upstream tags (oldest first) or release directories.")


def diff_model(args: DiffModelInput, env: ToolEnv) -> DiffModelOutput:
    """Pair every plugin model file with its true upstream counterpart and diff them by symbol.

    Pairing follows evidence, never a same-name guess: the caller's mapping_overrides, the plugin's
    registration module (plugin-only), the upstream registry entry of an architecture the file
    registers, the same relative path, the platform branch the family's upstream `__init__` dispatch
    gives an out-of-tree platform (platform and shared directories flattened), shared top-level
    symbols (vendor affixes such as Maca dropped), upstream model-class bases, the import sites of
    paired files, the package a file's siblings pair into, and the upstream history (renamed and
    removed counterparts). Conflicting evidence is shown as alternatives; content similarity only proposes
    candidates and raises flags. Each pair has a
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
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    request = ModelDiffRequest(
        paths=args.paths,
        mapping_overrides=args.mapping_overrides,
        releases=args.releases,
        detail=args.detail,
        file=args.file,
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=inputs_fingerprint("diff_model", args.model_dump(mode="json")),
    )
    result = compare_models(plugin, upstream, request, env.policy, env.store)
    return DiffModelOutput(
        subject=plugin.label,
        upstream_target=target_label(upstream, mapping),
        pairs=[_pair_result(p) for p in result.pairs],
        total=result.total,
        next_cursor=result.next_cursor,
        counts=result.counts,
        target_only=[_target_only(t) for t in result.target_only],
        diff=result.diff,
        releases=[ReleaseInfo(label=r.label, commit=r.commit) for r in result.releases],
        families=[FamilyRelease(**vars(f)) for f in result.families],
        matrix=[_matrix_entry(r) for r in result.matrix],
        matrix_counts=result.matrix_counts,
        parse_errors=result.parse_errors,
        unknowns=result.unknowns,
        modules_indexed=result.modules_indexed,
        cache_hits=result.cache_hits,
        parsed=result.parsed,
    )


SPEC = ToolSpec(
    name="diff_model",
    effect=Effect.READS,
    run=diff_model,
    input_model=DiffModelInput,
    output_model=DiffModelOutput,
    title="Pair plugin model files with upstream and diff them by symbol",
    cpu_heavy=True,
)
