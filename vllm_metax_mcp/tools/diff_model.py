"""Tool `diff_model`: every plugin model file against its true upstream counterpart, by symbol."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel, Field

from ..core.errors import bad_input, not_found
from ..core.evidence import Evidence
from ..core.pairing import Pair, Rule, Status, Trees, pair_files
from ..core.policy import Effect
from ..core.pyindex import ModuleIndex, RecordCache, module_name
from ..core.registration import plugin_registrations
from ..core.results import inputs_fingerprint, paginate
from ..core.subjects import Subject, clean_path
from ..core.symdiff import SymbolDiff, diff_extension, diff_symbols, import_swaps
from ..core.textdiff import StatsCache, split_lines, unified_diff
from .base import ToolEnv, ToolOutput, ToolSpec
from .common import UpstreamArgs, open_plugin_repo, open_plugin_subject, open_upstream

DEFAULT_LIMITS = {"summary": 20, "symbols": 5, "diff": 200}
MAX_PAIRS = 500
MAX_DIFF_LINES = 5000


class DiffModelInput(UpstreamArgs):
    paths: list[str] = Field(
        default_factory=lambda: ["vllm_metax/models/"],
        description="Plugin paths (files or directories) whose Python files are compared.",
    )
    mapping_overrides: dict[str, str | None] = Field(
        default_factory=dict,
        description="Plugin path -> upstream path (null: no counterpart); wins over every pairing rule.",
    )
    detail: Literal["summary", "symbols", "diff"] = Field(
        default="summary",
        description="summary: pairs with status, rule, flags, stats; symbols: plus the symbol diff and import "
        "swaps; diff: the unified diff of `file`, paged by lines.",
    )
    file: str | None = Field(default=None, description="detail=diff: the plugin (or upstream) path of one pair.")
    cursor: str | None = None
    limit: int | None = Field(
        default=None,
        description=f"Pairs per page (default {DEFAULT_LIMITS['summary']}, {DEFAULT_LIMITS['symbols']} with "
        f"detail=symbols; max {MAX_PAIRS}) or diff lines (default {DEFAULT_LIMITS['diff']}, max {MAX_DIFF_LINES}).",
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
    changed: list[str] = Field(default_factory=list, description="Body differs (docstrings, comments, blank lines ignored).")
    renamed: list[RenamedSymbol] = Field(default_factory=list)
    signatures: list[SignatureChange] = Field(default_factory=list)
    bases: list[BaseChange] = Field(default_factory=list)


class ImportSwap(BaseModel):
    name: str
    local_module: str
    upstream_module: str
    line: int = Field(description="Line of the local import.")
    paired: bool = Field(description="The local module is the pair of the upstream module (a copy follows its original).")


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
    candidates: list[Candidate] = Field(default_factory=list, description="Alternatives content or a tie proposes; never decisive.")
    stats: Stats | None = None
    symbols: Symbols | None = None
    import_swaps: list[ImportSwap] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why a side could not be parsed.")


class TargetOnly(BaseModel):
    upstream: str = Field(description="A file, or a directory (trailing /) standing for `files` files.")
    kind: Literal["family", "branch", "shared", "other_platform", "unreferenced", "directory"]
    files: int
    guard: str | None = Field(default=None, description="For other_platform: the dispatch condition that selects it.")


class DiffModelOutput(ToolOutput):
    subject: str = ""
    upstream_target: str = Field(default="", description="The upstream revision (or directory) compared against.")
    pairs: list[PairResult] = Field(default_factory=list)
    total: int = Field(default=0, description="Pairs in all pages, or diff lines with detail=diff.")
    next_cursor: str | None = None
    counts: dict[str, int] = Field(default_factory=dict, description="Pairs per status over all pages, and target_only files.")
    target_only: list[TargetOnly] = Field(default_factory=list, description="Not repeated with detail=diff.")
    diff: list[str] = Field(default_factory=list, description="detail=diff: this page of the unified diff (upstream -> local).")
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
            raise bad_input(f"mapping_overrides names {local}, which is not a Python file under paths; use a path from a summary call.")
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
        self.paired = {
            module_name(p.local) or "": module_name(p.upstream) or "" for p in pairs if p.upstream
        }

    def _error(self, pair: Pair) -> str | None:
        sides = [("local", self.trees.local_modules.get(pair.local))]
        if pair.upstream and pair.upstream in self.trees.upstream_files:
            sides.append(("upstream", self.trees.upstream_modules.get(pair.upstream)))
        problems = [f"{side}: {module.record.error}" for side, module in sides if module is not None and module.record.error]
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
            raise bad_input(f"{pair.local} has no counterpart at the target (status {pair.status.value}): there is nothing to diff.")
        upstream_text, local_text = self._texts(pair)
        return unified_diff(upstream_text, local_text, pair.upstream, pair.local)


def _find(pairs: list[Pair], file: str) -> Pair:
    path = clean_path(file)
    for pair in pairs:
        if path in (pair.local, pair.upstream):
            return pair
    raise not_found(f"{file} is neither a compared plugin file nor a paired upstream file; list the pairs with detail=summary.")


def _target_label(upstream: Subject, target: str | None, commit: str | None) -> str:
    if commit:
        return f"{target} ({commit[:12]})" if target and target != commit else commit[:12]
    return f"{upstream.label} (no revision)"


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
    """
    if args.detail == "diff" and not args.file:
        raise bad_input("detail=diff needs file: a plugin (or upstream) path from a summary call.")
    if args.file and args.detail != "diff":
        raise bad_input("file is only used with detail=diff.")
    prefixes = [clean_path(p) for p in args.paths]
    repo = open_plugin_repo(args, env)
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    local_files = sorted({p for prefix in prefixes for p in plugin.list(prefix) if p.endswith(".py")})
    if not local_files:
        raise not_found(f"No Python files under {', '.join(args.paths)} in the {plugin.label} subject; pass paths such as vllm_metax/models/.")
    overrides = _overrides(args.mapping_overrides, local_files)
    cache = RecordCache(env.store)
    index = ModuleIndex()
    index.add_tree("plugin", plugin, cache, prefixes)
    index.add_tree("upstream", upstream, cache, ["vllm/", *(u for u in overrides.values() if u)])
    trees = Trees(plugin, upstream, index)
    pairing = pair_files(trees, local_files, overrides, _registrations(plugin, prefixes))
    describer = _Describer(trees, StatsCache(env.store), pairing.pairs)
    fingerprint = inputs_fingerprint("diff_model", args.model_dump(mode="json"))
    output = DiffModelOutput(
        subject=plugin.label,
        upstream_target=_target_label(upstream, mapping.target, mapping.target_commit),
        unknowns=pairing.unknowns,
    )
    limit_max = MAX_DIFF_LINES if args.detail == "diff" else MAX_PAIRS
    if args.detail == "diff":
        pair = _find(pairing.pairs, args.file or "")
        page = paginate(describer.diff_lines(pair), cursor=args.cursor, limit=args.limit, fingerprint=fingerprint,
                        default_limit=DEFAULT_LIMITS["diff"], max_limit=limit_max)
        output.pairs, output.diff = [describer.describe(pair, symbols=True)], page.items
    else:
        page = paginate(pairing.pairs, cursor=args.cursor, limit=args.limit, fingerprint=fingerprint,
                        default_limit=DEFAULT_LIMITS[args.detail], max_limit=limit_max)
        output.pairs = [describer.describe(p, symbols=args.detail == "symbols") for p in page.items]
        output.target_only = [TargetOnly(**vars(t)) for t in pairing.target_only]
    output.total, output.next_cursor = page.total, page.next_cursor
    output.counts = dict(sorted(Counter(p.status.value for p in pairing.pairs).items()))
    output.counts["target_only"] = sum(t.files for t in pairing.target_only)
    paired_upstream = {p.upstream for p in pairing.pairs if p.upstream}
    output.parse_errors = sorted(
        f"{path}: {module.record.error}"
        for modules, wanted in ((trees.local_modules, set(local_files)), (trees.upstream_modules, paired_upstream))
        for path, module in modules.items()
        if module.record.error and path in wanted
    )
    output.modules_indexed, output.cache_hits, output.parsed = len(index.modules), cache.hits, cache.misses
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
