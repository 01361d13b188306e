"""Result ids and paging: every result can be cited later, every growing list is paged."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .errors import bad_input
from .state import StateStore

T = TypeVar("T")
PAGING_FIELDS = frozenset({"cursor", "limit"})
RESULT_BUDGET = 20_000
"""The most characters one result's text may hold (compact JSON as the client receives it); a page ends
before the row that would cross it, so `limit` is a ceiling, never a promise."""
CURSOR_RESERVE = 200
"""Room kept for the next_cursor and the page counters a paged result adds."""


def canonical(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)


def digest(document: Any, length: int = 24) -> str:
    return hashlib.sha256(canonical(document).encode()).hexdigest()[:length]


def inputs_fingerprint(tool: str, inputs: dict[str, Any]) -> str:
    """What a cursor is bound to: the tool and its inputs except the paging fields."""
    return digest({"tool": tool, "inputs": {k: v for k, v in inputs.items() if k not in PAGING_FIELDS}}, 16)


def record_result(store: StateStore, tool: str, inputs: dict[str, Any], output: dict[str, Any]) -> str:
    """Keep a result's inputs and output in the state directory under an id derived from both."""
    body = {"tool": tool, "inputs": inputs, "output": {k: v for k, v in output.items() if k != "result_id"}}
    result_id = f"r-{digest(body)}"
    store.write(f"results/{result_id}.json", body)
    return result_id


def result_resource(result_id: str) -> str:
    """The URI of a stored result (registered by the server's resources; paged like the tools)."""
    return f"vllm-metax://results/{result_id}"


def load_result(store: StateStore, result_id: str) -> dict[str, Any] | None:
    if not result_id.startswith("r-") or not all(c in "0123456789abcdef" for c in result_id[2:]):
        return None
    return store.read(f"results/{result_id}.json")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    total: int
    next_cursor: str | None
    offset: int = 0
    cut_by_size: bool = False
    """The page ended before `limit` because the next row would have crossed the size budget."""


@dataclass(frozen=True)
class SizeBudget:
    """How big one page may grow: `chars` for the rows, each measured by `size_of` (its compact JSON)."""

    size_of: Callable[[Any], int]
    chars: int


def paginate(
    items: Sequence[T],
    *,
    cursor: str | None,
    limit: int | None,
    fingerprint: str,
    default_limit: int,
    max_limit: int,
    budget: SizeBudget | None = None,
) -> Page[T]:
    """One page of `items`; the cursor is opaque and refused for different inputs. With a `budget` the page
    also ends before the row that would cross it (one row at least, so paging always advances)."""
    size = default_limit if limit is None else limit
    if not 1 <= size <= max_limit:
        raise bad_input(f"limit must be between 1 and {max_limit}; got {size}.")
    offset = _decode_cursor(cursor, fingerprint) if cursor else 0
    end = min(offset + size, len(items))
    cut = False
    if budget is not None:
        used, stop = 0, offset
        while stop < end:
            used += budget.size_of(items[stop]) + 1
            if used > budget.chars and stop > offset:
                cut = True
                break
            stop += 1
        end = stop
    following = _encode_cursor(end, fingerprint) if end < len(items) else None
    return Page(items=list(items[offset:end]), total=len(items), next_cursor=following, offset=offset, cut_by_size=cut)


def _encode_cursor(offset: int, fingerprint: str) -> str:
    return base64.urlsafe_b64encode(canonical({"o": offset, "f": fingerprint}).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, fingerprint: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        body = json.loads(base64.urlsafe_b64decode(padded.encode()))
        offset, bound = int(body["o"]), body["f"]
    except (ValueError, KeyError, TypeError):
        raise bad_input("cursor is not one this server issued; start again without a cursor.") from None
    if bound != fingerprint or offset < 0:
        raise bad_input(
            "cursor belongs to a call with different inputs; repeat the original call's inputs or drop the cursor."
        )
    return offset
