"""Runs inside the *target* interpreter (any Python >= 3.8): what a Ray cluster offers, and the end of
one smoke run's Ray job, as JSON after a marker.

Reads {"action": "resources" | "teardown", "address": ..., "tag_key": ..., "tag": ..., "grace_s": ...}
on stdin. It connects as a short-lived driver of the existing cluster (`ray.init` with an address
never starts one) after a plain TCP check, since Ray retries an unreachable address for minutes.
Ray's own tables are read from the GCS (`ray._private.state`): `ray.util.state` needs the
dashboard, which clusters often run without.

- resources: alive nodes with their total and free resources, then the Ray device key of the
  platform vLLM resolves here (what its Ray executor puts in each worker's bundle).
- teardown: the jobs whose config metadata carries the run's tag (set at launch), their actors
  that are not dead; after a grace for Ray to end them (a finished job's actors die with it), the
  rest are killed by actor id through the GCS. Other jobs' actors are never read.
"""

import json
import logging
import socket
import sys
import time

MARKER = "@@RAYPROBE@@"
STEP = "@@STEP@@"
CONNECT_TIMEOUT_S = 3.0
POLL_S = 0.25
KILL_WAIT_S = 10.0


def step(text):
    sys.stdout.write("\n" + STEP + text + "\n")
    sys.stdout.flush()


def emit(report):
    sys.stdout.write("\n" + MARKER + json.dumps(report) + "\n")
    sys.stdout.flush()


def error(exc):
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return "%s: %s" % (type(exc).__name__, text[:300])


def connect(address):
    """The GCS address the cluster answers on; raises with the reason when it does not."""
    import ray
    from ray._private import services

    step("finding the Ray cluster")
    gcs = services.canonicalize_bootstrap_address(address)
    if gcs is None:
        raise ConnectionError("no running Ray cluster found for %r" % address)
    host, port = gcs.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError("nothing answers at %s (%s)" % (gcs, exc)) from None
    step("connecting to the Ray cluster at " + gcs)
    ray.init(address=gcs, log_to_driver=False, logging_level=logging.ERROR)
    return gcs


def resources(request, report):
    import ray

    report["nodes"] = [
        {
            "node_id": node["NodeID"],
            "address": node.get("NodeManagerAddress"),
            "total": node.get("Resources") or {},
        }
        for node in ray.nodes()
        if node.get("Alive")
    ]
    from ray._private import state

    free = state.available_resources_per_node()
    for node in report["nodes"]:
        node["free"] = free.get(node["node_id"], {})
    report["total"] = ray.cluster_resources()
    report["free"] = ray.available_resources()
    ray.shutdown()
    emit(report)  # what the cluster offers survives a crash of the platform import below
    step("resolving vLLM's current platform")
    try:
        from vllm.platforms import current_platform

        report["platform"] = getattr(current_platform, "device_name", None)
        report["device_key"] = getattr(current_platform, "ray_device_key", "") or ""
    except BaseException as exc:  # plugin and platform code may raise anything, SystemExit included
        report["platform_error"] = error(exc)


def tagged_jobs(tag_key, tag):
    """{job id: driver alive} of the jobs whose config metadata carries `tag`."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    accessor = state.state._connect_and_get_accessor()
    jobs = {}
    for raw in accessor.get_job_table(skip_submission_job_info_field=True, skip_is_running_tasks_field=True):
        entry = gcs_pb2.JobTableData.FromString(raw)
        if entry.config.metadata.get(tag_key) == tag:
            jobs[entry.job_id.hex()] = not entry.is_dead
    return jobs


def live_actors(jobs):
    """The actors of `jobs` that are not dead (asked job by job: other jobs' actors are never read)."""
    import ray
    from ray._private import state

    alive = []
    for job in jobs:
        actors = state.actors(job_id=ray.JobID.from_hex(job))
        alive += [actor_id for actor_id, info in actors.items() if info["State"] != "DEAD"]
    return sorted(alive)


def kill(actor_ids):
    """Kill each actor by id through the GCS (a driver holds no handle to another job's unnamed actor)."""
    import ray
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    try:
        from ray._private.grpc_utils import init_grpc_channel
    except ImportError:  # older Ray keeps it in utils
        from ray._private.utils import init_grpc_channel

    failed = {}
    channel = init_grpc_channel(ray._private.worker.global_worker.node.gcs_address)
    stub = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(channel)
    for actor_id in actor_ids:
        request = gcs_service_pb2.KillActorViaGcsRequest(
            actor_id=bytes.fromhex(actor_id), force_kill=True, no_restart=True
        )
        try:
            reply = stub.KillActorViaGcs(request, timeout=10)
            if reply.status.code:
                failed[actor_id] = reply.status.message[:200]
        except Exception as exc:
            failed[actor_id] = error(exc)
    channel.close()
    return failed


def wait_dead(jobs, seconds):
    deadline = time.monotonic() + seconds
    while True:
        alive = live_actors(jobs)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(POLL_S)


def teardown(request, report):
    import ray

    step("listing the run's Ray jobs and actors")
    jobs = tagged_jobs(request["tag_key"], request["tag"])
    report["jobs"] = sorted(jobs)
    grace = float(request.get("grace_s", 10))
    left = wait_dead(jobs, grace)
    deadline = time.time() + grace  # the GCS marks a job finished a moment after its driver ended
    while True:
        alive = sorted(job for job, up in tagged_jobs(request["tag_key"], request["tag"]).items() if up)
        if not alive or time.time() >= deadline:
            break
        time.sleep(0.2)
    report["jobs_alive"] = alive
    report["left_alive"] = left
    if left:
        step("killing %d actor(s) of the run's jobs" % len(left))
        report["kill_errors"] = kill(left)
        report["still_alive"] = wait_dead(jobs, KILL_WAIT_S)
    else:
        report["still_alive"] = []
    ray.shutdown()


def main():
    request = json.loads(sys.stdin.read())
    report = {"action": request["action"]}
    step("importing ray")
    try:
        import ray

        report["ray"] = ray.__version__
    except BaseException as exc:
        report["ray_error"] = error(exc)
        emit(report)
        return
    try:
        report["gcs"] = connect(request["address"])
    except BaseException as exc:
        report["connect_error"] = error(exc)
        emit(report)
        return
    try:
        if request["action"] == "resources":
            resources(request, report)
        else:
            teardown(request, report)
    except Exception as exc:  # a Ray without the tables read here: the report says so, whole
        report["error"] = error(exc)
    emit(report)


main()
