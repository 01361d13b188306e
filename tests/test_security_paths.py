"""Issue 18, classes 3, 5 and 10, closed at the path chokepoint (core/foundation/policy.py, core/foundation/atomic.py):

- overwrite replaces only an earlier output of this server, as its state directory recorded writing
  it (a marker alone, forged, copied or moved, is not enough) — never a git repository (dir, `.git`
  file, bare), a read root, an output root, a protected path, the state directory, a tree holding or
  above one, nor one holding files a repository tracks;
- every file the server reads passes the root check after resolution — a symlink at the file, at a
  parent directory, or in a hub-cache snapshot never leads a read outside the roots;
- paths in messages are the caller's spelling or root-relative, never resolved absolute paths.

Each class has a canary: file hashes of every tree before and after (nothing deleted or changed),
canary bytes that must appear in no result, output or state file (nothing leaked), and an audit
hook that records every `open` of the process (no read reached the canary, even one whose bytes
would not show). Variants run in-process, through the CLI and through a real MCP client, in edit and
review mode.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import REPO_ROOT, console_script, git, make_repo
from mcp import Client, MCPError, StdioServerParameters
from test_inspect_config import fixture, write_safetensors

from vllm_metax_mcp.core.checkpoint.safetensors_headers import PREFERRED_INDEX
from vllm_metax_mcp.core.foundation import atomic
from vllm_metax_mcp.core.foundation.atomic import (
    EXPORT_MARKER,
    check_replaceable,
    repository_within,
    staged_directory,
)
from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.sources.git import tracked_below
from vllm_metax_mcp.core.trim.assets import (
    ASSETS,
    FAST_TOKENIZER,
    OTHER_TOKENIZER_FORMATS,
)
from vllm_metax_mcp.core.trim.cases import FILE_NAME, read_case_file
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import ALL_TOOLS
from vllm_metax_mcp.tools import export_snapshot as export_tool
from vllm_metax_mcp.tools import inspect_config as inspect_tool
from vllm_metax_mcp.tools import plan_trim as plan_tool
from vllm_metax_mcp.tools import run_smoke_test as smoke_tool
from vllm_metax_mcp.tools import trim_model as trim_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.timeout(120)

CANARY = "CANARY-5e1f0a9c-do-not-leak"
LAYERS = 4
REMOTE_CODE = "configuration_canary.py"
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ messages[0]['content'] }}"}


# -- the canary: every open of this process, hashes of whole trees ---------------------------------

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextmanager
def no_open_reaches(outside: Path) -> Iterator[None]:
    """Fail when anything in this process opened a path that resolves into `outside`."""
    global _OPENED
    _OPENED = []
    try:
        yield
    finally:
        opened, _OPENED = _OPENED, None
    leaked = sorted({p for p in opened if _inside(Path(os.path.realpath(p)), outside.resolve())})
    assert leaked == [], f"opened outside the roots: {leaked}"


def _inside(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def tree_hashes(top: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every entry under `top` (git dirs included): file sha256, link target, or a directory mark."""
    found: dict[str, str] = {}
    for directory, dirs, files in os.walk(top):
        rel_dir = os.path.relpath(directory, top)
        if rel_dir.split(os.sep)[0] in skip:
            dirs[:] = []
            continue
        for name in dirs + files:
            path = os.path.join(directory, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel.split(os.sep)[0] in skip:
                continue
            if os.path.islink(path):
                found[rel] = "-> " + os.readlink(path)
            elif os.path.isdir(path):
                found[rel + "/"] = ""
            else:
                with open(path, "rb") as handle:
                    found[rel] = hashlib.sha256(handle.read()).hexdigest()
    return found


def assert_no_canary(*tops: Path) -> None:
    """No regular file under these trees (links not followed) holds the canary bytes."""
    for top in tops:
        for directory, _, files in os.walk(top):
            for name in files:
                path = os.path.join(directory, name)
                if not os.path.islink(path):
                    with open(path, "rb") as handle:
                        assert CANARY.encode() not in handle.read(), f"canary in {path}"


def assert_clean_message(message: str, tmp_path: Path) -> None:
    assert "Traceback" not in message
    assert str(tmp_path) not in message and str(tmp_path.resolve()) not in message, message
    assert CANARY not in message


# -- the workspace -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


def llama_tensors() -> dict[str, tuple[str, list[int]]]:
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [8, 4])}
    for i in range(LAYERS):
        for module in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ):
            tensors[f"model.layers.{i}.{module}.weight"] = ("BF16", [4, 4])
        tensors[f"model.layers.{i}.input_layernorm.weight"] = ("BF16", [4])
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = ("BF16", [4])
    tensors["model.norm.weight"] = ("BF16", [4])
    tensors["lm_head.weight"] = ("BF16", [8, 4])
    return tensors


def model_config() -> dict[str, Any]:
    return fixture("llama") | {
        "num_hidden_layers": LAYERS,
        "auto_map": {"AutoConfig": "configuration_canary.CanaryConfig"},
    }


def checkpoint(directory: Path) -> Path:
    """Every kind of file a checkpoint directory holds, each a regular file: config, index, shards,
    every asset the trim assets module knows, both tokenizer formats, remote code, smoke cases, a model card."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(model_config(), indent=2))
    tensors = llama_tensors()
    names = list(tensors)
    half = len(names) // 2
    weight_map = {n: SHARDS[0] if i < half else SHARDS[1] for i, n in enumerate(names)}
    (directory / PREFERRED_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for shard in SHARDS:
        write_safetensors(directory / shard, {n: tensors[n] for n in names if weight_map[n] == shard})
    for name in ASSETS:
        (directory / name).write_text(json.dumps(TOKENIZER_CONFIG) if name.endswith(".json") else "{{ 'hi' }}")
    (directory / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    (directory / FAST_TOKENIZER).write_text('{"version": "1.0"}')
    for name in OTHER_TOKENIZER_FORMATS:
        (directory / name).write_text("slow tokenizer\n")
    (directory / REMOTE_CODE).write_text("# remote config code named by auto_map\n")
    (directory / FILE_NAME).write_text("cases:\n  - {name: t, kind: completion, prompt: hi}\n")
    (directory / "README.md").write_text("# model card\n")
    return directory


@pytest.fixture
def space(tmp_path: Path) -> dict[str, Path]:
    """root/ (plugin repo, a model, an earlier export), outside/ (the canary), state/ beside them."""
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.json"
    secret.write_text(json.dumps({**model_config(), "model_type": CANARY, "architectures": [CANARY], "canary": CANARY}))
    make_repo(root / "plugin")
    checkpoint(root / "m")
    return {"root": root, "outside": outside, "secret": secret, "state": tmp_path / "state", "tmp": tmp_path}


def runtime(space: dict[str, Path], mode: str = "edit", outputs: list[str] | None = None) -> Runtime:
    return Runtime.create([str(space["root"])], output_roots=outputs, mode=mode, state_dir=str(space["state"]))


def call(spec: Any, arguments: dict[str, Any], rt: Runtime) -> Any:
    return anyio.run(lambda: invoke(spec, arguments, ToolEnv(runtime=rt, tool=spec.name)))


def refused(spec: Any, arguments: dict[str, Any], rt: Runtime, code: ErrorCode) -> ToolFailure:
    with pytest.raises(ToolFailure) as info:
        call(spec, arguments, rt)
    assert info.value.code is code, info.value.to_dict()
    return info.value


def cli(space: dict[str, Path], tool: str, arguments: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        str(console_script()),
        "call",
        tool,
        "--args",
        json.dumps(arguments),
        "--root",
        str(space["root"]),
        "--state-dir",
        str(space["state"]),
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=space["tmp"])


def cli_error(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 1 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stderr)["error"]


def link(at: Path, to: Path) -> None:
    if at.exists() or at.is_symlink():
        at.unlink()
    at.symlink_to(to)


# == class 3: overwrite deletes repositories ===========================================================

EXPORT = {"subject": "worktree", "plugin_repo": "plugin", "overwrite": True}
TRIM = {"model": "m", "overwrite": True}


def _worktree(space: dict[str, Path]) -> str:
    git(space["root"] / "plugin", "worktree", "add", "-q", str(space["root"] / "wt"), "feature")
    assert (space["root"] / "wt" / ".git").is_file()
    return "wt"


def _genuine_export(space: dict[str, Path], output: str) -> Path:
    """An earlier export of this server at `output`: written by the tool, recorded in the state directory."""
    call(export_tool.SPEC, {**EXPORT, "output": output, "overwrite": False}, runtime(space))
    return space["root"] / output


def _repo_below(space: dict[str, Path]) -> str:
    out = _genuine_export(space, "outs/old")  # even a genuine earlier output does not help
    make_repo(out / "vendor" / "lib")
    return "outs/old"


def _above_repo(space: dict[str, Path]) -> str:
    make_repo(space["root"] / "outs" / "lib")
    return "outs"


def _marker_in_repo(space: dict[str, Path]) -> str:
    (space["root"] / "plugin" / "trim_manifest.json").write_text('{\n  "format": "vllm-metax-mcp/trim-manifest/1"\n}\n')
    return "plugin"


def _bare_repo(space: dict[str, Path]) -> str:
    out = _genuine_export(space, "bare-holder")
    git(space["root"], "init", "-q", "--bare", str(out / "mirror.git"))
    return "bare-holder"


def _forged_in_tracked_dir(space: dict[str, Path]) -> str:
    """The review's reproduction: a repository commits a marker in a subdirectory; the user's edits and
    notes there are uncommitted."""
    repo = space["root"] / "plugin"
    (repo / "docs").mkdir()
    (repo / "docs" / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}\n')
    (repo / "docs" / "guide.md").write_text("important\n")
    git(repo, "add", "docs")
    git(repo, "commit", "-q", "-m", "docs")
    (repo / "docs" / "guide.md").write_text("important\nuncommitted edit\n")
    (repo / "docs" / "notes.txt").write_text("untracked notes\n")
    return "plugin/docs"


def _forged_trim_manifest(space: dict[str, Path]) -> str:
    out = space["root"] / "shared-models" / "tiny"
    out.mkdir(parents=True)
    (out / "trim_manifest.json").write_text('{\n  "format": "vllm-metax-mcp/trim-manifest/1"\n}\n')
    (out / "weights.safetensors").write_text("someone's work\n")
    return "shared-models/tiny"


def _copied_genuine_marker(space: dict[str, Path]) -> str:
    """A byte-identical copy of a genuine marker, timestamps kept (cp -p), in another directory."""
    snap = _genuine_export(space, "snap")
    other = space["root"] / "other"
    other.mkdir()
    shutil.copy2(snap / EXPORT_MARKER, other / EXPORT_MARKER)
    (other / "mine.txt").write_text("not an output\n")
    return "other"


def _marker_replaced_by_a_copy(space: dict[str, Path]) -> str:
    snap = _genuine_export(space, "snap")
    shutil.copy2(snap / EXPORT_MARKER, space["tmp"] / "marker")
    os.replace(space["tmp"] / "marker", snap / EXPORT_MARKER)  # same bytes and mtime, another file
    return "snap"


def _directory_replaced_around_the_marker(space: dict[str, Path]) -> str:
    snap = _genuine_export(space, "snap")
    (space["root"] / "fresh").mkdir()
    os.replace(snap / EXPORT_MARKER, space["root"] / "fresh" / EXPORT_MARKER)  # the very marker file, moved
    (space["root"] / "fresh" / "mine.txt").write_text("not an output\n")
    os.replace(snap, space["root"] / "snap-was")
    os.replace(space["root"] / "fresh", snap)
    return "snap"


def _link_to_repo(space: dict[str, Path]) -> str:
    (space["root"] / "plain").symlink_to(space["root"] / "plugin", target_is_directory=True)
    return "plain"


def _absolute_repo(space: dict[str, Path]) -> str:
    return str(space["root"] / "plugin")


OVERWRITE_CASES = {
    "the repository top": (lambda s: "plugin", ["git repository"]),
    "a subdirectory of a repository (no marker)": (lambda s: "plugin/pkg", ["not an earlier output"]),
    "a .git-file worktree": (_worktree, ["git repository"]),
    "an earlier output with a repository below": (_repo_below, ["contains a git repository", "vendor/lib"]),
    "a forged export marker in a tracked subdirectory": (
        _forged_in_tracked_dir,
        ["no record of writing it", "delete plugin/docs yourself"],
    ),
    "a forged trim manifest": (_forged_trim_manifest, ["no record of writing it", "a marker alone is not enough"]),
    "a copy of a genuine marker elsewhere": (_copied_genuine_marker, ["no record of writing it"]),
    "a genuine output whose marker was replaced by a copy": (
        _marker_replaced_by_a_copy,
        ["its marker is not the one", "ino"],
    ),
    "a genuine output whose directory was replaced": (
        _directory_replaced_around_the_marker,
        ["directory is not the one"],
    ),
    "a directory above a repository": (_above_repo, ["not an earlier output"]),
    "a repository carrying a planted manifest": (_marker_in_repo, ["git repository"]),
    "a directory holding a bare repository": (_bare_repo, ["contains a git repository", "mirror.git"]),
    "a symlink to a repository": (_link_to_repo, ["git repository"]),
    "the repository by absolute path": (_absolute_repo, ["git repository"]),
    "the read root": (lambda s: ".", ["read root"]),
    "a plain file": (lambda s: "plugin/README.md", ["not an output directory"]),
}


@pytest.mark.parametrize("tool", ["export_snapshot", "trim_model"])
@pytest.mark.parametrize("case", sorted(OVERWRITE_CASES))
def test_overwrite_never_replaces_a_repository_or_a_read_root(space: dict[str, Path], tool: str, case: str) -> None:
    make, words = OVERWRITE_CASES[case]
    output = make(space)
    before = tree_hashes(space["tmp"], skip=("state",))
    spec, arguments = (export_tool.SPEC, EXPORT) if tool == "export_snapshot" else (trim_tool.SPEC, TRIM)
    failure = refused(spec, {**arguments, "output": output}, runtime(space), ErrorCode.PROTECTED_PATH)
    if not (tool == "trim_model" and output == "."):  # the root holds the source checkpoint: refused as protected first
        for word in words:
            assert word in failure.message, failure.message
    assert "earlier output of this server" in failure.message or "protected path" in failure.message
    if os.path.isabs(output):
        assert failure.message.startswith("plugin "), failure.message  # root-relative even when given absolute
    else:
        assert_clean_message(failure.message, space["tmp"])
    assert tree_hashes(space["tmp"], skip=("state",)) == before


def test_real_trim_overwrite_of_a_repository_is_refused_before_the_job(space: dict[str, Path]) -> None:
    before = tree_hashes(space["tmp"], skip=("state",))
    rt = runtime(space)
    failure = refused(trim_tool.SPEC, {**TRIM, "output": "plugin", "output_mode": "real"}, rt, ErrorCode.PROTECTED_PATH)
    assert "git repository" in failure.message
    assert tree_hashes(space["tmp"], skip=("state",)) == before
    jobs = space["state"] / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == [], "no job was started"


def test_overwrite_never_replaces_the_state_directory_or_a_tree_holding_it(space: dict[str, Path]) -> None:
    rt = runtime(space, outputs=[str(space["tmp"])])  # an output root wide enough to reach the state directory
    (space["state"] / "keep.txt").write_text("state")
    before = tree_hashes(space["tmp"])
    for output in (str(space["state"]), str(space["tmp"]), str(space["state"] / "jobs")):
        for overwrite in (True, False):
            failure = refused(
                export_tool.SPEC, {**EXPORT, "output": output, "overwrite": overwrite}, rt, ErrorCode.PROTECTED_PATH
            )
            assert "state directory" in failure.message
    assert tree_hashes(space["tmp"]) == before


def test_overwrite_never_replaces_a_read_root_or_a_tree_above_one(space: dict[str, Path]) -> None:
    """The upstream tree as a second --root (a plain directory, a planted marker even), and a directory above a root."""
    upstream = space["tmp"] / "wide" / "upstream"
    (upstream / "vllm").mkdir(parents=True)
    (upstream / "vllm" / "model.py").write_text("x = 1\n")
    (upstream / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}')
    (space["tmp"] / "wide" / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}')
    rt = Runtime.create(
        [str(space["root"]), str(upstream)], output_roots=[str(space["tmp"] / "wide")], state_dir=str(space["state"])
    )
    before = tree_hashes(space["tmp"], skip=("state",))
    for output, words in (
        (str(upstream), "upstream is a read root"),
        (str(space["tmp"] / "wide"), "wide contains a read root"),
    ):
        failure = refused(export_tool.SPEC, {**EXPORT, "output": output}, rt, ErrorCode.PROTECTED_PATH)
        assert failure.message.startswith(words), failure.message
        assert_clean_message(failure.message, space["tmp"])
    assert tree_hashes(space["tmp"], skip=("state",)) == before


def test_overwrite_of_a_genuine_earlier_output_still_works(space: dict[str, Path]) -> None:
    rt = runtime(space)
    first = call(export_tool.SPEC, {**EXPORT, "output": "snap", "overwrite": False}, rt)
    snap = space["root"] / "snap"
    marker = json.loads((snap / EXPORT_MARKER).read_text())
    assert marker["format"] == "vllm-metax-mcp/export/1" and marker["tool"] == "export_snapshot"
    exported = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())
    assert len(exported) == first.files + 1 and first.marker == EXPORT_MARKER  # exactly the subject, plus the marker
    (space["root"] / "plugin" / "pkg" / "added.py").write_text("X = 1\n")
    again = call(export_tool.SPEC, {**EXPORT, "output": "snap"}, rt)
    assert again.files == first.files + 1 and (snap / "pkg" / "added.py").is_file()

    call(trim_tool.SPEC, {"model": "m", "output": "tiny"}, rt)
    redone = call(trim_tool.SPEC, {**TRIM, "output": "tiny", "layers": [0, 1]}, rt)
    assert redone.kept_layers == [0, 1]
    assert json.loads((space["root"] / "tiny" / "config.json").read_text())["num_hidden_layers"] == 2
    assert sorted(p.name for p in space["root"].iterdir()) == ["m", "plugin", "snap", "tiny"]  # no leftovers


def test_an_earlier_output_that_gained_a_repository_is_no_longer_replaced(space: dict[str, Path]) -> None:
    rt = runtime(space)
    call(export_tool.SPEC, {**EXPORT, "output": "snap", "overwrite": False}, rt)
    make_repo(space["root"] / "snap" / "pkg" / "checkout")
    before = tree_hashes(space["root"] / "snap")
    failure = refused(export_tool.SPEC, {**EXPORT, "output": "snap"}, rt, ErrorCode.PROTECTED_PATH)
    assert "contains a git repository (pkg/checkout)" in failure.message
    assert tree_hashes(space["root"] / "snap") == before


def test_an_earlier_output_is_recognised_whatever_its_key_order(tmp_path: Path) -> None:
    for name, body in (
        (
            "trim_manifest.json",
            {"files": {}, "format": "vllm-metax-mcp/trim-manifest/1"},
        ),  # keys sorted by a job's JSON
        (EXPORT_MARKER, {"format": "vllm-metax-mcp/export/1"}),
    ):
        out = tmp_path / name.strip(".")
        out.mkdir()
        (out / name).write_text(json.dumps(body))
        assert atomic.output_marker(out) == name
        check_replaceable(out)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "trim_manifest.json").write_text(json.dumps({"format": "someone-else/1"}))
    (fake / "dir-marker").mkdir()
    (fake / EXPORT_MARKER).symlink_to(tmp_path / "export_marker" / EXPORT_MARKER)  # a link is no marker
    assert atomic.output_marker(fake) is None


def test_staged_directory_checks_again_right_before_the_swap(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}')
    with pytest.raises(ToolFailure) as info, staged_directory(target, replace=True, shown="out") as staging:
        (staging / "new.txt").write_text("new")
        git(tmp_path, "init", "-q", str(target))  # became a repository while a job wrote the new content
    assert info.value.code is ErrorCode.PROTECTED_PATH and "out is a git repository" in info.value.message
    assert (target / ".git").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_walk_is_bounded_and_never_follows_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "elsewhere")
    out = tmp_path / "out"
    (out / "many").mkdir(parents=True)
    (out / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}')
    (out / "link").symlink_to(repo, target_is_directory=True)  # replacing the output removes the link, not the repo
    assert repository_within(out) is None
    check_replaceable(out, "out")
    for i in range(30):
        (out / "many" / f"f{i}").write_text("x")
    monkeypatch.setattr(atomic, "REPLACE_WALK_LIMIT", 10)
    assert repository_within(out) == ""
    with pytest.raises(ToolFailure) as info:
        check_replaceable(out, "out")
    assert info.value.code is ErrorCode.PROTECTED_PATH and "more than 10 entries" in info.value.message


def test_overwrite_refusals_through_the_cli_in_both_modes(space: dict[str, Path]) -> None:
    _worktree(space)
    before = tree_hashes(space["tmp"], skip=("state",))
    for output in ("plugin", "wt", "."):
        error = cli_error(cli(space, "export_snapshot", {**EXPORT, "output": output}))
        assert error["code"] == "protected_path" and "earlier output of this server" in error["message"]
        assert_clean_message(error["message"], space["tmp"])
    error = cli_error(cli(space, "trim_model", {**TRIM, "output": "plugin"}))
    assert error["code"] == "protected_path" and "git repository" in error["message"]
    # with no --output-root the outputs default to the read roots: the README's own set-up
    error = cli_error(cli(space, "export_snapshot", {**EXPORT, "output": str(space["root"])}))
    assert error["code"] == "protected_path" and "read root" in error["message"]
    review = cli(space, "export_snapshot", {**EXPORT, "output": "plugin"}, "--mode", "review")
    assert review.returncode == 1 and json.loads(review.stderr)["error"]["code"] == "review_mode"
    assert tree_hashes(space["tmp"], skip=("state",)) == before


def test_overwrite_refusals_through_a_real_mcp_client(space: dict[str, Path]) -> None:
    before = tree_hashes(space["tmp"], skip=("state",))

    async def edit() -> list[Any]:
        async with Client(build_server(runtime(space))) as client:
            return [
                await client.call_tool("export_snapshot", {**EXPORT, "output": "plugin"}),
                await client.call_tool("trim_model", {**TRIM, "output": "plugin/pkg"}),
            ]

    for result in anyio.run(edit):
        assert result.is_error
        error = json.loads(result.content[0].text)["error"]
        assert error["code"] == "protected_path", error
        assert_clean_message(error["message"], space["tmp"])

    async def review() -> MCPError:
        async with Client(build_server(runtime(space, mode="review"))) as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("export_snapshot", {**EXPORT, "output": "plugin"})
            return info.value

    assert anyio.run(review).error.data["code"] == "review_mode"
    assert tree_hashes(space["tmp"], skip=("state",)) == before


# -- the marker alone is not enough: the state directory's record, files tracked below, the output roots ----


def _forged_repository(top: Path) -> Path:
    """The review's reproduction, as given: a repository whose tracked docs/ carries a committed marker, with
    an uncommitted edit and an untracked file there."""
    work = top / "work"
    (work / "vllm_metax").mkdir(parents=True)
    (work / "docs").mkdir()
    git(work, "init", "-q")
    (work / "vllm_metax" / "__init__.py").write_text("x=1\n")
    (work / "docs" / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}\n')
    (work / "docs" / "guide.md").write_text("important\n")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "i")
    (work / "docs" / "guide.md").write_text("important\nedit\n")
    (work / "docs" / "notes.txt").write_text("notes\n")
    return work


FORGED_EXPORT = {
    "subject": "revision",
    "revision": "HEAD",
    "prefix": "vllm_metax/",
    "output": "docs",
    "overwrite": True,
}


def test_a_forged_marker_in_a_repository_is_refused_through_the_cli_and_a_real_mcp_client(tmp_path: Path) -> None:
    work = _forged_repository(tmp_path)
    model = checkpoint(tmp_path / "models" / "m")
    before = tree_hashes(tmp_path, skip=("state",))
    command = [str(console_script()), "call", "export_snapshot", "--root", "work", "--state-dir", "state"]
    for mode in ("edit", "review"):
        proc = subprocess.run(
            [*command, "--mode", mode, "--args", json.dumps(FORGED_EXPORT)],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=tmp_path,
            check=False,
        )
        error = cli_error(proc)
        if mode == "review":
            assert error["code"] == "review_mode", error
            continue
        assert error["code"] == "protected_path", error
        assert "no record of writing it" in error["message"] and "delete docs yourself" in error["message"]
        assert_clean_message(error["message"], tmp_path)
    assert tree_hashes(tmp_path, skip=("state",)) == before
    rt = Runtime.create([str(work), str(model.parent)], state_dir=str(tmp_path / "state"))

    async def edit() -> list[Any]:
        async with Client(build_server(rt)) as client:
            return [
                await client.call_tool("export_snapshot", FORGED_EXPORT),
                await client.call_tool("trim_model", {"model": str(model), "output": "docs", "overwrite": True}),
            ]

    for result in anyio.run(edit):
        assert result.is_error
        error = json.loads(result.content[0].text)["error"]
        assert error["code"] == "protected_path", error
        assert_clean_message(error["message"], tmp_path)
    assert tree_hashes(tmp_path, skip=("state",)) == before, "the tracked directory, its edits and notes are intact"
    assert (work / "docs" / "notes.txt").read_text() == "notes\n"


def test_overwrite_never_replaces_files_a_repository_tracks_even_in_its_own_output(space: dict[str, Path]) -> None:
    """A genuine output inside a work tree is replaced while untracked; once the repository tracks a file below
    it (committed, or checked out into it), overwrite refuses: the record proves the marker is the server's,
    not that nothing else moved in."""
    rt = runtime(space)
    repo = space["root"] / "plugin"
    call(export_tool.SPEC, {**EXPORT, "output": "plugin/snap", "overwrite": False}, rt)
    call(export_tool.SPEC, {**EXPORT, "output": "plugin/snap"}, rt)  # untracked: its own output is replaced
    call(trim_tool.SPEC, {"model": "m", "output": "plugin/tiny"}, rt)
    call(trim_tool.SPEC, {**TRIM, "output": "plugin/tiny", "layers": [0, 1]}, rt)
    git(repo, "add", "snap", "tiny/config.json")
    git(repo, "commit", "-q", "-m", "keep the snapshot")
    (repo / "snap" / "README.md").write_text("edited, not committed\n")
    (repo / "snap" / "notes.txt").write_text("untracked\n")
    before = tree_hashes(space["tmp"], skip=("state",))
    for spec, arguments, output in ((export_tool.SPEC, EXPORT, "plugin/snap"), (trim_tool.SPEC, TRIM, "plugin/tiny")):
        failure = refused(spec, {**arguments, "output": output}, rt, ErrorCode.PROTECTED_PATH)
        assert "tracked by the git repository at plugin" in failure.message, failure.message
        assert f"delete {output} yourself" in failure.message
        assert_clean_message(failure.message, space["tmp"])
    error = cli_error(cli(space, "export_snapshot", {**EXPORT, "output": "plugin/snap"}))
    assert error["code"] == "protected_path" and "tracked by the git repository" in error["message"]
    assert tree_hashes(space["tmp"], skip=("state",)) == before  # .git/index included: ls-files wrote nothing


def test_a_repository_created_inside_another_hides_nothing_the_outer_one_tracks(space: dict[str, Path]) -> None:
    """`git init` below the output makes it the nearest work tree, which tracks nothing; the outer
    repository still tracks the output's files, so every enclosing work tree is asked."""
    rt = runtime(space)
    repo = space["root"] / "plugin"
    call(export_tool.SPEC, {**EXPORT, "output": "plugin/outs/snap", "overwrite": False}, rt)
    git(repo, "add", "-f", "outs/snap")
    git(repo, "commit", "-q", "-m", "keep the snapshot")
    (repo / "outs" / "snap" / "README.md").write_text("edited, not committed\n")
    git(repo / "outs", "init", "-q", ".")
    before = tree_hashes(space["tmp"], skip=("state",))
    failure = refused(export_tool.SPEC, {**EXPORT, "output": "plugin/outs/snap"}, rt, ErrorCode.PROTECTED_PATH)
    assert "tracked by the git repository at plugin" in failure.message, failure.message
    assert tree_hashes(space["tmp"], skip=("state",)) == before


def test_overwrite_inside_a_work_tree_outside_the_read_roots_is_refused(space: dict[str, Path]) -> None:
    """Whether such a repository tracks the output cannot be checked without reading outside the roots."""
    outer = make_repo(space["tmp"] / "outer")
    rt = runtime(space, outputs=[str(outer / "outs")])
    call(export_tool.SPEC, {**EXPORT, "output": str(outer / "outs" / "snap"), "overwrite": False}, rt)
    before = tree_hashes(space["tmp"], skip=("state",))
    failure = refused(
        export_tool.SPEC, {**EXPORT, "output": str(outer / "outs" / "snap")}, rt, ErrorCode.PROTECTED_PATH
    )
    assert "git work tree outside the server's read roots" in failure.message, failure.message
    assert tree_hashes(space["tmp"], skip=("state",)) == before


def test_an_output_root_is_never_an_output_and_never_replaced(space: dict[str, Path]) -> None:
    """The review's case (--output-root o2/out, a marker in o2/out, output = the root), a root that does not
    exist yet, a directory between two nested output roots; staging never lands outside a root."""
    out = space["tmp"] / "o2" / "out"
    out.mkdir(parents=True)
    out.chmod(0o755)
    (out / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}')
    (out / "kept.txt").write_text("the root's own file\n")
    between = space["tmp"] / "o3" / "a"
    between.mkdir(parents=True)
    (between / EXPORT_MARKER).write_text('{"format": "vllm-metax-mcp/export/1"}')
    missing = space["tmp"] / "o4" / "out"
    rt = runtime(space, outputs=[str(out), str(space["tmp"] / "o3"), str(between / "b"), str(missing)])
    before = tree_hashes(space["tmp"], skip=("state",))
    cases = (
        (out, True, "is an output root"),
        (out, False, "is an output root"),
        (between, True, "contains an output root"),
        (missing, False, "is an output root"),
        (missing, True, "is an output root"),
    )
    for target, overwrite, words in cases:
        failure = refused(
            export_tool.SPEC, {**EXPORT, "output": str(target), "overwrite": overwrite}, rt, ErrorCode.PROTECTED_PATH
        )
        assert words in failure.message, failure.message
    error = cli_error(cli(space, "export_snapshot", {**EXPORT, "output": str(out)}, "--output-root", str(out)))
    assert error["code"] == "protected_path" and "is an output root" in error["message"]
    assert tree_hashes(space["tmp"], skip=("state",)) == before and not missing.exists()
    assert stat.S_IMODE(out.stat().st_mode) == 0o755

    # strictly inside: the staging siblings are inside the root, and a replaced output keeps its mode
    call(export_tool.SPEC, {**EXPORT, "output": str(out / "snap"), "overwrite": False}, rt)
    (out / "snap").chmod(0o750)
    call(export_tool.SPEC, {**EXPORT, "output": str(out / "snap")}, rt)
    assert stat.S_IMODE((out / "snap").stat().st_mode) == 0o750
    assert sorted(p.name for p in (space["tmp"] / "o2").iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == [EXPORT_MARKER, "kept.txt", "snap"]


def test_the_record_is_checked_again_right_before_the_swap(space: dict[str, Path]) -> None:
    """A job writes for hours: a genuine output whose marker is swapped for a copy meanwhile is not replaced.
    The job worker's policy (rebuilt from the call's) sees the same record."""
    from vllm_metax_mcp.core.foundation.state import OutputRegistry, StateStore

    rt = runtime(space)
    snap = _genuine_export(space, "snap")
    worker = Policy.from_spec(rt.policy.to_spec(), OutputRegistry(StateStore(space["state"])), tracked_below)
    before = tree_hashes(snap)
    with (
        pytest.raises(ToolFailure) as info,
        staged_directory(snap, replace=True, shown="snap", policy=worker) as staging,
    ):
        (staging / "new.txt").write_text("new")
        shutil.copy2(snap / EXPORT_MARKER, space["tmp"] / "copy")
        os.replace(space["tmp"] / "copy", snap / EXPORT_MARKER)
    assert info.value.code is ErrorCode.PROTECTED_PATH and "its marker is not the one" in info.value.message
    assert tree_hashes(snap) == before and sorted(p.name for p in space["root"].iterdir()) == ["m", "plugin", "snap"]


def test_real_trims_record_their_outputs_from_the_job(space: dict[str, Path]) -> None:
    rt = runtime(space)
    real = {"model": "m", "output": "real", "output_mode": "real", "layers": [0, 1]}
    first = call(trim_tool.SPEC, real, rt)
    assert first.script_reproduced is True
    records = [json.loads(p.read_text()) for p in (space["state"] / "outputs").iterdir()]
    assert [r["path"] for r in records if r["marker"] == "trim_manifest.json"] == [
        str((space["root"] / "real").resolve())
    ]
    again = call(trim_tool.SPEC, {**real, "overwrite": True, "layers": [0]}, rt)  # the worker checked the record
    assert again.kept_layers == [0]
    assert json.loads((space["root"] / "real" / "config.json").read_text())["num_hidden_layers"] == 1
    shutil.copy2(space["root"] / "real" / "trim_manifest.json", space["tmp"] / "copy")
    os.replace(space["tmp"] / "copy", space["root"] / "real" / "trim_manifest.json")
    before = tree_hashes(space["root"])
    failure = refused(trim_tool.SPEC, {**real, "overwrite": True}, rt, ErrorCode.PROTECTED_PATH)
    assert "its marker is not the one" in failure.message
    assert tree_hashes(space["root"]) == before and sorted(p.name for p in space["root"].iterdir()) == [
        "m",
        "plugin",
        "real",
    ]


def test_every_staged_output_of_the_package_passes_the_policy() -> None:
    """staged_directory checks the record and records the new output only when it gets the policy: every
    call in the package passes it (a new one without fails here)."""
    package = REPO_ROOT / "vllm_metax_mcp"
    calls = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "staged_directory"
            ):
                calls.append((path.relative_to(package).as_posix(), any(k.arg == "policy" for k in node.keywords)))
    assert [path for path, _ in calls] == [
        "core/port/report.py",
        "core/trim/output.py",
        "core/trim/real.py",
        "tools/export_snapshot.py",
    ]
    assert all(passed for _, passed in calls), calls


# == class 5: reads through a symlink outside the roots ================================================

READ_BY_EVERY_TOOL = {"config.json", PREFERRED_INDEX}
READ_BY_PLANS = READ_BY_EVERY_TOOL | set(ASSETS) | {FAST_TOKENIZER, REMOTE_CODE}
CHECKPOINT_NAMES = sorted(
    {
        "config.json",
        PREFERRED_INDEX,
        *SHARDS,
        *ASSETS,
        FAST_TOKENIZER,
        *OTHER_TOKENIZER_FORMATS,
        REMOTE_CODE,
        FILE_NAME,
        "README.md",
    }
)
"""Every file name a checkpoint directory may hold that the tools know of (new assets join by themselves)."""


def run_direct(spec: Any, input_model: Any, arguments: dict[str, Any], rt: Runtime) -> Any:
    """The tool function in this process (not a worker), so the audit hook sees every open."""
    return spec.run(input_model.model_validate(arguments), ToolEnv(runtime=rt, tool=spec.name))


TOOLS = {
    "inspect_config": (inspect_tool.SPEC, inspect_tool.InspectConfigInput, {"construct": False}, READ_BY_EVERY_TOOL),
    "plan_trim": (plan_tool.SPEC, plan_tool.PlanTrimInput, {}, READ_BY_PLANS),
    "trim_model": (trim_tool.SPEC, trim_tool.TrimModelInput, {"output": "out"}, READ_BY_PLANS),
}


@pytest.mark.parametrize("mode", ["edit", "review"])
@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_a_symlink_out_of_the_roots_at_any_checkpoint_file_is_never_read(
    space: dict[str, Path], name: str, mode: str
) -> None:
    link(space["root"] / "m" / name, space["secret"])
    before = tree_hashes(space["outside"])
    rt = runtime(space, mode=mode)
    for tool, (spec, model, extra, reads) in TOOLS.items():
        if mode == "review" and tool == "trim_model":
            continue
        with no_open_reaches(space["outside"]):
            try:
                result = run_direct(spec, model, {"model": "m", **extra}, rt)
            except ToolFailure as failure:
                assert failure.code is ErrorCode.OUTSIDE_ROOTS, (tool, failure.to_dict())
                assert name in reads, f"{tool} refused {name}, which it does not read: {failure.message}"
                assert failure.message.startswith(f"m/{name} is outside the server's roots"), failure.message
                assert_clean_message(failure.message, space["tmp"])
            else:
                assert name not in reads, f"{tool} did not refuse {name}, which it reads"
                assert CANARY not in result.model_dump_json()
    assert_no_canary(space["root"], space["state"])
    assert tree_hashes(space["outside"]) == before


def test_a_shard_index_naming_a_linked_directory_is_not_read(space: dict[str, Path]) -> None:
    model = space["root"] / "m"
    away = space["outside"] / "sub"
    away.mkdir()
    os.replace(model / SHARDS[1], away / SHARDS[1])
    (model / "sub").symlink_to(away, target_is_directory=True)
    index = json.loads((model / PREFERRED_INDEX).read_text())
    index["weight_map"] = {t: (f"sub/{s}" if s == SHARDS[1] else s) for t, s in index["weight_map"].items()}
    (model / PREFERRED_INDEX).write_text(json.dumps(index))
    with no_open_reaches(space["outside"]):
        result = run_direct(
            inspect_tool.SPEC, inspect_tool.InspectConfigInput, {"model": "m", "construct": False}, runtime(space)
        )
    assert any(f.code == "shard_unreadable" and f"sub/{SHARDS[1]}" in f.message for f in result.checkpoint.findings)
    with no_open_reaches(space["outside"]), pytest.raises(ToolFailure) as info:
        run_direct(
            trim_tool.SPEC,
            trim_tool.TrimModelInput,
            {"model": "m", "output": "out", "output_mode": "real"},
            runtime(space),
        )
    assert "cannot be read within the server's roots" in info.value.message
    assert not (space["root"] / "out").exists()


def test_a_linked_model_directory_is_refused(space: dict[str, Path]) -> None:
    away = checkpoint(space["outside"] / "model")
    (away / "config.json").write_text(space["secret"].read_text())
    (space["root"] / "mlink").symlink_to(away, target_is_directory=True)
    for tool, (spec, model, extra, _) in TOOLS.items():
        with no_open_reaches(space["outside"]), pytest.raises(ToolFailure) as info:
            run_direct(spec, model, {"model": "mlink", **extra}, runtime(space))
        assert info.value.code is ErrorCode.OUTSIDE_ROOTS, tool
        assert info.value.message.startswith("mlink is outside the server's roots"), info.value.message
    assert_no_canary(space["root"], space["state"])


def _hub_snapshot(space: dict[str, Path], repo: str, commit: str) -> Path:
    top = space["tmp"] / "hf-cache" / f"models--{repo.replace('/', '--')}"
    (top / "refs").mkdir(parents=True)
    (top / "refs" / "main").write_text(commit)
    (top / "snapshots" / commit).mkdir(parents=True)
    (top / "blobs").mkdir()
    return top


def test_hub_cache_snapshots_read_through_their_blobs_but_never_outside(space: dict[str, Path]) -> None:
    good = _hub_snapshot(space, "org/good", "a" * 40)
    (good / "blobs" / "c0ffee").write_text(json.dumps(model_config()))
    (good / "snapshots" / ("a" * 40) / "config.json").symlink_to(Path("../../blobs/c0ffee"))
    rt = runtime(space, mode="review")
    result = run_direct(
        inspect_tool.SPEC, inspect_tool.InspectConfigInput, {"model": "org/good", "construct": False}, rt
    )
    assert result.backbone_layers == LAYERS and result.model == f"org/good@{'a' * 12}"

    bad = _hub_snapshot(space, "org/bad", "b" * 40)
    (bad / "snapshots" / ("b" * 40) / "config.json").symlink_to(space["secret"])
    moved = _hub_snapshot(space, "org/moved", "d" * 40)
    os.rmdir(moved / "snapshots" / ("d" * 40))
    away = space["outside"] / "snapshot"
    away.mkdir()
    (away / "config.json").write_text(space["secret"].read_text())
    (moved / "snapshots" / ("d" * 40)).symlink_to(away, target_is_directory=True)
    for repo, shown in (
        ("org/bad", f"<hf-cache>/models--org--bad/snapshots/{'b' * 40}/config.json"),
        ("org/moved", f"<hf-cache>/models--org--moved/snapshots/{'d' * 40}"),
    ):
        for tool, (spec, model, extra, _) in TOOLS.items():
            with no_open_reaches(space["outside"]), pytest.raises(ToolFailure) as info:
                run_direct(spec, model, {"model": repo, **extra}, runtime(space))
            assert info.value.code is ErrorCode.OUTSIDE_ROOTS, (repo, tool)
            assert info.value.message.startswith(f"{shown} is outside the server's roots"), info.value.message
            assert_clean_message(info.value.message, space["tmp"])
    assert_no_canary(space["root"], space["state"])


def test_case_files_linking_out_of_the_roots_are_refused_before_they_are_read(space: dict[str, Path]) -> None:
    policy = Policy.create([str(space["root"])])
    model = space["root"] / "m"
    link(model / FILE_NAME, space["outside"] / "cases.yaml")
    (space["outside"] / "cases.yaml").write_text(f"cases:\n  - {{name: {CANARY}, kind: completion, prompt: hi}}\n")
    with no_open_reaches(space["outside"]), pytest.raises(ToolFailure) as info:
        read_case_file(model / FILE_NAME, policy.readable)
    assert info.value.code is ErrorCode.OUTSIDE_ROOTS and info.value.message.startswith(f"m/{FILE_NAME} is outside")
    # a batched_test models file whose cases file is a link leading out
    (space["root"] / "bt").mkdir()
    (space["root"] / "bt" / "models.yaml").write_text("models:\n  - {name: m, path: ../m, cases: [cases.yaml]}\n")
    (space["root"] / "bt" / "cases.yaml").symlink_to(space["outside"] / "cases.yaml")
    with no_open_reaches(space["outside"]), pytest.raises(ToolFailure) as info:
        read_case_file(space["root"] / "bt" / "models.yaml", policy.readable)
    assert info.value.code is ErrorCode.OUTSIDE_ROOTS and info.value.message.startswith("bt/cases.yaml is outside")


def test_run_smoke_test_refuses_a_model_whose_case_file_or_any_entry_links_out(space: dict[str, Path]) -> None:
    rt = runtime(space)
    link(space["root"] / "m" / FILE_NAME, space["secret"])
    arguments = {"model": "m", "python": sys.executable}
    with no_open_reaches(space["outside"]):
        failure = refused(smoke_tool.SPEC, arguments, rt, ErrorCode.OUTSIDE_ROOTS)
    assert failure.message.startswith(f"m/{FILE_NAME} is outside"), failure.message
    (space["root"] / "m" / FILE_NAME).unlink()
    link(
        space["root"] / "m" / "tokenizer.json", space["secret"]
    )  # vLLM would read it; the server cannot check it for vLLM
    with no_open_reaches(space["outside"]):
        failure = refused(smoke_tool.SPEC, arguments, rt, ErrorCode.OUTSIDE_ROOTS)
    assert failure.message.startswith("m/tokenizer.json is a symlink leading outside"), failure.message
    assert not (space["state"] / "smoke").exists() or list((space["state"] / "smoke").iterdir()) == []


def test_symlinked_config_refused_through_the_cli_and_a_real_mcp_client(space: dict[str, Path]) -> None:
    link(space["root"] / "m" / "config.json", space["secret"])
    for mode in ("edit", "review"):
        for tool in ("inspect_config", "plan_trim"):
            error = cli_error(
                cli(
                    space,
                    tool,
                    {"model": "m", "construct": False} if tool == "inspect_config" else {"model": "m"},
                    "--mode",
                    mode,
                )
            )
            assert error["code"] == "outside_roots" and error["message"].startswith("m/config.json is outside")
            assert_clean_message(error["message"], space["tmp"])
    error = cli_error(cli(space, "trim_model", {"model": "m", "output": "out"}))
    assert error["code"] == "outside_roots"

    async def client(mode: str) -> list[Any]:
        async with Client(build_server(runtime(space, mode=mode))) as session:
            return [
                await session.call_tool("inspect_config", {"model": "m", "construct": False}),
                await session.call_tool("plan_trim", {"model": "m"}),
            ]

    for mode in ("edit", "review"):
        for result in anyio.run(client, mode):
            error = json.loads(result.content[0].text)["error"]
            assert result.is_error and error["code"] == "outside_roots", error
            assert_clean_message(error["message"], space["tmp"])
    assert not (space["root"] / "out").exists()
    assert_no_canary(space["root"], space["state"])


def test_symlinked_config_refused_over_stdio(space: dict[str, Path]) -> None:
    link(space["root"] / "m" / "config.json", space["secret"])
    params = StdioServerParameters(
        command=str(console_script()),
        args=["serve", "--mode", "review", "--root", str(space["root"]), "--state-dir", str(space["state"])],
        env={**os.environ},
    )

    async def main() -> Any:
        async with Client(params) as session:
            return await session.call_tool("inspect_config", {"model": "m", "construct": False})

    result = anyio.run(main)
    error = json.loads(result.content[0].text)["error"]
    assert (
        result.is_error and error["code"] == "outside_roots" and error["message"].startswith("m/config.json is outside")
    )
    assert_no_canary(space["root"], space["state"])


# -- every read goes through the policy: an inventory that fails on a new, unreviewed read ---------------

READ_CALLS = {"open", "read_bytes", "read_text", "safe_load", "load", "copyfile", "copy", "copy2", "copytree", "fdopen"}
"""Calls that read a file's bytes: `open` (builtin, os, io, Path), `Path.read_*`, `json.load`, `yaml.safe_load`,
`os.fdopen`, shutil copies. Reads through the policy (`policy.read_bytes`, `policy.open_readable`) are not listed."""

REVIEWED_READS = {
    # the chokepoint itself
    (
        "core/foundation/policy.py",
        "open_resolved",
    ): "opens a path the caller resolved and checked, never following a final link",
    ("core/foundation/policy.py", "copy_resolved"): "through open_resolved; writes a new file",
    ("core/foundation/atomic.py", "write_bytes_atomic"): "writes its own temporary file",
    ("core/foundation/atomic.py", "_flush"): "fsyncs its own staged output: files and folders, O_NOFOLLOW",
    (
        "core/foundation/atomic.py",
        "output_marker",
    ): "the marker of an existing output under an output root: lstat regular, O_NOFOLLOW",
    (
        "core/foundation/atomic.py",
        "output_fingerprint",
    ): "the same marker, hashed (never shown) to compare with the state's record; O_NOFOLLOW",
    # this package's own files
    ("core/target/__init__.py", "script_source"): "package file (a target script: probe, op probe, construct, extract)",
    ("prompts/__init__.py", "template"): "package file",
    ("core/trim/readers.py", "_code_digest"): "package files (the reader search's source, in its cache key)",
    ("resources/__init__.py", "text"): "package file",
    # the server's state directory, its runs and jobs, /proc
    ("core/foundation/state.py", "read"): "the state directory",
    ("core/foundation/state.py", "locked"): "the state directory's lock",
    ("core/code/fact_cache.py", "get_many"): "the state directory's cache",
    ("core/compare/textdiff.py", "get"): "the state directory's cache",
    ("core/code/blob_store.py", "_rows"): "the state directory's blob store (records, outlines, scanner facts)",
    ("core/code/blob_store.py", "_append"): "the state directory's blob store (records, outlines, scanner facts)",
    ("core/foundation/jobs.py", "start"): "the job's log in the state directory",
    ("core/foundation/jobs.py", "processes_of_job"): "/proc",
    ("core/foundation/process_call.py", "group_members"): "/proc",
    ("core/foundation/process_call.py", "_quiet_stdio"): "/dev/null, as a worker's stdin and stdout",
    ("core/foundation/jobs.py", "_alive"): "/proc",
    ("core/smoke/processes.py", "stat_fields"): "/proc",
    ("core/smoke/processes.py", "processes_of"): "/proc",
    ("core/smoke/devices.py", "_smoke_marker"): "/proc/PID/environ of a pid a device lists",
    ("core/smoke/evidence.py", "read_log"): "the run's log in the state directory",
    ("core/smoke/run.py", "serve"): "the run's log in the state directory",
    ("core/target/serve_wrapper.py", "write_report"): "writes its report into the run directory",
    ("core/target/op_probe.py", "mapped_files"): "runs in the target interpreter: /proc/self/maps",
    # plugin and upstream trees: resolved inside a root, links leaving the tree skipped
    ("core/sources/subjects.py", "_file_sha"): "a file-system subject's entry; links leaving the subject are skipped",
    ("core/sources/subjects.py", "_read_many"): "a file-system subject's entry; links leaving the subject are skipped",
    ("core/checkpoint/consumers.py", "directory_tree"): "a source tree's .py file; links leaving the tree are skipped",
    (
        "core/sources/git_guard.py",
        "_object_dir",
    ): "alternates of a git dir checked inside the roots; a link there and every entry are checked",
    # checkpoints: paths resolved by policy.readable before these run
    (
        "core/target/extract.py",
        "*",
    ): "stdlib-only (also shipped as extract.py): resolved, checked paths, outputs, or (run as the job's copier) "
    "its private SOURCE_DIR of links to them; regular files only",
    ("core/trim/assets.py", "copy_assets"): "reads through policy.open_readable; opens only its new output file",
    ("core/smoke/answers.py", "_image_url"): "a case image run_smoke_test resolved with policy.readable",
    ("core/smoke/plan.py", "_identity"): "the model directory, after policy.readable_entries",
    ("core/smoke/plan.py", "_validates_trim"): "the model directory, after policy.readable_entries",
    ("core/smoke/plan.py", "plan_smoke_test"): "the model directory, after policy.readable_entries",
}


class _Reads(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.stack: list[str] = []
        self.sites: set[tuple[str, str]] = set()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if name in READ_CALLS and "policy" not in owner and owner not in ("tarfile", "zipfile"):
            wrong_owner = (
                (name == "load" and owner != "json")
                or (name in ("copy", "copy2", "copytree", "copyfile") and owner != "shutil")
                or (name == "fdopen" and owner != "os")
            )
            if not wrong_owner:
                self.sites.add((self.module, self.stack[-1] if self.stack else "<module>"))
        self.generic_visit(node)


def _read_sites() -> set[tuple[str, str]]:
    """(module, innermost function) of every call in the package that reads a file by name."""
    package = REPO_ROOT / "vllm_metax_mcp"
    sites: set[tuple[str, str]] = set()
    for path in sorted(package.rglob("*.py")):
        visitor = _Reads(path.relative_to(package).as_posix())
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        sites |= visitor.sites
    return sites


def test_every_read_in_the_package_goes_through_the_policy_or_is_reviewed() -> None:
    """A new `open` / `read_bytes` / `read_text` / `json.load` / `yaml.safe_load` / shutil copy in the
    package fails here until it reads through `policy.read_bytes` / `policy.open_readable` (or a path
    `policy.readable` returned), and is listed above with the reason its path is checked or is the
    server's own."""
    sites = _read_sites()
    unreviewed = sorted(s for s in sites if s not in REVIEWED_READS and (s[0], "*") not in REVIEWED_READS)
    assert unreviewed == [], (
        "reads that bypass the policy (route them through Policy.read_bytes / open_readable, or review them "
        f"in REVIEWED_READS): {unreviewed}"
    )


# == class 10: paths in messages ======================================================================


def test_messages_name_paths_as_the_caller_spelled_them_or_root_relative(space: dict[str, Path]) -> None:
    model = space["root"] / "m4"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(model_config()))
    (model / "tokenizer_config.json").symlink_to(space["secret"])
    rt = runtime(space)
    failure = refused(plan_tool.SPEC, {"model": "m4"}, rt, ErrorCode.OUTSIDE_ROOTS)
    assert failure.message.startswith("m4/tokenizer_config.json is outside the server's roots"), failure.message
    assert_clean_message(failure.message, space["tmp"])
    # the caller's own spelling, relative or absolute outside the roots, is kept as given
    for spelling in ("../outside/secret.json", str(space["secret"])):
        failure = refused(inspect_tool.SPEC, {"model": spelling, "construct": False}, rt, ErrorCode.OUTSIDE_ROOTS)
        assert failure.message.startswith(f"{spelling} is outside"), failure.message
    # an absolute path inside a root is shown root-relative
    failure = refused(
        export_tool.SPEC, {**EXPORT, "output": str(space["root"] / "plugin")}, rt, ErrorCode.PROTECTED_PATH
    )
    assert failure.message.startswith("plugin is a git repository"), failure.message
    failure = refused(export_tool.SPEC, {**EXPORT, "output": "new/../x"}, rt, ErrorCode.BAD_INPUT)
    assert failure.message.startswith("new/../x contains"), failure.message


def test_display_never_shows_a_resolved_path_the_caller_did_not_give(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "m").mkdir(parents=True)
    other = tmp_path / "second"
    other.mkdir()
    policy = Policy.create([str(root), str(other)])
    policy.allow_read(tmp_path / "site-packages")
    policy.protect_state(tmp_path / "state")
    assert policy.display("m/config.json") == "m/config.json"
    assert policy.display(root / "m" / "config.json") == "m/config.json"
    assert policy.display(str(root / "m" / ".." / "m" / "x")) == "m/x"
    assert policy.display(other / "vllm" / "x.py") == "second/vllm/x.py"
    assert policy.display(tmp_path / "hf-cache" / "models--a--b") == "<hf-cache>/models--a--b"
    assert policy.display(tmp_path / "site-packages" / "vllm") == "<site-packages>/vllm"
    assert policy.display(tmp_path / "state" / "jobs") == "<state>/jobs"
    assert policy.display("/elsewhere/given") == "/elsewhere/given"
    (root / "m" / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ToolFailure) as info:
        policy.readable(root / "m" / "link")
    assert info.value.message.startswith("m/link is outside") and str(tmp_path) not in info.value.message


def test_tool_listing_is_unchanged() -> None:
    """The specs these tests reach are the served ones (no test-only copies)."""
    names = {spec.name for spec in ALL_TOOLS}
    assert {"export_snapshot", "trim_model", "inspect_config", "plan_trim", "run_smoke_test"} <= names
