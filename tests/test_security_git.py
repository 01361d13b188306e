"""Issue 18, classes 1 and 4: nothing a repository configures makes git start a program, reach a
remote, or read objects from outside the roots.

Class 1: a partial clone / promisor remote whose transport runs a command (an `ext::` URL, a local
remote with its own `uploadpack`) plus a repository-level `protocol.<x>.allow=always`: asking for an
object the repository lacks made git fetch, i.e. run the command. Class 4: `objects/info/alternates`
naming another repository's object store outside the roots let its content into a result.

Every variant first shows with plain git that its canary is live (the command runs, the secret is
readable), then calls the real tools through the installed CLI and a real MCP client, in review and
edit mode, and checks: the call is refused with a precise code and message (no absolute path the
caller did not give), the canary never ran, the secret never appeared, and no file changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import console_script, git, make_repo, plain_git_env
from mcp import Client

from vllm_metax_mcp.core.foundation.errors import ErrorCode, ToolFailure
from vllm_metax_mcp.core.foundation.policy import Policy
from vllm_metax_mcp.core.sources.git import open_repository
from vllm_metax_mcp.core.sources.git_guard import OVERRIDDEN, PROGRAM_KEYS, REFUSED, parse_alternates
from vllm_metax_mcp.core.sources.git_runner import NEUTRALISING_CONFIG, TRANSPORTS, hardened_env, run_git
from vllm_metax_mcp.core.sources.subjects import RevisionSubject
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools.spec import Runtime

pytestmark = pytest.mark.timeout(180)

MISSING = "0123456789abcdef0123456789abcdef01234567"
SECRET = "leaked-7f3a9c-outside-the-roots"
MODES = ("review", "edit")


# -- set-up ------------------------------------------------------------------------------------


def tree_hashes(*tops: Path) -> dict[str, str]:
    """Every file (git dirs and objects included) under the given trees: nothing may change."""
    hashes: dict[str, str] = {}
    for top in tops:
        for item in sorted(top.rglob("*")):
            key = str(item)
            if item.is_symlink():
                hashes[key] = "->" + os.readlink(item)
            elif item.is_file():
                hashes[key] = hashlib.sha256(item.read_bytes()).hexdigest()
            elif item.is_dir():
                hashes[key] = "dir"
    return hashes


def plain(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """git as a user runs it in the repository (the repository's own configuration applies)."""
    return subprocess.run(["git", *args], check=False, cwd=repo, env=plain_git_env(), capture_output=True, timeout=60)


def configure(repo: Path, settings: list[tuple[str, str]]) -> None:
    for key, value in settings:
        git(repo, "config", "--add", key, value)


def ext_url(canary: Path) -> str:
    return f"ext::sh -c touch% {canary}"


def _ext_partial_clone(tmp: Path, repo: Path, canary: Path) -> None:
    configure(
        repo,
        [
            ("extensions.partialClone", "origin"),
            ("remote.origin.promisor", "true"),
            ("remote.origin.url", ext_url(canary)),
            ("protocol.ext.allow", "always"),
        ],
    )


def _ext_promisor_only(tmp: Path, repo: Path, canary: Path) -> None:
    configure(
        repo,
        [("remote.origin.promisor", "true"), ("remote.origin.url", ext_url(canary)), ("protocol.ext.allow", "always")],
    )


def _local_remote_uploadpack(tmp: Path, repo: Path, canary: Path) -> None:
    remote = tmp / "remote.git"
    git(tmp, "init", "-q", "--bare", str(remote))
    configure(
        repo,
        [
            ("extensions.partialClone", "origin"),
            ("remote.origin.promisor", "true"),
            ("remote.origin.url", str(remote)),
            ("remote.origin.uploadpack", f"touch {canary}; git-upload-pack"),
            ("protocol.file.allow", "always"),
        ],
    )


def _promisor_in_include(tmp: Path, repo: Path, canary: Path) -> None:
    (repo / ".git" / "lazy.cfg").write_text(
        f'[remote "origin"]\n\turl = {ext_url(canary)}\n\tpromisor = yes\n[protocol "ext"]\n\tallow = always\n'
    )
    configure(repo, [("include.path", "lazy.cfg")])


def _odd_remote_name(tmp: Path, repo: Path, canary: Path) -> None:
    configure(
        repo,
        [
            ("extensions.partialclone", "Lazy.One"),
            ("remote.Lazy.One.promisor", "1"),
            ("remote.Lazy.One.url", ext_url(canary)),
            ("protocol.ext.allow", "always"),
        ],
    )


FETCH_VARIANTS: dict[str, Callable[[Path, Path, Path], None]] = {
    "ext-partial-clone": _ext_partial_clone,
    "ext-promisor-only": _ext_promisor_only,
    "local-remote-uploadpack": _local_remote_uploadpack,
    "promisor-in-include": _promisor_in_include,
    "odd-remote-name": _odd_remote_name,
}


def fetching_repo(tmp: Path, variant: str) -> tuple[Path, Path, Path]:
    """root/repo configured to fetch missing objects with a command that touches the canary;
    the control proves plain git runs it."""
    root = tmp / "root"
    repo = make_repo(root / "repo")
    canary = tmp / "canary"
    FETCH_VARIANTS[variant](tmp, repo, canary)
    copy = tmp / "control-copy"
    shutil.copytree(repo, copy, symlinks=True)
    plain(copy, "cat-file", "-e", MISSING)
    assert canary.exists(), f"control: plain git should fetch through the {variant} remote and run its command"
    canary.unlink()
    shutil.rmtree(copy)
    return root, repo, canary


def tool_calls(target: str = MISSING) -> list[tuple[str, dict[str, Any]]]:
    """Calls of every git-reading tool that ask for `target` (an object the repository lacks)."""
    upstream = {"plugin_repo": "repo", "upstream": "repo"}
    return [
        ("environment", {"action": "establish", **upstream, "target": target}),
        ("diff_model", {**upstream, "target": target, "paths": ["pkg/"]}),
        ("diff_model", {**upstream, "target": "HEAD", "subject": "revision", "revision": target, "paths": ["pkg/"]}),
        ("trace_dependency", {**upstream, "arch": "DemoForCausalLM", "target": target}),
        ("audit_commits", {**upstream, "target": target, "base": "HEAD~1", "paths": ["pkg/"]}),
    ]


def outside_repo(tmp: Path) -> tuple[Path, str]:
    """A repository outside the roots whose commit holds the secret; returns it and the commit."""
    outside = make_repo(tmp / "outside")
    (outside / "pkg" / "model.py").write_text(f"SECRET = {SECRET!r}\n\ndef forward(x):\n    return x * 7\n")
    git(outside, "commit", "-q", "-am", "secret")
    git(outside, "gc", "-q")
    return outside, git(outside, "rev-parse", "HEAD").strip()


def _alt_absolute(tmp: Path, repo: Path, outside: Path) -> None:
    (repo / ".git/objects/info/alternates").write_text(f"{outside / '.git/objects'}\n")


def _alt_relative(tmp: Path, repo: Path, outside: Path) -> None:
    (repo / ".git/objects/info/alternates").write_text("# borrowed\n../../../../outside/.git/objects\n")


def _alt_quoted(tmp: Path, repo: Path, outside: Path) -> None:
    (repo / ".git/objects/info/alternates").write_text('"../../../../outside/.git/obj\\145cts"\n')


def _alt_nested(tmp: Path, repo: Path, outside: Path) -> None:
    middle = tmp / "root" / "middle" / "objects"
    (middle / "info").mkdir(parents=True)
    (middle / "info" / "alternates").write_text("../../../outside/.git/objects\n")
    (repo / ".git/objects/info/alternates").write_text("../../../middle/objects\n")


def _alt_nested_absolute(tmp: Path, repo: Path, outside: Path) -> None:
    middle = tmp / "root" / "middle" / "objects"
    (middle / "info").mkdir(parents=True)
    (middle / "info" / "alternates").write_text(f"{outside / '.git/objects'}\n")
    (repo / ".git/objects/info/alternates").write_text(f"{middle}\n")


def _alt_symlinked_file(tmp: Path, repo: Path, outside: Path) -> None:
    elsewhere = tmp / "elsewhere-alternates"
    elsewhere.write_text(f"{outside / '.git/objects'}\n")
    (repo / ".git/objects/info/alternates").symlink_to(elsewhere)


def _alt_symlinked_pack(tmp: Path, repo: Path, outside: Path) -> None:
    for pack in sorted((outside / ".git/objects/pack").iterdir()):
        (repo / ".git/objects/pack" / pack.name).symlink_to(pack)


ALTERNATE_VARIANTS: dict[str, Callable[[Path, Path, Path], None]] = {
    "absolute": _alt_absolute,
    "relative": _alt_relative,
    "quoted": _alt_quoted,
    "nested-relative": _alt_nested,
    "nested-absolute": _alt_nested_absolute,
    "symlinked-alternates-file": _alt_symlinked_file,
    "symlinked-pack": _alt_symlinked_pack,
}


def borrowing_repo(tmp: Path, variant: str) -> tuple[Path, Path, Path]:
    """root/repo whose object store borrows the outside repository's objects; branch `outside`
    names the secret commit, and plain git reads the secret through it (the control)."""
    outside, commit = outside_repo(tmp)
    root = tmp / "root"
    repo = make_repo(root / "repo")
    ALTERNATE_VARIANTS[variant](tmp, repo, outside)
    (repo / ".git" / "refs" / "heads" / "outside").write_text(commit + "\n")
    shown = plain(repo, "cat-file", "-p", "outside:pkg/model.py")
    assert SECRET in shown.stdout.decode(), (
        f"control: plain git should read the secret through {variant}: {shown.stderr!r}"
    )
    return root, repo, outside


def alternate_calls() -> list[tuple[str, dict[str, Any]]]:
    upstream = {"plugin_repo": "repo", "upstream": "repo", "target": "outside"}
    pinned = {"mapping_overrides": {"pkg/model.py": "pkg/model.py"}}
    return [
        ("diff_model", {**upstream, **pinned, "paths": ["pkg/"], "detail": "diff", "file": "pkg/model.py"}),
        ("diff_model", {**upstream, "paths": ["pkg/"], "detail": "symbols"}),
        ("diff_model", {**upstream, "paths": ["pkg/"], "subject": "revision", "revision": "outside"}),
        ("audit_commits", {**upstream, **pinned, "base": "HEAD", "paths": ["pkg/"]}),
        ("trace_dependency", {**upstream, "arch": "DemoForCausalLM"}),
        ("environment", {"action": "establish", **upstream}),
    ]


# -- callers: the installed CLI and a real MCP client --------------------------------------------


def call_cli(tmp: Path, root: Path, mode: str, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [
            str(console_script()),
            "call",
            tool,
            "--root",
            str(root),
            "--state-dir",
            str(tmp / f"state-{mode}"),
            "--mode",
            mode,
            "--args",
            json.dumps(arguments),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        return {"result": json.loads(proc.stdout)}, proc.stdout + proc.stderr
    assert proc.returncode == 1 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stderr), proc.stdout + proc.stderr


def call_mcp(
    tmp: Path, root: Path, mode: str, calls: list[tuple[str, dict[str, Any]]]
) -> list[tuple[dict[str, Any], str]]:
    runtime = Runtime.create([str(root)], mode=mode, state_dir=str(tmp / f"state-mcp-{mode}"))
    server = build_server(runtime)

    async def main() -> list[tuple[dict[str, Any], str]]:
        answers = []
        async with Client(server, mode="auto") as client:
            for tool, arguments in calls:
                result = await client.call_tool(tool, arguments)
                text = "".join(getattr(item, "text", "") for item in result.content)
                if result.is_error:
                    answers.append((json.loads(text), text))
                else:
                    answers.append(
                        ({"result": result.structured_content}, text + json.dumps(result.structured_content))
                    )
        return answers

    return anyio.run(main)


def assert_refused(answer: dict[str, Any], code: str, words: tuple[str, ...], tmp: Path, what: str) -> None:
    assert "error" in answer, f"{what}: expected a refusal, got a result"
    error = answer["error"]
    assert error["code"] == code, (what, error)
    message = error["message"].lower()
    assert any(word in message for word in words), (what, error["message"])
    assert str(tmp) not in error["message"], f"{what}: the message shows a resolved absolute path: {error['message']}"


# -- class 1: fetching missing objects never runs a program ---------------------------------------


@pytest.mark.parametrize("variant", sorted(FETCH_VARIANTS))
def test_fetching_repository_is_refused_through_mcp_in_both_modes(variant: str, tmp_path: Path) -> None:
    root, _repo, canary = fetching_repo(tmp_path, variant)
    before = tree_hashes(root)
    for mode in MODES:
        for (tool, arguments), (answer, _) in zip(
            tool_calls(), call_mcp(tmp_path, root, mode, tool_calls()), strict=True
        ):
            assert not canary.exists(), f"{variant}: {mode} {tool} ran the remote's command"
            assert_refused(answer, "bad_input", ("promisor", "partialclone"), tmp_path, f"{mode} {tool} {arguments}")
    assert tree_hashes(root) == before, "a refused call changed the repository"


@pytest.mark.parametrize("variant", sorted(FETCH_VARIANTS))
def test_fetching_repository_is_refused_through_the_cli(variant: str, tmp_path: Path) -> None:
    root, _repo, canary = fetching_repo(tmp_path, variant)
    before = tree_hashes(root)
    calls = tool_calls()
    # every tool once, modes alternating (the MCP test covers every tool in both modes)
    for index, (tool, arguments) in enumerate(calls[:2] if variant != "ext-partial-clone" else calls):
        mode = MODES[index % 2]
        answer, _ = call_cli(tmp_path, root, mode, tool, arguments)
        assert not canary.exists(), f"{variant}: {mode} {tool} ran the remote's command"
        assert_refused(answer, "bad_input", ("promisor", "partialclone"), tmp_path, f"{mode} {tool}")
    assert tree_hashes(root) == before


def test_unguarded_runner_still_never_fetches(tmp_path: Path) -> None:
    """Defence in depth: even below the guard, the runner's environment allows no transport, so a
    lazy fetch that git starts (git < 2.44 cannot be told not to) never reaches the command."""
    for variant in ("ext-partial-clone", "local-remote-uploadpack", "promisor-in-include"):
        case = tmp_path / variant
        _root, repo, canary = fetching_repo(case, variant)
        for args in (
            ("cat-file", "-e", MISSING),
            ("rev-parse", "--verify", "--quiet", f"{MISSING}^{{commit}}"),
            ("ls-tree", MISSING),
            ("show", MISSING),
        ):
            run_git(repo, *args)
            assert not canary.exists(), f"{variant}: git {args[0]} ran the remote's command"


def test_missing_objects_are_not_found_and_never_fetched(tmp_path: Path) -> None:
    """A repository that is no partial clone but names a command-running remote and allows every
    protocol is fine to read; an object it lacks is invalid_revision / not_found, never a fetch."""
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    canary = tmp_path / "canary"
    configure(
        repo, [("remote.origin.url", ext_url(canary)), ("protocol.allow", "always"), ("protocol.ext.allow", "always")]
    )
    blob = git(repo, "rev-parse", "HEAD:pkg/model.py").strip()
    loose = repo / ".git" / "objects" / blob[:2] / blob[2:]
    loose.chmod(0o644)
    loose.unlink()
    opened = open_repository(repo, Policy.create([str(root)]))
    with pytest.raises(ToolFailure) as missing_commit:
        opened.resolve_commit(MISSING)
    assert missing_commit.value.code is ErrorCode.INVALID_REVISION
    with pytest.raises(ToolFailure) as missing_blob:
        RevisionSubject(opened, "HEAD").read("pkg/model.py")
    assert missing_blob.value.code is ErrorCode.NOT_FOUND and blob in missing_blob.value.message
    with pytest.raises(ToolFailure) as missing_tree:
        opened.run("ls-tree", MISSING)
    assert missing_tree.value.code is ErrorCode.NOT_FOUND
    answers = call_mcp(
        tmp_path,
        root,
        "review",
        [
            (
                "diff_model",
                {
                    "plugin_repo": "repo",
                    "upstream": "repo",
                    "target": "HEAD",
                    "paths": ["pkg/"],
                    "subject": "revision",
                    "revision": "HEAD",
                },
            )
        ],
    )
    ((answer, text),) = answers
    assert answer.get("error", {}).get("code") == "not_found", answer
    assert str(tmp_path) not in text
    assert not canary.exists()


def test_a_promisor_set_false_is_not_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    configure(repo, [("remote.origin.promisor", "false"), ("remote.origin.url", ext_url(tmp_path / "canary"))])
    opened = open_repository(repo, Policy.create([str(root)]))
    assert len(opened.resolve_commit("HEAD")) == 40


def test_promisor_added_after_the_first_call_is_refused_on_the_next(tmp_path: Path) -> None:
    """The guard decides once per repository, and again when a file it was decided from changes."""
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    canary = tmp_path / "canary"
    opened = open_repository(repo, Policy.create([str(root)]))
    opened.run("cat-file", "-e", "HEAD")
    _ext_partial_clone(tmp_path, repo, canary)
    with pytest.raises(ToolFailure) as refused:
        opened.run("cat-file", "-e", MISSING)
    assert refused.value.code is ErrorCode.BAD_INPUT and "partialclone" in refused.value.message.lower()
    assert not canary.exists()


def test_every_transport_is_forbidden_and_every_overridden_key_is_overridden() -> None:
    env = hardened_env()
    assert env["GIT_ALLOW_PROTOCOL"] == "" and env["GIT_NO_LAZY_FETCH"] == "1" and env["GIT_PROTOCOL_FROM_USER"] == "0"
    for name in TRANSPORTS:
        assert f"protocol.{name}.allow=never" in NEUTRALISING_CONFIG
    overridden = [setting.split("=", 1)[0].lower() for setting in NEUTRALISING_CONFIG]
    for rule in PROGRAM_KEYS:
        if rule.handling == OVERRIDDEN:
            assert any(fnmatch.fnmatchcase(key, rule.pattern) for key in overridden), rule
    assert {rule.pattern for rule in PROGRAM_KEYS if rule.handling == REFUSED} == {
        "extensions.partialclone",
        "remote.*.promisor",
    }


def test_empty_allow_protocol_beats_a_repository_allow_always(tmp_path: Path) -> None:
    """The mechanism's premise, checked against the git on this machine."""
    repo = make_repo(tmp_path / "repo")
    canary = tmp_path / "canary"
    configure(repo, [("protocol.ext.allow", "always"), ("protocol.allow", "always")])
    env = {**plain_git_env(), "GIT_ALLOW_PROTOCOL": ""}
    subprocess.run(
        ["git", "ls-remote", ext_url(canary)], check=False, cwd=repo, env=env, capture_output=True, timeout=60
    )
    assert not canary.exists()
    subprocess.run(
        ["git", "ls-remote", ext_url(canary)],
        check=False,
        cwd=repo,
        env=plain_git_env(),
        capture_output=True,
        timeout=60,
    )
    assert canary.exists(), "control: without the empty allow-list the repository's setting runs the command"


# -- class 4: alternates never read outside the roots ---------------------------------------------


@pytest.mark.parametrize("variant", sorted(ALTERNATE_VARIANTS))
def test_alternates_outside_the_roots_are_refused_through_mcp_in_both_modes(variant: str, tmp_path: Path) -> None:
    root, _repo, outside = borrowing_repo(tmp_path, variant)
    before = tree_hashes(root, outside)
    for mode in MODES:
        for (tool, arguments), (answer, text) in zip(
            alternate_calls(), call_mcp(tmp_path, root, mode, alternate_calls()), strict=True
        ):
            assert SECRET not in text, f"{variant}: {mode} {tool} leaked the outside repository's content"
            assert_refused(answer, "outside_roots", ("object store",), tmp_path, f"{mode} {tool} {arguments}")
    assert tree_hashes(root, outside) == before


@pytest.mark.parametrize("variant", ["absolute", "nested-relative", "symlinked-pack"])
def test_alternates_outside_the_roots_are_refused_through_the_cli(variant: str, tmp_path: Path) -> None:
    root, _repo, outside = borrowing_repo(tmp_path, variant)
    before = tree_hashes(root, outside)
    for index, (tool, arguments) in enumerate(alternate_calls()[:2]):
        mode = MODES[index % 2]
        answer, text = call_cli(tmp_path, root, mode, tool, arguments)
        assert SECRET not in text, f"{variant}: {mode} {tool} leaked the outside repository's content"
        assert_refused(answer, "outside_roots", ("object store",), tmp_path, f"{mode} {tool}")
    assert tree_hashes(root, outside) == before


def test_alternates_inside_the_roots_still_work(tmp_path: Path) -> None:
    """The control for the refusals: with the borrowed store inside the roots the same call
    reads it (so the refusals above are what keeps the secret out)."""
    root, _repo, outside = borrowing_repo(tmp_path, "nested-relative")
    shutil.move(str(outside), str(root / "outside"))
    (root / "middle/objects/info/alternates").write_text("../../outside/.git/objects\n")
    ((answer, text),) = call_mcp(tmp_path, root, "review", alternate_calls()[:1])
    assert "result" in answer, answer
    assert SECRET in text


def test_include_outside_the_roots_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    (tmp_path / "elsewhere.cfg").write_text("[core]\n\tquotePath = false\n")
    configure(repo, [("include.path", str(tmp_path / "elsewhere.cfg"))])
    with pytest.raises(ToolFailure) as refused:
        open_repository(repo, Policy.create([str(root)]))
    assert refused.value.code is ErrorCode.OUTSIDE_ROOTS and str(tmp_path) not in refused.value.message


def test_alternates_added_after_the_first_call_are_refused_on_the_next(tmp_path: Path) -> None:
    outside, commit = outside_repo(tmp_path)
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    opened = open_repository(repo, Policy.create([str(root)]))
    opened.run("cat-file", "-e", "HEAD")
    _alt_absolute(tmp_path, repo, outside)
    with pytest.raises(ToolFailure) as refused:
        opened.run("cat-file", "-p", f"{commit}:pkg/model.py")
    assert refused.value.code is ErrorCode.OUTSIDE_ROOTS


def test_parse_alternates_reads_entries_as_git_does() -> None:
    data = b'# comment\n\n/abs/objects\nrel/objects/\n"quo\\164ed\\nline"\n"broken\nplain\0/after/nul\n'
    assert parse_alternates(data) == [
        (3, "/abs/objects"),
        (4, "rel/objects/"),
        (5, "quoted\nline"),
        (6, '"broken'),
        (7, "plain"),
    ]


def test_include_outside_the_roots_created_later_is_refused_on_the_next_call(tmp_path: Path) -> None:
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    canary = tmp_path / "canary"
    later = tmp_path / "later.cfg"
    configure(repo, [("include.path", str(later))])
    opened = open_repository(repo, Policy.create([str(root)]))  # absent: git reads nothing from it
    later.write_text(
        f'[extensions]\n\tpartialClone = origin\n[remote "origin"]\n\turl = {ext_url(canary)}\n\tpromisor = true\n'
    )
    with pytest.raises(ToolFailure) as refused:
        opened.run("cat-file", "-e", MISSING)
    assert refused.value.code is ErrorCode.OUTSIDE_ROOTS
    assert not canary.exists()


@pytest.mark.parametrize("key", ["core.excludesFile", "core.attributesFile", "diff.orderFile", "mailmap.file"])
def test_a_file_the_config_names_outside_the_roots_is_refused(key: str, tmp_path: Path) -> None:
    """A FIFO outside the roots named by the repository's config would hang every listing or diff
    (and its content is read outside the policy): refused before git reads it, in both modes."""
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    fifo = tmp_path / "outside.fifo"
    os.mkfifo(fifo)
    configure(repo, [(key, str(fifo))])
    for mode in MODES:
        answer, _ = call_cli(
            tmp_path,
            root,
            mode,
            "diff_model",
            {"plugin_repo": "repo", "upstream": "repo", "target": "HEAD", "paths": ["pkg/"]},
        )
        assert_refused(answer, "outside_roots", (key.lower(),), tmp_path, f"{mode} {key}")
    inside = root / "ignore-list"
    inside.write_text("*.tmp\n")
    plain(repo, "config", "--unset-all", key)
    configure(repo, [(key, str(inside))])
    open_repository(repo, Policy.create([str(root)]))  # a file inside the roots is fine


def test_an_interpolated_path_in_the_config_is_refused(tmp_path: Path) -> None:
    """git expands `%(prefix)/` to its install prefix: a relative-looking value that leads outside."""
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    configure(repo, [("core.excludesFile", "%(prefix)/../tmp/x")])
    with pytest.raises(ToolFailure) as refused:
        open_repository(repo, Policy.create([str(root)]))
    assert refused.value.code is ErrorCode.OUTSIDE_ROOTS and "interpolates" in refused.value.message


@pytest.mark.parametrize(
    "entry", ["info/exclude", "info/attributes", "info/grafts", "shallow", "packed-refs", "refs/heads/x"]
)
def test_a_git_dir_file_linking_out_or_blocking_is_refused(entry: str, tmp_path: Path) -> None:
    """Files git reads from the git directory on the runner's calls: a link out of the roots, or a
    FIFO (which would hang every call), refuses the repository through the CLI in both modes."""
    root = tmp_path / "root"
    repo = make_repo(root / "repo")
    outside = tmp_path / "outside.fifo"
    os.mkfifo(outside)
    place = repo / ".git" / entry
    place.parent.mkdir(parents=True, exist_ok=True)
    if place.exists():
        place.unlink()
    place.symlink_to(outside)
    arguments = {"plugin_repo": "repo", "upstream": "repo", "target": "HEAD", "paths": ["pkg/"]}
    for mode in MODES:
        answer, _ = call_cli(tmp_path, root, mode, "diff_model", arguments)
        assert_refused(answer, "outside_roots", ("link outside",), tmp_path, f"{mode} {entry}")
    place.unlink()
    os.mkfifo(place)  # inside the roots, but a FIFO all the same
    with pytest.raises(ToolFailure) as refused:
        open_repository(repo, Policy.create([str(root)]))
    assert refused.value.code is ErrorCode.BAD_INPUT and "FIFO" in refused.value.message
