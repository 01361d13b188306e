"""Whether a layer-id list counts from 0 or 1, decided from evidence: tensor names first, then the
consumer code that reads the list; the values' range is only the fallback. Kinds that depend on
the list are rebuilt once a base is decided.
"""

from __future__ import annotations

from typing import Any

from .consumers import SourceTree, bases_from_code
from .cross_check import CheckpointReport, base_from_tensors, cross_check
from .findings import Finding
from .id_lists import MEANING_KINDS, IdList
from .kinds import RULE_FORMS
from .layout import Layout, rebuild_kinds
from .safetensors_headers import CheckpointFiles


def _decide_bases(
    layout: Layout, report: CheckpointReport | None, trees: list[SourceTree], model_class: str | None
) -> tuple[bool, list[Finding]]:
    """Tensor names first, then consumer code; the values' range is the fallback. Returns (changed, findings)."""
    changed = False
    findings: list[Finding] = []
    for item in layout.id_lists:
        if not item.ids:
            continue
        before = item.base
        decided = _from_tensors(item, layout, report, findings)
        if decided is None:
            decided = _from_code(item, trees, model_class, findings)
        if decided is not None and before is not None and decided != before:
            findings.append(
                Finding(
                    "warning",
                    "id_list_base_conflict",
                    f"{item.name}: the values suggest {before}-based ids but stronger evidence says {decided}-based "
                    f"({item.evidence}).",
                )
            )
        changed |= item.base != before
    return changed, findings


def _from_tensors(item: IdList, layout: Layout, report: CheckpointReport | None, findings: list[Finding]) -> int | None:
    if report is None:
        return None
    kinds = MEANING_KINDS.get(item.meaning or "", ())
    others = tuple(r.name for r in layout.rules if r.active and r.name in RULE_FORMS and RULE_FORMS[r.name][1] == kinds)
    base, evidence, contradicted = base_from_tensors(
        item, report.markers, layout.backbone_layers or 0, layout.mtp_layers or 0, others
    )
    if contradicted:
        findings.append(Finding("error", "id_list_contradicts_tensors", evidence))
    if base is not None:
        item.base, item.evidence = base, evidence
    return base


def _from_code(item: IdList, trees: list[SourceTree], model_class: str | None, findings: list[Finding]) -> int | None:
    evidence = bases_from_code(trees, item.name) if trees else []
    if not evidence:
        return None
    if model_class and len({e.base for e in evidence}) > 1:
        module = model_class.split(":", 1)[0].replace(".", "/")
        evidence = [e for e in evidence if e.location.path.startswith(module)] or evidence
    bases = {e.base for e in evidence}
    first = evidence[0].location
    cited = f"consumer code: {first.tree} {first.path}:{first.line} `{first.text}`" + (
        f" (+{len(evidence) - 1} more)" if len(evidence) > 1 else ""
    )
    if len(bases) > 1:
        findings.append(
            Finding(
                "warning",
                "id_list_consumers_disagree",
                f"{item.name}: consumers read it both 0- and 1-based ({cited}).",
            )
        )
        return None
    item.base, item.evidence = bases.pop(), cited
    return item.base


def cross_check_with_bases(
    layout: Layout,
    raw: dict[str, Any],
    files: CheckpointFiles | None,
    trees: list[SourceTree],
    model_class: str | None,
) -> tuple[CheckpointReport | None, list[Finding]]:
    """Cross-check, decide id-list bases from its tensor evidence (or code), and redo the layer kinds that
    depend on them."""
    report = cross_check(layout, files) if files else None
    changed, findings = _decide_bases(layout, report, trees, model_class)
    if changed:
        rebuild_kinds(raw, layout)
        report = cross_check(layout, files) if files else None
    return report, findings
