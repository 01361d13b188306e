"""Reading a checkpoint's `config.json`: the file itself, the counts it declares, and its submodels.

Counts are read by their keys and refused when absurd; a key that is absent is None, never a
config-class default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ..foundation.errors import bad_input, not_found
from ..foundation.policy import FileTooLarge, Policy
from ..foundation.safe_load import load_json_bounded

CONFIG_NAME = "config.json"
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_LAYERS = 4096
MAX_MTP_LAYERS = 64

DEPTH_KEYS = ("num_hidden_layers", "num_layers", "n_layers", "n_layer", "depth")
MTP_COUNT_KEYS = (
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "num_mtp_layers",
    "n_mtp_layers",
    "num_mtp_modules",
)


def load_config(directory: Path, policy: Policy) -> dict[str, Any]:
    """The parsed `config.json` of a model directory, or an error that says what is wrong. It is read
    through the policy: a config.json (or hub-cache snapshot link) leading outside the readable places
    is refused with outside_roots, whether or not its target exists."""
    path = directory / CONFIG_NAME
    if not path.is_file() and not path.is_symlink():
        raise not_found(
            f"No {CONFIG_NAME} in the model directory; pass the directory that holds the checkpoint's {CONFIG_NAME}."
        )
    policy.readable(path)
    if not path.is_file():
        raise not_found(f"{CONFIG_NAME} in the model directory is a dangling link; restore the file it points to.")
    try:
        data = load_json_bounded(policy.read_bytes(path, max_bytes=MAX_CONFIG_BYTES), CONFIG_NAME)
    except FileTooLarge as exc:
        raise bad_input(
            f"{CONFIG_NAME} is {exc.size} bytes, more than a config can reasonably be; check the file."
        ) from None
    except json.JSONDecodeError as exc:
        raise bad_input(
            f"{CONFIG_NAME} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix the file."
        ) from None
    except UnicodeDecodeError:
        raise bad_input(f"{CONFIG_NAME} is not UTF-8 text; fix the file.") from None
    if not isinstance(data, dict):
        raise bad_input(f"{CONFIG_NAME} holds a JSON {type(data).__name__}, not an object; fix the file.")
    return data


def is_int(value: Any) -> TypeGuard[int]:
    """An integer value of the JSON file (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_key(data: dict[str, Any], key: str, limit: int) -> int | None:
    """An integer count from the config, or None when absent; absurd values are refused."""
    if key not in data or data[key] is None:
        return None
    value = data[key]
    if not is_int(value) or not 0 <= value <= limit:
        raise bad_input(f"config.json: {key} is {value!r}; it must be an integer between 0 and {limit}. Fix the file.")
    return value


def depth_of(data: dict[str, Any]) -> tuple[int | None, str | None]:
    """The layer count and the key that declares it."""
    for key in DEPTH_KEYS:
        if key in data and data[key] is not None:
            return int_key(data, key, MAX_LAYERS), key
    return None, None


def mtp_count_of(data: dict[str, Any]) -> tuple[int | None, str | None]:
    """The MTP/draft layer count and the key that declares it."""
    for key in MTP_COUNT_KEYS:
        if key in data and data[key] is not None:
            return int_key(data, key, MAX_MTP_LAYERS), key
    return None, None


def sub_configs(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Nested configs (text_config, vision_config, ...): dict values that carry a depth or a model_type."""
    found = []
    for key, value in data.items():
        if key == "quantization_config" or not isinstance(value, dict):
            continue
        if "model_type" in value or any(k in value for k in DEPTH_KEYS):
            found.append((key, value))
    return found


@dataclass
class Submodel:
    name: str
    model_type: str | None
    layers: int | None
    depth_key: str | None
    mtp_layers: int | None = None


def find_submodels(data: dict[str, Any]) -> tuple[list[Submodel], str, dict[str, Any]]:
    """Every submodel with its own depth, and the primary (decoder) one the layer table describes."""
    depth, key = depth_of(data)
    mtp, _ = mtp_count_of(data)
    top = Submodel("", data.get("model_type"), depth, key, mtp)
    subs = []
    for name, sub in sub_configs(data):
        sub_depth, sub_key = depth_of(sub)
        subs.append((Submodel(name, sub.get("model_type"), sub_depth, sub_key, mtp_count_of(sub)[0]), sub))
    if depth is not None or not subs:
        return [top, *(s for s, _ in subs)], "", data
    decoders = [(s, d) for s, d in subs if s.layers is not None and "vocab_size" in d]
    primary, primary_data = (decoders or [(s, d) for s, d in subs if s.layers is not None] or [subs[0]])[0]
    return [top, *(s for s, _ in subs)], primary.name, primary_data
