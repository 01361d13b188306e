"""The constructed config: what the target vLLM builds from a checkpoint, and how it differs from the file.

The building happens in the environment record's interpreter (core/target/construct.py), isolated
like the environment probe; this module turns its report into field-by-field differences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..foundation.errors import ToolFailure
from ..foundation.isolated import run_isolated
from ..foundation.results import digest
from ..foundation.state import StateStore
from ..target import script_source
from .findings import Finding
from .layer_ids import compact_ids
from .layout import Layout, analyse

CONSTRUCT_MARKER = "@@CONSTRUCT@@"
CONSTRUCT_TIMEOUT_S = 300
VALUE_CHARS = 80


@dataclass(frozen=True)
class ConstructRequest:
    model: Path
    trust_remote_code: bool
    hf_overrides: dict[str, Any]
    speculative: dict[str, Any] | None

    def as_json(self) -> bytes:
        return json.dumps(
            {
                "model": str(self.model),
                "trust_remote_code": self.trust_remote_code,
                "hf_overrides": self.hf_overrides,
                "speculative": self.speculative,
            }
        ).encode()


def run_construct(
    python: Path, store: StateStore, request: ConstructRequest, pythonpath: list[Path] | None = None
) -> tuple[str, dict[str, Any]]:
    """Build the configs in the target interpreter; returns (probe_id, report) and keeps the report.

    Offline (never waits on the network), vLLM's model-class cache in the server's state
    directory, vLLM's own logging off so stdout carries only the report.
    """
    script = script_source("construct")
    extra = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CONFIGURE_LOGGING": "0",
        "VLLM_CACHE_ROOT": str(store.path("vllm-cache")),
    }
    report = run_isolated(
        python,
        script,
        CONSTRUCT_MARKER,
        what="config construction",
        stdin=request.as_json(),
        pythonpath=pythonpath,
        extra_env=extra,
        timeout_s=CONSTRUCT_TIMEOUT_S,
    )
    probe_id = f"p-{digest({'construct': report, 'request': request.as_json().decode()})}"
    store.write(f"probes/{probe_id}.json", {"kind": "construct", "report": report})
    return probe_id, report


# -- differences -------------------------------------------------------------------------------


ConfigName = Literal["target", "draft", "transformers"]
ChangeKind = Literal["added", "removed", "changed", "truncated", "extended", "transformed"]
ConstructStatus = Literal["complete", "partial", "failed"]


@dataclass(frozen=True)
class Difference:
    config: ConfigName
    field: str
    change: ChangeKind
    raw: str | None
    constructed: str | None


def render(value: Any) -> str:
    """A short, exact-enough rendering: long lists show their length and head."""
    if isinstance(value, list) and len(value) > 8:
        head = json.dumps(value[:6], default=str)[:-1]
        text = f"[{len(value)} items] {head}, ...]"
    else:
        text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


def _list_change(before: list[Any], after: list[Any]) -> ChangeKind:
    if len(after) < len(before) and before[: len(after)] == after:
        return "truncated"
    if len(after) > len(before) and after[: len(before)] == before:
        return "extended"
    return "transformed"


def diff_dicts(
    config: ConfigName, before: dict[str, Any], after: dict[str, Any], ignore_added: dict[str, Any] | None = None
) -> list[Difference]:
    """Field-by-field differences; nested dicts by dotted path. Generic base-class attributes
    that appear with their base default (`ignore_added`) are not differences of this model."""
    found: list[Difference] = []
    _diff(config, "", before, after, ignore_added or {}, found)
    return found


def _diff(
    config: ConfigName,
    path: str,
    before: dict[str, Any],
    after: dict[str, Any],
    base: dict[str, Any],
    out: list[Difference],
) -> None:
    for key in sorted(set(before) | set(after), key=str):
        name = f"{path}{key}"
        if key not in after:
            out.append(Difference(config, name, "removed", render(before[key]), None))
        elif key not in before:
            if not path and key in base and base[key] == after[key]:
                continue
            out.append(Difference(config, name, "added", None, render(after[key])))
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            _diff(config, f"{name}.", before[key], after[key], {}, out)
        elif before[key] != after[key] and not _same_number(before[key], after[key]):
            change: ChangeKind = (
                _list_change(before[key], after[key])
                if isinstance(before[key], list) and isinstance(after[key], list)
                else "changed"
            )
            out.append(Difference(config, name, change, render(before[key]), render(after[key])))


def _same_number(a: Any, b: Any) -> bool:
    numbers = (int, float)
    return (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and float(a) == float(b)
    )


@dataclass
class ConstructedView:
    """The parts of a construct report the tool shows, with the differences computed."""

    status: ConstructStatus
    config_class: str | None
    model_type: str | None
    architectures: list[str] | None
    architecture: str | None
    model_class: str | None
    total_layers: int | None
    platform: str | None
    device_name: str | None
    plugins: list[dict[str, Any]]
    plugins_filter: Any
    transformers_class: str | None
    draft: dict[str, Any] | None
    differences: list[Difference]
    errors: dict[str, str]
    target_dict: dict[str, Any] | None = field(default=None, repr=False)
    draft_dict: dict[str, Any] | None = field(default=None, repr=False)
    transformers_dict: dict[str, Any] | None = field(default=None, repr=False)


PATH_FIELDS = ("_name_or_path", "name_or_path")
CHANGE_ORDER = {"truncated": 0, "extended": 0, "transformed": 0, "changed": 1, "removed": 2, "added": 3}
CONFIG_ORDER = {"target": 0, "draft": 1, "transformers": 2}


def _without_paths(document: dict[str, Any] | None) -> dict[str, Any] | None:
    """The constructed dict minus the fields that only echo the (internal) model path."""
    return None if document is None else {k: v for k, v in document.items() if k not in PATH_FIELDS}


def view(raw: dict[str, Any], report: dict[str, Any], model_path: str = "", model_label: str = "") -> ConstructedView:
    """Differences: target vs the raw file, the draft vs the target (the speculative rewrite),
    and transformers' own class where it differs from what vLLM built."""
    if model_path:
        report = json.loads(json.dumps(report).replace(json.dumps(model_path)[1:-1], model_label or "<model>"))
    for part in ("target", "draft", "transformers"):
        if report.get(part):
            report[part]["dict"] = _without_paths(report[part].get("dict")) or {}
    errors: dict[str, str] = dict(report.get("errors") or {})
    target = report.get("target")
    transformers = report.get("transformers")
    draft = report.get("draft")
    base = report.get("base_defaults") or {}
    differences: list[Difference] = []
    if target:
        differences += diff_dicts("target", raw, target["dict"], base)
    if draft and target:
        differences += diff_dicts("draft", target["dict"], draft["dict"], base)
    if transformers:
        vllm_view = {(d.field, d.change, d.constructed) for d in differences if d.config == "target"}
        differences += [
            d
            for d in diff_dicts("transformers", raw, transformers["dict"], base)
            if (d.field, d.change, d.constructed) not in vllm_view
        ]
    differences.sort(key=lambda d: (CHANGE_ORDER.get(d.change, 9), CONFIG_ORDER.get(d.config, 9), d.field))
    platform = report.get("platform") or {}
    status: ConstructStatus
    if target and not target.get("partial") and not errors:
        status = "complete"
    elif target:
        status = "partial"
    else:
        status = "failed"
    return ConstructedView(
        status=status,
        config_class=(target or {}).get("class"),
        model_type=(target or {}).get("model_type"),
        architectures=(target or {}).get("architectures"),
        architecture=(target or {}).get("architecture"),
        model_class=(target or {}).get("model_class"),
        total_layers=(target or {}).get("total_layers"),
        platform=platform.get("class"),
        device_name=platform.get("device_name"),
        plugins=report.get("plugins") or [],
        plugins_filter=report.get("plugins_filter"),
        transformers_class=(transformers or {}).get("class"),
        draft=None
        if not draft
        else {k: draft.get(k) for k in ("class", "model_type", "architectures", "architecture", "model_class")}
        | {"n_predict": draft["dict"].get("n_predict"), "num_hidden_layers": draft["dict"].get("num_hidden_layers")},
        differences=differences,
        errors=errors,
        target_dict=(target or {}).get("dict"),
        draft_dict=(draft or {}).get("dict"),
        transformers_dict=(transformers or {}).get("dict"),
    )


# -- what construction did to the layer layout -------------------------------------------------


def constructed_findings(layout: Layout, built: ConstructedView) -> list[Finding]:
    """Arrays the constructors truncated, dropped or left inconsistent, derived layer types that
    disagree with the raw rules, and a draft depth that differs from the target's."""
    findings: list[Finding] = []
    for label, document in (("target", built.target_dict), ("transformers", built.transformers_dict)):
        if document:
            findings += _array_findings(label, layout, document)
    if built.target_dict:
        findings += _layer_type_findings(layout, built.target_dict)
        if layout.mtp_key and layout.mtp_key not in built.target_dict:
            findings.append(
                Finding(
                    "warning",
                    "mtp_key_dropped",
                    f"the constructed config has no {layout.mtp_key}: the MTP count the file declares is not what "
                    "vLLM reads.",
                )
            )
    if built.draft_dict and built.target_dict:
        target_depth, draft_depth = (
            built.target_dict.get("num_hidden_layers"),
            built.draft_dict.get("num_hidden_layers"),
        )
        if target_depth != draft_depth:
            findings.append(
                Finding(
                    "warning",
                    "draft_depth_differs",
                    f"the speculative draft config keeps num_hidden_layers={draft_depth} while the target has "
                    f"{target_depth}: the draft looks for its MTP layer at index {draft_depth} (dict hf_overrides "
                    "reach the target only).",
                )
            )
    return findings


def _lookup(document: dict[str, Any], dotted: str) -> Any:
    value: Any = document
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _array_findings(label: str, layout: Layout, document: dict[str, Any]) -> list[Finding]:
    """Per-layer arrays whose length no longer matches the constructed depth, or that were dropped."""
    try:
        built = analyse(document)
    except ToolFailure:
        return []
    depth, extra = built.backbone_layers or 0, built.mtp_layers or 0
    lengths: dict[str, int] = {a.name: a.length for a in built.arrays}
    for array in layout.arrays:
        value = _lookup(document, array.name)
        if isinstance(value, (list, str)):
            lengths[array.name] = len(value)
    findings: list[Finding] = [
        Finding(
            "warning",
            "constructed_array_length",
            f"{label} config: {name} has {length} entries for {depth} + {extra} layers; the consumer indexes it "
            "by layer id.",
        )
        for name, length in sorted(lengths.items())
        if length not in (depth, depth + extra)
    ]
    covers_mtp = [a.name for a in built.arrays if a.covers == "backbone+mtp"]
    for array in layout.arrays:
        if array.covers == "backbone+mtp" and array.name not in lengths and not covers_mtp:
            replaced = ", ".join(f"{a.name} ({a.length})" for a in built.arrays) or "none"
            findings.append(
                Finding(
                    "warning",
                    "mtp_entries_dropped",
                    f"{label} config has no {array.name} ({array.length} entries incl. MTP) and no per-layer array "
                    f"covering the MTP layers (per-layer arrays: {replaced}): the MTP entries are not carried.",
                )
            )
    return findings


COMPARABLE_ATTENTION = frozenset({"attn:full", "attn:sliding", "attn:linear"})
"""Layer-type values the raw rules can produce; other vocabularies (indexed_attention, ...) are not compared."""


def _layer_type_findings(layout: Layout, document: dict[str, Any]) -> list[Finding]:
    """A constructor-derived `layer_types` against the raw file's expanded rules."""
    types = document.get("layer_types")
    if not isinstance(types, list) or any(a.name == "layer_types" for a in layout.arrays):
        return []
    disagree = []
    for layer, value in enumerate(types[: layout.backbone_layers or 0]):
        raw = [k for k in layout.kinds.get(layer, []) if k.startswith("attn:")]
        short = "attn:" + str(value).removesuffix("_attention")
        if raw and short in COMPARABLE_ATTENTION and short not in raw:
            disagree.append(layer)
    if not disagree:
        return []
    return [
        Finding(
            "warning",
            "layer_types_disagree",
            f"the constructed layer_types disagree with the raw file's rules for layers {compact_ids(disagree)}.",
        )
    ]
