"""Tool `plan_trim`: which layers a depth trim keeps, what they cover, how to reach it, what it costs.

Its input and output models are in tools/arguments.py: trim_model's extend them.
"""

from __future__ import annotations

from ..core.checkpoint.evidence import checkpoint_evidence
from ..core.foundation.policy import Effect
from ..core.trim.plan import Source, make_plan
from ..core.trim.report import plan_context
from .arguments import PlanTrimInput, PlanTrimOutput, plan_trim_output, plugin_access
from .spec import ToolEnv, ToolSpec


def plan_trim(args: PlanTrimInput, env: ToolEnv) -> PlanTrimOutput:
    """Plan a depth trim of a checkpoint without writing anything: the fewest backbone layers that keep
    every distinct path (dense/MoE, each attention kind, compression ratio, routing, KV sharing, per-layer
    array values, id-list membership, modules only some layers' tensors hold) — not the first N — with the
    coverage table (path -> retained layers -> why -> the request that triggers it), the original->new
    layer map (MTP renamed to follow the backbone), paths no longer covered, every config change (with
    where consumer code reads the field), TP/PP notes, and per-rank parameter/KV budgets and disk bytes.
    Explicit `layers` that drop a distinct path are refused with sizes until `allow_drop` names it.
    Widths, head/LoRA dimensions, expert counts and quantization stay as they are. trim_model writes it.
    """
    evidence = checkpoint_evidence(plugin_access(args, env), env.policy, env.store, args.model, args.model_revision)
    plan = make_plan(Source.of(evidence, env.policy), args.trim_request())
    return plan_trim_output(plan, plan_context(evidence, plan, env.policy, args.plugin_repo))


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
