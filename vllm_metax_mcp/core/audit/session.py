"""What every action of one audit_commits call opens: the subjects, the files and what pairs them,
the record cache, the ledger as stored (or a fresh one to store), and how the call's lists are paged."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

from ..code.module_index import RecordCache
from ..compare.inputs import PairingInputs, pairing_inputs
from ..foundation.results import Page, SizeBudget, paginate
from ..foundation.state import StateStore
from ..sources.environment import UpstreamMapping
from ..sources.git import Repository
from ..sources.subjects import RevisionSubject, Subject
from .ledger import Ledger, change_ledger, ledger_id, load_ledger, new_ledger, recorded_pairs

PagedList = Literal["commits", "files", "unaccounted", "patch"]
DEFAULT_LIMITS: dict[PagedList, int] = {"commits": 8, "files": 50, "unaccounted": 40, "patch": 200}
MAX_LIMIT = 1000
"""One ceiling for every list: a page also ends where the result's size budget does."""
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Paging:
    """The page a call asks for; the cursor is bound to the call's inputs (`fingerprint`)."""

    cursor: str | None
    limit: int | None
    fingerprint: str

    def page(self, items: Sequence[T], kind: PagedList, budget: SizeBudget | None = None) -> Page[T]:
        return paginate(
            items,
            cursor=self.cursor,
            limit=self.limit,
            fingerprint=self.fingerprint,
            default_limit=DEFAULT_LIMITS[kind],
            max_limit=MAX_LIMIT,
            budget=budget,
        )

    def expanded(
        self, items: Sequence[T], kind: PagedList, expand: Callable[[Sequence[T]], list[R]], budget: SizeBudget
    ) -> Page[R]:
        """A page of `items` as rows, ending before the row that would cross `budget` (its size_of
        measures a row). Rows are built in batches as the page reaches them (the page's default
        limit first, then doubling), so the items within `limit` but past the budget cost nothing."""
        ceiling = self.page(items, kind).items
        position = {id(item): index for index, item in enumerate(ceiling)}
        rows: list[R] = []

        def size_of(item: T) -> int:
            index = position[id(item)]
            while len(rows) <= index:
                rows.extend(expand(ceiling[len(rows) : len(rows) + max(DEFAULT_LIMITS[kind], len(rows))]))
            return budget.size_of(rows[index])

        sized = self.page(items, kind, SizeBudget(size_of, budget.chars))
        return Page(rows[: len(sized.items)], sized.total, sized.next_cursor, sized.offset, sized.cut_by_size)


@dataclass
class AuditSession:
    """One call's subjects and ledger; `ledger` follows every change the call stores."""

    store: StateStore
    repo: Repository
    plugin: Subject
    upstream: RevisionSubject
    mapping: UpstreamMapping
    inputs: PairingInputs
    cache: RecordCache
    ledger_id: str
    ledger: Ledger | None
    """As stored (None: nothing stored yet)."""
    fresh: Ledger
    """The ledger a first change starts from."""

    @property
    def local_files(self) -> list[str]:
        return self.inputs.local_files

    @property
    def target(self) -> str:
        return self.upstream.commit

    @property
    def target_name(self) -> str:
        """How a range names its end: the target as the mapping names it, or its short commit."""
        return self.mapping.target or self.target[:12]

    def change(self, change: Callable[[Ledger], None]) -> None:
        """Apply `change` to the stored ledger under the state directory's lock."""
        self.ledger = change_ledger(self.store, self.fresh, change)

    def recorded(self) -> frozenset[tuple[str, str]]:
        return recorded_pairs(self.ledger)


def open_session(
    store: StateStore,
    repo: Repository,
    plugin: Subject,
    upstream: RevisionSubject,
    mapping: UpstreamMapping,
    paths: list[str],
    mapping_overrides: Mapping[str, str | None],
) -> AuditSession:
    """The session of a call on `paths` of the plugin, against the upstream target."""
    inputs = pairing_inputs(plugin, paths, mapping_overrides)
    identifier = ledger_id(repo.key, upstream.commit)
    return AuditSession(
        store,
        repo,
        plugin,
        upstream,
        mapping,
        inputs,
        RecordCache(store),
        identifier,
        load_ledger(store, identifier),
        new_ledger(identifier, repo.key, mapping.as_dict()),
    )


def first_lines(lines: Sequence[str], chars: int) -> list[str]:
    """As many of `lines` as fit in `chars`, and a last one counting the rest."""
    kept: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        used += len(line) + 3
        if used > chars:
            return [*kept, f"… {len(lines) - index} more"]
        kept.append(line)
    return kept


def json_chars(item: Any) -> int:
    """A dataclass row's size as JSON: at least what the client receives (which drops empty fields)."""
    return len(json.dumps(asdict(item), separators=(",", ":"), ensure_ascii=False, default=str))


def fitting(items: Sequence[T], chars: int) -> list[T]:
    """The first `items` (dataclasses) that fit in `chars` together: a block sent once, cut where it would cross."""
    kept: list[T] = []
    used = 0
    for item in items:
        used += json_chars(item) + 1
        if used > chars:
            break
        kept.append(item)
    return kept
