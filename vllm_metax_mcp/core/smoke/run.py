"""A smoke test on a real vLLM server: occupancy first, launch, health, requests, a teardown that
cannot leak, and an evidence record in the state directory.

`run_job` is a job target (`vllm_metax_mcp.core.smoke.run:run_job`): it receives the plan the tool
validated (`plan.py`: every path resolved and checked, every argument and variable allow-listed) and
returns the tool's output as a dict. It never stops a process it did not start (`processes.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..foundation.isolated import describe_exit
from ..foundation.jobs import JOB_MARKER_ENV, Stopped, stop_requested
from ..foundation.state import StateStore
from ..foundation.worker import Progress
from ..target import script_path
from . import devices as devices_module
from .answers import RequestRecord, run_case
from .client import get
from .drafts import draft_problem, parse_draft_counts
from .evidence import (
    DeviceEvidence,
    EnvDelta,
    ModuleOrigin,
    ServerRecord,
    SmokeEvidence,
    SubjectEvidence,
    TrimValidation,
    Verdict,
    output_of,
    read_log,
)
from .plan import SmokePlan
from .processes import SMOKE_MARKER_ENV, exit_status, free_port, start_ticks, stop_server
from .ray_cluster import JOB_CONFIG_ENV, check_cluster, release_job, tagged_job_config

JOB_TARGET = "vllm_metax_mcp.core.smoke.run:run_job"
"""`run_job` as a job names it."""
WRAPPER = script_path("serve_wrapper")
NO_ENGINE_EXIT = 3
"""The wrapper's exit status when the interpreter has no vLLM server (serve_wrapper.py runs
standalone in the target interpreter, so it keeps its own copy of this number)."""
HEALTH_POLL_S = 0.5
REQUEST_TIMEOUT_S = 180.0
STEPS = 5
"""Progress steps: occupancy, launch, health, requests, teardown, done."""
MAX_TMPDIR_CHARS = 60  # + a 36-character socket name stays well under the 107-byte limit
STRIPPED_ENV = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONHOME", "PYTHONSAFEPATH")
RUN_SUBDIRS = ("tmp", "cache", "config")
"""What the server writes in its run directory, removed when the run ends (with the snapshot)."""


@dataclass(frozen=True)
class LaunchEnvironment:
    env: dict[str, str]
    """The server's whole environment."""
    delta: EnvDelta


@dataclass
class Run:
    plan: SmokePlan
    progress: Progress
    store: StateStore = field(init=False)
    evidence: SmokeEvidence = field(init=False)
    cancelled: bool = False

    def __post_init__(self) -> None:
        plan = self.plan
        self.store = StateStore(plan.state_dir)
        self.evidence = SmokeEvidence(
            run_id=plan.run_id,
            model=plan.model_label,
            load_format=plan.load_format,
            cases_source=plan.cases_source,
            manifest_sha256=plan.identity.manifest_sha256,
            model_fingerprint=plan.identity.fingerprint,
            python=plan.python,
            started_at=time.time(),
            job_id=os.environ.get(JOB_MARKER_ENV),
            notes=list(plan.notes),
        )

    def report(self, step: float, message: str) -> None:
        self.progress.report(step, STEPS, message)

    # environment and command -----------------------------------------------------------

    def environment(self, devices: DeviceEvidence) -> LaunchEnvironment:
        plan, d = self.plan, self.plan.run_dir
        for sub in RUN_SUBDIRS:
            (d / sub).mkdir(parents=True, exist_ok=True)
        delta: dict[str, str] = {
            "TMPDIR": self.temporary_dir(),
            "VLLM_CACHE_ROOT": str(d / "cache" / "vllm"),
            "VLLM_CONFIG_ROOT": str(d / "config"),
            "TRITON_CACHE_DIR": str(d / "cache" / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(d / "cache" / "inductor"),
            "VLLM_HOST_IP": "127.0.0.1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            SMOKE_MARKER_ENV: plan.run_id,
        }
        if plan.subject:
            delta["PYTHONPATH"] = plan.subject.export_dir
        if devices.selected:
            ids = ",".join(str(i) for i in devices.selected)
            delta["CUDA_VISIBLE_DEVICES"] = ids
            if devices.occupancy.kind == "metax":
                delta["MACA_VISIBLE_DEVICES"] = ids
        if plan.ray_address:
            delta["RAY_ADDRESS"] = plan.ray_address
        delta.update(plan.env)
        if plan.ray_address:  # the server's Ray job carries the run id: teardown finds it by that
            delta[JOB_CONFIG_ENV] = tagged_job_config(plan.run_id)
        removed = sorted(k for k in STRIPPED_ENV if k in os.environ and k not in delta)
        env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
        env.update(delta)
        shown = {k: v for k, v in delta.items() if k != SMOKE_MARKER_ENV}
        return LaunchEnvironment(env, EnvDelta(shown, removed, f"{SMOKE_MARKER_ENV}={plan.run_id}"))

    def temporary_dir(self) -> str:
        """The run's TMPDIR. vLLM binds ZMQ IPC sockets there, and a Unix socket path holds at most
        107 bytes: a deep state directory gets a short private directory under the system's
        temporary directory instead (removed with the run)."""
        inside = self.plan.run_dir / "tmp"
        if len(str(inside)) <= MAX_TMPDIR_CHARS:
            return str(inside)
        short = tempfile.mkdtemp(prefix=f"vmm-{self.plan.run_id}-")
        self.evidence.short_tmpdir = short
        return short

    def serve_args(self, port: int) -> list[str]:
        plan, parallel = self.plan, self.plan.parallel
        args = ["--host", "127.0.0.1", "--port", str(port)]
        if plan.load_format:
            args += ["--load-format", plan.load_format]
        if plan.max_model_len:
            args += ["--max-model-len", str(plan.max_model_len)]
        if plan.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(plan.gpu_memory_utilization)]
        for flag, size in (
            ("--tensor-parallel-size", parallel.tp),
            ("--pipeline-parallel-size", parallel.pp),
            ("--data-parallel-size", parallel.dp),
        ):
            if size != 1:
                args += [flag, str(size)]
        if parallel.ep > 1:
            args.append("--enable-expert-parallel")
        if plan.trust_remote_code:
            args.append("--trust-remote-code")
        if plan.speculative_config:
            args += ["--speculative-config", json.dumps(plan.speculative_config, separators=(",", ":"))]
        if plan.ray_address:
            args += ["--distributed-executor-backend", "ray"]
        return args + list(plan.extra_args)

    # phases -----------------------------------------------------------------------------

    def occupancy(self) -> DeviceEvidence | None:
        """The devices to run on (none on a CPU-only machine or under Ray); None when the run is blocked."""
        plan = self.plan
        self.report(0, "checking accelerator occupancy")
        pythonpath = [Path(plan.subject.export_dir)] if plan.subject else None  # what the server will import
        occupancy = devices_module.detect(plan.python, self.store, pythonpath)
        devices = DeviceEvidence(occupancy, plan.parallel.devices, plan.devices)
        self.evidence.devices = devices
        if plan.ray_address:
            self.evidence.notes.append(
                "Ray places the workers by its own resource counts: processes outside Ray on this node's devices "
                "(listed in devices) and other nodes' occupancy do not gate the run"
            )
            return devices if self.ray_cluster(pythonpath) else None
        choice = devices_module.choose(occupancy, devices.needed, plan.devices, plan.gpu_memory_utilization)
        if choice.reasons:
            self.evidence.reasons += choice.reasons
            return None
        if occupancy.kind == "cpu":
            self.evidence.notes.append(
                "no accelerator management library (pymxsml, pynvml) or tool (mx-smi, nvidia-smi) answered: "
                "the server runs on the CPU"
            )
        devices.selected = choice.selected
        return devices

    def ray_cluster(self, pythonpath: list[Path] | None) -> bool:
        """Ray places the workers: the cluster's free devices (recorded in `ray.json`) decide; False when blocked."""
        plan = self.plan
        assert plan.ray_address is not None
        self.report(0, "checking the Ray cluster")
        check = check_cluster(plan.python, plan.ray_address, plan.parallel.devices, pythonpath)
        self.store.write(f"smoke/{plan.run_id}/ray.json", asdict(check))
        self.evidence.notes += [*check.notes, f"the Ray cluster's resources: smoke/{plan.run_id}/ray.json"]
        self.evidence.reasons += check.reasons
        return not check.reasons

    def wait_healthy(self, proc: subprocess.Popen[bytes], base: str, started: float) -> bool:
        deadline = started + float(self.plan.timeout_s)
        last_report = 0.0
        while True:
            status = exit_status(proc.pid)
            elapsed = time.monotonic() - started
            if status is not None:
                self.evidence.reasons.append(
                    f"the server ended ({describe_exit(status)}) after {elapsed:.0f} s, before /health answered; "
                    "see log_tail and errors"
                )
                return False
            try:
                if get(base + "/health", timeout=5).status == 200:
                    return True
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                self.evidence.reasons.append(
                    f"the server did not answer /health within {self.plan.timeout_s} s; see log_tail"
                )
                return False
            if elapsed - last_report >= 5:
                last_report = elapsed
                self.report(2, f"waiting for /health ({elapsed:.0f} s)")
            time.sleep(HEALTH_POLL_S)

    def requests(self, proc: subprocess.Popen[bytes], base: str) -> list[RequestRecord]:
        reply = get(base + "/v1/models", timeout=30)
        models = reply.body
        served = (
            [m.get("id") for m in (models.get("data") or [])]
            if reply.status == 200 and isinstance(models, dict)
            else []
        )
        records = [
            RequestRecord(
                case="(models)",
                kind="models",
                mode="first",
                endpoint="/v1/models",
                status=reply.status,
                served_models=served,
                ok=bool(served),
                checks={"lists_a_model": bool(served)},
            )
        ]
        if not served:
            self.evidence.reasons.append("/v1/models listed no model")
            return records
        dummy = self.plan.load_format == "dummy"
        cases = self.plan.cases
        for index, case in enumerate(cases):
            self.report(3, f"case {index + 1}/{len(cases)}: {case.name}")
            if exit_status(proc.pid) is not None:
                self.evidence.reasons.append(
                    f"the server exited during the requests (before case {case.name!r}); see log_tail"
                )
                break
            try:
                records += run_case(base, case, served[0], dummy, REQUEST_TIMEOUT_S)
            except (OSError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                records.append(RequestRecord(case=case.name, kind=case.kind, mode="first", error=error))
        self.evidence.reasons += [f"case {r.case} ({r.mode}): {r.problem}" for r in records if not r.ok]
        if self.plan.speculative_config and exit_status(proc.pid) is None:
            self.draft_counts(base)
        return records

    def draft_counts(self, base: str) -> None:
        """The spec-decode counters after the cases: the draft path ran, or the run fails."""
        try:
            reply = get(base + "/metrics", timeout=30)
        except (OSError, ValueError) as exc:
            self.evidence.reasons.append(f"/metrics did not answer ({type(exc).__name__}): the draft path is unproven")
            return
        counts = parse_draft_counts(reply.body) if reply.status == 200 and isinstance(reply.body, str) else None
        self.evidence.drafts = counts
        problem = draft_problem(counts)
        if problem:
            self.evidence.reasons.append(problem)

    def origins(self) -> None:
        """What the server's report says it imported, and (a subject run) whether that was the snapshot."""
        report = self.store.read(f"smoke/{self.plan.run_id}/server-report.json") or {}
        modules = report.get("modules") or {}
        evidence = self.evidence
        evidence.entry = report.get("entry")
        evidence.equivalent_command = report.get("equivalent_command")
        evidence.python_version = (report.get("python") or {}).get("version")
        evidence.versions = {"python": evidence.python_version} | {
            name: info.get("version") for name, info in modules.items()
        }
        evidence.import_origins = {
            name: ModuleOrigin(info.get("loaded"), info.get("origin"), info.get("error"))
            for name, info in modules.items()
        }
        subject = self.plan.subject
        if subject:
            plugin = modules.get("vllm_metax") or {}
            origin = plugin.get("origin") or ""
            export = os.path.realpath(subject.export_dir)
            used = bool(plugin.get("loaded")) and os.path.realpath(origin).startswith(export + os.sep)
            evidence.subject = SubjectEvidence(**asdict(subject), used=used, plugin_origin=origin or None)
            if not used:
                evidence.reasons.append(
                    f"the server did not import vllm_metax from the exported {subject.kind.value} snapshot "
                    f"(origin: {origin or plugin.get('error') or 'not loaded'})"
                )

    def serve(self, argv: list[str], launch: LaunchEnvironment, port: int, log_path: Path) -> subprocess.Popen[bytes]:
        """Launch the server, wait for its health, send the cases; always stop it (a cancel is noted)."""
        started = time.monotonic()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                cwd=self.plan.run_dir,
                env=launch.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        try:
            record = ServerRecord(
                proc.pid, proc.pid, launch.delta.marker, self.evidence.job_id, port, time.time(), start_ticks(proc.pid)
            )
            self.store.write(f"smoke/{self.plan.run_id}/server.json", asdict(record))
            base = f"http://127.0.0.1:{port}"
            if self.wait_healthy(proc, base, started):
                self.evidence.startup_s = round(time.monotonic() - started, 2)
                self.evidence.requests = self.requests(proc, base)
        except Stopped:
            self.cancelled = True
            self.evidence.reasons.append("cancelled on request; the server was stopped")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.report(4, "stopping the server")
            teardown = stop_server(proc, self.plan.run_id)
            if self.plan.ray_address:  # the workers are Ray actors, outside the server's process group
                self.report(4, "ending the run's Ray job")
                teardown = replace(teardown, ray=release_job(self.plan.python, self.plan.ray_address, self.plan.run_id))
            self.evidence.teardown = teardown
        return proc

    def execute(self) -> dict[str, Any]:
        plan, evidence = self.plan, self.evidence
        devices = self.occupancy()
        if devices is None:
            return self.finish("blocked")
        launch = self.environment(devices)
        port = free_port()
        argv = [
            plan.python,
            str(WRAPPER),
            str(plan.run_dir / "server-report.json"),
            "1" if plan.subject else "0",
            str(plan.model),
            "--",
            *self.serve_args(port),
        ]
        evidence.command, evidence.env_delta, evidence.port = argv, launch.delta, port
        self.report(1, "launching the server")
        log_path = plan.run_dir / "server.log"
        previous = signal.signal(signal.SIGTERM, stop_requested)
        proc = self.serve(argv, launch, port, log_path)
        assert evidence.teardown is not None  # serve always stops the server
        if evidence.teardown.leftover_pids:
            evidence.reasons.append(f"processes left after teardown: {evidence.teardown.leftover_pids}")
        if evidence.teardown.ray:
            evidence.reasons += evidence.teardown.ray.problems()
        self.origins()
        log = read_log(log_path)
        evidence.log_tail, evidence.errors = log.tail, log.errors
        if proc.returncode == NO_ENGINE_EXIT:
            evidence.reasons[:] = [
                "the interpreter has no vLLM server to start (see log_tail): nothing about the model was tested"
            ]
            return self.finish("blocked")
        output = self.finish("failed" if evidence.reasons else "passed")
        signal.signal(signal.SIGTERM, previous)
        if self.cancelled:
            raise Stopped()  # the job ends as cancelled (by the canceller), not as a success
        return output

    def finish(self, verdict: Verdict) -> dict[str, Any]:
        plan, evidence = self.plan, self.evidence
        for sub in (*RUN_SUBDIRS, "snapshot"):
            shutil.rmtree(plan.run_dir / sub, ignore_errors=True)
        if evidence.short_tmpdir:
            shutil.rmtree(evidence.short_tmpdir, ignore_errors=True)
        evidence.verdict, evidence.finished_at = verdict, time.time()
        evidence.evidence_path = f"smoke/{plan.run_id}/evidence.json"
        manifest_sha = plan.identity.manifest_sha256
        if plan.identity.validates_trim and manifest_sha:
            evidence.load_validated = verdict == "passed"
            if verdict == "passed":
                validation = TrimValidation(
                    manifest_sha, plan.run_id, plan.load_format, evidence.evidence_path, evidence.finished_at
                )
                self.store.write(f"validations/{manifest_sha}.json", asdict(validation))
        self.store.write(evidence.evidence_path, evidence.to_json())
        self.report(5, f"done: {verdict}")
        return output_of(evidence)


def run_job(plan: SmokePlan, progress: Progress) -> dict[str, Any]:
    """Job target: the whole smoke test for one validated plan."""
    return Run(plan, progress).execute()
