"""A smoke test on a real vLLM server: occupancy first, launch, health, requests, a teardown that
cannot leak, and an evidence record in the state directory.

`run_job` is a job target (`vllm_metax_mcp.core.smoke.run:run_job`): it receives the plan the tool
validated (every path resolved and checked, every argument and variable allow-listed) and
returns the tool's output as a dict. It never stops a process it did not start: the server is
launched in a new session (its own process group) with a marker variable, and only members of
that group or carriers of that marker are signalled. While the group's leader is not reaped
(exits are observed with WNOWAIT until teardown ends), its group id cannot be reused by
anyone else.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..foundation.isolated import describe_exit
from ..foundation.jobs import Stopped, stop_requested
from ..foundation.state import StateStore
from ..target import script_path
from . import devices as devices_module

SMOKE_MARKER_ENV = "VLLM_METAX_MCP_SMOKE"
WRAPPER = script_path("serve_wrapper")
NO_ENGINE_EXIT = 3
"""The wrapper's exit status when the interpreter has no vLLM server (serve_wrapper.py runs
standalone in the target interpreter, so it keeps its own copy of this number)."""
HEALTH_POLL_S = 0.5
REQUEST_TIMEOUT_S = 180.0
TEARDOWN = ((signal.SIGINT, 20.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0))
LOG_TAIL_LINES = 40
LOG_TAIL_CHARS = 4000
TEXT_CHARS = 160
MAX_REQUESTS_IN_OUTPUT = 24
MAX_TMPDIR_CHARS = 60  # + a 36-character socket name stays well under the 107-byte limit
LOG_PREFIX = re.compile(r"^\([^)]*\)\s+[A-Z]+\s+[\d-]+\s+[\d:.]+\s+\[[^\]]*\]\s*")
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b:?")
NOISE = ("Route: ", " - leaked ", "nanobind: ", " - ... skipped remainder")
STRIPPED_ENV = ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONINSPECT", "PYTHONHOME", "PYTHONSAFEPATH")


def run_dir(store: StateStore, run_id: str) -> Path:
    return store.path(f"smoke/{run_id}")


# -- processes -------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def processes_of(pgid: int, marker: str) -> list[int]:
    """Live processes in the server's group or carrying its marker: exactly what this run started."""
    needle = f"{SMOKE_MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        fields = _stat_fields(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == pgid:
            found.append(pid)
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(pid)
        except OSError:
            continue
    return sorted(found)


def exit_status(pid: int) -> int | None:
    """The child's exit status without reaping it (so its pid and group id stay ours); None while it runs."""
    try:
        result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -1
    if result is None:
        return None
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


def stop_server(proc: subprocess.Popen[bytes], marker: str) -> dict[str, Any]:
    """SIGINT, then SIGTERM, then SIGKILL to what this run started, each with a deadline; then verify."""
    started = time.monotonic()
    steps = []
    for sig, grace in TEARDOWN:
        pids = processes_of(proc.pid, marker)
        if not pids:
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        outside = [pid for pid in pids if (_stat_fields(pid) or ["", "", "-1"])[2] != str(proc.pid)]
        for pid in outside:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        steps.append({"signal": sig.name, "pids": pids})
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and processes_of(proc.pid, marker):
            time.sleep(0.2)
    leftover = processes_of(proc.pid, marker)
    try:
        proc.wait(timeout=5)  # reap the leader only now: until here its group id could not be reused
    except subprocess.TimeoutExpired:
        pass
    return {"steps": steps, "leftover_pids": leftover, "seconds": round(time.monotonic() - started, 2)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- HTTP ------------------------------------------------------------------------------------


def _get(url: str, timeout: float) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
            return response.status, json.loads(body) if body.strip().startswith((b"{", b"[")) else body.decode(
                errors="replace"
            )
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:500]


def _post(url: str, body: dict[str, Any], timeout: float) -> tuple[int, Any, float]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read()), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:500], time.monotonic() - started


def _post_stream(
    url: str, body: dict[str, Any], timeout: float
) -> tuple[int, list[dict[str, Any]], bool, float, float | None]:
    """(status, chunks, saw [DONE], latency, time to first content)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.monotonic()
    chunks: list[dict[str, Any]] = []
    first: float | None = None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return response.status, chunks, True, time.monotonic() - started, first
                chunk = json.loads(data)
                if first is None and any(_delta_text(c) for c in chunk.get("choices", [])):
                    first = time.monotonic() - started
                chunks.append(chunk)
            return response.status, chunks, False, time.monotonic() - started, first
    except urllib.error.HTTPError as exc:
        return (
            exc.code,
            [{"error": exc.read().decode(errors="replace")[:500]}],
            False,
            time.monotonic() - started,
            first,
        )


def _delta_text(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


# -- requests --------------------------------------------------------------------------------


def _image_url(image: str) -> str:
    if image.startswith("data:"):
        return image
    kind = mimetypes.guess_type(image)[0] or "image/png"
    return f"data:{kind};base64,{base64.b64encode(Path(image).read_bytes()).decode()}"


def _payload(case: dict[str, Any], served: str) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": served,
        "max_tokens": case["max_tokens"],
        "temperature": 0,
        "return_token_ids": True,
    }
    if case["kind"] == "completion":
        return "/v1/completions", {**body, "prompt": case["prompt"]}
    if case["kind"] == "chat":
        return "/v1/chat/completions", {**body, "messages": case["messages"]}
    content = [
        {"type": "text", "text": case.get("prompt") or "Describe the image."},
        {"type": "image_url", "image_url": {"url": _image_url(case["image"])}},
    ]
    return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": content}]}


@dataclass
class Answer:
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


def _answer(kind: str, body: Any) -> Answer:
    if not isinstance(body, dict) or not body.get("choices"):
        return Answer()
    choice = body["choices"][0]
    usage = body.get("usage") or {}
    text = choice.get("text") if kind == "completion" else (choice.get("message") or {}).get("content")
    return Answer(
        text=text if isinstance(text, str) else None,
        token_ids=choice.get("token_ids"),
        prompt_token_ids=choice.get("prompt_token_ids") or body.get("prompt_token_ids"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=choice.get("finish_reason"),
    )


def _streamed(chunks: list[dict[str, Any]]) -> Answer:
    text, ids, finish, usage = "", [], None, {}
    for chunk in chunks:
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            text += _delta_text(choice)
            ids += choice.get("token_ids") or []
            finish = choice.get("finish_reason") or finish
    return Answer(
        text=text,
        token_ids=ids or None,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        finish_reason=finish,
    )


def _structure_checks(answer: Answer, max_tokens: int) -> dict[str, bool]:
    checks = {
        "has_text": answer.text is not None,
        "token_count": answer.completion_tokens is not None and 1 <= answer.completion_tokens <= max_tokens,
        "finish_reason": answer.finish_reason in ("length", "stop"),
    }
    if answer.token_ids is not None:
        checks["token_ids_match_usage"] = len(answer.token_ids) == answer.completion_tokens
    return checks


def _same(a: Answer, b: Answer) -> bool:
    if a.token_ids is not None and b.token_ids is not None:
        return a.token_ids == b.token_ids
    return a.text == b.text


def _entry(
    case: dict[str, Any],
    mode: str,
    endpoint: str,
    status: int,
    latency: float,
    answer: Answer,
    checks: dict[str, bool],
    error: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    entry = {
        "case": case["name"],
        "kind": case["kind"],
        "covers": case.get("covers", ""),
        "mode": mode,
        "endpoint": endpoint,
        "status": status,
        "latency_s": round(latency, 3),
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "finish_reason": answer.finish_reason,
        "text": None if answer.text is None else answer.text[:TEXT_CHARS],
        "checks": checks,
        "ok": status == 200 and all(checks.values()),
        "error": None if error is None else str(error)[:500],
        **extra,
    }
    if mode == "first":
        entry["token_ids"] = answer.token_ids
        entry["prompt_token_ids"] = answer.prompt_token_ids
    return entry


def run_case(base: str, case: dict[str, Any], served: str, dummy: bool, timeout: float) -> list[dict[str, Any]]:
    """The case three times at temperature 0: once, again (determinism), and streamed (same tokens)."""
    endpoint, body = _payload(case, served)
    url = base + endpoint
    entries = []
    status, raw, latency = _post(url, body, timeout)
    first = _answer(case["kind"], raw)
    checks = _structure_checks(first, case["max_tokens"]) if status == 200 else {}
    keywords = case.get("expect_keywords") or []
    extra: dict[str, Any] = {}
    if keywords and status == 200:
        if dummy:
            extra["keywords"] = "not checked: dummy weights produce no meaning"
        else:
            missing = [k for k in keywords if k.lower() not in (first.text or "").lower()]
            checks["keywords"] = not missing
            extra["keywords_missing"] = missing
    entries.append(
        _entry(case, "first", endpoint, status, latency, first, checks, None if status == 200 else raw, **extra)
    )
    if status != 200:
        return entries
    status, raw, latency = _post(url, body, timeout)
    again = _answer(case["kind"], raw)
    checks = (
        {**_structure_checks(again, case["max_tokens"]), "same_as_first": _same(first, again)} if status == 200 else {}
    )
    entries.append(_entry(case, "repeat", endpoint, status, latency, again, checks, None if status == 200 else raw))
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    status, chunks, done, latency, ttft = _post_stream(url, stream_body, timeout)
    streamed = _streamed(chunks)
    checks = (
        {
            **_structure_checks(streamed, case["max_tokens"]),
            "done_marker": done,
            "same_as_first": _same(first, streamed),
        }
        if status == 200
        else {}
    )
    entries.append(
        _entry(
            case,
            "stream",
            endpoint,
            status,
            latency,
            streamed,
            checks,
            None if status == 200 else chunks,
            ttft_s=None if ttft is None else round(ttft, 3),
        )
    )
    return entries


# -- log -------------------------------------------------------------------------------------


def read_log(path: Path) -> tuple[str, list[str]]:
    """(tail of the log without noise, the error lines in it)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 512 * 1024))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return "", []
    lines = [line for line in text.splitlines() if line.strip() and not any(n in line for n in NOISE)]
    tail = "\n".join(lines[-LOG_TAIL_LINES:])[-LOG_TAIL_CHARS:]
    errors: list[str] = []
    for line in lines:
        message = LOG_PREFIX.sub("", line).strip()
        if EXCEPTION_LINE.match(message) and message[:300] not in errors:
            errors.append(message[:300])
    return tail, errors[:10]


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Run:
    plan: dict[str, Any]
    progress: Any
    store: StateStore = field(init=False)
    directory: Path = field(init=False)
    evidence: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = StateStore(Path(self.plan["state_dir"]))
        self.directory = Path(self.plan["run_dir"])

    def report(self, step: float, message: str) -> None:
        if self.progress is not None:
            self.progress.report(step, 5, message)

    # environment and command -----------------------------------------------------------

    def environment(self, selected: list[int], kind: str) -> tuple[dict[str, str], dict[str, Any]]:
        plan, d = self.plan, self.directory
        for sub in ("tmp", "cache", "config"):
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
            SMOKE_MARKER_ENV: plan["run_id"],
        }
        if plan.get("subject"):
            delta["PYTHONPATH"] = plan["subject"]["export_dir"]
        if selected:
            ids = ",".join(str(i) for i in selected)
            delta["CUDA_VISIBLE_DEVICES"] = ids
            if kind == "metax":
                delta["MACA_VISIBLE_DEVICES"] = ids
        if plan.get("ray_address"):
            delta["RAY_ADDRESS"] = plan["ray_address"]
        delta.update(plan.get("env") or {})
        removed = sorted(k for k in STRIPPED_ENV if k in os.environ and k not in delta)
        env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
        env.update(delta)
        shown = {k: v for k, v in delta.items() if k != SMOKE_MARKER_ENV}
        return env, {"set": shown, "removed": removed, "marker": f"{SMOKE_MARKER_ENV}={plan['run_id']}"}

    def temporary_dir(self) -> str:
        """The run's TMPDIR. vLLM binds ZMQ IPC sockets there, and a Unix socket path holds at most
        107 bytes: a deep state directory gets a short private directory under the system's
        temporary directory instead (removed with the run)."""
        inside = self.directory / "tmp"
        if len(str(inside)) <= MAX_TMPDIR_CHARS:
            return str(inside)
        short = tempfile.mkdtemp(prefix=f"vmm-{self.plan['run_id']}-")
        self.evidence["short_tmpdir"] = short
        return short

    def serve_args(self, port: int) -> list[str]:
        plan = self.plan
        args = ["--host", "127.0.0.1", "--port", str(port)]
        if plan.get("load_format"):
            args += ["--load-format", plan["load_format"]]
        if plan.get("max_model_len"):
            args += ["--max-model-len", str(plan["max_model_len"])]
        if plan.get("gpu_memory_utilization") is not None:
            args += ["--gpu-memory-utilization", str(plan["gpu_memory_utilization"])]
        for flag, key in (
            ("--tensor-parallel-size", "tp"),
            ("--pipeline-parallel-size", "pp"),
            ("--data-parallel-size", "dp"),
        ):
            if plan.get(key, 1) != 1:
                args += [flag, str(plan[key])]
        if plan.get("ep", 1) > 1:
            args.append("--enable-expert-parallel")
        if plan.get("trust_remote_code"):
            args.append("--trust-remote-code")
        if plan.get("speculative_config"):
            args += ["--speculative-config", json.dumps(plan["speculative_config"], separators=(",", ":"))]
        if plan.get("ray_address"):
            args += ["--distributed-executor-backend", "ray"]
        return args + list(plan.get("extra_args") or [])

    # phases -----------------------------------------------------------------------------

    def occupancy(self) -> tuple[list[int], str] | None:
        plan = self.plan
        self.report(0, "checking accelerator occupancy")
        occupancy = devices_module.detect()
        needed = plan.get("tp", 1) * plan.get("pp", 1) * plan.get("dp", 1)
        self.evidence["devices"] = {
            **occupancy.as_dict(),
            "needed": needed,
            "requested": plan.get("devices"),
            "selected": [],
        }
        if plan.get("ray_address"):
            self.notes.append("Ray places the workers: the occupancy of other nodes is not checked here.")
            return [], occupancy.kind
        selected, blocked = devices_module.choose(
            occupancy, needed, plan.get("devices"), plan.get("gpu_memory_utilization")
        )
        if blocked:
            self.reasons += blocked
            return None
        if occupancy.kind == "cpu":
            self.notes.append("no accelerator management tool found: the server runs on the CPU")
        self.evidence["devices"]["selected"] = selected
        return selected, occupancy.kind

    def wait_healthy(self, proc: subprocess.Popen[bytes], base: str, started: float) -> bool:
        deadline = started + float(self.plan["timeout_s"])
        last_report = 0.0
        while True:
            status = exit_status(proc.pid)
            elapsed = time.monotonic() - started
            if status is not None:
                self.reasons.append(
                    f"the server ended ({describe_exit(status)}) after {elapsed:.0f} s, before /health answered; "
                    "see log_tail and errors"
                )
                return False
            try:
                code, _ = _get(base + "/health", timeout=5)
                if code == 200:
                    return True
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                self.reasons.append(
                    f"the server did not answer /health within {self.plan['timeout_s']} s; see log_tail"
                )
                return False
            if elapsed - last_report >= 5:
                last_report = elapsed
                self.report(2, f"waiting for /health ({elapsed:.0f} s)")
            time.sleep(HEALTH_POLL_S)

    def requests(self, proc: subprocess.Popen[bytes], base: str) -> list[dict[str, Any]]:
        code, models = _get(base + "/v1/models", timeout=30)
        served_ids = (
            [m.get("id") for m in (models.get("data") or [])] if code == 200 and isinstance(models, dict) else []
        )
        entries: list[dict[str, Any]] = [
            {
                "case": "(models)",
                "kind": "models",
                "mode": "first",
                "endpoint": "/v1/models",
                "status": code,
                "served_models": served_ids,
                "ok": bool(served_ids),
                "checks": {"lists_a_model": bool(served_ids)},
            }
        ]
        if not served_ids:
            self.reasons.append("/v1/models listed no model")
            return entries
        dummy = self.plan.get("load_format") == "dummy"
        cases = self.plan["cases"]
        for index, case in enumerate(cases):
            self.report(3, f"case {index + 1}/{len(cases)}: {case['name']}")
            if exit_status(proc.pid) is not None:
                self.reasons.append(
                    f"the server exited during the requests (before case {case['name']!r}); see log_tail"
                )
                break
            try:
                entries += run_case(base, case, served_ids[0], dummy, REQUEST_TIMEOUT_S)
            except (OSError, ValueError) as exc:
                entries.append(
                    {
                        "case": case["name"],
                        "kind": case["kind"],
                        "mode": "first",
                        "ok": False,
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                        "checks": {},
                    }
                )
        for entry in entries:
            if not entry.get("ok"):
                failed = [k for k, v in (entry.get("checks") or {}).items() if not v]
                detail = (
                    f"failed checks {failed}" if failed else (entry.get("error") or f"status {entry.get('status')}")
                )
                self.reasons.append(f"case {entry['case']} ({entry['mode']}): {detail}")
        return entries

    def origins(self) -> None:
        report = self.store.read(f"smoke/{self.plan['run_id']}/server-report.json") or {}
        modules = report.get("modules") or {}
        self.evidence["entry"] = report.get("entry")
        self.evidence["equivalent_command"] = report.get("equivalent_command")
        self.evidence["python_version"] = (report.get("python") or {}).get("version")
        self.evidence["versions"] = {"python": self.evidence["python_version"]} | {
            name: info.get("version") for name, info in modules.items()
        }
        self.evidence["import_origins"] = {
            name: {k: info.get(k) for k in ("loaded", "origin", "error") if info.get(k) is not None}
            for name, info in modules.items()
        }
        subject = self.plan.get("subject")
        if subject:
            plugin = modules.get("vllm_metax") or {}
            origin = plugin.get("origin") or ""
            export = os.path.realpath(subject["export_dir"])
            used = bool(plugin.get("loaded")) and os.path.realpath(origin).startswith(export + os.sep)
            self.evidence["subject"] = {**subject, "used": used, "plugin_origin": origin or None}
            if not used:
                self.reasons.append(
                    f"the server did not import vllm_metax from the exported {subject['kind']} snapshot "
                    f"(origin: {origin or plugin.get('error') or 'not loaded'})"
                )

    def execute(self) -> dict[str, Any]:
        plan = self.plan
        self.evidence.update(
            run_id=plan["run_id"],
            model=plan["model_label"],
            load_format=plan.get("load_format"),
            cases_source=plan.get("cases_source"),
            manifest_sha256=plan.get("manifest_sha256"),
            model_fingerprint=plan.get("model_fingerprint"),
            python=plan["python"],
            started_at=time.time(),
            job_id=os.environ.get("VLLM_METAX_MCP_JOB"),
        )
        self.notes += plan.get("notes") or []
        chosen = self.occupancy()
        if chosen is None:
            return self.finish("blocked")
        selected, kind = chosen
        env, delta = self.environment(selected, kind)
        port = free_port()
        argv = [
            plan["python"],
            str(WRAPPER),
            str(self.directory / "server-report.json"),
            "1" if plan.get("subject") else "0",
            plan["model"],
            "--",
            *self.serve_args(port),
        ]
        self.evidence.update(command=argv, env_delta=delta, port=port)
        self.report(1, "launching the server")
        log_path = self.directory / "server.log"
        previous = signal.signal(signal.SIGTERM, stop_requested)
        stopped = False
        started = time.monotonic()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        try:
            self.store.write(
                f"smoke/{plan['run_id']}/server.json",
                {
                    "pid": proc.pid,
                    "pgid": proc.pid,
                    "marker": delta["marker"],
                    "job_id": self.evidence["job_id"],
                    "port": port,
                    "started_at": time.time(),
                },
            )
            base = f"http://127.0.0.1:{port}"
            if self.wait_healthy(proc, base, started):
                self.evidence["startup_s"] = round(time.monotonic() - started, 2)
                self.evidence["requests"] = self.requests(proc, base)
        except Stopped:
            stopped = True
            self.reasons.append("cancelled on request; the server was stopped")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.report(4, "stopping the server")
            self.evidence["teardown"] = stop_server(proc, plan["run_id"])
        if self.evidence["teardown"]["leftover_pids"]:
            self.reasons.append(f"processes left after teardown: {self.evidence['teardown']['leftover_pids']}")
        self.origins()
        self.evidence["log_tail"], self.evidence["errors"] = read_log(log_path)
        if proc.returncode == NO_ENGINE_EXIT:
            self.reasons[:] = [
                "the interpreter has no vLLM server to start (see log_tail): nothing about the model was tested"
            ]
            return self.finish("blocked")
        output = self.finish("failed" if self.reasons else "passed")
        signal.signal(signal.SIGTERM, previous)
        if stopped:
            raise Stopped()  # the job ends as cancelled (by the canceller), not as a success
        return output

    def finish(self, verdict: str) -> dict[str, Any]:
        for sub in ("tmp", "cache", "config", "snapshot"):
            shutil.rmtree(self.directory / sub, ignore_errors=True)
        if self.evidence.get("short_tmpdir"):
            shutil.rmtree(self.evidence["short_tmpdir"], ignore_errors=True)
        self.evidence.update(verdict=verdict, reasons=self.reasons, notes=self.notes, finished_at=time.time())
        evidence_path = f"smoke/{self.plan['run_id']}/evidence.json"
        self.evidence["evidence_path"] = evidence_path
        if self.plan.get("validates_trim"):
            self.evidence["load_validated"] = verdict == "passed"
            if verdict == "passed":
                self.store.write(
                    f"validations/{self.plan['manifest_sha256']}.json",
                    {
                        "manifest_sha256": self.plan["manifest_sha256"],
                        "run_id": self.plan["run_id"],
                        "load_format": self.plan.get("load_format"),
                        "evidence_path": evidence_path,
                        "finished_at": self.evidence["finished_at"],
                    },
                )
        self.store.write(evidence_path, self.evidence)
        self.report(5, f"done: {verdict}")
        return output_of(self.evidence)


def output_of(evidence: dict[str, Any]) -> dict[str, Any]:
    """The tool's output: the evidence less what only the record needs, with requests bounded."""
    requests = evidence.get("requests") or []
    shown = requests
    if len(requests) > MAX_REQUESTS_IN_OUTPUT:
        failed = [r for r in requests if not r.get("ok")]
        shown = (failed + [r for r in requests if r.get("ok") and r.get("mode") == "first"])[:MAX_REQUESTS_IN_OUTPUT]
    keys = (
        "run_id",
        "verdict",
        "reasons",
        "notes",
        "command",
        "equivalent_command",
        "entry",
        "env_delta",
        "devices",
        "versions",
        "import_origins",
        "subject",
        "startup_s",
        "log_tail",
        "errors",
        "evidence_path",
        "teardown",
        "manifest_sha256",
        "load_validated",
        "model_fingerprint",
        "cases_source",
        "python",
    )
    output = {k: evidence.get(k) for k in keys if evidence.get(k) is not None}
    output["requests"] = shown
    output["requests_total"] = len(requests)
    return output


def run_job(plan: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Job target: the whole smoke test for one validated plan."""
    return Run(plan, progress).execute()
