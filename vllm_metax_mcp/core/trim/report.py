"""What a plan shows beside the plan itself: the model's label, where consumer code reads each changed
field, related trimmed-model examples in the plugin, and the evidence's findings and gaps. plan_trim
shows it; trim_model's output and manifest extend it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.consumers import SourceTree
from ..checkpoint.evidence import CheckpointEvidence
from ..checkpoint.findings import Finding
from ..foundation.errors import ToolFailure
from ..foundation.policy import Policy, is_within
from ..foundation.state import StateStore
from ..sources.environment import EnvironmentRecord
from ..sources.hub import ModelLocation
from .assets import related_examples
from .plan import Plan
from .readers import field_readers

EXAMPLES_DIR = "tools/batched_test/models"


def root_relative(path: Path, roots: list[Path]) -> str:
    """A path relative to the first root holding it (its name when none does): never an absolute internal path."""
    for root in roots:
        if is_within(path, root):
            return path.relative_to(root).as_posix()
    return path.name


def model_label(location: ModelLocation, policy: Policy) -> str:
    """The model as a root-relative path, or repo@commit for the hub cache."""
    return root_relative(location.path, policy.roots) if location.source == "directory" else location.label


@dataclass(frozen=True)
class PlanContext:
    model: str
    readers: dict[str, list[str] | None]
    """Per changed field: where consumer code reads it (tree path:line); None when nothing was searched."""
    examples: list[str]
    findings: list[Finding]
    gaps: list[str]


def _transformers_configs(record: EnvironmentRecord | None, policy: Policy) -> SourceTree | None:
    """transformers' configuration modules (where a config class reads its keys), from the record's probe;
    each read through the policy (its site directory is readable; a file linking elsewhere is skipped)."""
    package_dir = record.probe.package_dir("transformers") if record else None
    if not package_dir:
        return None
    top = Path(package_dir)
    files = [top / "configuration_utils.py", *sorted((top / "models").glob("*/configuration_*.py"))]
    found: list[tuple[str, bytes]] = []
    for path in files:
        if not path.is_file():
            continue
        try:
            found.append((f"transformers/{path.relative_to(top).as_posix()}", policy.read_bytes(path)))
        except ToolFailure:
            continue
    return SourceTree("installed_transformers", tuple(found))


def _examples(plugin_repo: str, raw: dict[str, Any], policy: Policy) -> list[str]:
    try:
        models = policy.readable(Path(plugin_repo) / EXAMPLES_DIR)
    except ToolFailure:  # outside the roots: no examples to list
        return []
    return [f"{EXAMPLES_DIR}/{name}" for name in related_examples(models, raw, policy)]


def plan_context(
    evidence: CheckpointEvidence, plan: Plan, policy: Policy, plugin_repo: str, store: StateStore
) -> PlanContext:
    """Consumer code is searched in the evidence's trees plus transformers' config modules (with a record);
    the answers are kept in the state directory by content (core/trim/readers.py)."""
    trees = list(evidence.trees)
    extra = _transformers_configs(evidence.record, policy) if trees else None
    trees += [extra] if extra else []
    gaps = list(evidence.gaps)
    fields = [change.field for change in plan.changes]
    readers: dict[str, list[str] | None] = dict.fromkeys(fields)
    if trees:
        readers.update(field_readers(store, trees, fields).readers)
    else:
        gaps.append("No consumer code searched (no environment record): read_by is null for every changed field.")
    return PlanContext(
        model=model_label(evidence.location, policy),
        readers=readers,
        examples=_examples(plugin_repo, evidence.raw, policy),
        findings=evidence.findings,
        gaps=gaps,
    )
