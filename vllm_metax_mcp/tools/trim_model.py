"""Tool `trim_model`: write a depth-trimmed model directory (dummy mode: config and assets, no weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ..core.atomic import staged_directory
from ..core.config_rewrite import dump_config
from ..core.errors import bad_input
from ..core.policy import Effect
from ..core.safetensors_index import PREFERRED_INDEX
from ..core.smoke_cases import FILE_NAME, write_smoke_cases
from ..core.trim import Plan, make_plan
from ..core.trim_output import IMAGE_NAME, MANIFEST_NAME, STATEMENT, copy_assets, sha256_of, tiny_png
from .base import ToolEnv, ToolSpec
from .plan_trim import PlanTrimInput, PlanTrimOutput, gather, plan_output, root_relative, trim_request

MANIFEST_FORMAT = "vllm-metax-mcp/trim-manifest/1"
PLAN_FIELDS = {
    "kept_layers",
    "mtp_kept",
    "layer_map",
    "coverage",
    "submodels",
    "uncovered",
    "config_changes",
    "budgets",
    "parallel",
    "notes",
}


class TrimModelInput(PlanTrimInput):
    output: str = Field(
        description="New directory under an output root (never inside the source checkpoint or a protected path)."
    )
    output_mode: Literal["dummy", "real"] = Field(
        default="dummy",
        description="dummy: config, tokenizer/processor assets and smoke cases for --load-format dummy (no weights). "
        "real: a self-contained checkpoint with renamed tensors (not implemented yet).",
    )
    overwrite: bool = Field(
        default=False, description="Replace an existing output directory (only once the new one is complete)."
    )


class TrimModelOutput(PlanTrimOutput):
    output: str = Field(default="", description="The written directory, as given.")
    output_mode: str = ""
    files: list[str] = Field(default_factory=list, description="Files written (relative to output).")
    manifest: str = Field(default="", description="The trim manifest, relative to the first root.")
    manifest_sha256: str = ""


def _manifest(
    args: TrimModelInput, planned: PlanTrimOutput, source_hashes: dict[str, str], written: dict[str, str]
) -> dict[str, Any]:
    """Source and its hashes, the request, the plan, layer map, coverage, uncovered paths, and what the trim proves."""
    plan = planned.model_dump(mode="json", include=PLAN_FIELDS)
    return {
        "format": MANIFEST_FORMAT,
        "output_mode": args.output_mode,
        "statement": STATEMENT,
        "source": {"model": planned.model, "backbone_layers": planned.backbone_layers, "sha256": source_hashes},
        "request": args.model_dump(mode="json", exclude={"output", "overwrite", "cursor", "limit"}),
        "plan": plan,
        "smoke_cases": FILE_NAME,
        "files": written,
    }


def _source_hashes(plan: Plan, directory: Path) -> dict[str, str]:
    names = ["config.json", *plan.assets.copy, *([PREFERRED_INDEX] if (directory / PREFERRED_INDEX).is_file() else [])]
    return {name: sha256_of(directory / name) for name in names}


def trim_model(args: TrimModelInput, env: ToolEnv) -> TrimModelOutput:
    """Write a depth-trimmed model with `output_mode="dummy"`: the plan of plan_trim applied to the raw
    config.json (depth, per-layer arrays with their MTP tail, layer-id lists in their own base, threshold
    and periodic rules, MTP count, quantization ignore lists renumbered), one copy of each tokenizer /
    generation / chat-template / processor asset, no weights, `trim_manifest.json` (source hashes, plan,
    layer map, coverage, uncovered paths) and `smoke_cases.yaml` for run_smoke_test (load_format dummy,
    a speculative config when MTP is kept). The directory appears whole or not at all, only under an
    output root and never inside the source checkpoint. output_mode="real" is not implemented yet.
    """
    if args.output_mode == "real":
        raise bad_input(
            'output_mode="real" (a self-contained checkpoint whose retained tensors are renamed to the trimmed layout, '
            'with a validated non-dummy load) is not implemented yet; use output_mode="dummy" for --load-format dummy '
            "smoke tests, or plan_trim for the plan and the real-weight disk budget."
        )
    evidence, source = gather(args, env)
    target = env.policy.writable(args.output)
    plan = make_plan(source, trim_request(args))
    planned = PlanTrimOutput(**plan_output(args, env, evidence, plan))
    source_hashes = _source_hashes(plan, source.directory)
    with staged_directory(target, replace=args.overwrite) as staging:
        (staging / "config.json").write_bytes(dump_config(plan.config))
        written = {"config.json": sha256_of(staging / "config.json")}
        written |= copy_assets(source.directory, plan.assets.copy, staging, env.policy.readable)
        write_smoke_cases(staging / FILE_NAME, plan.cases)
        written[FILE_NAME] = sha256_of(staging / FILE_NAME)
        if plan.image:
            (staging / IMAGE_NAME).write_bytes(tiny_png())
            written[IMAGE_NAME] = sha256_of(staging / IMAGE_NAME)
        manifest = json.dumps(_manifest(args, planned, source_hashes, written), indent=2, ensure_ascii=False) + "\n"
        (staging / MANIFEST_NAME).write_text(manifest)
    manifest_path = target / MANIFEST_NAME
    return TrimModelOutput(
        **dict(planned),
        output=args.output,
        output_mode=args.output_mode,
        files=sorted([*written, MANIFEST_NAME]),
        manifest=root_relative(manifest_path, [*env.policy.output_roots, *env.policy.roots]),
        manifest_sha256=sha256_of(manifest_path),
    )


SPEC = ToolSpec(
    name="trim_model",
    effect=Effect.WRITES,
    run=trim_model,
    input_model=TrimModelInput,
    output_model=TrimModelOutput,
    title="Write a depth-trimmed model (dummy mode)",
    idempotent=False,
    destructive=True,
    cpu_heavy=True,
)
