"""Whether a speculative draft (an MTP layer, a draft model) really ran: vLLM's spec-decode counters.

A server started with `--speculative-config` may still never propose a token (a draft that failed to
load falls back, or every case ended before decoding), and greedy answers look the same either way.
vLLM counts drafts in Prometheus counters on `/metrics` (vllm/v1/spec_decode/metrics.py:
`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`, each rendered with
the `_total` suffix and one sample per engine); read after the cases, they prove the path executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}
_NAME = re.compile(r"^[A-Za-z_:][\w:]*")


def _sample(line: str) -> tuple[str, float] | None:
    """(metric name, value) of one exposition line; the value follows the labels (whose quoted values may
    hold `}`), and an optional timestamp may follow it."""
    name = _NAME.match(line)
    if name is None:
        return None
    rest = line[name.end() :]
    if rest.startswith("{"):
        rest = rest[rest.rfind("}") + 1 :]
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
        return None
    try:
        return name.group(), float(fields[0])
    except ValueError:
        return None


@dataclass(frozen=True)
class DraftCounts:
    """Totals over every engine since the server started."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int


def parse_draft_counts(metrics: str) -> DraftCounts | None:
    """The counters in a Prometheus text exposition; None when the server exports none of them."""
    totals = dict.fromkeys(COUNTERS.values(), 0.0)
    seen = False
    for line in metrics.splitlines():
        sample = _sample(line.strip())
        if sample is None or sample[0] not in COUNTERS or sample[1] != sample[1]:  # NaN
            continue
        totals[COUNTERS[sample[0]]] += sample[1]
        seen = True
    if not seen:
        return None
    return DraftCounts(int(totals["drafts"]), int(totals["draft_tokens"]), int(totals["accepted_tokens"]))


def draft_problem(counts: DraftCounts | None) -> str | None:
    """Why the run cannot count as having exercised the draft (None: it did)."""
    if counts is None:
        return "speculative_config was set, but /metrics has no spec-decode counters: the draft path is unproven"
    if counts.draft_tokens == 0:
        return "speculative_config was set, but the server proposed no draft token during the cases"
    return None
