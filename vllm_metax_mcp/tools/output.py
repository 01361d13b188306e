"""What a result costs the agent: the compact form every result is sent in, and the size budget a page of
rows is fitted to (core/foundation/results.py pages by it)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..core.foundation.results import CURSOR_RESERVE, RESULT_BUDGET, SizeBudget, result_resource
from .spec import JobOutput

PENDING_FIELDS = ("result_id", "job", "poll_after_s", "resource")
"""All a call answers while its job runs: the rest of the output does not exist yet."""


def compact(model: BaseModel) -> dict[str, Any]:
    """The model as JSON values without the fields that say nothing: None, and empty lists, dicts and
    strings where the field is optional (a required field stays, so the result still validates)."""
    out: dict[str, Any] = {}
    fields = type(model).model_fields
    pending = isinstance(model, JobOutput) and model.job is not None
    for name, info in fields.items():
        if pending and name not in PENDING_FIELDS:
            continue
        value = _compact_value(getattr(model, name))
        if not info.is_required() and (value is None or value == [] or value == {} or value == ""):
            continue
        out[info.alias or name] = value
    return out


def _compact_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return compact(value)
    if isinstance(value, (list, tuple)):
        return [_compact_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _compact_value(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _compact_value(dataclasses.asdict(value))
    return json.loads(json.dumps(value, default=str))  # enums, paths: their JSON form


def text_of(model: BaseModel) -> str:
    """The text copy of a result: compact JSON of its compact form. An output that carries a document
    (a unified diff) names it in `plain_text_field`: the document follows the JSON as it is, unescaped."""
    return _text(type(model), compact(model))


def _text(kind: type[BaseModel], body: dict[str, Any]) -> str:
    document_field = getattr(kind, "plain_text_field", None)
    body = dict(body)
    document = body.pop(document_field, None) if document_field else None
    head = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return f"{head}\n{document}" if isinstance(document, str) else head


@dataclass(frozen=True)
class Sent:
    structured: dict[str, Any]
    text: str


def sent(model: BaseModel) -> Sent:
    """What the client receives. Tools page by size, so this is `compact` and `text_of`. Should a result
    still cross the budget, first `next_step` stops repeating long arguments (the call's own, echoed),
    then its largest optional fields give way, largest first, and `omitted` names them and the stored
    whole result's resource (paged) — never a reply an agent cannot take in."""
    structured = compact(model)
    text = _text(type(model), structured)
    if len(text) <= RESULT_BUDGET:
        return Sent(structured, text)
    if isinstance(structured.get("next_step"), dict):
        structured["next_step"] = _short_step(structured["next_step"])
    fields = type(model).model_fields
    optional = [info.alias or name for name, info in fields.items() if not info.is_required()]
    dropped: list[str] = []
    while len(text := _text(type(model), structured)) > RESULT_BUDGET - CURSOR_RESERVE:
        present = [name for name in optional if name in structured and name not in ("result_id", "next_step")]
        if not present:
            break
        largest = max(present, key=lambda name: len(json.dumps(structured[name], separators=(",", ":"))))
        del structured[largest]
        dropped.append(largest)
    result_id = getattr(model, "result_id", "")
    if dropped or len(text) > RESULT_BUDGET:
        structured["omitted"] = {"fields": dropped, "resource": result_resource(result_id) if result_id else None}
    return Sent(structured, _text(type(model), structured))


STEP_ARGUMENT_CHARS = 500
"""The longest argument value `next_step` repeats when a result is over budget."""


def _short_step(step: dict[str, Any]) -> dict[str, Any]:
    arguments = step.get("arguments") or {}
    long = sorted(k for k, v in arguments.items() if len(json.dumps(v, separators=(",", ":"))) > STEP_ARGUMENT_CHARS)
    if not long:
        return step
    kept = {k: v for k, v in arguments.items() if k not in long}
    why = f"{step.get('why', '')} Pass this call's own {', '.join(long)} as well.".strip()
    return {**step, "arguments": kept, "why": why}


def size_of(model: BaseModel) -> int:
    return len(text_of(model))


def rows_budget(fixed: BaseModel) -> SizeBudget:
    """The room left for a page's rows once the result's fixed part (`fixed`, built with no rows) is sent."""
    return SizeBudget(size_of=size_of, chars=max(RESULT_BUDGET - size_of(fixed) - CURSOR_RESERVE, 1))
