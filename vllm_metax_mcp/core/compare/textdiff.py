"""Line-level comparison of an upstream file and its local copy.

Direction is always upstream -> local, as `git diff upstream local` would show it: `added` are
lines only in the local file, `removed` lines only in the upstream file, `hunks` the change
blocks of a zero-context diff, beside the line totals of both files. Statistics depend only on the
two blobs, so they are cached in the state directory by the pair of blob ids and a second run over
unchanged trees diffs nothing.
"""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..foundation.state import StateStore

STATS_VERSION = 2
"""Part of the cache path: a version bump leaves entries of another shape (v1 had no line totals) unread."""


@dataclass(frozen=True)
class LineStats:
    added: int
    removed: int
    hunks: int
    local_lines: int
    upstream_lines: int
    """Totals as `split_lines` counts them: a last line without a newline counts too."""


def split_lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()


def _matcher(upstream: list[str], local: list[str]) -> difflib.SequenceMatcher:
    # autojunk off: popular lines (blank lines, closing brackets) must still anchor the match,
    # or long files get needlessly large hunks.
    return difflib.SequenceMatcher(None, upstream, local, autojunk=False)


def line_stats(upstream: bytes, local: bytes) -> LineStats:
    added = removed = hunks = 0
    a, b = split_lines(upstream), split_lines(local)
    for tag, i1, i2, j1, j2 in _matcher(a, b).get_opcodes():
        if tag != "equal":
            hunks += 1
            removed += i2 - i1
            added += j2 - j1
    return LineStats(added, removed, hunks, local_lines=len(b), upstream_lines=len(a))


def _range(start: int, length: int) -> str:
    """A unified-diff range: `start,length`, with git's conventions for one and zero lines."""
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def unified_diff(upstream: bytes, local: bytes, upstream_label: str, local_label: str, context: int = 3) -> list[str]:
    """The unified diff upstream -> local (no trailing newlines), from the same matcher as the stats."""
    a, b = split_lines(upstream), split_lines(local)
    lines: list[str] = []
    for group in _matcher(a, b).get_grouped_opcodes(context):
        if not lines:
            lines += [f"--- a/{upstream_label}", f"+++ b/{local_label}"]
        first, last = group[0], group[-1]
        lines.append(f"@@ -{_range(first[1], last[2] - first[1])} +{_range(first[3], last[4] - first[3])} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[i1:i2]]
                continue
            lines += ["-" + line for line in a[i1:i2]]
            lines += ["+" + line for line in b[j1:j2]]
    return lines


def line_profile(data: bytes | str) -> Counter[str]:
    """The multiset of meaningful lines: stripped, without blank and comment-only lines."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return Counter(s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#"))


def similarity(a: Counter[str], b: Counter[str]) -> float:
    """Dice coefficient of two line multisets: 1.0 for the same lines in any order, 0.0 for none shared."""
    total = sum(a.values()) + sum(b.values())
    return 2 * sum((a & b).values()) / total if total else 1.0


class StatsCache:
    """Line statistics keyed by (upstream blob, local blob) in the state directory."""

    def __init__(self, store: StateStore) -> None:
        self.root = store.path(f"cache/linestats/v{STATS_VERSION}")
        self.hits = 0
        self.misses = 0

    def _path(self, upstream_sha: str, local_sha: str) -> Path:
        return self.root / upstream_sha[:2] / f"{upstream_sha}-{local_sha}.json"

    def get(self, upstream_sha: str, local_sha: str, read: Callable[[], tuple[bytes, bytes]]) -> LineStats:
        """Cached stats, or computed from `read()` -> (upstream bytes, local bytes) and stored."""
        path = self._path(upstream_sha, local_sha)
        try:
            stats = LineStats(**json.loads(path.read_text()))
            self.hits += 1
            return stats
        except (FileNotFoundError, ValueError, TypeError):
            pass
        self.misses += 1
        stats = line_stats(*read())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(stats)))
        os.replace(tmp, path)
        return stats
