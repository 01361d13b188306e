"""Tool `audit_commits`: every upstream commit in each plugin file's range, reviewed per file and
recorded in a ledger with evidence the server checks. The work is core/audit's; here are the
models, the argument checks, the subjects a call opens and the mapping to the output."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..core.audit.commits import SymbolChangeKind
from ..core.audit.counts import Status, status
from ..core.audit.decisions import EntryOutcome, ProposedAnnotation, ProposedDecision, decide
from ..core.audit.dependents import DependencyKind
from ..core.audit.export import Export, export
from ..core.audit.lagging import DeclaredBase
from ..core.audit.ledger import Disposition, Side
from ..core.audit.listing import CommitPage, ListedCommit, list_page
from ..core.audit.local_history import LocalCommit, local_history
from ..core.audit.recheck import Baseline, Recheck, run_recheck, take_baseline
from ..core.audit.scope import ScopeRequest
from ..core.audit.session import DEFAULT_LIMITS, MAX_LIMITS, AuditSession, Paging, open_session
from ..core.code.module_index import RecordCache
from ..core.compare.inputs import target_label
from ..core.compare.releases import MAX_RELEASES
from ..core.foundation.errors import bad_input
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import inputs_fingerprint
from ..core.sources.environment import load_record, require_confirmed_target
from ..core.sources.subjects import RevisionSubject
from .arguments import UpstreamArgs, open_plugin_repo, open_plugin_subject, open_upstream
from .spec import ToolEnv, ToolOutput, ToolSpec

Action = Literal["list", "local", "record", "baseline", "annotate", "status", "recheck", "export"]
CONFIRMED_ACTIONS = frozenset({"record", "baseline", "annotate"})
MAX_ENTRIES = 500
SHOWN = 10  # per-commit list items in a page of commits; `commit=<sha>` shows up to DETAIL_SHOWN
DETAIL_SHOWN = 2000
LEDGER_URI = "vllm-metax://ledgers/{}"


class RecordEntry(BaseModel):
    commit: str = Field(description="Upstream commit (full or abbreviated sha) inside the file's range.")
    file: str = Field(description="Audited plugin file, repository-relative (vllm_metax/models/...).")
    side: Side = Field(
        default="upstream", description="plugin: commit is a plugin commit of local_range and file one it touched."
    )
    disposition: Disposition
    local_edit: bool = Field(
        description="Whether the plugin file needs (or got) an edit for this commit; "
        "false keeps no-edit commits visible."
    )
    affected_interface: str = Field(
        min_length=1, description="The interface or behaviour the commit changes, or 'none'."
    )
    plugin_symbols: list[str] = Field(
        default_factory=list, description="Dependent plugin symbols: module:Name[.member], or a name in `file`."
    )
    evidence: list[Evidence] = Field(
        min_length=1,
        description="Checked items: file (path, line, rev = blob or revision), commit (in range), tool_result, test, "
        "probe; a note never stands alone and the judged commit itself does not count.",
    )


class AnnotateEntry(BaseModel):
    node: str = Field(description="A trace_dependency inventory row: module or module:Symbol.")
    disposition: Disposition
    evidence: list[Evidence] = Field(min_length=1, description="As for record entries.")


class AuditCommitsInput(UpstreamArgs):
    action: Action = Field(
        default="list",
        description="list: commits per page; local: the plugin's own commits in local_range (moves with the "
        "imports still naming the old module, dropped op bindings still called); record: decisions (entries); "
        "baseline: import diff_model's difference "
        "matrix; annotate: inventory rows (entries with node); status: per-file counts, paged; recheck: differences "
        "nothing explains, paged; export: JSON and markdown of the ledger.",
    )
    paths: list[str] = Field(
        default_factory=lambda: ["vllm_metax/models/"], description="Plugin files or directories to audit."
    )
    mapping_overrides: dict[str, str | None] = Field(
        default_factory=dict, description="As diff_model's: plugin path -> upstream path."
    )
    releases: list[str] = Field(
        default_factory=list,
        max_length=MAX_RELEASES,
        description="Upstream release tags, oldest first: each file's base is its closest release "
        "(as diff_model computes it). Without releases or base the ledger's recorded bases are used.",
    )
    base: str | None = Field(default=None, description="One base revision for every file (overrides releases).")
    local_range: str | None = Field(
        default=None,
        description="local, and record with side=plugin: START..END revisions of the plugin repository "
        "(e.g. its last upgrade).",
    )
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
        description="Page size of the action's list: "
        f"commits (default {DEFAULT_LIMITS['commits']}, max {MAX_LIMITS['commits']}), "
        f"files ({DEFAULT_LIMITS['files']}), unaccounted ({DEFAULT_LIMITS['unaccounted']}) "
        f"or patch lines ({DEFAULT_LIMITS['patch']}).",
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
    change: SymbolChangeKind


class DependentSymbol(BaseModel):
    plugin_symbol: str
    how: DependencyKind
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
    behind_declared: list[str] = Field(
        default_factory=list, description="status: commits of the range below the plugin's declared release."
    )
    behind_total: int = 0


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
    local_commits: list[LocalCommit] = Field(
        default_factory=list,
        description="local: commits oldest first; moves: modules renamed or deleted, with what at END still names "
        "them (dangling); dropped: op registrations removed that END still calls.",
    )
    local_counts: dict[str, int] = Field(
        default_factory=dict, description="local: commits, moves, dangling (moves still named), dropped_bindings."
    )
    patch: list[str] = Field(default_factory=list, description="list with commit and patch: this page of the patch.")
    total: int = Field(
        default=0, description="Items of the paged list (commits, files, unaccounted or patch lines) in all pages."
    )
    next_cursor: str | None = None
    results: list[EntryOutcome] = Field(default_factory=list)
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
    declared: list[DeclaredBase] = Field(
        default_factory=list, description="status: where the plugin declares the upstream release it targets."
    )
    declared_release: str | None = Field(default=None, description="status: the release behind_declared counts to.")
    unknowns: list[str] = Field(default_factory=list)
    next_step: str = ""


# -- what a call opens ------------------------------------------------------------------------


def _open(args: AuditCommitsInput, env: ToolEnv) -> AuditSession:
    repo = open_plugin_repo(args, env)
    if repo is None:
        raise bad_input(
            "audit_commits keeps one ledger per plugin repository: use subject worktree, index, revision or installed."
        )
    plugin = open_plugin_subject(args, env, repo)
    upstream, mapping = open_upstream(args, env, repo)
    if not isinstance(upstream, RevisionSubject):
        raise bad_input(
            "audit_commits needs a git upstream (commits exist only in a repository): "
            "pass upstream=<vLLM clone> and target."
        )
    if args.action in CONFIRMED_ACTIONS:
        require_confirmed_target(load_record(env.store, repo), mapping if args.upstream else None)
    return open_session(env.store, repo, plugin, upstream, mapping, args.paths, args.mapping_overrides)


def _check_arguments(args: AuditCommitsInput) -> None:
    if args.patch != "none" and (args.action != "list" or not args.commit):
        raise bad_input("patch needs action=list and commit (the sha whose patch to read).")
    if args.entries and args.action not in ("record", "annotate"):
        raise bad_input("entries are only taken by action=record or action=annotate.")
    if args.action in ("record", "annotate") and not args.entries:
        raise bad_input(f"action={args.action} needs entries.")
    for name, actions in (("commit", ("list",)), ("local_range", ("local", "record"))):
        if getattr(args, name) and args.action not in actions:
            raise bad_input(f"{name} is only used with action={' or '.join(actions)}.")


def _proposal(entry: RecordEntry | AnnotateEntry) -> ProposedDecision | ProposedAnnotation:
    kind = ProposedDecision if isinstance(entry, RecordEntry) else ProposedAnnotation
    return kind(**{f.name: getattr(entry, f.name) for f in fields(kind)})


# -- core results as output ---------------------------------------------------------------------


def _output(args: AuditCommitsInput, session: AuditSession, **fields: Any) -> AuditCommitsOutput:
    return AuditCommitsOutput(
        action=args.action,
        ledger_id=session.ledger_id,
        ledger_uri=LEDGER_URI.format(session.ledger_id),
        upstream_target=target_label(session.upstream, session.mapping),
        **fields,
    )


def _commit_out(listed: ListedCommit, shown: int) -> CommitOut:
    commit, hits, others = listed.commit, listed.hits, listed.others
    return CommitOut(
        sha=commit.sha,
        subject=commit.subject,
        author=commit.author,
        date=commit.date,
        local_files=listed.local_files,
        files=CommitFiles(
            mapped=sorted(hit.path for hit in hits),
            renamed_from={h.path: h.previous for h in hits if h.previous},
            production=others.production[:shown],
            production_total=len(others.production),
            other=others.other[:shown],
            other_total=len(others.other),
        ),
        changed_symbols=[ChangedSymbol(file=c.path, symbol=c.symbol, change=c.change) for c in listed.changes[:shown]],
        changed_symbols_total=len(listed.changes),
        dependent_plugin_symbols=[DependentSymbol(**asdict(d)) for d in listed.dependents[:shown]],
        dependents_total=len(listed.dependents),
        entries=[LedgerEntry.model_validate(e) for e in listed.entries],
    )


def _listed(args: AuditCommitsInput, session: AuditSession, page: CommitPage) -> AuditCommitsOutput:
    shown = DETAIL_SHOWN if args.commit else SHOWN
    output = _output(
        args,
        session,
        files=[FileRange(**asdict(f)) for f in page.files],
        commits=[_commit_out(c, shown) for c in page.commits],
        patch=page.patch,
        total=page.total,
        next_cursor=page.next_cursor,
        summary=Summary(**asdict(page.counts)),
        unknowns=page.unknowns,
    )
    output.next_step = (
        "Read each commit's patch (commit=<sha>, patch=mapped), inspect its other production modules and the dependent "
        "plugin symbols, then record one entry per (commit, local file) with checkable evidence (action=record)."
    )
    return output


def _decided(args: AuditCommitsInput, session: AuditSession, outcomes: list[EntryOutcome]) -> AuditCommitsOutput:
    output = _output(args, session, results=outcomes)
    output.next_step = "status (action=status) shows the commits still without an entry; recheck then the differences."
    return output


def _status(args: AuditCommitsInput, session: AuditSession, paging: Paging, found: Status) -> AuditCommitsOutput:
    page = paging.page([FileRange(**asdict(f)) for f in found.files], "files")
    output = _output(
        args,
        session,
        files=page.items,
        total=page.total,
        next_cursor=page.next_cursor,
        summary=Summary(**asdict(found.counts)),
        unknowns=found.unknowns,
        declared=found.window.declared,
        declared_release=found.window.release,
    )
    output.next_step = (
        "Record entries for the commits without one (action=list shows them), then recheck (action=recheck)."
        if output.summary.without_entry
        else "Every commit has an entry: recheck the differences (action=recheck)."
    )
    return output


def _baseline(args: AuditCommitsInput, session: AuditSession, taken: Baseline) -> AuditCommitsOutput:
    output = _output(
        args,
        session,
        baseline_rows=taken.rows,
        unknowns=taken.unknowns,
        matrix_counts=taken.matrix.class_counts(),
    )
    output.next_step = (
        "The baseline explains today's differences; after edits, recheck reports any difference it no longer explains."
    )
    return output


def _recheck(args: AuditCommitsInput, session: AuditSession, paging: Paging, check: Recheck) -> AuditCommitsOutput:
    page = paging.page([UnaccountedOut(**u.as_json()) for u in check.unaccounted], "unaccounted")
    output = _output(
        args,
        session,
        unaccounted=page.items,
        total=page.total,
        next_cursor=page.next_cursor,
        summary=Summary(**asdict(check.counts)),
        complete=check.complete,
        unknowns=check.unknowns,
        matrix_counts=check.matrix.class_counts(),
    )
    output.next_step = (
        "Complete: export the ledger (action=export)."
        if output.complete
        else (
            "Explain each unaccounted difference with an entry naming its plugin symbol (or record the commits that "
            "changed it), or take a new baseline once the difference is confirmed intended; record entries for "
            "commits still without one."
        )
    )
    return output


def _exported(args: AuditCommitsInput, session: AuditSession, check: Recheck, done: Export) -> AuditCommitsOutput:
    return _output(
        args,
        session,
        summary=Summary(**asdict(check.counts)),
        complete=check.complete,
        unknowns=done.document["unknowns"],
        export=ExportOut(
            json_path=done.json_path, markdown_path=done.markdown_path, document=done.document, markdown=done.markdown
        ),
    )


def _local(args: AuditCommitsInput, env: ToolEnv, paging: Paging) -> AuditCommitsOutput:
    repo = open_plugin_repo(args, env)
    if repo is None or not args.local_range:
        raise bad_input("action=local needs local_range=START..END and a plugin repository (not subject=directory).")
    history = local_history(repo, RecordCache(env.store), args.local_range, args.paths)
    page = paging.page(history.commits, "commits")
    return AuditCommitsOutput(
        action="local",
        local_commits=list(page.items),
        local_counts=history.counts(),
        total=page.total,
        next_cursor=page.next_cursor,
        unknowns=history.unknowns,
        next_step="Fix each dangling reference (the new location) and each dropped binding still called; then audit "
        "the upstream range of the mapped files (action=list).",
    )


def audit_commits(args: AuditCommitsInput, env: ToolEnv) -> AuditCommitsOutput:
    """Every upstream commit in each plugin file's range, reviewed per (commit, file) into a ledger.

    A file's range runs from its base (its closest of `releases` as diff_model pairs it, or `base`;
    later calls reuse the ledger's) to the target over its counterpart, renames followed
    (include_dependencies adds the modules it imports). list pages commits: files (mapped, other
    production, other), upstream symbols changed, plugin symbols depending on them, the patch on
    request. record answers each decision once its evidence checks out (file lines at the cited
    revision, commits in range, results and probes exist; a note never stands alone, a title is
    never evidence). baseline imports diff_model's difference matrix; annotate marks
    trace_dependency rows; status counts commits with and without an entry; recheck lists the
    differences nothing explains; export writes JSON and markdown. local lists the plugin's own
    commits in local_range: files touched, modules moved or deleted with what at END still names
    them, op registrations dropped that END still calls. record, baseline and annotate need a
    confirmed target; only the state directory is written.
    """
    _check_arguments(args)
    paging = Paging(args.cursor, args.limit, inputs_fingerprint("audit_commits", args.model_dump(mode="json")))
    if args.action == "local":
        return _local(args, env, paging)
    session = _open(args, env)
    scope = ScopeRequest(args.base, tuple(args.releases), args.include_dependencies)
    if args.action == "list":
        return _listed(args, session, list_page(session, scope, paging, args.commit, args.patch))
    if args.action == "record" or args.action == "annotate":
        outcomes = decide(session, scope, args.action, [_proposal(e) for e in args.entries], args.local_range)
        return _decided(args, session, outcomes)
    if args.action == "status":
        return _status(args, session, paging, status(session, scope))
    if args.action == "baseline":
        return _baseline(args, session, take_baseline(session, scope))
    check = run_recheck(session, scope)
    if args.action == "recheck":
        return _recheck(args, session, paging, check)
    return _exported(args, session, check, export(session, check))


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
