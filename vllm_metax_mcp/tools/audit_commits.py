"""Tool `audit_commits`: every upstream commit in each plugin file's range, reviewed per file and
recorded in a ledger with evidence the server checks."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from ..core.audit.commits import (
    Commit,
    Hit,
    Listing,
    SymbolChange,
    Track,
    commit_patch,
    list_commits,
    other_files,
    symbol_changes,
)
from ..core.audit.dependents import Dependents
from ..core.audit.ledger import (
    Disposition,
    EvidenceChecker,
    Unaccounted,
    baseline_rows,
    change_ledger,
    differences,
    entries_by_commit,
    entry_key,
    inventory_node,
    ledger_id,
    load_ledger,
    new_ledger,
    plugin_symbol,
    render_markdown,
    unaccounted,
    write_text,
)
from ..core.audit.ranges import (
    FileBase,
    Range,
    ancestor_release,
    counterpart_imports,
    file_bases,
    file_ranges,
    file_tracks,
    matrix_bases,
    remember,
    stored_bases,
)
from ..core.code.codebase import Codebase
from ..core.code.module_index import RecordCache
from ..core.code.overrides import find_overrides, override_facts
from ..core.code.plugin_facts import plugin_facts
from ..core.code.registration import plugin_registrations
from ..core.compare.matrix import MatrixRow, difference_matrix
from ..core.compare.pairing import LOCAL_ROOT, Pair, Trees, build_trees, pair_files
from ..core.compare.releases import MAX_RELEASES, PairingInputs
from ..core.compare.textdiff import StatsCache
from ..core.foundation.errors import ToolFailure, bad_input, not_found
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import Page, inputs_fingerprint, paginate
from ..core.sources.environment import (
    UpstreamMapping,
    load_record,
    require_confirmed_target,
)
from ..core.sources.git import Repository
from ..core.sources.subjects import RevisionSubject, Subject, clean_path
from .arguments import (
    UpstreamArgs,
    open_plugin_repo,
    open_plugin_subject,
    open_upstream,
)
from .spec import ToolEnv, ToolOutput, ToolSpec

Action = Literal["list", "record", "baseline", "annotate", "status", "recheck", "export"]
CONFIRMED_ACTIONS = frozenset({"record", "baseline", "annotate"})
DEFAULT_LIMITS = {"commits": 8, "files": 50, "unaccounted": 40, "patch": 200}
MAX_LIMITS = {"commits": 200, "files": 2000, "unaccounted": 5000, "patch": 5000}
MAX_ENTRIES = 500
SHOWN = 10
"""Per-commit list items in a page of commits; `commit=<sha>` shows up to DETAIL_SHOWN."""
DETAIL_SHOWN = 2000
LEDGER_URI = "vllm-metax://ledgers/{}"
T = TypeVar("T")


class RecordEntry(BaseModel):
    commit: str = Field(description="Upstream commit (full or abbreviated sha) inside the file's range.")
    file: str = Field(description="Audited plugin file, repository-relative (vllm_metax/models/...).")
    disposition: Disposition
    local_edit: bool = Field(
        description="Whether the plugin file needs (or got) an edit for this commit; false keeps no-edit commits visible."
    )
    affected_interface: str = Field(
        min_length=1, description="The interface or behaviour the commit changes, or 'none'."
    )
    plugin_symbols: list[str] = Field(
        default_factory=list, description="Dependent plugin symbols: module:Name[.member], or a name in `file`."
    )
    evidence: list[Evidence] = Field(
        min_length=1,
        description="Checked items: file (path, line, rev = blob or revision), commit (in range), tool_result, test, probe; "
        "a note never stands alone and the judged commit itself does not count.",
    )


class AnnotateEntry(BaseModel):
    node: str = Field(description="A trace_dependency inventory row: module or module:Symbol.")
    disposition: Disposition
    evidence: list[Evidence] = Field(min_length=1, description="As for record entries.")


class AuditCommitsInput(UpstreamArgs):
    action: Action = Field(
        default="list",
        description="list: commits per page; record: decisions (entries); baseline: import diff_model's difference matrix; "
        "annotate: inventory rows (entries with node); status: per-file counts, paged; recheck: differences nothing "
        "explains, paged; export: JSON and markdown of the ledger.",
    )
    paths: list[str] = Field(
        default_factory=lambda: [f"{LOCAL_ROOT}/models/"], description="Plugin files or directories to audit."
    )
    mapping_overrides: dict[str, str | None] = Field(
        default_factory=dict, description="As diff_model's: plugin path -> upstream path."
    )
    releases: list[str] = Field(
        default_factory=list,
        max_length=MAX_RELEASES,
        description="Upstream release tags, oldest first: each file's base is its closest release (as diff_model computes it). "
        "Without releases or base the ledger's recorded bases are used.",
    )
    base: str | None = Field(default=None, description="One base revision for every file (overrides releases).")
    include_dependencies: bool = Field(
        default=False, description="Also follow the upstream modules each counterpart imports."
    )
    commit: str | None = Field(default=None, description="list: only this commit, with its full file and symbol lists.")
    patch: Literal["none", "mapped", "all"] = Field(
        default="none", description="list with commit: the patch of its mapped files (or all files), paged by lines."
    )
    entries: list[RecordEntry | AnnotateEntry] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        description="record: {commit, file, disposition, local_edit, affected_interface, plugin_symbols, evidence}; "
        "annotate: {node, disposition, evidence}. Each entry is checked and answered on its own.",
    )
    cursor: str | None = None
    limit: int | None = Field(
        default=None,
        description=f"Page size of the action's list: commits (default {DEFAULT_LIMITS['commits']}, max {MAX_LIMITS['commits']}), "
        f"files ({DEFAULT_LIMITS['files']}), unaccounted ({DEFAULT_LIMITS['unaccounted']}) or patch lines ({DEFAULT_LIMITS['patch']}).",
    )


class CommitFiles(BaseModel):
    mapped: list[str] = Field(description="Tracked upstream files the commit touched (paths at the commit).")
    renamed_from: dict[str, str] = Field(
        default_factory=dict, description="Mapped path -> the path it had before this commit."
    )
    production: list[str] = Field(
        description="Other production modules it touched (code outside tests, docs, benchmarks, CI)."
    )
    production_total: int
    other: list[str] = Field(description="Tests, docs, benchmarks, CI and non-code files.")
    other_total: int


class ChangedSymbol(BaseModel):
    file: str
    symbol: str = Field(description="module:Qualified.name (import:<alias> for an import, * for the whole module).")
    change: Literal["added", "removed", "changed", "moved", "unparsed"]


class DependentSymbol(BaseModel):
    plugin_symbol: str
    how: Literal["copy", "subclass", "override", "importer", "module_importer", "patch", "registration"]
    upstream_symbol: str


class LedgerEntry(BaseModel):
    commit: str
    file: str
    disposition: Disposition
    local_edit: bool
    affected_interface: str
    plugin_symbols: list[str]
    evidence: list[Evidence]
    recorded_at: float


class CommitOut(BaseModel):
    sha: str
    subject: str = Field(description="The commit title: context, never evidence.")
    author: str
    date: str
    local_files: list[str] = Field(description="Audited plugin files this commit needs an entry for.")
    files: CommitFiles
    changed_symbols: list[ChangedSymbol]
    changed_symbols_total: int
    dependent_plugin_symbols: list[DependentSymbol]
    dependents_total: int
    entries: list[LedgerEntry]


class FileRange(BaseModel):
    local: str
    upstream: str | None = Field(description="Counterpart at the target (null: none).")
    rule: str
    base: str | None = Field(description="Release or revision the range starts at (null: no base known).")
    followed: list[str] = Field(
        default_factory=list, description="Older upstream names of the counterpart within the range."
    )
    dependencies: int = Field(
        default=0, description="Upstream modules tracked besides the counterpart (include_dependencies)."
    )
    commits: int = 0
    with_entry: int = 0
    without_entry: int = 0


class EntryResult(BaseModel):
    index: int
    accepted: bool
    error: str | None = None
    code: str | None = None


class Summary(BaseModel):
    total: int = Field(default=0, description="Commits in range touching the audited files.")
    with_entry: int = Field(default=0, description="Commits with an entry for every audited file they touch.")
    without_entry: int = 0


class UnaccountedOut(BaseModel):
    local: str
    symbol: str
    upstream_symbol: str | None
    change: str
    proposed_class: str
    reason: str
    commits: list[str] = Field(
        description="Commits in range that changed the upstream symbol and have no entry for this file."
    )


class ExportOut(BaseModel):
    json_path: str = Field(description="State-directory-relative path of the JSON copy.")
    markdown_path: str
    document: dict[str, Any]
    markdown: str


class AuditCommitsOutput(ToolOutput):
    action: str = ""
    ledger_id: str = ""
    ledger_uri: str = Field(default="", description="The ledger as a read-only resource.")
    upstream_target: str = ""
    files: list[FileRange] = Field(
        default_factory=list, description="status: this page of files; list: the files of this page's commits."
    )
    commits: list[CommitOut] = Field(default_factory=list)
    patch: list[str] = Field(default_factory=list, description="list with commit and patch: this page of the patch.")
    total: int = Field(
        default=0, description="Items of the paged list (commits, files, unaccounted or patch lines) in all pages."
    )
    next_cursor: str | None = None
    results: list[EntryResult] = Field(default_factory=list)
    summary: Summary = Field(default_factory=Summary)
    unaccounted: list[UnaccountedOut] = Field(default_factory=list)
    baseline_rows: int = 0
    matrix_counts: dict[str, int] = Field(
        default_factory=dict, description="baseline/recheck: differences per proposed class."
    )
    complete: bool = Field(
        default=False, description="recheck/export only: every commit has an entry and nothing is unaccounted."
    )
    export: ExportOut | None = None
    unknowns: list[str] = Field(default_factory=list)
    next_step: str = ""


# -- what every action opens -------------------------------------------------------------------


@dataclass
class _Call:
    repo: Repository
    plugin: Subject
    upstream: RevisionSubject
    mapping: UpstreamMapping
    local_files: list[str]
    inputs: PairingInputs
    cache: RecordCache
    ledger_id: str
    ledger: dict[str, Any] | None
    fresh: dict[str, Any]

    @property
    def target(self) -> str:
        return self.upstream.commit

    @property
    def target_label(self) -> str:
        return self.mapping.target or self.target[:12]


@dataclass
class _Scope:
    """Pairing at the target, each file's base, and what to list."""

    trees: Trees
    pairs: list[Pair]
    bases: dict[str, FileBase]
    tracks: list[Track]
    unknowns: list[str]


def _registrations(plugin: Subject, prefixes: list[str]) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for prefix in prefixes:
        for registration in plugin_registrations(plugin, prefix):
            line, count = found.get(registration.path, (registration.line, 0))
            found[registration.path] = (min(line, registration.line), count + 1)
    return found


def _open(args: AuditCommitsInput, env: ToolEnv) -> _Call:
    repo = open_plugin_repo(args, env)
    if repo is None:
        raise bad_input(
            "audit_commits keeps one ledger per plugin repository: use subject worktree, index, revision or installed."
        )
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    if not isinstance(upstream, RevisionSubject):
        raise bad_input(
            "audit_commits needs a git upstream (commits exist only in a repository): pass upstream=<vLLM clone> and target."
        )
    if args.action in CONFIRMED_ACTIONS:
        require_confirmed_target(load_record(env.store, repo), mapping if args.upstream else None)
    prefixes = [clean_path(p) for p in args.paths]
    local_files = sorted({p for prefix in prefixes for p in plugin.list(prefix) if p.endswith(".py")})
    if not local_files:
        raise not_found(
            f"No Python files under {', '.join(args.paths)} in the {plugin.label} subject; pass paths such as vllm_metax/models/."
        )
    overrides = {}
    for local, counterpart in args.mapping_overrides.items():
        if clean_path(local) not in local_files:
            raise bad_input(f"mapping_overrides names {local}, which is not a Python file under paths.")
        overrides[clean_path(local)] = clean_path(counterpart) if counterpart else None
    inputs = PairingInputs(local_files, prefixes, overrides, _registrations(plugin, prefixes))
    identifier = ledger_id(repo.key, upstream.commit)
    return _Call(
        repo,
        plugin,
        upstream,
        mapping,
        local_files,
        inputs,
        RecordCache(env.store),
        identifier,
        load_ledger(env.store, identifier),
        new_ledger(identifier, repo.key, mapping.as_dict()),
    )


def _bases(args: AuditCommitsInput, env: ToolEnv, call: _Call, pairs: list[Pair] | None) -> dict[str, FileBase]:
    """Each file's base, as the call names it (and then remembered) or as the ledger recorded it.

    Without the target's `pairs` (record, annotate) one explicit base is taken without pairing there.
    """
    if not (args.base or args.releases):
        return stored_bases(call.ledger, call.local_files)
    if len(set(args.releases)) != len(args.releases):
        raise bad_input("releases names a release twice; list each once, oldest first.")
    releases = [
        ancestor_release(call.upstream.repo, label, call.target)
        for label in ([args.base] if args.base else args.releases)
    ]
    if args.base and pairs is None:
        bases = {local: FileBase(args.base, releases[0].commit or "") for local in call.local_files}
    else:
        known = {call.target: pairs} if pairs else {}
        bases = file_bases(
            call.plugin, releases, call.cache, StatsCache(env.store), call.inputs, known, one_base=bool(args.base)
        )
    call.ledger = change_ledger(env.store, call.fresh, lambda ledger: remember(ledger["bases"], bases))
    return bases


def _codebase(call: _Call, trees: Trees) -> Codebase:
    return Codebase(trees.index, {"plugin": call.plugin, "upstream": call.upstream}, frozenset({"vllm", LOCAL_ROOT}))


def _scope(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> _Scope:
    prefixes = sorted({f"{LOCAL_ROOT}/", *call.inputs.prefixes})
    trees = build_trees(
        call.plugin, call.upstream, call.cache, prefixes, [u for u in call.inputs.overrides.values() if u]
    )
    pairs = pair_files(
        trees, call.local_files, call.inputs.overrides, call.inputs.registrations, judge_content=False
    ).pairs
    bases = _bases(args, env, call, pairs)
    code = _codebase(call, trees)
    imports = (lambda counterpart: counterpart_imports(trees, code, counterpart)) if args.include_dependencies else None
    tracks, unknowns = file_tracks(pairs, bases, imports)
    if not tracks and any(p.upstream for p in pairs):
        raise bad_input(
            "No file has a base: pass releases (tags, oldest first) or base once; the ledger then remembers them."
        )
    return _Scope(trees, pairs, bases, tracks, unknowns)


# -- counting ----------------------------------------------------------------------------------


def _recorded(call: _Call) -> set[tuple[str, str]]:
    return {(e["commit"], e["file"]) for e in (call.ledger or {}).get("entries", {}).values()}


def _files(scope: _Scope, listing: Listing, recorded: set[tuple[str, str]]) -> list[FileRange]:
    tracks = {t.local: t for t in scope.tracks}
    rows = []
    for pair in scope.pairs:
        shas = listing.hits.get(pair.local, {})
        done = sum(1 for sha in shas if (sha, pair.local) in recorded)
        track = tracks.get(pair.local)
        rows.append(
            FileRange(
                local=pair.local,
                upstream=pair.upstream,
                rule=pair.rule.value,
                base=scope.bases[pair.local].label if track else None,
                followed=listing.followed.get(pair.local, []),
                dependencies=len(track.paths) - 1 if track else 0,
                commits=len(shas),
                with_entry=done,
                without_entry=len(shas) - done,
            )
        )
    return rows


def _summary(listing: Listing, recorded: set[tuple[str, str]]) -> Summary:
    done = sum(1 for sha in listing.commits if all((sha, f) in recorded for f in listing.files_of(sha)))
    return Summary(total=len(listing.commits), with_entry=done, without_entry=len(listing.commits) - done)


def _output(args: AuditCommitsInput, call: _Call, **fields: Any) -> AuditCommitsOutput:
    label = (
        f"{call.mapping.target} ({call.target[:12]})"
        if call.mapping.target and call.mapping.target != call.target
        else call.target[:12]
    )
    return AuditCommitsOutput(
        action=args.action,
        ledger_id=call.ledger_id,
        ledger_uri=LEDGER_URI.format(call.ledger_id),
        upstream_target=label,
        **fields,
    )


def _page(args: AuditCommitsInput, items: list[T], kind: str) -> Page[T]:
    fingerprint = inputs_fingerprint("audit_commits", args.model_dump(mode="json"))
    return paginate(
        items,
        cursor=args.cursor,
        limit=args.limit,
        fingerprint=fingerprint,
        default_limit=DEFAULT_LIMITS[kind],
        max_limit=MAX_LIMITS[kind],
    )


# -- list ----------------------------------------------------------------------------------------


def _commit_out(
    commit: Commit,
    hits: list[Hit],
    listing: Listing,
    changes: list[SymbolChange],
    dependents: Dependents,
    entries: list[dict[str, Any]],
    shown: int,
) -> CommitOut:
    production, other = other_files(commit, hits)
    found = dependents.of_changes(changes, {hit.path: hit.target_path for hit in hits})
    return CommitOut(
        sha=commit.sha,
        subject=commit.subject,
        author=commit.author,
        date=commit.date,
        local_files=listing.files_of(commit.sha),
        files=CommitFiles(
            mapped=sorted(hit.path for hit in hits),
            renamed_from={h.path: h.previous for h in hits if h.previous},
            production=production[:shown],
            production_total=len(production),
            other=other[:shown],
            other_total=len(other),
        ),
        changed_symbols=[ChangedSymbol(file=c.path, symbol=c.symbol, change=c.change) for c in changes[:shown]],
        changed_symbols_total=len(changes),
        dependent_plugin_symbols=[DependentSymbol(**asdict(d)) for d in found[:shown]],
        dependents_total=len(found),
        entries=[LedgerEntry.model_validate(e) for e in sorted(entries, key=lambda e: e["file"])],
    )


def _list(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> AuditCommitsOutput:
    scope = _scope(args, env, call)
    listing = list_commits(call.upstream.repo, scope.tracks, call.target)
    recorded = _recorded(call)
    commits, shown = listing.ordered(), SHOWN
    if args.commit:
        sha = call.upstream.repo.resolve_commit(args.commit)
        if sha not in listing.commits:
            raise not_found(
                f"{args.commit} touches none of the audited files' upstream files within their ranges; list without commit."
            )
        commits, shown = [listing.commits[sha]], DETAIL_SHOWN
    output = _output(args, call, summary=_summary(listing, recorded), unknowns=scope.unknowns + listing.unknowns)
    if args.patch != "none":
        hits = listing.hits_of(commits[0].sha) if args.patch == "mapped" else None
        page: Page[Any] = _page(args, commit_patch(call.upstream.repo, commits[0].sha, hits), "patch")
        output.patch = page.items
    else:
        page = _page(args, commits, "commits")
        commits = page.items
    touched = [(c, listing.hits_of(c.sha)) for c in commits]
    changes = symbol_changes(call.upstream.repo, call.cache, touched)
    code = _codebase(call, scope.trees)
    dependents = Dependents(
        code, scope.pairs, find_overrides(code, override_facts(env.store, code, frozenset({LOCAL_ROOT})), None)
    )
    by_commit = entries_by_commit(call.ledger)
    output.commits = [
        _commit_out(c, hits, listing, changes[c.sha], dependents, by_commit.get(c.sha, []), shown)
        for c, hits in touched
    ]
    involved = {f for c in output.commits for f in c.local_files}
    output.files = [f for f in _files(scope, listing, recorded) if f.local in involved]
    output.total, output.next_cursor = page.total, page.next_cursor
    output.next_step = (
        "Read each commit's patch (commit=<sha>, patch=mapped), inspect its other production modules and the dependent "
        "plugin symbols, then record one entry per (commit, local file) with checkable evidence (action=record)."
    )
    return output


# -- record and annotate ------------------------------------------------------------------------


def _checker(env: ToolEnv, call: _Call, bases: dict[str, FileBase]) -> EvidenceChecker:
    trees: list[Subject] = [call.plugin, call.upstream]
    trees += [RevisionSubject(call.upstream.repo, commit) for commit in sorted({b.commit for b in bases.values()})]
    return EvidenceChecker(env.store, trees, [call.upstream.repo, call.repo], call.upstream.repo)


def _checked_entry(
    entry: RecordEntry, call: _Call, ranges: dict[str, Range], checker: EvidenceChecker
) -> dict[str, Any]:
    local = clean_path(entry.file)
    if local not in call.local_files:
        raise bad_input(f"{entry.file} is not an audited file (a Python file under paths).")
    if local not in ranges:
        raise bad_input(f"{local} has no base, so its range is unknown: pass releases or base.")
    commit = call.upstream.repo.resolve_commit(entry.commit)
    if commit not in ranges[local].commits:
        raise bad_input(f"commit {commit[:12]} is outside {local}'s range {ranges[local].label}.")
    symbols = [plugin_symbol(s, local, call.plugin, call.cache) for s in entry.plugin_symbols]
    evidence = checker.check(entry.evidence, ranges[local], judged=commit)
    return {
        "commit": commit,
        "file": local,
        "disposition": entry.disposition,
        "local_edit": entry.local_edit,
        "affected_interface": entry.affected_interface,
        "plugin_symbols": symbols,
        "evidence": [item.model_dump(mode="json") for item in evidence],
        "recorded_at": time.time(),
    }


def _checked_annotation(
    entry: AnnotateEntry, call: _Call, scope: Range | None, checker: EvidenceChecker
) -> dict[str, Any]:
    node = inventory_node(entry.node, call.plugin, call.upstream, call.cache)
    evidence = checker.check(entry.evidence, scope)
    return {
        "node": node,
        "disposition": entry.disposition,
        "recorded_at": time.time(),
        "evidence": [item.model_dump(mode="json") for item in evidence],
    }


def _decide(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> AuditCommitsOutput:
    """record and annotate: each entry checked and answered on its own, the accepted stored at once."""
    bases = _bases(args, env, call, None)
    ranges = file_ranges(call.upstream.repo, bases, call.target, call.target_label)
    union = (
        Range(f"a base..{call.target_label}", frozenset().union(*(r.commits for r in ranges.values())))
        if ranges
        else None
    )
    checker = _checker(env, call, bases)
    wanted, section = (RecordEntry, "entries") if args.action == "record" else (AnnotateEntry, "annotations")
    results: list[EntryResult] = []
    accepted: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(args.entries):
        try:
            if isinstance(entry, RecordEntry) and wanted is RecordEntry:
                stored = _checked_entry(entry, call, ranges, checker)
                accepted[entry_key(stored["commit"], stored["file"])] = stored
            elif isinstance(entry, AnnotateEntry) and wanted is AnnotateEntry:
                stored = _checked_annotation(entry, call, union, checker)
                accepted[stored["node"]] = stored
            else:
                raise bad_input(f"action={args.action} takes entries of the form {{{', '.join(wanted.model_fields)}}}.")
        except ToolFailure as failure:
            results.append(EntryResult(index=index, accepted=False, error=failure.message, code=failure.code.value))
            continue
        results.append(EntryResult(index=index, accepted=True))
    if accepted:
        call.ledger = change_ledger(env.store, call.fresh, lambda ledger: ledger[section].update(accepted))
    output = _output(args, call, results=results)
    output.next_step = "status (action=status) shows the commits still without an entry; recheck then the differences."
    return output


# -- status, baseline, recheck, export -----------------------------------------------------------


def _status(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> AuditCommitsOutput:
    scope = _scope(args, env, call)
    listing = list_commits(call.upstream.repo, scope.tracks, call.target)
    recorded = _recorded(call)
    page = _page(args, _files(scope, listing, recorded), "files")
    output = _output(
        args,
        call,
        files=page.items,
        total=page.total,
        next_cursor=page.next_cursor,
        summary=_summary(listing, recorded),
        unknowns=scope.unknowns + listing.unknowns,
    )
    output.next_step = (
        "Record entries for the commits without one (action=list shows them), then recheck (action=recheck)."
        if output.summary.without_entry
        else "Every commit has an entry: recheck the differences (action=recheck)."
    )
    return output


def _matrix(call: _Call, scope: _Scope) -> tuple[list[MatrixRow], list[str]]:
    """diff_model's difference matrix, each file measured from the base its range starts at."""
    releases, closest = matrix_bases(call.upstream.repo, scope.bases)
    return difference_matrix(scope.trees, scope.pairs, plugin_facts(call.plugin), call.cache, closest, releases)


def _counts(rows: list[MatrixRow]) -> dict[str, int]:
    return dict(sorted(Counter(r.proposed_class.value for r in rows).items()))


def _baseline(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> AuditCommitsOutput:
    scope = _scope(args, env, call)
    rows, gaps = _matrix(call, scope)
    imported = baseline_rows(differences(rows, scope.trees))
    audited = set(call.local_files)

    def store(ledger: dict[str, Any]) -> None:
        kept = {
            k: v for k, v in ((ledger.get("baseline") or {}).get("rows") or {}).items() if v["local"] not in audited
        }
        ledger["baseline"] = {"taken_at": time.time(), "rows": {**kept, **imported}}

    call.ledger = change_ledger(env.store, call.fresh, store)
    output = _output(
        args, call, baseline_rows=len(imported), unknowns=scope.unknowns + gaps, matrix_counts=_counts(rows)
    )
    output.next_step = (
        "The baseline explains today's differences; after edits, recheck reports any difference it no longer explains."
    )
    return output


@dataclass
class _Recheck:
    scope: _Scope
    listing: Listing
    rows: list[MatrixRow]
    unaccounted: list[Unaccounted]
    summary: Summary
    gaps: list[str]
    """What the matrix could not compare (a base that does not parse)."""

    @property
    def complete(self) -> bool:
        return not self.unaccounted and self.summary.without_entry == 0 and not self.scope.unknowns

    @property
    def unknowns(self) -> list[str]:
        return self.scope.unknowns + self.listing.unknowns + self.gaps


def _run_recheck(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> _Recheck:
    """The differences now, and which of them neither the baseline nor an entry explains."""
    scope = _scope(args, env, call)
    listing = list_commits(call.upstream.repo, scope.tracks, call.target)
    rows, gaps = _matrix(call, scope)
    found = differences(rows, scope.trees)
    involved = sorted({d.local for d in found})
    touched = {
        sha: (listing.commits[sha], hits) for local in involved for sha, hits in listing.hits.get(local, {}).items()
    }
    changes = symbol_changes(call.upstream.repo, call.cache, list(touched.values()))
    changed: dict[str, dict[str, list[str]]] = {}
    for local in involved:
        for sha in listing.hits.get(local, {}):
            for change in changes[sha]:
                changed.setdefault(local, {}).setdefault(change.qualified, []).append(sha)
    summary = _summary(listing, _recorded(call))
    return _Recheck(scope, listing, rows, unaccounted(found, call.ledger, changed), summary, gaps)


def _unaccounted_out(found: list[Unaccounted]) -> list[UnaccountedOut]:
    return [
        UnaccountedOut(
            local=u.difference.local,
            symbol=u.difference.symbol,
            upstream_symbol=u.difference.upstream_symbol,
            change=u.difference.change,
            proposed_class=u.difference.proposed_class,
            reason=u.reason,
            commits=list(u.commits),
        )
        for u in found
    ]


def _recheck(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> AuditCommitsOutput:
    check = _run_recheck(args, env, call)
    page = _page(args, _unaccounted_out(check.unaccounted), "unaccounted")
    output = _output(
        args,
        call,
        unaccounted=page.items,
        total=page.total,
        next_cursor=page.next_cursor,
        summary=check.summary,
        complete=check.complete,
        unknowns=check.unknowns,
        matrix_counts=_counts(check.rows),
    )
    output.next_step = (
        "Complete: export the ledger (action=export)."
        if output.complete
        else (
            "Explain each unaccounted difference with an entry naming its plugin symbol (or record the commits that changed it), "
            "or take a new baseline once the difference is confirmed intended; record entries for commits still without one."
        )
    )
    return output


def _document(call: _Call, check: _Recheck) -> dict[str, Any]:
    """The export: files, decisions, commits without one, unaccounted differences, baseline, annotations."""
    recorded = _recorded(call)
    ledger = call.ledger or call.fresh
    baseline = ledger.get("baseline")
    listing = check.listing
    return {
        "ledger_id": call.ledger_id,
        "upstream": call.mapping.as_dict(),
        "summary": check.summary.model_dump(),
        "complete": check.complete,
        "files": [f.model_dump() for f in _files(check.scope, listing, recorded)],
        "entries": sorted(ledger["entries"].values(), key=lambda e: (e["file"], e["commit"])),
        "subjects": {sha: c.subject for sha, c in listing.commits.items()},
        "missing": [
            {"commit": c.sha, "subject": c.subject, "files": missing}
            for c in listing.ordered()
            if (missing := [f for f in listing.files_of(c.sha) if (c.sha, f) not in recorded])
        ],
        "unaccounted": [u.model_dump() for u in _unaccounted_out(check.unaccounted)],
        "baseline": {
            "taken_at": baseline["taken_at"],
            "rows": len(baseline["rows"]),
            "classes": dict(Counter(r["proposed_class"] for r in baseline["rows"].values())),
        }
        if baseline
        else None,
        "annotations": sorted(ledger["annotations"].values(), key=lambda a: a["node"]),
        "unknowns": check.unknowns,
    }


def _export(args: AuditCommitsInput, env: ToolEnv, call: _Call) -> AuditCommitsOutput:
    check = _run_recheck(args, env, call)
    document = _document(call, check)
    markdown = render_markdown(document)
    json_path, markdown_path = f"exports/{call.ledger_id}.json", f"exports/{call.ledger_id}.md"
    env.store.write(json_path, document)
    write_text(env.store, markdown_path, markdown)
    return _output(
        args,
        call,
        summary=check.summary,
        complete=check.complete,
        unknowns=document["unknowns"],
        export=ExportOut(json_path=json_path, markdown_path=markdown_path, document=document, markdown=markdown),
    )


ACTIONS = {
    "list": _list,
    "record": _decide,
    "annotate": _decide,
    "status": _status,
    "baseline": _baseline,
    "recheck": _recheck,
    "export": _export,
}


def _check_arguments(args: AuditCommitsInput) -> None:
    if args.patch != "none" and (args.action != "list" or not args.commit):
        raise bad_input("patch needs action=list and commit (the sha whose patch to read).")
    if args.commit and args.action != "list":
        raise bad_input("commit is only used with action=list.")
    if args.entries and args.action not in ("record", "annotate"):
        raise bad_input("entries are only taken by action=record or action=annotate.")
    if args.action in ("record", "annotate") and not args.entries:
        raise bad_input(f"action={args.action} needs entries.")


def audit_commits(args: AuditCommitsInput, env: ToolEnv) -> AuditCommitsOutput:
    """Every upstream commit in each plugin file's range, reviewed per (commit, file) and recorded.

    A file's range runs from its base (its closest release among `releases`, as diff_model pairs
    it, or `base`; later calls reuse the ledger's) to the target, over its upstream counterpart
    (renames and moves followed) and, with include_dependencies, the modules that counterpart
    imports. list pages the commits: touched files split into mapped, other production modules
    and other (tests, docs, benchmarks, CI), the upstream symbols each changed, the plugin symbols
    depending on them (copies, subclasses, importers, patches), and the patch on request. A title
    is never evidence. record takes a batch of decisions and answers each: disposition, local_edit,
    affected interface, plugin symbols and evidence the server verifies (file lines exist at the
    cited revision, commits lie in range, results and probes exist; a note never stands alone).
    baseline imports diff_model's difference matrix, annotate marks trace_dependency inventory
    rows, status counts commits with and without an entry, recheck reports every local-vs-target
    difference neither the baseline nor an entry explains, export writes JSON and markdown.
    record, baseline and annotate need a confirmed target; everything writes only the state
    directory.
    """
    _check_arguments(args)
    return ACTIONS[args.action](args, env, _open(args, env))


SPEC = ToolSpec(
    name="audit_commits",
    effect=Effect.READS,
    run=audit_commits,
    input_model=AuditCommitsInput,
    output_model=AuditCommitsOutput,
    title="Audit upstream commits per plugin file into a ledger",
    idempotent=False,
    cpu_heavy=True,
)
