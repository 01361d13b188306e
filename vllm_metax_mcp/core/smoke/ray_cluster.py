"""A smoke run on an existing Ray cluster (`ray_address`): the cluster's free devices checked before the
launch, the server's Ray job tagged at launch, and only that job's actors ended after the server.

Ray runs only in the target interpreter (`target/ray_probe.py`). vLLM's Ray executor asks for one bundle
of `current_platform.ray_device_key` per worker (tp*pp of them per engine), so that key is the one
counted; a platform without one (vLLM's CPU platform) gets no device check, and vLLM itself refuses
Ray there. The server's driver carries the run id in its Ray job's metadata (Ray reads a job config
from `RAY_JOB_CONFIG_JSON_ENV_VAR` on `ray.init`): that tag, not a process id that may be gone by
teardown, is how the run finds its own job, and no other job's actor is ever touched.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundation.isolated import ProbeDied, run_isolated
from ..target import script_source

MARKER = "@@RAYPROBE@@"
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
TAG_KEY = "vllm_metax_mcp_smoke"
"""The job-metadata key whose value is the run id."""
RESOURCES_TIMEOUT_S = 180
"""Connecting, then importing vLLM (and torch) to read its platform's Ray device key."""
GRACE_S = 15.0
"""How long Ray gets to end a finished job's actors itself before they are killed."""
TEARDOWN_TIMEOUT_S = 90


@dataclass(frozen=True)
class RayNode:
    node_id: str
    address: str | None
    total: dict[str, float]
    free: dict[str, float]


@dataclass
class ClusterCheck:
    """What the cluster offered before the launch (`smoke/<run_id>/ray.json`), and why the run may not go on."""

    address: str
    needed: int
    """Devices the server takes (tp*pp*dp)."""
    gcs: str | None = None
    ray_version: str | None = None
    platform: str | None = None
    device_key: str | None = None
    """The platform's Ray resource per worker; None where it names none or could not be read."""
    free_devices: float | None = None
    nodes: list[RayNode] = field(default_factory=list)
    total: dict[str, float] = field(default_factory=dict)
    free: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RayTeardown:
    """The end of the run's Ray job: what was left of it after the server stopped, and what was killed."""

    jobs: list[str]
    """The run's jobs (tagged with its id)."""
    jobs_alive: list[str]
    left_alive: list[str]
    """Actors of those jobs still alive after the grace (killed then, by id)."""
    still_alive: list[str]
    """Still alive after the kill (the run fails then)."""
    kill_errors: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    """Why the job could not be checked; the run fails then."""

    def problems(self) -> list[str]:
        found = []
        if self.error:
            found.append(f"the run's Ray job could not be checked after teardown: {self.error}")
        if self.still_alive:
            found.append(f"actors of the run's Ray job still alive after being killed: {self.still_alive}")
        if self.jobs_alive:
            found.append(f"the run's Ray job is still running after teardown: {self.jobs_alive}")
        return found


def tagged_job_config(run_id: str) -> str:
    """`RAY_JOB_CONFIG_JSON_ENV_VAR` for the server: the run's tag and nothing else (a caller's job config,
    whose runtime_env would reach the driver and every worker, is refused by the env allow-list, and the
    server's own is replaced)."""
    return json.dumps({"metadata": {TAG_KEY: run_id}}, separators=(",", ":"))


def _probe(python: str, request: dict[str, Any], pythonpath: list[Path] | None, timeout_s: float) -> dict[str, Any]:
    return run_isolated(
        Path(python),
        script_source("ray_probe"),
        MARKER,
        what="Ray probe",
        stdin=json.dumps(request).encode(),
        pythonpath=pythonpath,
        extra_env={"RAY_ADDRESS": request["address"]},  # Ray prefers it to any address it is given
        timeout_s=timeout_s,
    )


def _floats(value: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (value or {}).items()}


def check_cluster(python: str, address: str, needed: int, pythonpath: list[Path] | None) -> ClusterCheck:
    """Connect to the cluster in the target interpreter and check it can place `needed` workers."""
    check = ClusterCheck(address, needed)
    try:
        report = _probe(python, {"action": "resources", "address": address}, pythonpath, RESOURCES_TIMEOUT_S)
    except ProbeDied as died:
        report = dict(died.partial or {})
        report.setdefault("platform_error", died.death.sentence())
        if "nodes" not in report:
            check.reasons.append(f"the Ray cluster at {address} could not be checked: {died.death.sentence()}")
            return check
    check.ray_version, check.gcs = report.get("ray"), report.get("gcs")
    if report.get("ray_error"):
        check.reasons.append(
            f"the interpreter cannot import ray ({report['ray_error']}): vLLM's Ray backend needs it there"
        )
        return check
    if report.get("connect_error"):
        check.reasons.append(f"the Ray cluster at {address} cannot be reached: {report['connect_error']}")
        return check
    if report.get("error"):
        check.reasons.append(f"the Ray cluster at {address} could not be read: {report['error']}")
        return check
    check.nodes = [
        RayNode(n["node_id"], n.get("address"), _floats(n.get("total")), _floats(n.get("free")))
        for n in report["nodes"]
    ]
    check.total, check.free = _floats(report.get("total")), _floats(report.get("free"))
    check.platform = report.get("platform")
    _count_devices(check, report)
    return check


def _count_devices(check: ClusterCheck, report: dict[str, Any]) -> None:
    """Blocked when the platform's Ray device is short; noted when the platform names none."""
    if not check.nodes:
        check.reasons.append(f"the Ray cluster at {check.address} has no alive node")
        return
    if report.get("platform_error"):
        check.notes.append(
            f"vLLM's platform could not be read here ({report['platform_error']}): the cluster's devices "
            "are not counted; the server's log tells whether vLLM can place its workers"
        )
        return
    key = report.get("device_key") or None
    if key is None:
        check.notes.append(
            f"vLLM's {check.platform} platform names no Ray device (its ray_device_key is empty): its Ray "
            "executor requests none and vLLM refuses the Ray backend on it; the devices are not counted"
        )
        return
    check.device_key = key
    # a worker's bundle takes one whole device on one node: fractions free on several nodes do not add up
    check.free_devices = float(sum(math.floor(n.free.get(key, 0.0)) for n in check.nodes))
    per_node = ", ".join(f"{n.address or n.node_id[:12]}: {n.free.get(key, 0.0):g}" for n in check.nodes)
    summary = f"{check.free_devices:g} free {key} of {check.total.get(key, 0.0):g} ({per_node})"
    if check.free_devices < check.needed:
        check.reasons.append(f"the Ray cluster at {check.address} has {summary}; tp*pp*dp needs {check.needed}")
    else:
        check.notes.append(f"the Ray cluster at {check.address} has {summary} for {check.needed} worker(s)")


def release_job(python: str, address: str, run_id: str) -> RayTeardown:
    """After the server stopped: the run's Ray job has no live actor left (those Ray did not end are killed)."""
    request = {"action": "teardown", "address": address, "tag_key": TAG_KEY, "tag": run_id, "grace_s": GRACE_S}
    try:
        report = _probe(python, request, None, TEARDOWN_TIMEOUT_S)
    except ProbeDied as died:
        return RayTeardown([], [], [], [], error=died.death.sentence())
    error = report.get("ray_error") or report.get("connect_error") or report.get("error")
    return RayTeardown(
        jobs=list(report.get("jobs") or []),
        jobs_alive=list(report.get("jobs_alive") or []),
        left_alive=list(report.get("left_alive") or []),
        still_alive=list(report.get("still_alive") or []),
        kill_errors=dict(report.get("kill_errors") or {}),
        error=error,
    )
