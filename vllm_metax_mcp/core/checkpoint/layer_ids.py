"""Layer ids in tensor and module names, and their short rendering: shared by the config reading,
the tensor cross-check and the trim."""

from __future__ import annotations

from typing import Literal

ModulePart = Literal["layers", "mtp", "other"]


def compact_ids(ids: list[int] | set[int]) -> str:
    """`0-2`, `3,7,...,47`, `0,1,43`: a short, exact rendering of a set of layer ids."""
    values = sorted(set(ids))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i + 1
        if j < len(values):
            step = values[j] - values[i]
            while j + 1 < len(values) and values[j + 1] - values[j] == step:
                j += 1
            run = j - i + 1
            if step == 1 and run >= 3:
                parts.append(f"{values[i]}-{values[j]}")
                i = j + 1
                continue
            if step > 1 and run >= 4:
                parts.append(f"{values[i]},{values[i] + step},...,{values[j]}")
                i = j + 1
                continue
        parts.append(str(values[i]))
        i += 1
    return ",".join(parts)


def split_layer_name(name: str) -> tuple[str, int, str] | None:
    """`model.layers.3.mlp.gate` -> (`model.layers`, 3, `mlp.gate`): prefix, first numeric component, rest."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:index]), int(part), ".".join(parts[index + 1 :])
    return None


def is_mtp_prefix(prefix: str) -> bool:
    """A module path that names multi-token-prediction modules (`mtp`, `model.mtp.layers`)."""
    return any(part == "mtp" or part.startswith("mtp_") for part in prefix.split("."))


def logical_layer(prefix: str, index: int, backbone: int) -> tuple[ModulePart, int]:
    """(part, logical id) of a numbered module path: `*layers.N` keeps N, `mtp.*` i becomes L+i, the rest is other."""
    if is_mtp_prefix(prefix):
        return "mtp", backbone + index
    if prefix.endswith("layers"):
        return "layers", index
    return "other", index
