"""One row per measured figure and the table `make bench` prints: what | now | reference | ratio | goal | met?

Each bench module's `rows()` runs it (printing its own detail lines) and returns BenchRows; `python -m bench`
runs each in its own process (peak RSS and caches are per bench) and prints one table; `python -m bench.bench_x`
runs one and prints its part of it.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

Test = Literal["ratio_at_most", "ratio_at_least", "now_at_most", "none"]


@dataclass(frozen=True)
class Goal:
    """What a row is held to: a bound on its ratio or on its own figure, or only a word ("keep")."""

    test: Test = "none"
    bound: float = 0.0
    note: str = ""

    def text(self, unit: str) -> str:
        if self.test == "ratio_at_most":
            return f"<= {self.bound:g}x"
        if self.test == "ratio_at_least":
            return f">= {self.bound:g}x"
        if self.test == "now_at_most":
            return f"<= {self.bound:g} {unit}"
        return self.note or "-"

    def met(self, now: float, ratio: float | None) -> bool | None:
        if self.test == "now_at_most":
            return now <= self.bound
        if ratio is None or self.test == "none":
            return None
        return ratio <= self.bound if self.test == "ratio_at_most" else ratio >= self.bound


def at_most(bound: float) -> Goal:
    return Goal("ratio_at_most", bound)


def at_least(bound: float) -> Goal:
    return Goal("ratio_at_least", bound)


def seconds_at_most(bound: float) -> Goal:
    return Goal("now_at_most", bound)


def only(note: str) -> Goal:
    return Goal("none", note=note)


@dataclass(frozen=True)
class BenchRow:
    """One figure measured now beside its reference measured in the same run (ratio = now / reference)."""

    what: str
    now: float
    reference: float | None = None
    reference_what: str = ""
    goal: Goal = Goal()
    unit: str = "s"

    @property
    def ratio(self) -> float | None:
        return self.now / self.reference if self.reference else None

    @property
    def met(self) -> bool | None:
        return self.goal.met(self.now, self.ratio)


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} {unit}" if unit else f"{value:g}"


def _cells(row: BenchRow) -> tuple[str, ...]:
    reference = _figure(row.reference, row.unit)
    if row.reference_what:
        reference = f"{row.reference_what} {reference}"
    ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
    met = {True: "met", False: "MISSED", None: "-"}[row.met]
    return row.what, _figure(row.now, row.unit), reference, ratio, row.goal.text(row.unit), met


def print_table(rows: Iterable[BenchRow], failed: Iterable[str] = ()) -> None:
    """A Markdown table, aligned; benches that failed are listed under it."""
    head = ("what", "now", "reference", "ratio", "goal", "met?")
    body = [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    for number, line in enumerate([head, *body]):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) + " |")
        if number == 0:
            print("| " + " | ".join("-" * width for width in widths) + " |")
    for name in failed:
        print(f"FAILED: {name} (see its output above)")


def run_alone(rows: Callable[[], list[BenchRow]]) -> None:
    """A bench run by itself: its detail lines, then its rows as a table."""
    measured = rows()
    print()
    print_table(measured)


def emit(module: str, path: str) -> None:
    """Run `bench.<module>`'s rows() and write them as JSON to path (the runner calls this in a child process)."""
    measured: list[BenchRow] = importlib.import_module(f"bench.{module}").rows()
    Path(path).write_text(json.dumps([asdict(row) for row in measured]))


def load(path: Path) -> list[BenchRow]:
    def row(data: dict[str, Any]) -> BenchRow:
        return BenchRow(**{**data, "goal": Goal(**data["goal"])})

    return [row(data) for data in json.loads(path.read_text())]


def differing(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """The top-level fields of two answers that differ (a warm call should give the cold call's answer)."""
    return sorted(key for key in first.keys() | second.keys() if first.get(key) != second.get(key))


def warm_page_cache(*trees: Path, pattern: str = "*") -> int:
    """Read every file under the trees once (those matching pattern), so a "cold" call pays for an empty state
    directory, not for disk reads the OS would have cached anyway; returns the bytes read."""
    return sum(len(path.read_bytes()) for tree in trees for path in tree.rglob(pattern) if path.is_file())
