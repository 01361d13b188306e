"""The raw `config.json` of a depth-trimmed model (shared by the dummy and the real-weight trim).

The file is edited as JSON — a dict in its own key order — never rebuilt through a config class,
so fields no library knows survive untouched. Everything that names layers moves together: the
depth, MTP count, per-layer arrays (with their MTP tail), layer-id lists (in their own base),
threshold and periodic rules, and quantization ignore lists. Each rewritten rule is proven by
analysing the new file again: every kept layer must come out with the kinds it had.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..checkpoint.construct import render
from ..checkpoint.id_lists import MEANING_KINDS, parse_id_list
from ..checkpoint.kinds import RULE_FORMS
from ..checkpoint.layer_ids import compact_ids, logical_layer, split_layer_name
from ..checkpoint.layout import Layout, analyse, rebuild_kinds
from ..checkpoint.raw_config import DEPTH_KEYS
from ..foundation.errors import bad_input

LAYER_WORDS = ("layer", "block", "index", "indices", "idx")


@dataclass(frozen=True)
class Selection:
    """Kept backbone layers (original ids) and kept MTP layers (index i of layer L+i), both ascending."""

    kept: tuple[int, ...]
    kept_mtp: tuple[int, ...] = ()

    def layer_map(self, backbone: int) -> dict[int, int]:
        """Original id -> new id, MTP layers included (L+i -> L'+j)."""
        mapping = {old: new for new, old in enumerate(self.kept)}
        mapping.update({backbone + old: len(self.kept) + new for new, old in enumerate(self.kept_mtp)})
        return mapping


@dataclass(frozen=True)
class Change:
    field: str
    change: str
    old: str | None
    new: str | None
    reason: str


@dataclass(frozen=True)
class Setting:
    """A field the plan sets verbatim (dotted path into the config), and why."""

    field: str
    value: Any
    reason: str


class _Part:
    """One (sub)config dict being rewritten, with dotted access one nested level deep."""

    def __init__(self, data: dict[str, Any], prefix: str, changes: list[Change]) -> None:
        self.data = data
        self.prefix = prefix
        self.changes = changes

    def get(self, dotted: str) -> Any:
        value: Any = self.data
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def set(self, dotted: str, value: Any, change: str, reason: str) -> None:
        parent = self.data
        *path, leaf = dotted.split(".")
        for key in path:
            parent = parent[key]
        old = parent.get(leaf)
        parent[leaf] = value
        if old != value:
            self.changes.append(Change(self.prefix + dotted, change, render(old), render(value), reason))


# -- the parts of a rewrite ----------------------------------------------------------------------


def _slice(values: list[Any], covers: str, backbone: int, selection: Selection) -> list[Any]:
    kept = [values[i] for i in selection.kept]
    if covers == "backbone+mtp":
        kept += [values[backbone + i] for i in selection.kept_mtp]
    return kept


def _arrays(part: _Part, layout: Layout, selection: Selection) -> None:
    backbone = layout.backbone_layers or 0
    for array in layout.arrays:
        if array.covers == "mismatch":
            raise bad_input(
                f"{part.prefix}{array.name} has {array.length} entries for {backbone} + {layout.mtp_layers or 0} "
                "layers: which entry belongs to which layer is unknown, so it cannot be trimmed; fix the config or its "
                "consumer first."
            )
        sliced = _slice(array.values, array.covers, backbone, selection)
        value = "".join(sliced) if isinstance(part.get(array.name), str) else sliced
        tail = " with its MTP tail" if array.covers == "backbone+mtp" else ""
        part.set(array.name, value, "sliced", f"per-layer array: entries of the kept layers{tail}")


def _id_lists(part: _Part, layout: Layout, selection: Selection) -> None:
    mapping = selection.layer_map(layout.backbone_layers or 0)
    for item in layout.id_lists:
        if not item.ids:
            continue
        if item.base is None:
            raise bad_input(
                f"{part.prefix}{item.name} lists layers {item.ids} but its base (0 or 1) is undetermined "
                f"({item.evidence}); give the checkpoint's safetensors index, or an environment record whose code "
                "reads the list, "
                "so it can be renumbered."
            )
        renumbered = [mapping[i - item.base] + item.base for i in item.ids if i - item.base in mapping]
        original = part.get(item.name)
        value: Any = ",".join(map(str, renumbered)) if isinstance(original, str) else renumbered
        part.set(item.name, value, "renumbered", f"layer-id list ({item.base}-based): kept layers, new ids")


def _thresholds(part: _Part, layout: Layout, selection: Selection) -> list[str]:
    """Rewrite `below`/`from_end` rules; return the periodic rules left to refit."""
    backbone = layout.backbone_layers or 0
    periodic: list[str] = []
    for rule in layout.rules:
        form = RULE_FORMS.get(rule.name)
        value = part.get(rule.name)
        if form is None or not isinstance(value, int) or isinstance(value, bool):
            continue
        state = "" if rule.active else " (inactive rule, kept consistent)"
        if form[0] == "below":
            new = sum(1 for i in selection.kept if i < value)
            part.set(rule.name, new, "recounted", f"kept layers with id < {value}{state}")
        elif form[0] == "from_end":
            new = sum(1 for i in selection.kept if i >= backbone - value)
            part.set(rule.name, new, "recounted", f"kept layers among the last {value}{state}")
        elif rule.active:
            periodic.append(rule.name)
    return periodic


def _mtp_count(part: _Part, top: _Part | None, layout: Layout, selection: Selection) -> None:
    key = layout.mtp_key
    if key is None:
        return
    holder = part if key in part.data else top
    if holder is not None and key in holder.data:
        holder.set(key, len(selection.kept_mtp), "set", "MTP layers kept")


# -- proof by re-analysis ----------------------------------------------------------------------


def _categories(layout: Layout) -> dict[str, tuple[str, ...]]:
    """Which kinds each active rule or based id list decides (the kinds a rewrite must preserve)."""
    found = {r.name: RULE_FORMS[r.name][1] for r in layout.rules if r.active and r.name in RULE_FORMS}
    for item in layout.id_lists:
        if item.ids and item.base is not None and item.meaning in MEANING_KINDS:
            found[item.name] = MEANING_KINDS[item.meaning]
    return found


def _reanalysed(data: dict[str, Any], bases: dict[str, int | None]) -> Layout:
    """The new file's layout, with the id-list bases the original evidence decided."""
    layout = analyse(data)
    for item in layout.id_lists:
        if item.name in bases:
            item.base = bases[item.name]
    rebuild_kinds(data, layout)
    return layout


def _mismatches(before: Layout, after: Layout, selection: Selection, prefixes: tuple[str, ...]) -> list[int]:
    """New ids whose kinds (of the given categories) differ from their original layer's."""

    def pick(kinds: list[str]) -> set[str]:
        return {k for k in kinds if k.startswith(prefixes)}

    return [
        new
        for new, old in enumerate(selection.kept)
        if pick(after.kinds.get(new, [])) != pick(before.kinds.get(old, []))
    ]


def _refit(part: _Part, name: str, kept: int, check: Callable[[], list[int]]) -> bool:
    """Find a period that marks the kept layers as before: the original value first, then 1..n+1."""
    original = part.data[name]
    for value in [original, *range(1, kept + 2)]:
        part.data[name] = value
        if not check():
            part.data[name] = original
            part.set(name, value, "refit", "periodic rule: the value that marks the kept layers as before")
            return True
    part.data[name] = original
    return False


def _explicit_dense_list(part: _Part, layout: Layout, selection: Selection) -> bool:
    """decoder_sparse_step with a dense id list: step 1, and the list names every kept dense layer."""
    dense = next((i for i in layout.id_lists if i.meaning == "dense" and i.base is not None), None)
    if dense is None or "decoder_sparse_step" not in part.data:
        return False
    base = dense.base or 0
    ids = [new + base for new, old in enumerate(selection.kept) if "dense" in layout.kinds.get(old, [])]
    part.set("decoder_sparse_step", 1, "refit", "periodic rule replaced by an explicit list")
    part.set(dense.name, ids, "renumbered", f"explicit list of the kept dense layers ({base}-based)")
    return True


def _prove(part: _Part, layout: Layout, selection: Selection, periodic: list[str]) -> None:
    bases = {i.name: i.base for i in layout.id_lists}
    categories = _categories(layout)

    def check(prefixes: tuple[str, ...]) -> list[int]:
        return _mismatches(layout, _reanalysed(part.data, bases), selection, prefixes)

    for name in periodic:
        prefixes = categories[name]
        if _refit(part, name, len(selection.kept), partial(check, prefixes)):
            continue
        if prefixes == ("dense", "moe") and _explicit_dense_list(part, layout, selection) and not check(prefixes):
            continue
        raise bad_input(
            f"{part.prefix}{name}={part.data[name]} cannot mark the kept layers {compact_ids(list(selection.kept))} "
            f"the way it marked them before (no value from 1 to {len(selection.kept) + 1} does, and the config has no "
            "explicit "
            "list for it); "
            "choose layers whose pattern one value expresses (pass layers)."
        )
    wrong = check(tuple(p for prefixes in categories.values() for p in prefixes))
    if wrong:
        raise bad_input(
            f"after the rewrite, new layers {compact_ids(wrong)} of {part.prefix or 'the decoder'} no longer have "
            "their original kinds; a field the trim does not know decides them. Inspect the config with inspect_config "
            "and pass layers explicitly."
        )


def _unhandled_layer_fields(part: _Part, layout: Layout) -> None:
    """Refuse fields that look like layer references the rewrite does not understand."""
    backbone, extra = layout.backbone_layers or 0, layout.mtp_layers or 0
    handled = {a.name for a in layout.arrays} | {i.name for i in layout.id_lists}
    for name, value in _fields(part.data):
        leaf = name.rsplit(".", 1)[-1].lower()
        if name in handled or not any(w in leaf for w in LAYER_WORDS) or leaf.endswith(("token_id", "token_ids")):
            continue
        ids = parse_id_list(value) if isinstance(value, list) else None
        per_layer = isinstance(value, list) and len(value) in (backbone, backbone + extra) and backbone >= 2
        if (ids and all(0 <= i <= backbone + extra for i in ids)) or per_layer:
            raise bad_input(
                f"{part.prefix}{name} = {render(value)} looks like layer ids or one entry per layer, and the trim does "
                "not know how its consumer reads it; check its consumer (inspect_config consumers_of) before trimming "
                "this model."
            )


def _fields(data: dict[str, Any]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for key, value in data.items():
        if key == "quantization_config":
            continue
        if isinstance(value, dict):
            if "model_type" in value or any(k in value for k in DEPTH_KEYS):
                continue  # a sub-config is trimmed (or kept) by its own depth
            found += [(f"{key}.{k}", v) for k, v in value.items() if not isinstance(v, dict)]
        else:
            found.append((key, value))
    return found


# -- quantization ignore lists -------------------------------------------------------------------


def _ignore_list(
    config: dict[str, Any], part_data: dict[str, Any], prefix: str, layout: Layout, selection: Selection
) -> Change | None:
    holder, where = (part_data, prefix) if "quantization_config" in part_data else (config, "")
    quant = holder.get("quantization_config")
    ignore = layout.quantization.ignore if layout.quantization else None
    if not isinstance(quant, dict) or ignore is None:
        return None
    backbone = layout.backbone_layers or 0
    mapping = selection.layer_map(backbone)
    mtp_new = {backbone + old: new for new, old in enumerate(selection.kept_mtp)}
    kept: list[str] = []
    counts = {"non_layer": 0, "patterns": 0, "backbone": 0, "mtp": 0, "removed": 0}
    for entry in quant[ignore.key]:
        renamed = _rename(entry, backbone, mapping, mtp_new, counts)
        if renamed is not None:
            kept.append(renamed)
    old_total = len(quant[ignore.key])
    quant[ignore.key] = kept
    layer_map = ", ".join(f"{o}->{n}" for o, n in sorted(mapping.items()))
    reason = (
        f"kept {len(kept)} of {old_total}: {counts['non_layer']} non-layer, {counts['backbone']} backbone and "
        f"{counts['mtp']} MTP entries renumbered ({layer_map}), {counts['patterns']} patterns verbatim; "
        f"{counts['removed']} entries of dropped layers removed"
    )
    return Change(
        f"{where}quantization_config.{ignore.key}",
        "filtered",
        f"[{old_total} entries]",
        f"[{len(kept)} entries]",
        reason,
    )


def _rename(
    entry: str, backbone: int, mapping: dict[int, int], mtp_new: dict[int, int], counts: dict[str, int]
) -> str | None:
    """An ignore entry under its new name, or None when its layer is gone."""
    if entry.startswith("re:"):
        counts["patterns"] += 1
        return entry
    parsed = split_layer_name(entry)
    part, logical = logical_layer(parsed[0], parsed[1], backbone) if parsed else ("other", -1)
    if parsed is None or part == "other":
        counts["non_layer"] += 1
        return entry
    prefix, _, rest = parsed
    if logical not in mapping:
        counts["removed"] += 1
        return None
    new = mtp_new[logical] if part == "mtp" else mapping[logical]
    counts["mtp" if logical >= backbone else "backbone"] += 1
    return f"{prefix}.{new}" + (f".{rest}" if rest else "")


# -- the whole rewrite ---------------------------------------------------------------------------


def rewrite_part(
    data: dict[str, Any],
    layout: Layout,
    depth_key: str,
    selection: Selection,
    prefix: str,
    top: dict[str, Any] | None = None,
) -> list[Change]:
    """Rewrite one (sub)config in place for the selection; the changes, proven by re-analysis."""
    changes: list[Change] = []
    part = _Part(data, prefix, changes)
    _unhandled_layer_fields(part, layout)
    part.set(depth_key, len(selection.kept), "set", "kept backbone layers")
    _mtp_count(part, _Part(top, "", changes) if top is not None else None, layout, selection)
    _arrays(part, layout, selection)
    _id_lists(part, layout, selection)
    periodic = _thresholds(part, layout, selection)
    _prove(part, layout, selection, periodic)
    return changes


def rewrite_config(
    raw: dict[str, Any], layout: Layout, depth_key: str, selection: Selection, settings: Sequence[Setting] = ()
) -> tuple[dict[str, Any], list[Change]]:
    """A trimmed copy of the raw config and every change; `settings` are set verbatim."""
    config = copy.deepcopy(raw)
    part_data = config[layout.primary] if layout.primary else config
    prefix = f"{layout.primary}." if layout.primary else ""
    changes = rewrite_part(part_data, layout, depth_key, selection, prefix, config if layout.primary else None)
    ignore = _ignore_list(config, part_data, prefix, layout, selection)
    if ignore is not None:
        changes.append(ignore)
    setter = _Part(config, "", changes)
    for setting in settings:
        setter.set(setting.field, setting.value, "set", setting.reason)
    return config, changes


def dump_config(config: dict[str, Any]) -> bytes:
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode()
