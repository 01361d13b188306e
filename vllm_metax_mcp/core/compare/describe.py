"""One pair as diff_model reports it: line statistics with symbol counts, parse errors, closest release;
the symbol diff, import swaps and unified diff on request.

Line statistics are cached by blob pair (`StatsCache`), so a second call over unchanged trees diffs no
lines. The symbol counts come from the symbol diff of every pair, which costs about a millisecond a
pair, blob reads included (measured on both real plugin snapshots), so even a summary has them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ..foundation.errors import bad_input
from .pairs import UPSTREAM_ROOT, Pair, PairFlag, Rule, Status, Trees, paired_modules
from .releases import FileReleases
from .symdiff import ImportSwap, SymbolDiff, diff_extension, diff_symbols, import_swaps
from .textdiff import LineStats, StatsCache, split_lines, unified_diff

NO_SYMBOL_DIFF = "not an importable module path: no symbol diff"


@dataclass(frozen=True)
class PairStats(LineStats):
    """A pair's line statistics, with how many top-level symbols differ where both sides are modules that parse."""

    symbols_unchanged: int | None = None
    symbols_differing: int | None = None

    @classmethod
    def of(cls, lines: LineStats, symbols: SymbolDiff | None) -> PairStats:
        if symbols is None:
            return cls(**asdict(lines))
        return cls(**asdict(lines), symbols_unchanged=symbols.unchanged, symbols_differing=symbols.differing())


@dataclass(frozen=True)
class PairReport:
    """A pair with what diff_model adds to it."""

    pair: Pair
    flags: list[PairFlag]
    """The pair's flags, plus `parse_error` when a side does not parse."""
    error: str | None
    """Why a side could not be parsed (or why there is no symbol diff)."""
    stats: PairStats | None = None
    symbols: SymbolDiff | None = None
    import_swaps: list[ImportSwap] = field(default_factory=list)
    closest_release: str | None = None
    per_release: dict[str, int | None] = field(default_factory=dict)


class PairDescriber:
    """Turns pairs into reports: statistics (cached by blob pair), symbols and swaps on request."""

    def __init__(
        self,
        trees: Trees,
        stats: StatsCache,
        pairs: list[Pair],
        closest: Mapping[str, FileReleases],
        labels: list[str],
    ) -> None:
        self.trees = trees
        self.stats = stats
        self.paired = paired_modules(pairs)
        self.closest = closest
        self.labels = labels

    def _error(self, pair: Pair) -> str | None:
        sides = [("local", self.trees.local_modules.get(pair.local))]
        if pair.upstream and pair.upstream in self.trees.upstream_files:
            sides.append(("upstream", self.trees.upstream_modules.get(pair.upstream)))
        problems = [
            f"{side}: {module.record.error}" for side, module in sides if module is not None and module.record.error
        ]
        return "; ".join(problems) or None

    def describe(self, pair: Pair, symbols: bool) -> PairReport:
        error = self._error(pair)
        flags: list[PairFlag] = [*pair.flags, "parse_error"] if error else list(pair.flags)
        releases = self.closest.get(pair.local)
        closest = releases.closest if releases else None
        per_release = releases.per_release(self.labels) if releases else {}
        if pair.status not in (Status.CHANGED, Status.IDENTICAL) or pair.upstream is None:
            return PairReport(pair, flags, error, closest_release=closest, per_release=per_release)
        upstream_sha, local_sha = self.trees.upstream.sha(pair.upstream), self.trees.local.sha(pair.local)
        line_stats = self.stats.get(upstream_sha, local_sha, lambda: self._texts(pair))
        diff: SymbolDiff | None = None
        swaps: list[ImportSwap] = []
        mine = self.trees.local_modules.get(pair.local)
        theirs = self.trees.upstream_modules.get(pair.upstream)
        if not error and mine is not None and theirs is not None:
            diff = self._symbol_diff(pair)
            if symbols:
                swaps = import_swaps(mine, theirs, self.trees.package.name, UPSTREAM_ROOT, self.paired)
        elif symbols and not error:
            error = NO_SYMBOL_DIFF
        stats = PairStats.of(line_stats, diff)
        return PairReport(pair, flags, error, stats, diff if symbols else None, swaps, closest, per_release)

    def _texts(self, pair: Pair) -> tuple[bytes, bytes]:
        assert pair.upstream is not None
        return self.trees.upstream.read(pair.upstream), self.trees.local.read(pair.local)

    def _symbol_diff(self, pair: Pair) -> SymbolDiff:
        mine = self.trees.local_modules[pair.local]
        theirs = self.trees.upstream_modules[pair.upstream or ""]
        if pair.rule is Rule.SUBCLASS:
            return diff_extension(mine.record, theirs.record, pair.extends)
        upstream_text, local_text = self._texts(pair)
        return diff_symbols(
            mine.record, theirs.record, split_lines(local_text), split_lines(upstream_text), self.trees.affixes
        )

    def diff_lines(self, pair: Pair) -> list[str]:
        """The unified diff upstream -> local of a pair with a counterpart at the target."""
        if pair.upstream is None or pair.status not in (Status.CHANGED, Status.IDENTICAL):
            raise bad_input(
                f"{pair.local} has no counterpart at the target (status {pair.status.value}): there is nothing to diff."
            )
        upstream_text, local_text = self._texts(pair)
        return unified_diff(upstream_text, local_text, pair.upstream, pair.local)
