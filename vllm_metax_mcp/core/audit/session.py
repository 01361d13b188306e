"""What every action of one audit_commits call opens: the subjects, the files and what pairs them,
the record cache, the ledger as stored (or a fresh one to store), and how the call's lists are paged."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from ..code.module_index import RecordCache
from ..compare.inputs import PairingInputs, pairing_inputs
from ..foundation.results import Page, paginate
from ..foundation.state import StateStore
from ..sources.environment import UpstreamMapping
from ..sources.git import Repository
from ..sources.subjects import RevisionSubject, Subject
from .ledger import Ledger, change_ledger, ledger_id, load_ledger, new_ledger, recorded_pairs

PagedList = Literal["commits", "files", "unaccounted", "patch"]
DEFAULT_LIMITS: dict[PagedList, int] = {"commits": 8, "files": 50, "unaccounted": 40, "patch": 200}
MAX_LIMITS: dict[PagedList, int] = {"commits": 200, "files": 2000, "unaccounted": 5000, "patch": 5000}
T = TypeVar("T")


@dataclass(frozen=True)
class Paging:
    """The page a call asks for; the cursor is bound to the call's inputs (`fingerprint`)."""

    cursor: str | None
    limit: int | None
    fingerprint: str

    def page(self, items: Sequence[T], kind: PagedList) -> Page[T]:
        return paginate(
            items,
            cursor=self.cursor,
            limit=self.limit,
            fingerprint=self.fingerprint,
            default_limit=DEFAULT_LIMITS[kind],
            max_limit=MAX_LIMITS[kind],
        )


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
