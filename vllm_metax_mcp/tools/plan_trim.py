"""Tool `plan_trim`: which layers a depth trim keeps, what they cover, how to reach it, what it costs.

Its input and output models are in tools/arguments.py: trim_model's extend them.
"""

from __future__ import annotations

from ..core.checkpoint.evidence import checkpoint_evidence
from ..core.foundation.policy import Effect
from ..core.foundation.progress import phase
from ..core.trim.plan import Source, make_plan
from ..core.trim.report import plan_context
from .arguments import (
    PlanTrimInput,
    PlanTrimOutput,
    fit_plan,
    fresh_output,
    given_arguments,
    plan_trim_output,
    plugin_access,
)
from .spec import NextCall, ToolEnv, ToolSpec


def plan_trim(args: PlanTrimInput, env: ToolEnv) -> PlanTrimOutput:
    """Plan a depth trim (writes nothing): fewest layers keeping every distinct path; coverage,
    layer_map, config changes, budgets. next_step: trim_model."""
    with phase("reading the checkpoint and the code that reads its config", 0.8):
        evidence = checkpoint_evidence(plugin_access(args, env), env.policy, env.store, args.model, args.model_revision)
    with phase("choosing the layers", 0.15):
        plan = make_plan(Source.of(evidence, env.policy), args.trim_request())
    output = plan_trim_output(plan, plan_context(evidence, plan, env.policy, args.plugin_repo, env.store))
    output.next_step = NextCall(
        tool="trim_model",
        arguments=given_arguments(args, output=fresh_output(env, args.model)),
        why="write this plan as a dummy-weight model (output_mode=real copies the weights)",
    )
    return fit_plan(output)


SPEC = ToolSpec(
    name="plan_trim",
    effect=Effect.READS,
    run=plan_trim,
    input_model=PlanTrimInput,
    output_model=PlanTrimOutput,
    title="Plan a depth trim of a checkpoint",
    idempotent=True,
    cpu_heavy=True,
)
