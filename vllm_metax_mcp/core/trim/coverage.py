"""The coverage table of a plan: per distinct path, the kept layers that have it, why it is distinct, and
the request or serve setting that reaches it; MTP/draft layers and submodels are optional rows."""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.cross_check import CheckpointReport
from ..checkpoint.layout import Layout
from .selection import Paths, mtp_indices


@dataclass(frozen=True)
class CoverageEntry:
    target: str
    aliases: list[str]
    kept: list[int]
    available: list[int]
    reason: str
    request: str
    optional: bool = False


def coverage_rows(
    paths: Paths, kept: list[int], limits: dict[str, tuple[int, str]], long_ok: bool
) -> list[CoverageEntry]:
    """One row per distinct path: the kept layers that have it, why it is distinct, the request that reaches it."""
    rows = []
    for target in paths.targets:
        everywhere = len(target.layers) == paths.backbone
        reason = (
            f"{target.source}; {'every layer' if everywhere else f'{len(target.layers)} of {paths.backbone} layers'}"
        )
        requests = [] if target.name in limits else ["text case: any prompt"]
        for name in (n for n in target.names if n in limits):
            why = limits[name][1]
            requests.append(
                f"long-context case: {name} needs a prompt past {why}"
                if long_ok
                else f"{name} needs a prompt past {why}: max_model_len is too short"
            )
        rows.append(
            CoverageEntry(
                target.name,
                target.names[1:5],
                [i for i in kept if i in target.layers],
                target.layers,
                reason,
                "; ".join(requests),
            )
        )
    return rows


def mtp_row(layout: Layout, report: CheckpointReport | None, kept_mtp: tuple[int, ...]) -> CoverageEntry | None:
    """The MTP/draft layers, optional coverage (a speculative-decoding case reaches them)."""
    found = mtp_indices(layout, report)
    if not found:
        return None
    backbone = layout.backbone_layers or 0
    naming = report.mtp_naming if report else None
    declared = (
        f"{layout.mtp_key}={layout.mtp_layers}"
        if layout.mtp_layers
        else "no MTP count key: the consumer code decides how many are built"
    )
    return CoverageEntry(
        "mtp",
        [],
        [backbone + i for i in kept_mtp],
        [backbone + i for i in found],
        f"MTP/draft layers ({declared}{'; tensors ' + naming if naming else ''}); optional coverage",
        "serve.speculative_config {method: mtp, num_speculative_tokens: 1} (case mtp-draft)",
        optional=True,
    )
