"""plan_trim of a real config with an environment record, cold and warm, beside the same plan without a record.

Run: `python -m bench.bench_plan_trim [FIXTURE]` (default v4, DeepSeek-V4-Flash's config.json from tests/data;
the other names are test_inspect_config's FIXTURES). The record is established for the CPU build of vLLM the
tests use (workbench.vllm_cpu_python(): built on first use, about 3 minutes), so a plan searches upstream,
the installed vLLM and the plugin for the code that reads each changed config field. Each call has a new
Runtime on the same state directory, as a restarted server would.
- cold: the first plan after `environment action=establish` (the state holds the record and nothing else).
- warm: the same call again on the state the cold call left.
The reference, in the same run, is the identical plan_trim call (cold, then warm) on a state directory without
a record (no consumer code searched). Prints seconds, ratios and the issue's goal (warm <= 1 s); asserts no time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_inspect_config import established_plugin, fixture, write_model
from workbench import vllm_cpu_python

from bench.table import BenchRow, differing, run_alone, seconds_at_most, warm_page_cache
from vllm_metax_mcp.core.sources.environment import load_record
from vllm_metax_mcp.core.sources.git import open_repository
from vllm_metax_mcp.tools.arguments import PlanTrimInput, PlanTrimOutput
from vllm_metax_mcp.tools.plan_trim import plan_trim
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

WARM_GOAL = 1.0


def run_tool(root: Path, state: Path, python: Path, model: str) -> tuple[float, PlanTrimOutput]:
    runtime = Runtime.create([str(root)], state_dir=str(state), interpreters=[str(python)])
    env = ToolEnv(runtime=runtime, tool="plan_trim")
    start = time.perf_counter()
    output = plan_trim(PlanTrimInput(model=model, plugin_repo="plugin"), env)
    return time.perf_counter() - start, output


def readers(output: PlanTrimOutput) -> int:
    return sum(len(change.read_by or []) for change in output.config_changes)


def rows(name: str = "v4") -> list[BenchRow]:
    python = vllm_cpu_python()
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as scratch:
        root = Path(scratch) / "ws"
        runtime = established_plugin(root, python)  # its state lies beside root: ws.state
        record = load_record(runtime.store, open_repository(str(root / "plugin"), runtime.policy))
        assert record is not None, "environment action=establish left no record"
        write_model(root / name, fixture(name))
        state = Path(scratch) / "ws.state"
        installed = record.probe.package_dir("vllm")
        warm_page_cache(root)
        warm_page_cache(*([Path(installed)] if installed else []), pattern="*.py")
        cold, output = run_tool(root, state, python, name)
        warm, again = run_tool(root, state, python, name)
        bare_cold, bare = run_tool(root, Path(scratch) / "bare.state", python, name)
        bare_warm, _ = run_tool(root, Path(scratch) / "bare.state", python, name)
    differ = differing(output.model_dump(), again.model_dump())
    print(
        f"{name}: kept layers {output.kept_layers}; {len(output.config_changes)} config changes, "
        f"{readers(output)} readers named with the record, {readers(bare)} without"
    )
    print(f"fields the warm answer has unlike the cold one: {', '.join(differ) or 'none'}")
    print(f"plan_trim without a record   cold {bare_cold:6.2f} s   warm {bare_warm:6.2f} s")
    for label, seconds, reference in (("cold", cold, bare_cold), ("warm", warm, bare_warm)):
        print(f"plan_trim with a record      {label} {seconds:6.2f} s   ratio {seconds / reference:5.0f}x no record")
    print(f"goal: warm <= {WARM_GOAL:g} s: {'met' if warm <= WARM_GOAL else 'MISSED'}")
    return [
        BenchRow("plan_trim with an environment record, cold", cold, bare_cold, "no record"),
        BenchRow(
            "plan_trim with an environment record, warm", warm, bare_warm, "no record", seconds_at_most(WARM_GOAL)
        ),
    ]


def main() -> None:
    run_alone(lambda: rows(*sys.argv[1:2]))


if __name__ == "__main__":
    main()
