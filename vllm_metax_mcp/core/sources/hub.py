"""Where a model's files are: a local directory, or a Hugging Face repo in the local cache only.

The network is never asked (offline is the normal case here): a repo id resolves through the
local cache's refs and snapshots, or the call says it is not cached.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..foundation.errors import bad_input, not_found
from ..foundation.policy import Policy, hf_cache_dir

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


ModelSource = Literal["directory", "hf_cache"]


@dataclass(frozen=True)
class ModelLocation:
    path: Path
    label: str
    source: ModelSource
    revision: str | None = None


def _looks_like_path(model: str, policy: Policy) -> bool:
    if os.path.isabs(model) or model.startswith((".", "~")) or model.strip("/").count("/") > 1:
        return True
    return (policy.base() / model).exists()


def locate_model(policy: Policy, model: str, revision: str | None) -> ModelLocation:
    """A readable model directory for `model`; repo ids come from the local Hugging Face cache."""
    if not model or "\0" in model:
        raise bad_input("model is empty; pass a model directory or a Hugging Face repo id.")
    if _looks_like_path(model, policy):
        if revision:
            raise bad_input("model_revision applies to a Hugging Face repo id, not to a local directory; omit it.")
        path = policy.readable(model)
        if not path.is_dir():
            raise not_found(f"{model} is not a directory; pass the checkpoint directory that holds config.json.")
        return ModelLocation(path, model, "directory")
    if not REPO_ID.match(model):
        raise not_found(f"{model} is neither an existing directory nor a Hugging Face repo id (org/name).")
    return _from_cache(policy, model, revision)


def _from_cache(policy: Policy, repo_id: str, revision: str | None) -> ModelLocation:
    from huggingface_hub import snapshot_download

    cache = hf_cache_dir()
    try:
        snapshot = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
    except Exception:  # the hub client raises several types for "not cached"; all mean the same here
        wanted = f"{repo_id}@{revision}" if revision else repo_id
        raise not_found(
            f"{wanted} is no directory under the roots and not in the local Hugging Face cache (the server never "
            f"downloads); fetch it first (`hf download {repo_id}{' --revision ' + revision if revision else ''}`) "
            "or pass a local directory."
        ) from None
    path = policy.readable(snapshot)
    commit = path.name if re.fullmatch(r"[0-9a-f]{40}", path.name) else None
    label = f"{repo_id}@{commit[:12]}" if commit else repo_id
    return ModelLocation(path, label, "hf_cache", commit)
