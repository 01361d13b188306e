"""Progress by phase, reported from deep inside core code without threading a callback through it.

A call's runner installs a sink with `reporting(sink)`; code on the way says
`with phase("pairing files", weight=0.3):` and `advance(done, total)`. A phase takes `weight` of
the span of the phase around it (the whole call at the top), starting where the previous sibling
ended, so overall progress is a fraction in [0, 1) that only grows. Without a sink (a tool run in a
thread, the CLI, a test calling core directly) both are no-ops.

`Monotonic` is the other end: it turns reports (and heartbeats while nothing new is reported) into
a strictly increasing sequence below `total`, as MCP requires of progress notifications.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

Sink = Callable[[float, float, str], None]
"""Receives (fraction done, the most the current phase may reach, the phase's message)."""
Send = Callable[[float, float | None, str | None], Awaitable[None]]
"""Sends one progress notification: (progress, total, message)."""

SEND_EVERY_S = 0.25
"""A report inside a phase is passed on at most this often (a phase's start always is)."""
HEARTBEAT_S = 1.0
"""With no report for this long, the last value is re-sent, a little higher."""
STEP = 0.01
"""A repeated value rises by this share of what is left to the phase's end (or the total)."""
T = TypeVar("T")


@dataclass(eq=False)  # found in the stack by identity
class _Span:
    name: str
    low: float
    high: float
    cursor: float = 0.0  # where the next child phase starts

    def __post_init__(self) -> None:
        self.cursor = self.low


@dataclass
class Tracker:
    """The open phases of one call and the last fraction sent to the sink."""

    sink: Sink
    stack: list[_Span] = field(default_factory=lambda: [_Span("working", 0.0, 1.0)])
    sent_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, name: str, weight: float) -> _Span:
        with self.lock:
            parent = self.stack[-1]
            width = (parent.high - parent.low) * min(max(weight, 0.0), 1.0)
            span = _Span(name, parent.cursor, min(parent.cursor + width, parent.high))
            self.stack.append(span)
            self._send(span.low, force=True)
            return span

    def leave(self, span: _Span) -> None:
        with self.lock:
            if span in self.stack:
                del self.stack[self.stack.index(span) :]
            self.stack[-1].cursor = max(self.stack[-1].cursor, span.high)

    def advance(self, done: float, total: float, detail: str | None) -> None:
        with self.lock:
            span = self.stack[-1]  # the part of it its finished child phases left
            share = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
            self._send(span.cursor + (span.high - span.cursor) * share, force=False, detail=detail)

    def _send(self, value: float, force: bool, detail: str | None = None) -> None:
        now = time.monotonic()
        if force or now - self.sent_at >= SEND_EVERY_S:
            self.sent_at = now
            names = [s.name for s in self.stack[1:]] + ([detail] if detail else [])
            self.sink(value, self.stack[-1].high, ": ".join(names) or "working")


_current: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar("vllm_metax_mcp_progress", default=None)


@contextmanager
def reporting(sink: Sink) -> Iterator[Tracker]:
    """Send the phases of the work inside to `sink` (in this context)."""
    tracker = Tracker(sink)
    token = _current.set(tracker)
    try:
        yield tracker
    finally:
        _current.reset(token)


@contextmanager
def phase(name: str, weight: float) -> Iterator[None]:
    """A named stretch of the work, `weight` of the enclosing phase's span (0..1)."""
    tracker = _current.get()
    if tracker is None:
        yield
        return
    span = tracker.enter(name, weight)
    try:
        yield
    finally:
        tracker.leave(span)


def advance(done: float, total: float, detail: str | None = None) -> None:
    """How far the current phase is: `done` of `total` units of what its finished child phases left;
    `detail` says what the units are (it follows the phase's name in the message)."""
    tracker = _current.get()
    if tracker is not None:
        tracker.advance(done, total, detail)


def advancing(items: Iterable[T], total: int, detail: str | None = None) -> Iterator[T]:
    """`items` unchanged, advancing the current phase by one of `total` per item."""
    for done, item in enumerate(items, 1):
        yield item
        advance(done, total, detail)


class Monotonic:
    """Progress notifications that strictly increase and stay below `total` until the work ends.

    A value at or below the last one sent (a job that restarts its count, a heartbeat) goes out as
    the last one plus a small step toward the ceiling, so the sequence never stands still or goes back."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._last: float | None = None
        self._ceiling = math.inf
        self._total: float | None = None
        self._message: str | None = None
        self._lock = anyio.Lock()
        self.sent_at = time.monotonic()

    async def report(
        self, value: float, total: float | None, message: str | None, ceiling: float | None = None
    ) -> None:
        async with self._lock:
            self._total = total if total is not None else self._total
            top = self._top()
            self._ceiling = min(ceiling, top) if ceiling is not None else top
            self._message = message or self._message
            await self._emit(min(value, top))

    async def beat(self) -> None:
        """Re-send the last value a little higher (nothing before the first report)."""
        async with self._lock:
            if self._last is not None:
                await self._emit(self._last)

    async def heartbeat(self) -> None:
        """Beat whenever HEARTBEAT_S passes without a notification; runs until cancelled."""
        while True:
            await anyio.sleep(max(0.05, self.sent_at + HEARTBEAT_S - time.monotonic()))
            if time.monotonic() - self.sent_at >= HEARTBEAT_S * 0.95:
                await self.beat()

    def _top(self) -> float:
        """The most a report may show before the end: a little below the total, leaving room to go on rising."""
        return self._total * (1 - 1e-3) if self._total is not None else math.inf

    async def _emit(self, value: float) -> None:
        last = self._last
        if last is not None and value <= last:
            ceiling = self._ceiling if self._ceiling > last else (self._total if self._total is not None else math.inf)
            value = last + (ceiling - last) * STEP if math.isfinite(ceiling) else last + max(1e-6, abs(last) * 1e-6)
            if value <= last:
                return  # the float range toward the ceiling is used up; nothing truthful to add
        self._last, self.sent_at = value, time.monotonic()
        await self._send(value, self._total, self._message)
