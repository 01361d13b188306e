"""Tool `audit_commits`: every upstream commit in each plugin file's range, reviewed per file and
recorded in a ledger with evidence the server checks. The work is core/audit's (steps.py picks the
next call); here are the models, the argument checks, the subjects a call opens and the mapping of
core results to outputs that fit the result budget."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from typing_extensions import Self

from ..core.audit import steps
from ..core.audit.arguments import problems
from ..core.audit.commits import SymbolChangeKind
from ..core.audit.counts import status
from ..core.audit.decisions import EntryOutcome, ProposedAnnotation, ProposedDecision, decide
from ..core.audit.dependents import DependencyKind
from ..core.audit.export import export
from ..core.audit.ledger import Disposition, Side
from ..core.audit.listing import ListedCommit, ListView, PatchScope, list_view
from ..core.audit.local_history import LocalCommit, local_history
from ..core.audit.recheck import run_recheck, take_baseline
from ..core.audit.scope import ScopeRequest
from ..core.audit.session import MAX_LIMIT, AuditSession, Paging, first_lines, fitting, json_chars, open_session
from ..core.code.module_index import RecordCache
from ..core.compare.inputs import target_label
from ..core.compare.releases import MAX_RELEASES
from ..core.foundation.errors import bad_input
from ..core.foundation.evidence import Evidence
from ..core.foundation.policy import Effect
from ..core.foundation.results import RESULT_BUDGET, SizeBudget, inputs_fingerprint
from ..core.sources.environment import load_record, require_confirmed_target
from ..core.sources.subjects import RevisionSubject
from .arguments import UpstreamArgs, open_plugin_repo, open_plugin_subject, open_upstream
from .output import rows_budget, size_of
from .spec import NextCall, ToolEnv, ToolOutput, ToolSpec

Action = Literal["list", "local", "record", "baseline", "annotate", "status", "recheck", "export"]
CONFIRMED_ACTIONS = frozenset({"record", "baseline", "annotate"})
MAX_ENTRIES = 500
SHOWN = 10  # per-commit list items in a page of commits; `commit=<sha>` shows up to DETAIL_SHOWN
DETAIL_SHOWN = 2000
BLOCK_CHARS = RESULT_BUDGET // 4
"""Room for a first page's invariant block (files, unknowns) or, beside a patch, the commit's row."""
CURSOR_CHARS = 64  # a cursor is ~48: the offset and the inputs' fingerprint
LEDGER_URI = "vllm-metax://ledgers/{}"
SCOPE = ("plugin_repo", "subject", "revision", "upstream", "target", "paths", "mapping_overrides", "releases", "base")
EvidenceIn = Annotated[
    Evidence,
    WithJsonSchema(
        {
            "type": "object",
            "required": ["kind"],
            "description": "file{path,line,rev} commit{sha} tool_result{result_id} test{name,outcome} probe{probe_id} "
            "note{text}",
        }
    ),
]


class Entry(BaseModel):  # a decision (record) or an inventory annotation (annotate): see `entries`
    model_config = ConfigDict(extra="forbid")
    commit: str | None = None
    file: str | None = None
    node: str | None = None
    side: Side = "upstream"
    disposition: Disposition
    local_edit: bool | None = None
    affected_interface: str | None = Field(default=None, min_length=1)
    plugin_symbols: list[str] = Field(default_factory=list)
    evidence: list[EvidenceIn] = Field(min_length=1)


class AuditCommitsInput(UpstreamArgs):
    action: Action = Field(
        default="list",
        description="list (commit: one; patch: its diff), local (plugin commits in local_range), record/annotate "
        "(entries), baseline (diff_model's differences), status, recheck (unexplained diffs), export",
    )
    paths: list[str] = Field(default_factory=lambda: ["vllm_metax/models/"], max_length=256)
    mapping_overrides: dict[str, str | None] = Field(default_factory=dict, max_length=256, description="path: upstream")
    releases: list[str] = Field(default_factory=list, max_length=MAX_RELEASES, description="Tags, oldest first")
    base: str | None = Field(default=None, description="One base for all")
    local_range: str | None = Field(default=None, description="Plugin START..END")
    include_dependencies: bool = Field(default=False, description="Also counterparts' imports")
    commit: str | None = None
    patch: Literal["mapped", "all"] | None = None
    entries: list[Entry] = Field(
        default_factory=list,
        max_length=MAX_ENTRIES,
        description="record: commit, file, local_edit, affected_interface, plugin_symbols (module:Name[.member]), "
        "side (plugin: commit in local_range); annotate: node; both: disposition, evidence",
    )
    cursor: str | None = None
    limit: int | None = Field(default=None, ge=1, le=MAX_LIMIT)

    @model_validator(mode="after")
    def _combination(self) -> Self:
        """An argument the chosen action would ignore is a mistake, said before any work."""
        entries = [entry.model_dump(exclude_defaults=True) for entry in self.entries]
        found = problems(self.action, self.model_dump(exclude_defaults=True), entries)
        if found:
            raise ValueError("; ".join(found))
        return self


class CommitFiles(BaseModel):
    mapped: list[str] = Field(description="Tracked upstream files it touched (paths at the commit).")
    renamed_from: dict[str, str] = Field(default_factory=dict, description="Mapped path -> its earlier path.")
    production: list[str] = Field(description="Other production modules (not tests, docs, benchmarks, CI).")
    production_total: int
    other: list[str] = Field(description="Tests, docs, benchmarks, CI and non-code files.")
    other_total: int


class ChangedSymbol(BaseModel):
    file: str
    symbol: str = Field(description="module:Qualified.name (import:<alias>; * for the whole module).")
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
    entries_total: int = 0


class FileRange(BaseModel):
    local: str
    upstream: str | None = Field(description="Counterpart at the target (null: none).")
    rule: str
    base: str | None = Field(description="Release or revision the range starts at (null: none known).")
    followed: list[str] = Field(default_factory=list, description="Older upstream names within the range.")
    dependencies: int = Field(default=0, description="Upstream modules tracked besides the counterpart.")
    commits: int = 0
    with_entry: int = 0
    without_entry: int = 0
    behind_declared: list[str] = Field(default_factory=list, description="Commits below the declared release.")
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
    commits: list[str] = Field(description="Commits in range that changed it with no entry for the file.")


class Outcome(BaseModel):
    index: int
    accepted: bool
    error: str | None = None
    code: str | None = None


class Declared(BaseModel):
    version: str
    where: str = Field(description="file:line of the declaration.")
    text: str


class ExportOut(BaseModel):
    json_path: str = Field(description="The JSON copy, relative to the state directory.")
    markdown_path: str = Field(description="The markdown copy, relative to the state directory.")
    missing: int = Field(description="(commit, file) pairs without an entry.")


class AuditCommitsOutput(ToolOutput):
    action: str = ""
    ledger_id: str = ""
    ledger_uri: str = Field(default="", description="The ledger as a read-only resource.")
    upstream_target: str = ""
    files: list[FileRange] = Field(
        default_factory=list, description="First page only. status: a page of files; list: files with commits."
    )
    files_total: int = 0
    commits: list[CommitOut] = Field(default_factory=list)
    local_commits: list[LocalCommit] = Field(default_factory=list, description="local: commits, oldest first.")
    local_counts: dict[str, int] = Field(default_factory=dict, description="local: commits, moves, dangling, dropped.")
    patch: list[str] = Field(default_factory=list, description="list with commit and patch: a page of it.")
    total: int = Field(default=0, description="Items of the paged list in all pages.")
    next_cursor: str | None = None
    results: list[Outcome] = Field(default_factory=list, description="record/annotate: answers, in order.")
    accepted: int = 0
    summary: Summary = Field(default_factory=Summary)
    unaccounted: list[UnaccountedOut] = Field(default_factory=list)
    baseline_rows: int = 0
    matrix_counts: dict[str, int] = Field(default_factory=dict, description="Differences per proposed class.")
    complete: bool = Field(default=False, description="recheck/export: all entries in, nothing unaccounted.")
    export: ExportOut | None = None
    declared: list[Declared] = Field(default_factory=list, description="status: declared upstream release.")
    declared_release: str | None = Field(default=None, description="status: the release behind_declared counts to.")
    unknowns: list[str] = Field(default_factory=list, description="First page only.")


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


def _proposal(entry: Entry) -> ProposedDecision | ProposedAnnotation:
    kind = ProposedAnnotation if entry.node else ProposedDecision
    return kind(**{f.name: getattr(entry, f.name) for f in fields(kind)})


def _next(args: AuditCommitsInput, step: steps.Step | None) -> NextCall | None:
    """The step as a whole call: the same call with a cursor, or the scope of this one plus the step's arguments."""
    if step is None:
        return None
    include = None if step.same_call else set(SCOPE) | {"directory", "include_dependencies"}
    base = args.model_dump(mode="json", exclude_defaults=True, include=include)
    return NextCall(tool="audit_commits", arguments=base | step.arguments, why=step.why)


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
        entries=[LedgerEntry.model_validate(e) for e in listed.entries[: max(shown, 1)]],
        entries_total=len(listed.entries),
    )


def _fitted(listed: ListedCommit, shown: int, chars: int) -> CommitOut:
    """The commit's row with its lists cut (halving) until it fits `chars`; the totals say what was cut."""
    row = _commit_out(listed, shown)
    while shown and size_of(row) > chars:
        shown //= 2
        row = _commit_out(listed, shown)
    return row


def _listed(args: AuditCommitsInput, session: AuditSession, view: ListView) -> AuditCommitsOutput:
    first = args.cursor is None
    files = [FileRange(**asdict(f)) for f in fitting(view.files, BLOCK_CHARS)] if first and not args.commit else []
    output = _output(
        args,
        session,
        files=files,
        files_total=len(view.files),
        summary=Summary(**asdict(view.counts)),
        unknowns=first_lines(view.unknowns, BLOCK_CHARS) if first else [],
    )
    if args.patch:
        return _patched(args, output, view, args.patch)
    return _detail(args, output, view) if args.commit else _commits(args, output, view)


def _detail(args: AuditCommitsInput, output: AuditCommitsOutput, view: ListView) -> AuditCommitsOutput:
    """The one commit asked for, its lists as long as the budget allows."""
    (listed,) = view.rows(view.commits)
    output.commits, output.total = [_fitted(listed, DETAIL_SHOWN, _room(args, output))], 1
    undecided = view.first_undecided([listed]) is not None
    output.next_step = _next(args, steps.after_detail(listed.commit.sha, undecided, view.counts))
    return output


def _commits(args: AuditCommitsInput, output: AuditCommitsOutput, view: ListView) -> AuditCommitsOutput:
    """A page of commit rows, ending where the next row would cross the budget."""
    chars = _room(args, output)
    rows: dict[str, CommitOut] = {}

    def measured(listed: ListedCommit) -> int:
        rows[listed.commit.sha] = _fitted(listed, SHOWN, chars)
        return size_of(rows[listed.commit.sha])

    page = _paging(args).expanded(view.commits, "commits", view.rows, SizeBudget(measured, chars))
    output.commits = [rows[c.commit.sha] for c in page.items]
    output.total, output.next_cursor = page.total, page.next_cursor
    first = view.first_undecided(page.items)
    output.next_step = _next(args, steps.after_list(view.counts, first.commit.sha if first else None, page.next_cursor))
    return output


def _patched(
    args: AuditCommitsInput, output: AuditCommitsOutput, view: ListView, scope: PatchScope
) -> AuditCommitsOutput:
    """A page of the commit's patch; the commit's row (cut to BLOCK_CHARS) on the first page only."""
    if args.cursor is None:
        output.commits = [_fitted(listed, SHOWN, BLOCK_CHARS) for listed in view.rows(view.commits)]
    page = _paging(args).page(view.patch(scope), "patch", _line_budget(_room(args, output)))
    output.patch, output.total, output.next_cursor = page.items, page.total, page.next_cursor
    output.next_step = _next(args, steps.after_patch(page.next_cursor))
    return output


def _line_budget(room: int) -> SizeBudget:
    """A patch line costs its JSON string (escapes included) and a comma."""
    return SizeBudget(lambda line: len(json.dumps(line, ensure_ascii=False)), room)


def _room(args: AuditCommitsInput, fixed: AuditCommitsOutput) -> int:
    """The chars left for rows once the fixed part and the largest next_step this call can name are sent."""
    largest = _next(args, steps.further("c" * CURSOR_CHARS, "x" * 100))
    return rows_budget(fixed.model_copy(update={"next_step": largest})).chars


def _paging(args: AuditCommitsInput) -> Paging:
    return Paging(args.cursor, args.limit, inputs_fingerprint("audit_commits", args.model_dump(mode="json")))


def _decided(args: AuditCommitsInput, session: AuditSession, outcomes: list[EntryOutcome]) -> AuditCommitsOutput:
    """Every answer in order while they fit; `accepted` counts them all, `total` says how many were sent."""
    output = _output(args, session, accepted=sum(o.accepted for o in outcomes), total=len(outcomes))
    output.next_step = _next(args, steps.after_decisions(len(outcomes) - output.accepted))
    kept = fitting(outcomes, rows_budget(output).chars)  # the real next_step is counted
    output.results = [Outcome(**asdict(outcome)) for outcome in kept]
    return output


def _status(args: AuditCommitsInput, session: AuditSession) -> AuditCommitsOutput:
    found = status(session, _scope(args))
    first = args.cursor is None
    output = _output(
        args,
        session,
        summary=Summary(**asdict(found.counts)),
        unknowns=first_lines(found.unknowns, BLOCK_CHARS) if first else [],
        declared=[Declared(**asdict(d)) for d in found.window.declared] if first else [],
        declared_release=found.window.release,
    )
    rows = [FileRange(**asdict(f)) for f in found.files]
    page = _paging(args).page(rows, "files", SizeBudget(size_of, _room(args, output)))
    output.files, output.total, output.next_cursor = page.items, page.total, page.next_cursor
    output.next_step = _next(args, steps.after_status(found.counts, page.next_cursor))
    return output


def _recheck(args: AuditCommitsInput, session: AuditSession) -> AuditCommitsOutput:
    check = run_recheck(session, _scope(args))
    output = _output(
        args,
        session,
        summary=Summary(**asdict(check.counts)),
        complete=check.complete,
        unknowns=first_lines(check.unknowns, BLOCK_CHARS) if args.cursor is None else [],
        matrix_counts=check.matrix.class_counts(),
    )
    rows = [UnaccountedOut(**u.as_json()) for u in check.unaccounted]
    page = _paging(args).page(rows, "unaccounted", SizeBudget(size_of, _room(args, output)))
    output.unaccounted, output.total, output.next_cursor = page.items, page.total, page.next_cursor
    commit = next((c for u in page.items for c in u.commits), None)
    output.next_step = _next(args, steps.after_recheck(check.complete, check.counts, commit, page.next_cursor))
    return output


def _exported(args: AuditCommitsInput, session: AuditSession) -> AuditCommitsOutput:
    """The export is written to the state directory; the result says where, not what."""
    check = run_recheck(session, _scope(args))
    done = export(session, check)
    missing = sum(len(m["files"]) for m in done.document["missing"])
    return _output(
        args,
        session,
        summary=Summary(**asdict(check.counts)),
        complete=check.complete,
        unknowns=first_lines(done.document["unknowns"], BLOCK_CHARS),
        export=ExportOut(json_path=done.json_path, markdown_path=done.markdown_path, missing=missing),
        next_step=_next(args, steps.after_export(check.complete, check.counts)),
    )


def _local(args: AuditCommitsInput, env: ToolEnv) -> AuditCommitsOutput:
    repo = open_plugin_repo(args, env)
    if repo is None or not args.local_range:
        raise bad_input("action=local needs local_range=START..END and a plugin repository (not subject=directory).")
    history = local_history(repo, RecordCache(env.store), args.local_range, args.paths)
    output = AuditCommitsOutput(
        action="local",
        local_counts=history.counts(),
        unknowns=first_lines(history.unknowns, BLOCK_CHARS) if args.cursor is None else [],
    )
    room = _room(args, output)
    page = _paging(args).page(history.commits, "commits", SizeBudget(json_chars, room))
    output.local_commits, output.total, output.next_cursor = list(page.items), page.total, page.next_cursor
    output.next_step = _next(args, steps.after_local(page.next_cursor))
    return output


def _scope(args: AuditCommitsInput) -> ScopeRequest:
    return ScopeRequest(args.base, tuple(args.releases), args.include_dependencies)


def audit_commits(args: AuditCommitsInput, env: ToolEnv) -> AuditCommitsOutput:
    """Upstream commits per plugin file range (from closest release, base or ledger), decided into a
    ledger with checked evidence; writes need a confirmed target. Follow next_step."""
    if args.action == "local":
        return _local(args, env)
    session = _open(args, env)
    if args.action == "list":
        return _listed(args, session, list_view(session, _scope(args), args.commit))
    if args.action == "record" or args.action == "annotate":
        proposals = [_proposal(e) for e in args.entries]
        return _decided(args, session, decide(session, _scope(args), args.action, proposals, args.local_range))
    if args.action == "status":
        return _status(args, session)
    if args.action == "baseline":
        taken = take_baseline(session, _scope(args))
        counts = taken.matrix.class_counts()
        output = _output(args, session, baseline_rows=taken.rows, unknowns=taken.unknowns, matrix_counts=counts)
        output.next_step = _next(args, steps.after_baseline())
        return output
    if args.action == "recheck":
        return _recheck(args, session)
    return _exported(args, session)


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
