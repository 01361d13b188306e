"""What every trim output carries: `trim_manifest.json` (source hashes, request, plan, files), the
run_smoke_test call that validates a real one, and the dummy output written whole or not at all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.safetensors_headers import PREFERRED_INDEX
from ..foundation.atomic import staged_directory
from ..foundation.policy import Policy, is_within
from ..target.extract import file_sha256
from .assets import IMAGE_NAME, MANIFEST_NAME, STATEMENT, copy_assets, tiny_png
from .cases import FILE_NAME, write_smoke_cases
from .config_rewrite import dump_config
from .plan import Plan, Source
from .report import root_relative

MANIFEST_FORMAT = "vllm-metax-mcp/trim-manifest/1"


@dataclass(frozen=True)
class TrimTarget:
    """The output directory of a trim: where, as the caller gave it and as messages show it, and whether an
    earlier output may be replaced."""

    path: Path
    given: str
    shown: str
    replace: bool


@dataclass(frozen=True)
class ManifestHead:
    """The parts of the manifest the call decides, as JSON: the mode, the source model, the request, the plan."""

    output_mode: str
    model: str
    backbone_layers: int
    request: dict[str, Any]
    plan: dict[str, Any]


def manifest_document(head: ManifestHead, source_hashes: dict[str, str], written: dict[str, str]) -> dict[str, Any]:
    """Source and its hashes, the request, the plan, layer map, coverage, uncovered paths, and what the trim proves."""
    return {
        "format": MANIFEST_FORMAT,
        "output_mode": head.output_mode,
        "statement": STATEMENT,
        "source": {"model": head.model, "backbone_layers": head.backbone_layers, "sha256": source_hashes},
        "request": head.request,
        "plan": head.plan,
        "smoke_cases": FILE_NAME,
        "files": written,
    }


def source_hashes(plan: Plan, directory: Path, policy: Policy) -> dict[str, str]:
    """sha256 of the source files a trim reads besides the shards: config, assets, the index."""
    names = ["config.json", *plan.assets.copy, *([PREFERRED_INDEX] if (directory / PREFERRED_INDEX).is_file() else [])]
    return {name: file_sha256(policy.readable(directory / name)) for name in names}


def manifest_label(target: Path, policy: Policy) -> str:
    """Where the manifest is, relative to the first output or read root holding it."""
    return root_relative(target / MANIFEST_NAME, [*policy.output_roots, *policy.roots])


def validate_with(target: TrimTarget, policy: Policy, plugin_repo: str | None) -> dict[str, Any]:
    """The run_smoke_test call (a non-dummy load) that validates a real-weight output (an output root is
    readable, so the same server runs it wherever the output lies)."""
    inside = any(is_within(target.path, root) for root in policy.roots)
    arguments: dict[str, Any] = {
        "model": root_relative(target.path, policy.roots) if inside else target.given,
        "load_format": "safetensors",
    }
    if plugin_repo is not None:
        arguments["plugin_repo"] = plugin_repo
    return {
        "tool": "run_smoke_test",
        "arguments": arguments,
        "why": "a non-dummy load on a real vLLM server validates the checkpoint; its evidence records this manifest's "
        "sha256.",
    }


@dataclass(frozen=True)
class DummyOutput:
    files: list[str]
    """Relative to the output, the manifest included."""
    manifest_sha256: str


def write_dummy(source: Source, plan: Plan, target: TrimTarget, head: ManifestHead, policy: Policy) -> DummyOutput:
    """The rewritten config, the assets, the smoke cases (and image) and the manifest, staged and renamed into
    place only once complete."""
    hashes = source_hashes(plan, source.directory, policy)
    with staged_directory(target.path, replace=target.replace, shown=target.shown, policy=policy) as staging:
        (staging / "config.json").write_bytes(dump_config(plan.config))
        written = {"config.json": file_sha256(staging / "config.json")}
        written |= copy_assets(source.directory, plan.assets.copy, staging, policy)
        write_smoke_cases(staging / FILE_NAME, plan.cases)
        written[FILE_NAME] = file_sha256(staging / FILE_NAME)
        if plan.image:
            (staging / IMAGE_NAME).write_bytes(tiny_png())
            written[IMAGE_NAME] = file_sha256(staging / IMAGE_NAME)
        manifest = json.dumps(manifest_document(head, hashes, written), indent=2, ensure_ascii=False) + "\n"
        (staging / MANIFEST_NAME).write_text(manifest)
    return DummyOutput(sorted([*written, MANIFEST_NAME]), file_sha256(target.path / MANIFEST_NAME))
