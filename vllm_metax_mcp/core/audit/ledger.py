"""The audit ledger: one per plugin repository (git common dir) and upstream target commit, in the
state directory, so it survives restarts and every server sharing the directory sees one copy.

It holds a decision per (upstream commit, plugin file), the baseline (the difference matrix as it
stood when imported, each row with the identity of the code on both sides), inventory annotations
and the base each file's range was computed from. A decision is accepted only with evidence the
server checked here: a `file` item must name a line that exists in that path at the cited blob or
revision, a `commit` item must lie in the file's range, a `tool_result` or `probe` must exist in
the state directory, and a `note` never stands alone — nor does the judged commit itself, whose
title or patch is what is being decided on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ..code.module_index import ModuleRecord, RecordCache, module_name
from ..compare.matrix import MatrixRow
from ..compare.pairing import Trees
from ..compare.textdiff import split_lines
from ..foundation.atomic import write_bytes_atomic
from ..foundation.errors import ErrorCode, ToolFailure, bad_input, not_found
from ..foundation.evidence import (
    CommitEvidence,
    Evidence,
    FileEvidence,
    ProbeEvidence,
    ToolResultEvidence,
)
from ..foundation.results import digest, load_result
from ..foundation.state import StateStore
from ..sources.git import Repository
from ..sources.subjects import Subject, clean_path
from .commits import definition_hashes
from .ranges import Range

LEDGER_VERSION = 1
Disposition = Literal["inherited", "merge", "coordinated_dependency", "platform_specific", "unsupported_architecture"]
PLUGIN_ROOT = "vllm_metax"
UPSTREAM_ROOT = "vllm"
HEX = frozenset("0123456789abcdef")


# -- storage ----------------------------------------------------------------------------------


def ledger_id(repository_key: str, target_commit: str) -> str:
    return digest({"repository": repository_key, "target": target_commit}, 24)


def ledger_path(identifier: str) -> str:
    return f"ledgers/{identifier}.json"


def new_ledger(identifier: str, repository_key: str, upstream: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": LEDGER_VERSION,
        "id": identifier,
        "plugin_repository": repository_key,
        "upstream": upstream,
        "bases": {},
        "entries": {},
        "baseline": None,
        "annotations": {},
    }


def load_ledger(store: StateStore, identifier: str) -> dict[str, Any] | None:
    return store.read(ledger_path(identifier))


def change_ledger(store: StateStore, fresh: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply `change` to the stored ledger (or `fresh`) under the state directory's lock."""

    def apply(current: dict[str, Any] | None) -> dict[str, Any]:
        ledger = current or fresh
        change(ledger)
        return ledger

    return store.update(ledger_path(fresh["id"]), apply)


def entry_key(commit: str, local: str) -> str:
    return f"{commit} {local}"


def entries_by_commit(ledger: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in (ledger or {}).get("entries", {}).values():
        found.setdefault(entry["commit"], []).append(entry)
    return found


def write_text(store: StateStore, relative: str, text: str) -> None:
    with store.locked():
        write_bytes_atomic(store.path(relative), text.encode())


# -- evidence ---------------------------------------------------------------------------------


def read_at(repo: Repository, commit: str, path: str) -> bytes | None:
    """The bytes of `path` at `commit`, or None where the path does not exist there."""
    raw = repo.run("cat-file", "--batch", input=f"{commit}:{path}\n".encode())
    header, _, rest = raw.partition(b"\n")
    parts = header.split()
    if len(parts) != 3 or parts[1] != b"blob":
        return None
    return rest[: int(parts[2])]


@dataclass
class EvidenceChecker:
    """Verifies evidence items against the trees, repositories and state directory of one call."""

    store: StateStore
    trees: list[Subject]
    """Snapshots whose blob ids a `file` item may cite: the plugin subject, the target, the bases."""
    repos: list[Repository]
    """Repositories whose revisions a `file` item may cite: upstream first, then the plugin."""
    upstream: Repository

    def check(self, items: list[Evidence], scope: Range | None, judged: str | None = None) -> list[Evidence]:
        """Refuse (ToolFailure) unless some item is checkable and every item checks out; return the
        items with revisions resolved (full commit or blob ids), so the record does not move."""
        own = {judged} if judged else set()
        checkable = [
            i for i in items if i.kind != "note" and not (isinstance(i, CommitEvidence) and self._sha(i.sha) in own)
        ]
        if not checkable:
            why = " (the entry's own commit is what is being judged)" if any(i.kind == "commit" for i in items) else ""
            raise bad_input(
                "A decision needs at least one checkable evidence item — a file line at a revision, a commit in the range, "
                f"an earlier tool result, a test or a probe; a note alone is not evidence{why}."
            )
        checked = []
        for position, item in enumerate(items):
            try:
                checked.append(self._item(item, scope))
            except ToolFailure as failure:
                raise ToolFailure(failure.code, f"evidence[{position}] ({item.kind}): {failure.message}") from None
        return checked

    def _item(self, item: Evidence, scope: Range | None) -> Evidence:
        if isinstance(item, FileEvidence):
            return item.model_copy(update={"path": clean_path(item.path), "rev": self._file(item)})
        if isinstance(item, CommitEvidence):
            sha = self.upstream.resolve_commit(item.sha)
            if scope is None:
                raise bad_input("no range is known to check the commit against: pass base or releases.")
            if sha not in scope.commits:
                raise bad_input(f"commit {sha[:12]} is not in the range {scope.label}.")
            return item.model_copy(update={"sha": sha})
        if isinstance(item, ToolResultEvidence) and load_result(self.store, item.result_id) is None:
            raise not_found(f"no tool result {item.result_id} in this server's state directory.")
        if isinstance(item, ProbeEvidence):
            body = item.probe_id[2:]
            if not (
                item.probe_id.startswith("p-")
                and body
                and set(body) <= HEX
                and self.store.read(f"probes/{item.probe_id}.json")
            ):
                raise not_found(f"no probe {item.probe_id} in this server's state directory.")
        return item

    def _sha(self, revision: str) -> str | None:
        try:
            return self.upstream.resolve_commit(revision)
        except ToolFailure:
            return None

    def _file(self, item: FileEvidence) -> str:
        """Check the line exists; return the full blob or commit id the path was read at."""
        path = clean_path(item.path)
        if "\n" in path:
            raise bad_input("a path must not contain a newline.")
        found = self._blob(path, item.rev.lower()) or self._revision(path, item.rev)
        lines = len(split_lines(found[1]))
        if item.line > lines:
            raise bad_input(f"{path} has {lines} lines at {item.rev}; line {item.line} does not exist.")
        return found[0]

    def _blob(self, path: str, rev: str) -> tuple[str, bytes] | None:
        if len(rev) < 7 or not set(rev) <= HEX:
            return None
        for tree in self.trees:
            entry = tree.entries().get(path)
            if entry is not None and entry.sha.startswith(rev):
                return entry.sha, tree.read(path)
        return None

    def _revision(self, path: str, rev: str) -> tuple[str, bytes]:
        resolved = []
        for repo in self.repos:
            try:
                commit = repo.resolve_commit(rev)
            except ToolFailure as failure:
                if failure.code is ErrorCode.INVALID_REVISION:
                    continue
                raise
            data = read_at(repo, commit, path)
            if data is not None:
                return commit, data
            resolved.append(commit[:12])
        if resolved:
            raise not_found(f"{path} does not exist at {rev} ({', '.join(resolved)}).")
        raise bad_input(
            f"{rev!r} is neither the blob of {path} in the plugin subject, the target or a base, nor a revision of the "
            "upstream or plugin repository; cite the commit (or tag) the line is at."
        )


# -- symbols named by decisions ---------------------------------------------------------------


def module_record(subject: Subject, module: str, cache: RecordCache) -> ModuleRecord | None:
    stem = module.replace(".", "/")
    for path in (f"{stem}.py", f"{stem}/__init__.py"):
        if path in subject.entries():
            return cache.get_many(subject, [path])[path]
    return None


def _defines(record: ModuleRecord, qualified: str, re_exports: bool) -> bool:
    owner, _, member = qualified.partition(".")
    definition = record.definition(owner)
    if definition is None:
        bound = re_exports and any(alias == owner for item in record.imports for _, alias in item.names)
        return not member and (owner in record.guarded_names or bound)
    return not member or (definition.kind == "class" and member in definition.members)


def plugin_symbol(symbol: str, local: str, plugin: Subject, cache: RecordCache) -> str:
    """`module:Name[.member]` (or a name in the entry's own file) that exists in the plugin subject."""
    module, _, qualified = symbol.rpartition(":")
    module = module or module_name(local) or ""
    record = module_record(plugin, module, cache)
    if record is None:
        raise not_found(f"plugin symbol {symbol!r}: {module} is not a module of the plugin subject.")
    if not qualified or not _defines(record, qualified, re_exports=False):
        raise not_found(f"plugin symbol {symbol!r}: {module} defines no {qualified or '(empty name)'}.")
    return f"{module}:{qualified}"


def inventory_node(node: str, plugin: Subject, upstream: Subject, cache: RecordCache) -> str:
    """A trace_dependency inventory row name that exists: a plugin or upstream module (and the
    symbol it names, defined or re-exported there); third-party and stdlib boundaries as named."""
    module, _, symbol = node.partition(":")
    top = module.split(".")[0]
    subject = plugin if top == PLUGIN_ROOT else upstream if top == UPSTREAM_ROOT else None
    if subject is None:
        return node
    record = module_record(subject, module, cache)
    if record is None:
        raise not_found(
            f"{module} is not a module of the {'plugin subject' if subject is plugin else 'upstream target'}."
        )
    if symbol and not _defines(record, symbol, re_exports=True):
        raise not_found(f"{module} neither defines nor re-exports {symbol}.")
    return node


# -- baseline and recheck ---------------------------------------------------------------------


def row_identity(change: str, local: str | None, target: str | None) -> str:
    """What a difference is made of: its kind and the code on both sides (hash or blob id)."""
    return digest([change, local, target], 16)


@dataclass(frozen=True)
class Difference:
    """A current local-vs-target difference (a matrix row) and the identity of its code."""

    local: str
    symbol: str
    upstream_symbol: str | None
    change: str
    proposed_class: str
    identity: str

    @property
    def key(self) -> str:
        return f"{self.local} {self.symbol}"


@dataclass(frozen=True)
class Unaccounted:
    difference: Difference
    reason: str
    commits: tuple[str, ...]
    """Commits in the file's range that changed the upstream symbol and have no entry for the file."""


def differences(rows: Iterable[MatrixRow], trees: Trees) -> list[Difference]:
    """Matrix rows with the identity of their code: symbol hashes, or blob ids for whole files."""
    found = []
    for row in rows:
        local = trees.local_modules.get(row.local)
        target = trees.upstream_modules.get(row.upstream or "")
        if row.symbol == "*":
            entry = trees.upstream.entries().get(row.upstream or "")
            identity = row_identity(row.change, trees.local.sha(row.local), entry.sha if entry else None)
        else:
            mine = definition_hashes(local.record).get(row.symbol) if local else None
            theirs = definition_hashes(target.record).get(row.upstream_symbol or row.symbol) if target else None
            identity = row_identity(row.change, mine, theirs)
        found.append(
            Difference(row.local, row.symbol, row.upstream_symbol, row.change, row.proposed_class.value, identity)
        )
    return found


def baseline_rows(differences: Iterable[Difference]) -> dict[str, dict[str, Any]]:
    return {
        d.key: {
            "local": d.local,
            "symbol": d.symbol,
            "upstream_symbol": d.upstream_symbol,
            "change": d.change,
            "proposed_class": d.proposed_class,
            "identity": d.identity,
        }
        for d in differences
    }


def unaccounted(
    differences: list[Difference],
    ledger: dict[str, Any] | None,
    changed: dict[str, dict[str, list[str]]],
) -> list[Unaccounted]:
    """Differences neither the baseline (same key, same code) nor an entry explains.

    `changed` maps a local file to upstream qualified names -> commits in its range that changed
    them. An entry (commit, file) explains a difference of that file when it names the plugin
    symbol, or when its commit changed the difference's upstream symbol.
    """
    baseline = ((ledger or {}).get("baseline") or {}).get("rows")
    entries = list((ledger or {}).get("entries", {}).values())
    recorded = {(e["commit"], e["file"]) for e in entries}
    named = {(e["file"], s) for e in entries for s in e.get("plugin_symbols", [])}
    found = []
    for difference in differences:
        row = (baseline or {}).get(difference.key)
        if row is not None and row["identity"] == difference.identity:
            continue
        qualified = difference.upstream_symbol or difference.symbol
        commits = changed.get(difference.local, {}).get(qualified, [])
        module = module_name(difference.local) or difference.local
        if (difference.local, f"{module}:{difference.symbol}") in named or any(
            (c, difference.local) in recorded for c in commits
        ):
            continue
        if baseline is None:
            reason = "no baseline was taken (action=baseline)"
        elif row is None:
            reason = "not in the baseline: the difference is new since it was taken"
        else:
            reason = "the baseline has this difference, but the local or target code changed since it was taken"
        missing = tuple(c for c in commits if (c, difference.local) not in recorded)
        if missing:
            reason += f"; {len(missing)} commit(s) in range changed {qualified} and have no entry for this file"
        else:
            reason += f"; no ledger entry names it, and no commit in the file's range changed upstream {qualified}"
        found.append(Unaccounted(difference, reason, missing))
    return found


# -- export -----------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _evidence(items: list[dict[str, Any]]) -> str:
    shown = []
    for item in items:
        kind = item["kind"]
        if kind == "file":
            shown.append(f"file {item['path']}:{item['line']}@{item['rev'][:12]}")
        elif kind == "commit":
            shown.append(f"commit {item['sha'][:12]}")
        elif kind == "tool_result":
            shown.append(f"result {item['result_id']}")
        elif kind == "probe":
            shown.append(f"probe {item['probe_id']}")
        elif kind == "test":
            shown.append(f"test {item['name']} {item['outcome']}")
        else:
            shown.append(f"note: {item['text']}")
    return "; ".join(shown)


def render_markdown(document: dict[str, Any]) -> str:
    """The export as a compact disposition record a reviewer reads top to bottom."""
    summary = document["summary"]
    lines = [
        f"# Upstream commit audit — ledger {document['ledger_id']}",
        "",
        f"- Upstream: `{document['upstream'].get('target')}` ({(document['upstream'].get('target_commit') or '')[:12]})",
        f"- Commits: {summary['total']} total, {summary['with_entry']} with an entry, {summary['without_entry']} without",
        f"- Unaccounted differences: {len(document['unaccounted'])}",
        f"- Complete: {'yes' if document['complete'] else 'no'}",
        "",
        "## Files",
        "",
        "| plugin file | upstream at target | base | commits | with entry | without |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {_cell(f['local'])} | {_cell(f['upstream'] or '—')} | {_cell(f['base'] or '—')} | {f['commits']} | {f['with_entry']} | {f['without_entry']} |"
        for f in document["files"]
    ]
    lines += [
        "",
        "## Decisions",
        "",
        "| commit | subject | plugin file | disposition | local edit | interface | plugin symbols | evidence |",
        "|---|---|---|---|---|---|---|---|",
    ]
    subjects = document.get("subjects", {})
    lines += [
        f"| {e['commit'][:12]} | {_cell(subjects.get(e['commit'], ''))} | {_cell(e['file'])} | {e['disposition']} | "
        f"{'yes' if e['local_edit'] else 'no'} | {_cell(e['affected_interface'])} | {_cell(e['plugin_symbols'])} | {_cell(_evidence(e['evidence']))} |"
        for e in document["entries"]
    ]
    lines += ["", "## Commits without an entry", ""]
    lines += [f"- {m['commit'][:12]} {_cell(m['subject'])} — {_cell(m['files'])}" for m in document["missing"]] or [
        "- none"
    ]
    lines += ["", "## Unaccounted differences", ""]
    lines += [
        f"- {_cell(u['local'])} `{u['symbol']}` ({u['change']}, {u['proposed_class']}): {_cell(u['reason'])}"
        for u in document["unaccounted"]
    ] or ["- none"]
    baseline = document.get("baseline")
    lines += ["", "## Baseline", ""]
    lines += (
        [
            f"- taken {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(baseline['taken_at']))} UTC, {baseline['rows']} rows: "
            + ", ".join(f"{k} {v}" for k, v in sorted(baseline["classes"].items()))
        ]
        if baseline
        else ["- none taken"]
    )
    lines += ["", "## Inventory annotations", ""]
    lines += [
        f"- `{a['node']}`: {a['disposition']} — {_cell(_evidence(a['evidence']))}" for a in document["annotations"]
    ] or ["- none"]
    return "\n".join(lines) + "\n"
