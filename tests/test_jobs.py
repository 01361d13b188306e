"""Jobs with real detached workers: bounded calls, polling, cancellation of whole process trees,
reaping of jobs whose worker died, and the locked state store shared by several processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import jobtargets
import pytest
from helpers import (
    JOB_TOOL,
    TESTS_DIR,
    kill_pids,
    pid_alive,
    pids_with_marker,
    wait_for,
    with_tests_on_pythonpath,
)
from pydantic import BaseModel

from vllm_metax_mcp.core.foundation import jobs as jobs_module
from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.tools.cancel_job import SPEC as CANCEL_SPEC
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.jobs import SPEC as JOBS_SPEC
from vllm_metax_mcp.tools.output import compact, text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv, ToolSpec

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with_tests_on_pythonpath(monkeypatch)
    root = tmp_path / "root"
    root.mkdir()
    rt = Runtime.create([str(root)], state_dir=str(tmp_path / "state"))
    yield rt
    for job_id in rt.store.list("jobs"):
        kill_pids(pids_with_marker(job_id))


def call(spec: ToolSpec, args: dict[str, Any], rt: Runtime, **kwargs: Any) -> BaseModel:
    return anyio.run(lambda: invoke(spec, args, ToolEnv(runtime=rt, tool=spec.name), **kwargs))


def job_status(rt: Runtime, job_id: str) -> dict[str, Any]:
    out = call(JOBS_SPEC, {"action": "status", "job_id": job_id}, rt)
    return out.job.model_dump()


def start_spawner(rt: Runtime, tmp_path: Path) -> tuple[str, dict[str, int]]:
    pidfile = tmp_path / "pids.json"
    handle = rt.jobs.start("test_job", "jobtargets:spawn_and_sleep", {"pidfile": str(pidfile), "seconds": 120})
    pids = json.loads(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 20, what="the job's pid file"))
    assert all(pid_alive(pid) for pid in pids.values()), pids
    return handle.job_id, pids


def test_job_outlives_a_short_call_and_is_polled_to_completion(runtime: Runtime) -> None:
    out = call(JOB_TOOL, {"args": {"steps": 15, "delay": 0.2}}, runtime, job_wait_s=0.5)
    assert out.job is not None, "a 3 s job must not finish within a 0.5 s call"
    assert out.job.status in ("queued", "running")
    assert out.steps is None and out.message is None
    assert out.result_id.startswith("r-")
    job_id = out.job.id
    sent = compact(out)
    assert set(sent) == {"job", "poll_after_s", "resource", "result_id"}, sent
    assert 2 <= sent["poll_after_s"] <= 10 and sent["resource"] == f"vllm-metax://jobs/{job_id}"
    assert sent["job"]["message"].startswith(sent["job"]["status"]), sent
    assert len(text_of(out)) < 400

    polled = call(JOBS_SPEC, {"action": "status", "job_id": job_id}, runtime)
    if polled.job.status == "running":
        assert set(compact(polled)) == {"job", "poll_after_s", "resource", "result_id"}, compact(polled)
        assert "jobs" not in compact(polled) and "total" not in compact(polled)

    listed = call(JOBS_SPEC, {"action": "list"}, runtime)
    assert [j.id for j in listed.jobs] == [job_id] and listed.total == 1
    assert listed.jobs[0].message and listed.jobs[0].message.startswith(listed.jobs[0].status)

    final = wait_for(
        lambda: (s := job_status(runtime, job_id))["status"] not in ("queued", "running") and s, 30, 0.2, "the job"
    )
    assert final["status"] == "succeeded", final
    assert final["progress"] == {"done": 15, "total": 15, "message": "done"}
    status = call(JOBS_SPEC, {"action": "status", "job_id": job_id}, runtime)
    assert status.next_step is not None and status.next_step.arguments == {"action": "result", "job_id": job_id}
    result = call(JOBS_SPEC, {"action": "result", "job_id": job_id}, runtime)
    cited = dict(result.job.result)
    assert cited.pop("result_id").startswith("r-")
    assert cited == {"steps": 15, "message": "slept 15 steps"}


def test_a_typed_payload_is_rebuilt_from_its_annotation_in_the_worker(runtime: Runtime, tmp_path: Path) -> None:
    """Jobs.start stores the target's own dataclass as JSON; the real worker rebuilds it (nested
    dataclass, Path, tuple, Literal) from the annotation of the target's first parameter."""
    order = jobtargets.TypedOrder("copy", 3, jobtargets.Place(tmp_path / "out", ("a", "b")))
    handle = runtime.jobs.start("test_job", "jobtargets:describe_order", order)
    stored = runtime.store.read(f"jobs/{handle.job_id}/spec.json")["args"]
    assert stored == {"kind": "copy", "count": 3, "place": {"directory": str(tmp_path / "out"), "names": ["a", "b"]}}
    final = wait_for(lambda: (s := job_status(runtime, handle.job_id))["status"] == "succeeded" and s, 30, 0.1, "job")
    result = call(JOBS_SPEC, {"action": "result", "job_id": handle.job_id}, runtime).job.result
    assert final["status"] == "succeeded"
    assert {k: result[k] for k in ("type", "place_type", "directory_is_path", "names")} == {
        "type": "TypedOrder",
        "place_type": "Place",
        "directory_is_path": True,
        "names": ["a", "b"],
    }


def test_a_payload_that_is_not_the_targets_type_fails_with_a_precise_message(runtime: Runtime) -> None:
    """A payload another version stored (here: a field missing, a kind outside the Literal) is refused by
    the worker as a clean failure naming the type, never an internal error."""
    handle = runtime.jobs.start("test_job", "jobtargets:describe_order", {"kind": "delete", "count": 1})
    final = wait_for(
        lambda: (s := job_status(runtime, handle.job_id))["status"] not in ("queued", "running") and s, 30, 0.1, "job"
    )
    assert final["status"] == "failed"
    error = runtime.store.read(f"jobs/{handle.job_id}/status.json")["error"]
    assert error["code"] == "failed" and "is not a TypedOrder of this server" in error["message"], error


def test_job_finishing_within_the_call_returns_its_result_and_progress(runtime: Runtime) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def run() -> BaseModel:
        return await invoke(
            JOB_TOOL,
            {"args": {"steps": 4, "delay": 0.3}},
            ToolEnv(runtime, "test_job", progress=progress),
            job_wait_s=30,
        )

    out = anyio.run(run)
    assert out.job is None and out.steps == 4 and out.message == "slept 4 steps"
    assert seen, "progress of a running job is forwarded to the caller"
    assert [s[0] for s in seen] == sorted(s[0] for s in seen)


def test_cancel_kills_the_whole_process_tree(runtime: Runtime, tmp_path: Path) -> None:
    job_id, pids = start_spawner(runtime, tmp_path)
    try:
        out = call(CANCEL_SPEC, {"job_id": job_id}, runtime)
        assert out.job.status == "cancelled"
        wait_for(lambda: not any(pid_alive(p) for p in pids.values()), 3, what="all job processes to end")
        assert job_status(runtime, job_id)["status"] == "cancelled"
    finally:
        kill_pids(list(pids.values()))


def test_cancelled_call_stops_its_job(runtime: Runtime, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids.json"

    async def run() -> None:
        with anyio.move_on_after(30):
            env = ToolEnv(runtime, "test_job")
            async with anyio.create_task_group() as group:
                group.start_soon(
                    invoke, JOB_TOOL, {"target": "jobtargets:spawn_and_sleep", "args": {"pidfile": str(pidfile)}}, env
                )
                while not pidfile.exists():
                    await anyio.sleep(0.05)
                group.cancel_scope.cancel()

    anyio.run(run)
    pids = json.loads(pidfile.read_text())
    try:
        (job,) = runtime.jobs.list()
        assert job["status"] == "cancelled"
        wait_for(lambda: not any(pid_alive(p) for p in pids.values()), 3, what="all job processes to end")
    finally:
        kill_pids(list(pids.values()))


def test_job_whose_worker_died_is_reaped_by_the_next_server(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, pids = start_spawner(runtime, tmp_path)
    try:
        os.kill(pids["worker"], signal.SIGKILL)
        wait_for(lambda: not pid_alive(pids["worker"]), 5, what="the worker to die")
        assert pid_alive(pids["grandchild"]) and pid_alive(pids["child"]), "the job's other processes live on"
        monkeypatch.setattr(jobs_module, "STALE_AFTER_S", 1.0)
        wait_for(lambda: (runtime.jobs.heartbeat_age(job_id) or 0) > 1.5, 10, what="the heartbeat to go stale")

        next_server = Runtime.create([str(tmp_path / "root")], state_dir=str(tmp_path / "state"))
        assert next_server.jobs.reap_stale() == [job_id]
        wait_for(lambda: not any(pid_alive(p) for p in pids.values()), 3, what="the orphans to be stopped")
        status = job_status(next_server, job_id)
        assert status["status"] == "lost"
        assert status["error"]["code"] == "failed"
        assert next_server.jobs.reap_stale() == []
    finally:
        kill_pids(list(pids.values()))


def test_live_job_is_not_reaped(runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, pids = start_spawner(runtime, tmp_path)
    try:
        monkeypatch.setattr(jobs_module, "STALE_AFTER_S", 2.5)
        created = runtime.jobs.get(job_id)["created_at"]
        wait_for(lambda: time.time() - created > 3.5, 10, what="the job to be older than the stale limit")

        next_server = Runtime.create([str(tmp_path / "root")], state_dir=str(tmp_path / "state"))
        assert next_server.jobs.reap_stale() == []
        assert job_status(next_server, job_id)["status"] == "running"
        assert all(pid_alive(p) for p in pids.values())
    finally:
        runtime.jobs.cancel(job_id)
        kill_pids(list(pids.values()))


def test_failed_job_reports_a_clean_error(runtime: Runtime) -> None:
    with pytest.raises(ToolFailure) as info:
        call(JOB_TOOL, {"target": "jobtargets:raise_unexpected"}, runtime, job_wait_s=30)
    assert info.value.code is ErrorCode.FAILED
    assert "Traceback" not in info.value.message and str(TESTS_DIR) not in info.value.message

    with pytest.raises(ToolFailure) as info:
        call(JOB_TOOL, {"target": "jobtargets:raise_blocked"}, runtime, job_wait_s=30)
    assert info.value.code is ErrorCode.BLOCKED


def test_jobs_tool_refuses_bad_ids(runtime: Runtime) -> None:
    for args, code in (
        ({"action": "status"}, ErrorCode.BAD_INPUT),
        ({"action": "status", "job_id": "../../etc"}, ErrorCode.BAD_INPUT),
        ({"action": "result", "job_id": "j-0123456789abcdef"}, ErrorCode.NOT_FOUND),
        ({"action": "cancel", "job_id": "j-0123456789abcdef"}, ErrorCode.BAD_INPUT),
        ({"action": "list", "job_id": "j-0123456789abcdef"}, ErrorCode.BAD_INPUT),
        ({"action": "status", "job_id": "j-0123456789abcdef", "limit": 2}, ErrorCode.BAD_INPUT),
        ({"limit": 0}, ErrorCode.BAD_INPUT),
        ({"limit": 501}, ErrorCode.BAD_INPUT),
    ):
        with pytest.raises(ToolFailure) as info:
            call(JOBS_SPEC, args, runtime)
        assert info.value.code is code, args
    with pytest.raises(ToolFailure) as info:
        call(CANCEL_SPEC, {"job_id": "j-0123456789abcdef"}, runtime)
    assert info.value.code is ErrorCode.NOT_FOUND


def test_a_result_too_big_to_inline_is_read_from_its_resource_in_pages(runtime: Runtime) -> None:
    handle = runtime.jobs.start("test_job", "jobtargets_more:big_result", {"rows": 400, "width": 100})
    wait_for(lambda: runtime.jobs.get(handle.job_id)["status"] == "succeeded", 30, 0.1, "the job")
    out = call(JOBS_SPEC, {"action": "result", "job_id": handle.job_id}, runtime)
    assert out.job.result is None and len(text_of(out)) <= RESULT_BUDGET
    result_id = out.job.result_resource.removeprefix("vllm-metax://results/")
    rows = runtime.store.read(f"results/{result_id}.json")["output"]["rows"]
    assert rows == runtime.jobs.get(handle.job_id)["result"]["rows"], "the resource holds the whole output"


def test_poll_interval_follows_the_progress_rate() -> None:
    """A quarter of the expected time left, within 2..10 s; 2 s while queued or cancelling, 5 s without a rate."""
    base = {"id": "j-0", "started_at": 100.0}
    assert jobs_module.poll_after({**base, "status": "running", "progress": {"done": 1, "total": 2}}, 120) == 5
    assert jobs_module.poll_after({**base, "status": "running", "progress": {"done": 1, "total": 100}}, 101) == 10
    assert jobs_module.poll_after({**base, "status": "running", "progress": {"done": 99, "total": 100}}, 200) == 2
    assert jobs_module.poll_after({**base, "status": "running", "progress": {"done": 3, "total": None}}, 200) == 5
    assert jobs_module.poll_after({**base, "status": "cancelling", "progress": None}, 200) == 2
    message = jobs_module.progress_message(
        {"status": "running", "progress": {"done": 3, "total": 4, "message": "copy"}}
    )
    assert message == "running: copy (75%)"


def test_cancel_reads_cancelling_until_the_processes_are_gone(runtime: Runtime, tmp_path: Path) -> None:
    """A worker that takes 2 s to stop: while cancel_job waits for it, any poll sees `cancelling`
    (in the small running shape), and `cancelled` only once no process of the job is left."""
    pidfile = tmp_path / "pids.json"
    handle = runtime.jobs.start("test_job", "jobtargets_more:stop_slowly", {"pidfile": str(pidfile), "linger": 2})
    pids = json.loads(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 20, what="the job's pid file"))
    outcome: dict[str, Any] = {}

    async def cancel_and_poll() -> list[dict[str, Any]]:
        seen = []
        async with anyio.create_task_group() as group:

            async def cancel() -> None:
                outcome["job"] = await anyio.to_thread.run_sync(call, CANCEL_SPEC, {"job_id": handle.job_id}, runtime)

            group.start_soon(cancel)
            while "job" not in outcome:
                polled = await anyio.to_thread.run_sync(
                    call, JOBS_SPEC, {"action": "status", "job_id": handle.job_id}, runtime
                )
                seen.append(compact(polled))
                await anyio.sleep(0.1)
        return seen

    try:
        seen = anyio.run(cancel_and_poll)
        cancelling = [s for s in seen if s["job"]["status"] == "cancelling"]
        assert cancelling, seen
        assert set(cancelling[0]) == {"job", "poll_after_s", "resource", "result_id"}
        assert cancelling[0]["job"]["message"] == "cancelling: lingering" and cancelling[0]["poll_after_s"] == 2
        assert outcome["job"].job.status == "cancelled"
        assert not any(pid_alive(p) for p in pids.values()), "cancelled only once every process is gone"
    finally:
        kill_pids(list(pids.values()))


_INCREMENTER = """
import sys, time
from pathlib import Path
from vllm_metax_mcp.core.foundation.state import StateStore
store = StateStore(Path(sys.argv[1]))
go = Path(sys.argv[3])
while not go.exists():
    time.sleep(0.001)
for _ in range(int(sys.argv[2])):
    store.update("shared/counter.json", lambda doc: {"count": (doc or {}).get("count", 0) + 1, "pad": "x" * 4096})
"""


@pytest.mark.timeout(90)
def test_two_processes_sharing_a_state_dir_lose_no_update(tmp_path: Path) -> None:
    state = tmp_path / "state"
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _INCREMENTER, str(state), "100", str(go)]) for _ in range(2)]
    try:
        store = StateStore(state)
        time.sleep(0.3)
        go.touch()
        reads = 0
        while any(p.poll() is None for p in procs):
            doc = store.read("shared/counter.json")  # raises on a torn or half-written document
            if doc is not None:
                assert isinstance(doc["count"], int)
                reads += 1
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    assert store.read("shared/counter.json")["count"] == 200
    assert json.loads((state / "shared" / "counter.json").read_text())["count"] == 200
    assert sorted(os.listdir(state / "shared")) == ["counter.json"], "no temporary files left behind"
