"""The smoke test's HTTP client for the server it started on 127.0.0.1 (stdlib only): plain GET and POST,
and a streamed POST read as server-sent events."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

ERROR_BODY_CHARS = 500


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    """The parsed JSON; the (cut) text of an error, or of an answer that is not JSON."""
    latency_s: float


@dataclass(frozen=True)
class StreamReply:
    status: int
    chunks: list[dict[str, Any]]
    """The parsed events; for an error, one holding its (cut) text."""
    done: bool
    """The stream ended with the [DONE] marker."""
    latency_s: float
    ttft_s: float | None
    """Time to the first content."""


def get(url: str, timeout: float) -> Reply:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
            parsed = json.loads(body) if body.strip().startswith((b"{", b"[")) else body.decode(errors="replace")
            return Reply(response.status, parsed, time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read().decode(errors="replace")[:ERROR_BODY_CHARS], time.monotonic() - started)


def _request(url: str, body: dict[str, Any]) -> urllib.request.Request:
    return urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def post(url: str, body: dict[str, Any], timeout: float) -> Reply:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(_request(url, body), timeout=timeout) as response:
            return Reply(response.status, json.loads(response.read()), time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read().decode(errors="replace")[:ERROR_BODY_CHARS], time.monotonic() - started)


def post_stream(url: str, body: dict[str, Any], timeout: float) -> StreamReply:
    started = time.monotonic()
    chunks: list[dict[str, Any]] = []
    first: float | None = None
    try:
        with urllib.request.urlopen(_request(url, body), timeout=timeout) as response:
            for raw in response:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return StreamReply(response.status, chunks, True, time.monotonic() - started, first)
                chunk = json.loads(data)
                if first is None and any(delta_text(c) for c in chunk.get("choices", [])):
                    first = time.monotonic() - started
                chunks.append(chunk)
            return StreamReply(response.status, chunks, False, time.monotonic() - started, first)
    except urllib.error.HTTPError as exc:
        error = {"error": exc.read().decode(errors="replace")[:ERROR_BODY_CHARS]}
        return StreamReply(exc.code, [error], False, time.monotonic() - started, first)


def delta_text(choice: dict[str, Any]) -> str:
    """The text of one streamed choice (chat delta or completion text)."""
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""
