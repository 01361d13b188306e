"""What the checkpoint checks report: one finding type for the config, the shard headers, the tensor
cross-check, the id-list bases and the constructed config alike."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[Severity, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    """A disagreement (or a note) about a checkpoint: how serious, a stable code, and what it means."""

    severity: Severity
    code: str
    message: str


def ordered_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then warnings, then notes; the order within a severity is kept."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER[f.severity])
