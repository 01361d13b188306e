"""Tool `diff_model`: every plugin model file against its true upstream counterpart, by symbol."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from ..core.compare.classify import DiffClass
from ..core.compare.describe import PairReport
from ..core.compare.inputs import target_label
from ..core.compare.matrix import MatrixChange, MatrixRow
from ..core.compare.model_diff import (
    MAX_DIFF_LINES,
    MAX_LIMITS,
    MAX_PAIRS,
    MAX_ROWS,
    Ask,
    Comparison,
    Detail,
    ModelDiff,
    ModelDiffRequest,
    Sizes,
    compare_models,
    report,
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
from .output import size_of
from .spec import NextCall, ToolEnv, ToolOutput, ToolSpec


class DiffModelInput(UpstreamArgs):
    paths: list[str] = Field(
        default_factory=lambda: ["vllm_metax/models/"], max_length=256, description="Plugin files or dirs."
    )
    mapping_overrides: dict[str, str | None] = Field(
        default_factory=dict, max_length=256, description="Plugin path -> upstream path (null: none)."
    )
    releases: list[str] = Field(
        default_factory=list,
        max_length=MAX_RELEASES,
        description="Upstream tags or dirs, oldest first: closest-release bases.",
    )
    detail: Detail = Field(
        default="summary",
        description="summary: pairs; symbols: + symbol diffs; releases: per release; matrix: classified "
        "rows; diff: `file`'s unified diff.",
    )
    file: str | None = Field(default=None, description="A pair's plugin or upstream path (diff, matrix).")
    cursor: str | None = None
    limit: int | None = Field(
        default=None,
        ge=1,
        le=MAX_DIFF_LINES,
        description=f"Pairs (max {MAX_PAIRS}), rows ({MAX_ROWS}) or lines a page at most.",
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
    plain_text_field: ClassVar[str | None] = "diff"
    """detail=diff: the text copy is this JSON without `diff`, a newline, then the diff itself."""

    subject: str = ""
    upstream_target: str = Field(default="", description="The upstream revision (or directory) compared against.")
    counts: dict[str, int] = Field(default_factory=dict, description="Pairs per status (all pages), target_only files.")
    total: int = Field(default=0, description="Pairs, matrix rows or diff lines over all pages.")
    next_cursor: str | None = None
    pairs: list[PairResult] = Field(default_factory=list, description="detail=diff: the pair, on the first page.")
    target_only: list[TargetOnly] = Field(default_factory=list, description="First page of pair details only.")
    diff: str = Field(default="", description="detail=diff: this page of the unified diff (upstream -> local).")
    releases: list[ReleaseInfo] = Field(default_factory=list, description="The releases compared, oldest first.")
    families: list[FamilyRelease] = Field(default_factory=list, description="With releases: closest per family.")
    matrix: list[MatrixEntry] = Field(default_factory=list, description="detail=matrix: rows by (local, symbol).")
    matrix_counts: dict[str, int] = Field(default_factory=dict, description="detail=matrix: rows per class.")
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


def check(args: DiffModelInput) -> None:
    """Refuse what this combination would ignore, before any work."""
    if args.detail == "diff" and not args.file:
        raise bad_input("detail=diff needs file: a plugin (or upstream) path from a summary call.")
    if args.file and args.detail not in ("diff", "matrix"):
        raise bad_input("file is only used with detail=diff or detail=matrix.")
    if args.detail == "releases" and not args.releases:
        raise bad_input("detail=releases needs releases: upstream tags (oldest first) or release directories.")
    if args.limit and args.limit > MAX_LIMITS[args.detail]:
        raise bad_input(f"limit for detail={args.detail} is at most {MAX_LIMITS[args.detail]}; got {args.limit}.")


def _output(result: ModelDiff, subject: str = "", target: str = "") -> DiffModelOutput:
    return DiffModelOutput(
        subject=subject,
        upstream_target=target,
        pairs=[_pair_result(p) for p in result.pairs],
        total=result.total,
        next_cursor=result.next_cursor,
        counts=result.counts,
        target_only=[_target_only(t) for t in result.target_only],
        diff="".join(f"{line}\n" for line in result.diff),
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


def _call(args: DiffModelInput, why: str, **changed: Any) -> NextCall:
    """The caller's own arguments with `changed` applied: the exact call to make next."""
    given = args.model_dump(mode="json", include=args.model_fields_set) | changed
    return NextCall(tool="diff_model", arguments={k: v for k, v in given.items() if v is not None}, why=why)


def _next_step(args: DiffModelInput, output: DiffModelOutput) -> NextCall | None:
    """Summary and symbols: the diff of the page's first changed pair; otherwise (or none) the next page."""
    changed = [p for p in output.pairs if p.status == "changed"] if args.detail in ("summary", "symbols") else []
    if changed:
        return _call(
            args,
            f"the diff of the first changed pair ({output.counts.get('changed', 0)} changed)",
            detail="diff",
            file=changed[0].local,
            cursor=None,
            limit=None,
        )
    if output.next_cursor:
        return _call(args, f"the next page of {output.total}", cursor=output.next_cursor)
    return None


def _sizes(args: DiffModelInput, subject: str, target: str) -> Sizes:
    """What the client receives, measured: the fixed part with the longest next_step this call can get."""
    probe = _call(args, "x" * 80, detail="diff", file="f" * 120, cursor="c" * 64)

    def fixed(result: ModelDiff) -> int:
        output = _output(result, subject, target).model_copy(update={"next_cursor": "c" * 64, "next_step": probe})
        return size_of(output) + 1

    return Sizes(
        fixed=fixed,
        pair=lambda pair: size_of(_pair_result(pair)),
        row=lambda row: size_of(_matrix_entry(row)),
        line=lambda line: len(line) + 1,
    )


def diff_model(args: DiffModelInput, env: ToolEnv) -> DiffModelOutput:
    """Pair each plugin model file with its upstream counterpart by evidence (never by name alone;
    conflicts as alternatives) and diff them by symbol; target_only: unpaired upstream files. With
    releases: each pair's closest release. Summary first; next_step names the next call.
    """
    check(args)
    comparison, subject, target = run(args, env)
    return answer(args, comparison, subject, target)


def run(args: DiffModelInput, env: ToolEnv) -> tuple[Comparison, str, str]:
    """The comparison the call names (every page of every detail level is cut from it), and its labels."""
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    request = ModelDiffRequest(paths=args.paths, mapping_overrides=args.mapping_overrides, releases=args.releases)
    comparison = compare_models(plugin, upstream, request, env.policy, env.store)
    return comparison, plugin.label, target_label(upstream, mapping)


def answer(args: DiffModelInput, comparison: Comparison, subject: str, target: str) -> DiffModelOutput:
    """The page the call asks for, with the call to make next."""
    fingerprint = inputs_fingerprint("diff_model", args.model_dump(mode="json"))
    ask = Ask(args.detail, args.file, args.cursor, args.limit, fingerprint)
    output = _output(report(comparison, ask, _sizes(args, subject, target)), subject, target)
    output.next_step = _next_step(args, output)
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
