"""A line-level three-way merge (diff3) of one symbol's text: what the structural merge falls back to
inside a symbol both sides changed.

Both sides are matched against the base with difflib; the base lines both sides keep unchanged are
the stable points. Between two stable points a chunk changed on one side only takes that side; a
chunk changed on both sides the same way is taken once; anything else is a conflict, kept with both
sides' lines (never decided here).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Conflict:
    """Base lines the two sides replaced differently, with both replacements."""

    local: list[str]
    target: list[str]
    base: list[str]


@dataclass
class Merged:
    """The merge as chunks in order: a list of lines (settled) or a Conflict."""

    chunks: list[list[str] | Conflict] = field(default_factory=list)

    @property
    def conflicts(self) -> list[Conflict]:
        return [c for c in self.chunks if isinstance(c, Conflict)]

    def add(self, lines: list[str]) -> None:
        if lines:
            self.chunks.append(list(lines))


def _matches(base: list[str], other: list[str]) -> dict[int, int]:
    """Base line index -> the other side's index for every line difflib matches."""
    found: dict[int, int] = {}
    for block in difflib.SequenceMatcher(None, base, other, autojunk=False).get_matching_blocks():
        for offset in range(block.size):
            found[block.a + offset] = block.b + offset
    return found


def merge3(base: list[str], local: list[str], target: list[str]) -> Merged:
    """The three-way merge of line lists (lines with their newlines)."""
    in_local, in_target = _matches(base, local), _matches(base, target)  # both monotone: chunks never cross
    stable = [i for i in range(len(base)) if i in in_local and i in in_target]
    merged = Merged()
    b = l_pos = t_pos = 0
    for anchor in [*stable, len(base)]:
        l_end = in_local[anchor] if anchor < len(base) else len(local)
        t_end = in_target[anchor] if anchor < len(base) else len(target)
        _chunk(merged, base[b:anchor], local[l_pos:l_end], target[t_pos:t_end])
        if anchor < len(base):
            merged.add([base[anchor]])
        b, l_pos, t_pos = anchor + 1, l_end + 1, t_end + 1
    return merged


def _chunk(merged: Merged, base: list[str], local: list[str], target: list[str]) -> None:
    if local == base:
        merged.add(target)
    elif target == base or local == target or _same_stripped(local, target):
        merged.add(local)
    else:
        settled = _around(base, local, target) or _aligned(base, local, target)
        merged.chunks.append(Conflict(local, target, base) if settled is None else settled)


def _aligned(base: list[str], local: list[str], target: list[str]) -> list[str] | None:
    """Both sides rewrote the same lines one for one: line by line, unless one line changed on both."""
    if not (len(base) == len(local) == len(target)):
        return None
    out: list[str] = []
    for b, lo, t in zip(base, local, target, strict=True):
        if lo != b and t != b and lo != t:
            return None
        out.append(t if lo == b else lo)
    return out


def _around(base: list[str], local: list[str], target: list[str]) -> list[str] | None:
    """One side kept the base lines whole and only added lines before or after them, the other
    rewrote them: the rewrite with the additions around it (the order is then not in doubt)."""
    if not base:
        return None
    for keeper, writer in ((local, target), (target, local)):
        n = len(base)
        if len(keeper) > n and keeper[:n] == base:
            return writer + keeper[n:]
        if len(keeper) > n and keeper[-n:] == base:
            return keeper[:-n] + writer
    return None


def _same_stripped(a: list[str], b: list[str]) -> bool:
    """Equal but for trailing whitespace and blank lines: the same change typed twice."""
    return [x.rstrip() for x in a if x.strip()] == [y.rstrip() for y in b if y.strip()]
