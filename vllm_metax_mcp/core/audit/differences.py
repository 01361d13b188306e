"""The local-vs-target differences a recheck weighs: each difference matrix row with the identity of
the code on both sides, the baseline rows made of them, and which differences neither the baseline
(same key, same code) nor a ledger entry explains."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..code.module_index import module_name
from ..compare.matrix import MatrixRow
from ..compare.pairs import Trees
from ..foundation.results import digest
from .commits import definition_hashes
from .ledger import Ledger, recorded_pairs


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

    def as_json(self) -> dict[str, Any]:
        """As the export document and the tool's output list it."""
        return {
            "local": self.difference.local,
            "symbol": self.difference.symbol,
            "upstream_symbol": self.difference.upstream_symbol,
            "change": self.difference.change,
            "proposed_class": self.difference.proposed_class,
            "reason": self.reason,
            "commits": list(self.commits),
        }


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
    """The baseline's rows as stored, by difference key."""
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
    ledger: Ledger | None,
    changed: dict[str, dict[str, list[str]]],
) -> list[Unaccounted]:
    """Differences neither the baseline (same key, same code) nor an entry explains.

    `changed` maps a local file to upstream qualified names -> commits in its range that changed
    them. An entry (commit, file) explains a difference of that file when it names the plugin
    symbol, or when its commit changed the difference's upstream symbol.
    """
    baseline = ((ledger or {}).get("baseline") or {}).get("rows")
    entries = list((ledger or {}).get("entries", {}).values())
    recorded = recorded_pairs(ledger)
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
