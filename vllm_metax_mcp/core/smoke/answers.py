"""One smoke case against the running server, and the checks of its answers: structure and token counts,
determinism at temperature 0 (the same tokens again, and streamed), and keywords for real weights."""

from __future__ import annotations

import base64
import mimetypes
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..trim.cases import CaseKind, SmokeCase
from .client import Reply, StreamReply, delta_text, post, post_stream

TEXT_CHARS = 160
ERROR_CHARS = 500

RequestKind = Literal["completion", "chat", "image", "models"]
"""A case's kind, or the listing of the served models that precedes the cases."""
RequestMode = Literal["first", "repeat", "stream"]


@dataclass
class RequestRecord:
    """One request of the run and its checks (a `requests` entry of the output)."""

    case: str
    kind: RequestKind
    mode: RequestMode
    ok: bool = False
    checks: dict[str, bool] = field(default_factory=dict)
    covers: str = ""
    endpoint: str | None = None
    status: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    keywords: str | None = None
    keywords_missing: list[str] | None = None
    served_models: list[str] | None = None
    error: str | None = None

    @property
    def problem(self) -> str:
        """Why it is not ok: its failed checks, else its error or status."""
        failed = [name for name, passed in self.checks.items() if not passed]
        return f"failed checks {failed}" if failed else (self.error or f"status {self.status}")


@dataclass(frozen=True)
class CaseRequest:
    endpoint: str
    body: dict[str, Any]


@dataclass
class Answer:
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


def _image_url(image: str) -> str:
    if image.startswith("data:"):
        return image
    kind = mimetypes.guess_type(image)[0] or "image/png"
    return f"data:{kind};base64,{base64.b64encode(Path(image).read_bytes()).decode()}"


def case_request(case: SmokeCase, served: str) -> CaseRequest:
    """The case's request to the served model at temperature 0, asking for token ids."""
    body: dict[str, Any] = {
        "model": served,
        "max_tokens": case.max_tokens,
        "temperature": 0,
        "return_token_ids": True,
    }
    if case.kind == "completion":
        return CaseRequest("/v1/completions", {**body, "prompt": case.prompt})
    if case.kind == "chat":
        return CaseRequest("/v1/chat/completions", {**body, "messages": case.messages})
    assert case.image is not None  # an image case has one (SmokeCase checks it)
    content = [
        {"type": "text", "text": case.prompt or "Describe the image."},
        {"type": "image_url", "image_url": {"url": _image_url(case.image)}},
    ]
    return CaseRequest("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": content}]})


def _answer(kind: CaseKind, body: Any) -> Answer:
    if not isinstance(body, dict) or not body.get("choices"):
        return Answer()
    choice = body["choices"][0]
    usage = body.get("usage") or {}
    text = choice.get("text") if kind == "completion" else (choice.get("message") or {}).get("content")
    return Answer(
        text=text if isinstance(text, str) else None,
        token_ids=choice.get("token_ids"),
        prompt_token_ids=choice.get("prompt_token_ids") or body.get("prompt_token_ids"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=choice.get("finish_reason"),
    )


def _streamed(chunks: list[dict[str, Any]]) -> Answer:
    text, finish = "", None
    ids: list[int] = []
    usage: dict[str, Any] = {}
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            text += delta_text(choice)
            ids += choice.get("token_ids") or []
            finish = choice.get("finish_reason") or finish
    return Answer(
        text=text,
        token_ids=ids or None,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=finish,
    )


def _structure_checks(answer: Answer, max_tokens: int) -> dict[str, bool]:
    checks = {
        "has_text": answer.text is not None,
        "token_count": answer.completion_tokens is not None and 1 <= answer.completion_tokens <= max_tokens,
        "finish_reason": answer.finish_reason in ("length", "stop"),
    }
    if answer.token_ids is not None:
        checks["token_ids_match_usage"] = len(answer.token_ids) == answer.completion_tokens
    return checks


def _same(a: Answer, b: Answer) -> bool:
    if a.token_ids is not None and b.token_ids is not None:
        return a.token_ids == b.token_ids
    return a.text == b.text


def _record(
    case: SmokeCase,
    mode: RequestMode,
    endpoint: str,
    status: int,
    latency: float,
    answer: Answer,
    checks: dict[str, bool],
    error: Any = None,
) -> RequestRecord:
    return RequestRecord(
        case=case.name,
        kind=case.kind,
        covers=case.covers,
        mode=mode,
        endpoint=endpoint,
        status=status,
        latency_s=round(latency, 3),
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        finish_reason=answer.finish_reason,
        text=None if answer.text is None else answer.text[:TEXT_CHARS],
        checks=checks,
        ok=status == 200 and all(checks.values()),
        error=None if error is None else str(error)[:ERROR_CHARS],
        token_ids=answer.token_ids if mode == "first" else None,
        prompt_token_ids=answer.prompt_token_ids if mode == "first" else None,
    )


def _first_record(case: SmokeCase, endpoint: str, reply: Reply, answer: Answer, dummy: bool) -> RequestRecord:
    """The first answer, checked for structure and (real weights) keywords."""
    ok = reply.status == 200
    checks = _structure_checks(answer, case.max_tokens) if ok else {}
    keywords, missing = None, None
    if case.expect_keywords and ok:
        if dummy:
            keywords = "not checked: dummy weights produce no meaning"
        else:
            missing = [k for k in case.expect_keywords if k.lower() not in (answer.text or "").lower()]
            checks["keywords"] = not missing
    record = _record(case, "first", endpoint, reply.status, reply.latency_s, answer, checks, None if ok else reply.body)
    record.keywords, record.keywords_missing = keywords, missing
    return record


def _repeat_record(case: SmokeCase, endpoint: str, reply: Reply, first: Answer) -> RequestRecord:
    """The same request again: the same tokens at temperature 0."""
    again = _answer(case.kind, reply.body)
    ok = reply.status == 200
    checks = {**_structure_checks(again, case.max_tokens), "same_as_first": _same(first, again)} if ok else {}
    return _record(case, "repeat", endpoint, reply.status, reply.latency_s, again, checks, None if ok else reply.body)


def _stream_record(case: SmokeCase, endpoint: str, stream: StreamReply, first: Answer) -> RequestRecord:
    """The same request streamed: the same tokens, ending with [DONE]."""
    streamed = _streamed(stream.chunks)
    ok = stream.status == 200
    checks = {}
    if ok:
        checks = {**_structure_checks(streamed, case.max_tokens), "done_marker": stream.done}
        checks["same_as_first"] = _same(first, streamed)
    record = _record(
        case, "stream", endpoint, stream.status, stream.latency_s, streamed, checks, None if ok else stream.chunks
    )
    record.ttft_s = None if stream.ttft_s is None else round(stream.ttft_s, 3)
    return record


def run_case(base: str, case: SmokeCase, served: str, dummy: bool, timeout: float) -> list[RequestRecord]:
    """The case three times at temperature 0: once, again (determinism), and streamed (same tokens)."""
    request = case_request(case, served)
    url = base + request.endpoint
    reply = post(url, request.body, timeout)
    first = _answer(case.kind, reply.body)
    records = [_first_record(case, request.endpoint, reply, first, dummy)]
    if reply.status == 200:
        records.append(_repeat_record(case, request.endpoint, post(url, request.body, timeout), first))
        stream_body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
        records.append(_stream_record(case, request.endpoint, post_stream(url, stream_body, timeout), first))
    return records
