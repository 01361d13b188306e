"""Issue 18, class 6: every launch value that could name a file is checked as one.

A canary file lives outside the read roots; each variant spells a way to reach it from a value
passed to the launched vLLM server (a `{` in the value, `tmp/../../`, `..` deep inside JSON, env
values, `~` and `~user`, `file:` URLs, a symlink inside the roots, `$VAR` references that expand to
a path outside or to nothing known). Each must be refused before anything is launched (no job, no
run directory), with the caller's own spelling in the message, and the canary's content nowhere: not
in the reply, not in the state directory. Legitimate text (hub ids, inline templates, numbers, dtype
names, JSON with plain strings) still passes. In review mode a value that may name where the
launched server writes (any env value, a plain option, --compilation-config) may not name a path in
a read root either, though edit mode passes it; --download-dir is refused in both (not on the
allow-list).

Exercised three ways: the rules themselves (core/smoke/launch_rules.py), `run_smoke_test` through
the CLI (`vllm-metax-mcp call`), and through a real MCP client, in edit and review mode. Refusals
happen before any launch, so no vLLM is needed; the passing calls ask for a device that does not
exist (97), so the run ends `blocked` without starting a server and its plan shows what would have
been passed.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from helpers import console_script, git
from mcp import Client

from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.smoke.launch_rules import (
    check_env,
    check_json_value,
    check_serve_args,
)
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools.spec import Runtime

CANARY = f"CANARY-launch-{uuid.uuid4().hex}"
TEMPLATE = "{{ messages[0]['content'] }}"


@dataclass
class World:
    base: Path
    root: Path
    outside: Path
    home: Path

    @property
    def state(self) -> Path:
        """The launch directory is <state>/smoke/<run_id>: four `..` from its `tmp` reach `base`."""
        return self.base / "state"


@pytest.fixture()
def world(tmp_path: Path) -> World:
    root, outside, home = tmp_path / "root", tmp_path / "outside", tmp_path / "home"
    for directory in (root / "model", root / "templates", outside, home):
        directory.mkdir(parents=True)
    (root / "model/config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (root / "templates/chat.jinja").write_text(TEMPLATE)
    for name in ("canary.jinja", "t{.jinja"):
        (outside / name).write_text(CANARY)
    (outside / "tok").mkdir()
    (outside / "tok/tokenizer_config.json").write_text(json.dumps({"chat_template": CANARY}))
    (home / "canary.jinja").write_text(CANARY)
    (root / "link").symlink_to(outside, target_is_directory=True)  # inside the roots, leading out
    (root / "Qwen").symlink_to(outside, target_is_directory=True)  # a "hub id" that exists on disk
    (outside / "Qwen3-0.6B").mkdir()
    (outside / "Qwen3-0.6B/config.json").write_text(CANARY)
    plugin = root / "plugin"
    plugin.mkdir()
    (plugin / "README.md").write_text("plugin\n")
    git(root, "init", "-q", str(plugin))
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "plugin")
    return World(tmp_path, root, outside, home)


def refusals(w: World) -> list[tuple[str, dict[str, Any], str]]:
    """(label, run_smoke_test arguments, error code): each would reach the canary if passed."""
    out = str(w.outside)
    climb = "tmp/../../../../outside/canary.jinja"  # from the launch directory to the canary
    return [
        # a `{` no longer makes a value text
        ("brace-absolute", {"extra_args": [f"--chat-template={out}/t{{.jinja"]}, "outside_roots"),
        ("brace-relative-to-root", {"extra_args": ["--chat-template=tmp/../../outside/t{.jinja"]}, "outside_roots"),
        (
            "brace-in-json",
            {"extra_args": ["--hf-overrides", json.dumps({"chat_template": f"{out}/t{{.jinja"})]},
            "outside_roots",
        ),
        # relative paths climbing out of the launch directory, without a leading ./ or ../
        ("climb-env", {"env": {"VLLM_TEMPLATE": climb}}, "outside_roots"),
        ("climb-file-option", {"extra_args": ["--tokenizer", "tok/../../outside/tok"]}, "outside_roots"),
        ("climb-plain-option", {"extra_args": ["--revision", climb]}, "outside_roots"),
        (
            "climb-json-nested",
            {"extra_args": ["--hf-overrides", json.dumps({"text_config": {"extra": [1, "fine", climb]}})]},
            "outside_roots",
        ),
        ("climb-json-key", {"extra_args": ["--mm-processor-kwargs", json.dumps({climb: 1})]}, "outside_roots"),
        (
            "climb-json-in-json",
            {"extra_args": ["--additional-config", json.dumps({"inner": json.dumps({"p": [climb]})})]},
            "outside_roots",
        ),
        (
            "climb-speculative",
            {"speculative_config": {"method": "eagle", "model": "draft/../../../../outside"}},
            "outside_roots",
        ),
        # env values: key=value, lists, JSON
        ("env-key-value", {"env": {"VLLM_X": f"path={out}/canary.jinja"}}, "outside_roots"),
        ("env-list", {"env": {"VLLM_X": f"fine:{out}/canary.jinja"}}, "outside_roots"),
        ("env-comma-climb", {"env": {"VLLM_X": f"a,{climb}"}}, "outside_roots"),
        ("env-json", {"env": {"VLLM_X": json.dumps({"paths": [f"{out}/canary.jinja"]})}}, "outside_roots"),
        ("env-explicit-relative", {"env": {"VLLM_X": "./canary.jinja"}}, "bad_input"),
        # home
        ("home-file-option", {"extra_args": ["--chat-template=~/canary.jinja"]}, "outside_roots"),
        ("home-env", {"env": {"HF_X": "~/canary.jinja"}}, "outside_roots"),
        ("home-json", {"extra_args": ["--hf-overrides", json.dumps({"a": {"b": "~/canary.jinja"}})]}, "outside_roots"),
        # file URLs
        ("file-url-option", {"extra_args": [f"--chat-template=file://{out}/canary.jinja"]}, "outside_roots"),
        (
            "file-url-localhost-json",
            {"extra_args": ["--hf-overrides", json.dumps({"a": f"file://localhost{out}/canary.jinja"})]},
            "outside_roots",
        ),
        (
            "file-url-percent-encoded",
            {"env": {"VLLM_X": f"file://{quote(str(w.root))}/%2e%2e/outside/canary.jinja"}},
            "outside_roots",
        ),
        ("file-url-no-slashes", {"env": {"VLLM_X": f"file:{out}/canary.jinja"}}, "outside_roots"),
        ("file-url-remote-host", {"env": {"VLLM_X": "file://elsewhere/etc/hostname"}}, "bad_input"),
        # a symlink inside the roots leading out
        ("symlink-relative-option", {"extra_args": ["--chat-template=link/canary.jinja"]}, "outside_roots"),
        ("symlink-absolute-option", {"extra_args": [f"--chat-template={w.root}/link/canary.jinja"]}, "outside_roots"),
        ("symlink-env", {"env": {"VLLM_X": f"{w.root}/link/canary.jinja"}}, "outside_roots"),
        (
            "symlink-json",
            {"extra_args": ["--hf-overrides", json.dumps({"a": [f"{w.root}/link/tok"]})]},
            "outside_roots",
        ),
        # a file option's hub id that exists relative to the root is a path (here leading out);
        # in an env value or JSON it stays text (the launched server would look in its run directory)
        ("hub-id-on-disk", {"extra_args": ["--tokenizer", "Qwen/Qwen3-0.6B"]}, "outside_roots"),
        # variable references, read expanded as huggingface_hub does (HOME is the test's home)
        ("var-home-climb", {"env": {"HF_HUB_CACHE": "$HOME/../outside"}}, "outside_roots"),
        ("var-braced", {"env": {"HF_HOME": "${HOME}/../outside"}}, "outside_roots"),
        ("var-token-path", {"env": {"HF_TOKEN_PATH": "$HOME/canary.jinja"}}, "outside_roots"),
        ("var-in-list", {"env": {"VLLM_X": "fine:$HOME/canary.jinja"}}, "outside_roots"),
        ("var-in-file-url", {"env": {"VLLM_X": "file:$HOME/canary.jinja"}}, "outside_roots"),
        (
            "var-in-json",
            {"extra_args": ["--hf-overrides", json.dumps({"a": ["${HOME}/canary.jinja"]})]},
            "outside_roots",
        ),
        ("var-file-option", {"extra_args": ["--chat-template=$HOME/canary.jinja"]}, "outside_roots"),
        ("var-unset", {"env": {"HF_HUB_CACHE": f"${UNSET}/x"}}, "bad_input"),
        ("var-unset-braced", {"extra_args": ["--revision", f"${{{UNSET}}}"]}, "bad_input"),
        ("var-shell-default", {"env": {"VLLM_X": f"${{{UNSET}:-{out}}}"}}, "bad_input"),
        ("var-set-per-run", {"env": {"VLLM_X": "$TMPDIR/../../../../outside/canary.jinja"}}, "bad_input"),
        (
            "var-home-expands-to-home-of-user",
            {"env": {"VLLM_X": "$VLLM_USER_HOME/canary.jinja", "VLLM_USER_HOME": f"~{USER}"}},
            "outside_roots",
        ),
        # ~user: another user's home, by the password database (not $HOME)
        ("home-user-env", {"env": {"HF_TOKEN_PATH": "~root/.ssh/id_rsa"}}, "outside_roots"),
        ("home-user-option", {"extra_args": [f"--chat-template=~{USER}/canary.jinja"]}, "outside_roots"),
    ]


def review_refusals(w: World) -> list[tuple[str, dict[str, Any], str]]:
    """Values naming a path in a read root where vLLM may write: refused in review mode, passed in edit mode."""
    root = str(w.root)
    return [
        ("review-env-write-file", {"env": {"NCCL_DEBUG_FILE": f"{root}/nccl.%h.%p"}}, "review_mode"),
        ("review-env-write-dir", {"env": {"VLLM_TORCH_PROFILER_DIR": f"{root}/profiles"}}, "review_mode"),
        ("review-env-read-file", {"env": {"VLLM_TEMPLATE": f"{root}/templates/chat.jinja"}}, "review_mode"),
        ("review-env-root-itself", {"env": {"HF_HOME": root}}, "review_mode"),
        ("review-env-list", {"env": {"VLLM_X": f"a,{root}/templates"}}, "review_mode"),
        ("review-env-file-url", {"env": {"VLLM_X": f"file://{root}/dump"}}, "review_mode"),
        ("review-env-json", {"env": {"VLLM_X": json.dumps({"out": f"{root}/dump"})}}, "review_mode"),
        ("review-env-variable", {"env": {"HF_HUB_CACHE": "$VLLM_ROOT_DIR/hub", "VLLM_ROOT_DIR": "hub"}}, None),
        (
            "review-compilation-dump",
            {"extra_args": ["--compilation-config", json.dumps({"debug_dump_path": f"{root}/dump"})]},
            "review_mode",
        ),
        ("review-O-cache-dir", {"extra_args": ["-O", json.dumps({"cache_dir": f"{root}/cache"})]}, "review_mode"),
        ("review-plain-option", {"extra_args": [f"--revision={root}/templates"]}, "review_mode"),
    ]


def review_only(w: World) -> list[tuple[str, dict[str, Any], str]]:
    return [(label, arguments, code) for label, arguments, code in review_refusals(w) if code]


UNSET = f"VMM_UNSET_{uuid.uuid4().hex.upper()}"
USER = pwd.getpwuid(os.getuid()).pw_name  # a ~user form naming the running user's home by the password database


# A subset for the (slower) CLI: one per kind of variant.
CLI_LABELS = (
    "brace-absolute",
    "climb-env",
    "climb-json-nested",
    "env-key-value",
    "home-env",
    "file-url-option",
    "symlink-relative-option",
    "hub-id-on-disk",
    "var-home-climb",
    "var-braced",
    "var-unset",
    "home-user-env",
)
REVIEW_CLI_LABELS = ("review-env-write-file", "review-env-read-file", "review-compilation-dump")


def legitimate(w: World, mode: str = "edit") -> dict[str, Any]:
    """Values every mode passes; in edit mode also the ones review mode refuses (a path in a read root
    where vLLM may write)."""
    args: dict[str, Any] = {
        "extra_args": [
            "--tokenizer",
            "meta-llama/Llama-3.2-1B",  # a hub id that is not on disk under the root: text
            "--chat-template",
            "templates/chat.jinja",  # relative to the root: passed resolved
            "--dtype",
            "float16",
            "--max-num-seqs",
            "4",
            "--generation-config",
            "auto",
            "-O3",
            "--hf-overrides",
            json.dumps(
                {
                    "num_hidden_layers": 2,
                    "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
                    "tie_word_embeddings": True,
                    "sliding_window": None,
                    "architectures": ["LlamaForCausalLM"],
                }
            ),
        ],
        "env": {
            "VLLM_LOGGING_LEVEL": "DEBUG",
            "TORCH_CUDA_ARCH_LIST": "8.0 9.0+PTX",
            "VLLM_X_WIN": "%USERPROFILE%\\x",  # Windows syntax: nothing on Linux expands it
            "VLLM_X_TEXT": "tmp",
            "VLLM_X_REF": "$VLLM_X_TEXT/x",  # expands to text in the run directory
            "VLLM_X_HOME_TEXT": "~no-such-user-vmm/x",
        },  # names no home: text
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
    }
    if mode == "edit":
        args["env"].update(
            {"VLLM_TEMPLATE": f"{w.root}/templates/chat.jinja", "NCCL_DEBUG_FILE": f"{w.root}/nccl.%h.%p"}
        )
        args["extra_args"] += ["--compilation-config", json.dumps({"debug_dump_path": f"{w.root}/dump"})]
    return args


def expect_legitimate_plan(w: World, plan: dict[str, Any]) -> None:
    assert plan["extra_args"][:2] == [
        "--tokenizer=meta-llama/Llama-3.2-1B",
        f"--chat-template={w.root / 'templates/chat.jinja'}",
    ]
    assert (
        "--dtype=float16" in plan["extra_args"]
        and "--generation-config=auto" in plan["extra_args"]
        and "-O=3" in plan["extra_args"]
    )
    assert plan["env"]["TORCH_CUDA_ARCH_LIST"] == "8.0 9.0+PTX" and plan["env"]["VLLM_X_REF"] == "$VLLM_X_TEXT/x"
    assert plan["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}


def assert_clean_refusal(
    w: World, label: str, arguments: dict[str, Any], error: dict[str, Any], code: str, *texts: str
) -> None:
    assert error["code"] == code, (label, error)
    given = json.dumps(arguments)
    message = error["message"]
    # refused by the launch rules (not by something earlier), naming where the value was
    where = "serve argument" if "extra_args" in arguments else "env " if "env" in arguments else "speculative_config"
    assert message.startswith(where) and " names " in message, (label, message)
    for text in texts:
        assert CANARY not in text and "Traceback" not in text, (label, text)
    # the caller's spelling, never a resolved path the caller did not give
    for private in (str(w.outside), str(w.home), str(w.state)):
        if private not in given:
            assert private not in message, (label, message)
    assert_nothing_launched(w, label)


def assert_nothing_launched(w: World, label: str = "") -> None:
    for sub in ("jobs", "smoke"):
        entries = list((w.state / sub).iterdir()) if (w.state / sub).is_dir() else []
        assert entries == [], (label, sub, entries)
    assert_canary_nowhere(w.state)


def assert_canary_nowhere(directory: Path) -> None:
    if not directory.exists():
        return
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert CANARY.encode() not in path.read_bytes(), path


# -- the rules themselves ----------------------------------------------------------------------


def checked(w: World, arguments: dict[str, Any], mode: str = "edit") -> None:
    readable = Policy.create([str(w.root)], mode=mode).readable
    check_serve_args(arguments.get("extra_args", []), readable)
    check_env(arguments.get("env", {}), readable)
    if "speculative_config" in arguments:
        check_json_value(json.dumps(arguments["speculative_config"]), "speculative_config", readable)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_every_variant_is_refused_by_the_rules(world: World, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(world.home))
    monkeypatch.delenv(UNSET, raising=False)
    for label, arguments, code in refusals(world):
        with pytest.raises(ToolFailure) as info:
            checked(world, arguments, mode)
        assert_clean_refusal(world, label, arguments, info.value.to_dict(), code, info.value.message)


@pytest.mark.timeout(60)
def test_review_mode_refuses_values_naming_a_read_root_that_edit_mode_passes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(world.home))
    monkeypatch.setenv("VMM_TEST_MODELS", str(world.root / "models"))  # the server's own environment
    variants = [
        *review_refusals(world),
        ("review-env-variable-from-server", {"env": {"HF_HUB_CACHE": "$VMM_TEST_MODELS/hub"}}, "review_mode"),
        # expanded with the call's own values: a file URL on another host, in every mode
        (
            "review-env-variable-from-call",
            {"env": {"VLLM_X": "${VLLM_Y}//elsewhere/etc", "VLLM_Y": "file:"}},
            "bad_input",
        ),
    ]
    for label, arguments, code in variants:
        if code == "bad_input":
            for mode in ("edit", "review"):
                with pytest.raises(ToolFailure) as info:
                    checked(world, arguments, mode)
                assert info.value.code.value == code, (label, mode, info.value.message)
            continue
        checked(world, arguments, "edit")
        if code is None:
            checked(world, arguments, "review")
            continue
        with pytest.raises(ToolFailure) as info:
            checked(world, arguments, "review")
        assert_clean_refusal(world, label, arguments, info.value.to_dict(), code, info.value.message)
        assert "review mode" in info.value.message and "file option" in info.value.message, info.value.message
    # a file option is only read: the same path passes in review mode, resolved
    template = world.root / "templates/chat.jinja"
    review = Policy.create([str(world.root)], mode="review").readable
    assert (
        check_serve_args(
            [f"--chat-template={template}", "--hf-overrides", json.dumps({"chat_template": str(template)})], review
        )[0]
        == f"--chat-template={template}"
    )
    check_json_value(json.dumps({"method": "eagle", "model": str(world.root / "model")}), "speculative_config", review)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_download_dir_is_refused_in_every_mode(world: World, mode: str) -> None:
    """vLLM downloads weights into --download-dir: a write destination, and not on the allow-list."""
    readable = Policy.create([str(world.root)], mode=mode).readable
    for args in ([f"--download-dir={world.root}/weights"], ["--download-dir", f"{world.root}/weights"]):
        with pytest.raises(ToolFailure) as info:
            check_serve_args(args, readable)
        assert info.value.code.value == "bad_input", info.value.message
    assert "--download-dir is not on the allow-list" in info.value.message or "is not an option" in info.value.message


@pytest.mark.timeout(60)
def test_the_rules_need_the_policy_itself() -> None:
    """They read its roots and mode: a bare callable cannot say whether review mode applies."""
    with pytest.raises(TypeError):
        check_env({"VLLM_X": "1"}, lambda path: Path(path))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_legitimate_values_pass_the_rules(world: World, mode: str) -> None:
    readable = Policy.create([str(world.root)], mode=mode).readable
    args = legitimate(world, mode)
    expect_legitimate_plan(
        world,
        {
            "extra_args": check_serve_args(args["extra_args"], readable),
            "env": check_env(args["env"], readable),
            "speculative_config": args["speculative_config"],
        },
    )
    check_json_value(json.dumps(args["speculative_config"]), "speculative_config", readable)
    for text in (TEMPLATE, "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}", "auto", "vllm"):
        assert check_serve_args([f"--chat-template={text}"], readable) == [f"--chat-template={text}"]
    for value in ("float16", "bfloat16", "auto", "3", "0.5", "FLASH_ATTN", "deepseek_r1", "main", "Qwen/Qwen3-0.6B"):
        assert check_serve_args(["--dtype", value], readable) == [f"--dtype={value}"]
        assert check_env({"VLLM_X": value}, readable) == {"VLLM_X": value}
    assert check_json_value('{"a": [1, 2.5, true, null, "text", {"b": "Qwen/Qwen3-0.6B"}]}', "x", readable)["a"][0] == 1
    assert check_json_value("3", "-O", readable) == 3


# -- run_smoke_test through the CLI ------------------------------------------------------------


def cli(w: World, mode: str, tool: str, arguments: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(w.home)}
    env.pop(UNSET, None)
    command = [
        str(console_script()),
        "call",
        tool,
        "--mode",
        mode,
        "--root",
        str(w.root),
        "--state-dir",
        str(w.state),
        "--args",
        json.dumps(arguments),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=w.base, check=False)


def smoke_call(w: World, mode: str, extra: dict[str, Any]) -> dict[str, Any]:
    """run_smoke_test arguments; the interpreter comes from the environment record in both modes."""
    return {"model": "model", "plugin_repo": "plugin", **extra}


def establish_args() -> dict[str, Any]:
    """The server's default interpreter (no --python: its own, or python3 on PATH), allowed in both modes."""
    return {"action": "establish", "plugin_repo": "plugin"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_cli_refuses_every_kind_before_any_launch(world: World, mode: str) -> None:
    proc = cli(world, mode, "environment", establish_args())
    assert proc.returncode == 0, proc.stderr
    variants = {label: (arguments, code) for label, arguments, code in [*refusals(world), *review_only(world)]}
    for label in CLI_LABELS + (REVIEW_CLI_LABELS if mode == "review" else ()):
        arguments, code = variants[label]
        call = smoke_call(world, mode, arguments)
        proc = cli(world, mode, "run_smoke_test", call)
        assert proc.returncode == 1, (label, proc.returncode, proc.stdout, proc.stderr)
        error = json.loads(proc.stderr)["error"]
        assert_clean_refusal(world, label, call, error, code, proc.stdout, proc.stderr)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_cli_passes_legitimate_values(world: World, mode: str) -> None:
    established = cli(world, mode, "environment", establish_args())
    assert established.returncode == 0, established.stderr
    proc = cli(world, mode, "run_smoke_test", smoke_call(world, mode, {**legitimate(world, mode), "devices": [97]}))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)  # blocked: device 97 does not exist, nothing started
    assert json.loads(proc.stdout)["verdict"] == "blocked"
    (job,) = list((world.state / "jobs").iterdir())
    plan = json.loads((job / "spec.json").read_text())["args"]
    expect_legitimate_plan(world, plan)
    if mode == "edit":
        assert plan["env"]["NCCL_DEBUG_FILE"] == f"{world.root}/nccl.%h.%p", plan["env"]


# -- run_smoke_test through a real MCP client ---------------------------------------------------


def mcp_calls(w: World, mode: str, calls: list[dict[str, Any]]) -> list[Any]:
    runtime = Runtime.create([str(w.root)], mode=mode, state_dir=str(w.state))
    server = build_server(runtime)

    async def main() -> list[Any]:
        async with Client(server) as client:
            established = await client.call_tool("environment", establish_args())
            assert not established.is_error, established.content
            return [await client.call_tool("run_smoke_test", call) for call in calls]

    return anyio.run(main)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_mcp_client_refuses_every_variant_before_any_launch(
    world: World, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(world.home))
    monkeypatch.delenv(UNSET, raising=False)
    variants = refusals(world) + (review_only(world) if mode == "review" else [])
    calls = [smoke_call(world, mode, arguments) for _, arguments, _ in variants]
    for (label, _, code), call, result in zip(variants, calls, mcp_calls(world, mode, calls), strict=True):
        assert result.is_error, (label, result.content)
        (content,) = result.content
        error = json.loads(content.text)["error"]
        assert_clean_refusal(world, label, call, error, code, content.text)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["edit", "review"])
def test_mcp_client_passes_legitimate_values(world: World, mode: str) -> None:
    (result,) = mcp_calls(world, mode, [smoke_call(world, mode, {**legitimate(world, mode), "devices": [97]})])
    assert not result.is_error, result.content
    assert result.structured_content["verdict"] == "blocked"
    (job,) = list((world.state / "jobs").iterdir())
    expect_legitimate_plan(world, json.loads((job / "spec.json").read_text())["args"])


@pytest.mark.timeout(60)
def test_unreadable_json_and_nul_are_precise_refusals(world: World) -> None:
    readable = Policy.create([str(world.root)]).readable
    for args, words in (
        (["--hf-overrides", "[" * 100_000 + "]" * 100_000], "nested too deeply"),
        (["--hf-overrides", json.dumps({"a": "x\u0000y"})], "NUL"),
        (["--hf-overrides", json.dumps({"a": json.dumps({"b": "\u0000"})})], "NUL"),
    ):
        with pytest.raises(ToolFailure) as info:
            check_serve_args(args, readable)
        assert info.value.code.value == "bad_input" and words in info.value.message, info.value.message
    long_template = "{{ x }}/../../" + "y" * 10_000  # climbs: refused, and quoted short
    with pytest.raises(ToolFailure) as info:
        check_env({"VLLM_T": long_template}, readable)
    assert info.value.code.value == "outside_roots" and len(info.value.message) < 800
