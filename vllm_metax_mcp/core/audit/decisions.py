"""The record and annotate actions: a batch of proposed decisions (per upstream commit and plugin
file) or inventory annotations, each checked and answered on its own, the accepted stored at once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from ..foundation.errors import ToolFailure, bad_input
from ..foundation.evidence import Evidence
from ..sources.subjects import RevisionSubject, Subject, clean_path
from .checks import EvidenceChecker
from .ledger import Annotation, Decision, Disposition, Side
from .local_history import LocalRange, local_range
from .ranges import FileBase, Range, file_ranges
from .scope import ScopeRequest, resolve_bases
from .session import AuditSession
from .symbols import inventory_node, plugin_symbol

DecisionAction = Literal["record", "annotate"]


@dataclass(frozen=True)
class ProposedDecision:
    """A decision as the caller proposes it (the fields of a record entry)."""

    commit: str
    file: str
    disposition: Disposition
    local_edit: bool
    affected_interface: str
    plugin_symbols: list[str]
    evidence: list[Evidence]
    side: Side = "upstream"


@dataclass(frozen=True)
class ProposedAnnotation:
    """An inventory annotation as the caller proposes it (the fields of an annotate entry)."""

    node: str
    disposition: Disposition
    evidence: list[Evidence]


@dataclass(frozen=True)
class EntryOutcome:
    """The answer to one proposed item."""

    index: int
    accepted: bool
    error: str | None = None
    code: str | None = None


def _checker(session: AuditSession, bases: dict[str, FileBase]) -> EvidenceChecker:
    upstream = session.upstream.repo
    trees: list[Subject] = [session.plugin, session.upstream]
    trees += [RevisionSubject(upstream, commit) for commit in sorted({b.commit for b in bases.values()})]
    return EvidenceChecker(session.store, trees, [upstream, session.repo], upstream)


def _plugin_decision(
    proposed: ProposedDecision, session: AuditSession, local: LocalRange | None, checker: EvidenceChecker
) -> Decision:
    """A decision on a plugin commit: it lies in the call's local_range and touched the file."""
    if local is None:
        raise bad_input("A plugin-side entry (side=plugin) needs local_range=START..END, the range its commit is in.")
    commit = session.repo.resolve_commit(proposed.commit)
    if commit not in local.commits:
        raise bad_input(f"commit {commit[:12]} is not in the plugin range {local.label}.")
    path = clean_path(proposed.file)
    if path not in local.touched[commit]:
        raise bad_input(f"plugin commit {commit[:12]} did not touch {path}.")
    return _checked(proposed, session, commit, path, Range(local.label, local.commits), checker)


def _decision(
    proposed: ProposedDecision, session: AuditSession, ranges: dict[str, Range], checker: EvidenceChecker
) -> Decision:
    local = clean_path(proposed.file)
    if local not in session.local_files:
        raise bad_input(f"{proposed.file} is not an audited file (a Python file under paths).")
    if local not in ranges:
        raise bad_input(f"{local} has no base, so its range is unknown: pass releases or base.")
    commit = session.upstream.repo.resolve_commit(proposed.commit)
    if commit not in ranges[local].commits:
        raise bad_input(f"commit {commit[:12]} is outside {local}'s range {ranges[local].label}.")
    return _checked(proposed, session, commit, local, ranges[local], checker)


def _checked(
    proposed: ProposedDecision,
    session: AuditSession,
    commit: str,
    path: str,
    scope: Range,
    checker: EvidenceChecker,
) -> Decision:
    """The decision once its plugin symbols resolve and its evidence checks out against `scope`."""
    symbols = [plugin_symbol(s, path, session.plugin, session.cache) for s in proposed.plugin_symbols]
    evidence = checker.check(proposed.evidence, scope, judged=commit)
    return Decision(
        commit,
        path,
        proposed.disposition,
        proposed.local_edit,
        proposed.affected_interface,
        tuple(symbols),
        tuple(evidence),
        time.time(),
        proposed.side,
    )


def _annotation(
    proposed: ProposedAnnotation, session: AuditSession, scope: Range | None, checker: EvidenceChecker
) -> Annotation:
    node = inventory_node(proposed.node, session.inputs.package.name, session.plugin, session.upstream, session.cache)
    evidence = checker.check(proposed.evidence, scope)
    return Annotation(node, proposed.disposition, time.time(), tuple(evidence))


def decide(
    session: AuditSession,
    request: ScopeRequest,
    action: DecisionAction,
    proposals: Sequence[ProposedDecision | ProposedAnnotation],
    local_range_text: str | None = None,
) -> list[EntryOutcome]:
    """Check each proposal against its file's range (record), the plugin range (record, side
    plugin) or every file's range (annotate)."""
    bases = resolve_bases(session, request, None)
    ranges = file_ranges(session.upstream.repo, bases, session.target, session.target_name)
    union = (
        Range(f"a base..{session.target_name}", frozenset().union(*(r.commits for r in ranges.values())))
        if ranges
        else None
    )
    checker = _checker(session, bases)
    local = local_range(session.repo, local_range_text) if local_range_text else None
    plugin_checker = EvidenceChecker(session.store, [session.plugin], [session.repo], session.repo)
    wanted = ProposedDecision if action == "record" else ProposedAnnotation
    outcomes: list[EntryOutcome] = []
    accepted: dict[str, dict[str, dict[str, Any]]] = {}
    for index, proposed in enumerate(proposals):
        try:
            if isinstance(proposed, ProposedDecision) and wanted is ProposedDecision:
                item: Decision | Annotation = (
                    _plugin_decision(proposed, session, local, plugin_checker)
                    if proposed.side == "plugin"
                    else _decision(proposed, session, ranges, checker)
                )
            elif isinstance(proposed, ProposedAnnotation) and wanted is ProposedAnnotation:
                item = _annotation(proposed, session, union, checker)
            else:
                form = ", ".join(f.name for f in fields(wanted))
                raise bad_input(f"action={action} takes entries of the form {{{form}}}.")
        except ToolFailure as failure:
            outcomes.append(EntryOutcome(index=index, accepted=False, error=failure.message, code=failure.code.value))
            continue
        section = item.section if isinstance(item, Decision) else "annotations"
        accepted.setdefault(section, {})[item.key] = item.stored()
        outcomes.append(EntryOutcome(index=index, accepted=True))
    if accepted:
        session.change(lambda ledger: _store(ledger, accepted))
    return outcomes


def _store(ledger: dict[str, Any], accepted: dict[str, dict[str, dict[str, Any]]]) -> None:
    for section, items in accepted.items():
        ledger.setdefault(section, {}).update(items)
