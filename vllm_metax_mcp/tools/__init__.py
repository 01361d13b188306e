"""Every tool the server offers, declared once; the server and the CLI both read this list."""

from __future__ import annotations

from ..core.foundation.policy import Effect, Mode
from . import (
    audit_commits,
    cancel_job,
    diff_model,
    environment,
    export_snapshot,
    inspect_config,
    jobs,
    plan_trim,
    port_model,
    run_smoke_test,
    trace_dependency,
    trim_model,
)
from .spec import ToolSpec

ALL_TOOLS: tuple[ToolSpec, ...] = (
    environment.SPEC,
    trace_dependency.SPEC,
    diff_model.SPEC,
    inspect_config.SPEC,
    export_snapshot.SPEC,
    jobs.SPEC,
    cancel_job.SPEC,
    run_smoke_test.SPEC,
    plan_trim.SPEC,
    trim_model.SPEC,
    audit_commits.SPEC,
    port_model.SPEC,
)


def served_tools(mode: Mode, tools: tuple[ToolSpec, ...] = ALL_TOOLS) -> tuple[ToolSpec, ...]:
    """Review mode serves no *writes* tool at all."""
    return tuple(t for t in tools if not (mode is Mode.REVIEW and t.effect is Effect.WRITES))
