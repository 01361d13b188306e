"""audit_commits on a real upstream history: vLLM 0.26.0 and 0.33.0 as tagged release commits, then
fine-grained commits this test adds — a model file and a layer module changed together, a pure
move of a model file into its platform directory (with commits before and after), a test-only,
a docs-only and an unrelated-model commit — against a MACA-like plugin copied from 0.26.0 with a
subclass, an importer and a monkey-patch of the upstream MoE outside the audited files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from workbench import build_plugin_repo, build_upstream_history, default_maca_edit, git

from vllm_metax_mcp.core.audit.commits import is_production
from vllm_metax_mcp.core.audit.session import DEFAULT_LIMITS
from vllm_metax_mcp.core.foundation.errors import ToolFailure
from vllm_metax_mcp.core.foundation.results import RESULT_BUDGET
from vllm_metax_mcp.server.app import build_server
from vllm_metax_mcp.tools import audit_commits as tool
from vllm_metax_mcp.tools import environment as environment_tool
from vllm_metax_mcp.tools import trace_dependency as trace_tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.output import text_of
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = pytest.mark.slow

V4 = "vllm/models/deepseek_v4"
PKG = "vllm_metax/models/deepseek_v4"
LAYERNORM = "vllm/model_executor/layers/layernorm.py"
ERNIE = "vllm/model_executor/models/ernie45.py"
COPIES = {
    f"{PKG}/model.py": f"{V4}/nvidia/model.py",
    f"{PKG}/attention.py": f"{V4}/attention.py",
    f"{PKG}/fused_qk_rmsnorm.py": f"{V4}/common/ops/fused_qk_rmsnorm.py",
    "vllm_metax/models/ernie45.py": ERNIE,
}
FILES = sorted(COPIES)
RELEASES = ["v0.26.0", "v0.33.0"]
MOE_USERS = """\
from vllm.models.deepseek_v4.nvidia.model import DeepseekV4MoE


class MacaMoE(DeepseekV4MoE):
    def forward(self, hidden_states):
        return super().forward(hidden_states)


def build_moe(*args, **kwargs):
    return DeepseekV4MoE(*args, **kwargs)
"""
MOE_PATCH = """\
from vllm.models.deepseek_v4.nvidia import model as v4_model


def maca_moe_init(self, *args, **kwargs):
    return None


v4_model.DeepseekV4MoE.__init__ = maca_moe_init
"""


def maca_edits(local: str, text: str) -> str:
    return text if local.endswith("fused_qk_rmsnorm.py") else default_maca_edit(COPIES)(local, text)


def add_history(history: Any) -> dict[str, str]:
    """The fine-grained commits after v0.33.0, by name."""
    top = history.path

    def text(path: str) -> str:
        return (top / path).read_text()

    model = text(f"{V4}/nvidia/model.py")
    assert model.count("        self.reduce_results = reduce_results\n") == 1
    attention = text(f"{V4}/attention.py")
    shas = {}
    shas["moe"] = history.add_commit(
        {
            f"{V4}/nvidia/model.py": model.replace(
                "        self.reduce_results = reduce_results\n",
                "        self.reduce_results = reduce_results\n        self.expert_bias = None\n",
            ),
            LAYERNORM: text(LAYERNORM)
            + "\n\ndef rms_norm_eps_floor(eps: float) -> float:\n    return max(eps, 1e-12)\n",
            "tests/kernels/test_layernorm_eps.py": "def test_eps_floor():\n    assert True\n",
        },
        "[Model] DeepSeek V4 MoE expert bias; RMSNorm eps floor",
    )
    shas["before_move"] = history.add_commit(
        {
            f"{V4}/attention.py": attention.replace(
                "    cache_config: CacheConfig | None,\n) -> tuple[str, torch.dtype]:",
                "    cache_config: CacheConfig | None,\n    strict: bool = False,\n) -> tuple[str, torch.dtype]:",
            )
        },
        "[Attention] strict kv-cache dtype resolution",
    )
    shas["move"] = history.add_commit(
        {f"{V4}/attention.py": None, f"{V4}/nvidia/attention.py": text(f"{V4}/attention.py")},
        "[Refactor] move DeepSeek V4 attention into nvidia/",
    )
    shas["tests_only"] = history.add_commit(
        {"tests/models/test_deepseek_v4.py": "def test_v4():\n    assert True\n"}, "[CI] V4 test"
    )
    shas["docs_only"] = history.add_commit({"docs/models/deepseek_v4.md": "# DeepSeek V4\n"}, "[Doc] DeepSeek V4")
    shas["unrelated"] = history.add_commit(
        {
            "vllm/model_executor/models/qwen2.py": text("vllm/model_executor/models/qwen2.py")
            + "\n\ndef qwen2_marker() -> int:\n    return 2\n"
        },
        "[Model] qwen2 marker",
    )
    shas["after_move"] = history.add_commit(
        {
            f"{V4}/nvidia/attention.py": text(f"{V4}/nvidia/attention.py")
            + "\n\ndef dsv4_backend_name() -> str:\n    return 'flashmla'\n"
        },
        "[Attention] backend name",
    )
    shas["ernie"] = history.add_commit(
        {ERNIE: text(ERNIE) + "\n\ndef ernie_rope_style() -> str:\n    return 'gpt-j'\n"}, "[Model] ernie rope style"
    )
    return shas


def make_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def confirm(ws: dict[str, Any], plugin: str) -> None:
    for action in ("establish", "confirm"):
        arguments = {"action": action, "plugin_repo": plugin, "upstream": "vllm", "target": "main"}
        if action == "establish":
            arguments["python"] = str(ws["python"])
        call(ws, environment_tool.SPEC, arguments)


def call(ws: dict[str, Any], spec: Any, arguments: dict[str, Any], state: str = "state") -> Any:
    runtime = Runtime.create([str(ws["root"])], state_dir=str(ws["root"] / state))
    return anyio.run(lambda: invoke(spec, arguments, ToolEnv(runtime=runtime, tool=spec.name)))


def run(ws: dict[str, Any], state: str = "state", **arguments: Any) -> Any:
    return call(ws, tool.SPEC, {"plugin_repo": "plugin", "paths": FILES, **arguments}, state)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, upstream_026: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("audit")
    history = build_upstream_history(root / "vllm", ["0.26.0", "0.33.0"], include=["vllm/"])
    shas = add_history(history)
    shas["v0.33.0"] = history.rev_parse("v0.33.0")
    plugin = build_plugin_repo(
        root / "plugin",
        upstream_026,
        COPIES,
        edits=maca_edits,
        registrations={"DeepseekV4ForCausalLM": "vllm_metax.models.deepseek_v4.model:DeepseekV4ForCausalLM"},
    )
    for relative, text in {
        "vllm_metax/layers/__init__.py": "",
        "vllm_metax/layers/maca_moe.py": MOE_USERS,
        "vllm_metax/patch/__init__.py": "",
        "vllm_metax/patch/moe_patch.py": MOE_PATCH,
    }.items():
        (plugin / relative).parent.mkdir(parents=True, exist_ok=True)
        (plugin / relative).write_text(text)
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "MACA MoE users and patch")
    ws = {"root": root, "plugin": plugin, "history": history, "shas": shas, "python": make_venv(root / "venv")}
    confirm(ws, "plugin")
    return ws


@pytest.fixture(scope="module")
def listed(workspace: dict[str, Any]) -> Any:
    return run(workspace, releases=RELEASES, limit=tool.MAX_LIMIT)


def by_sha(result: Any) -> dict[str, Any]:
    return {c.sha: c for c in result.commits}


def per_file(result: Any, ws: dict[str, Any]) -> dict[str, set[str]]:
    """Local file -> names of the commits listed for it."""
    names = {sha: name for name, sha in ws["shas"].items()}
    found: dict[str, set[str]] = {}
    for commit in result.commits:
        for local in commit.local_files:
            found.setdefault(local, set()).add(names[commit.sha])
    return found


def test_exact_commits_per_file_from_each_files_closest_release(workspace: dict[str, Any], listed: Any) -> None:
    assert per_file(listed, workspace) == {
        f"{PKG}/model.py": {"v0.33.0", "moe"},
        f"{PKG}/attention.py": {"v0.33.0", "before_move", "move", "after_move"},
        f"{PKG}/fused_qk_rmsnorm.py": {"v0.33.0"},
        "vllm_metax/models/ernie45.py": {"ernie"},  # identical in 0.26 and 0.33: its base is the newer release
    }
    files = {f.local: f for f in run(workspace, action="status", releases=RELEASES).files}
    assert {local: (f.upstream, f.base, f.commits) for local, f in files.items()} == {
        f"{PKG}/attention.py": (f"{V4}/nvidia/attention.py", "v0.26.0", 4),
        f"{PKG}/fused_qk_rmsnorm.py": ("vllm/models/common/ops/fused_qk_rmsnorm.py", "v0.26.0", 1),
        f"{PKG}/model.py": (f"{V4}/nvidia/model.py", "v0.26.0", 2),
        "vllm_metax/models/ernie45.py": (ERNIE, "v0.33.0", 1),
    }
    assert listed.summary.model_dump() == {"total": 6, "with_entry": 0, "without_entry": 6}
    assert [c.sha for c in listed.commits] == [
        workspace["shas"][n] for n in ("v0.33.0", "moe", "before_move", "move", "after_move", "ernie")
    ]


def test_one_base_for_every_file_narrows_or_widens_the_ranges(workspace: dict[str, Any]) -> None:
    newer = run(workspace, base="v0.33.0", limit=50)
    assert per_file(newer, workspace) == {
        f"{PKG}/model.py": {"moe"},
        f"{PKG}/attention.py": {"before_move", "move", "after_move"},
        "vllm_metax/models/ernie45.py": {"ernie"},
    }
    older = run(workspace, base="v0.26.0", limit=50)
    assert per_file(older, workspace)["vllm_metax/models/ernie45.py"] == {"ernie"}  # 0.33 did not touch it
    with pytest.raises(ToolFailure) as refused:
        run(workspace, base="moe")
    assert refused.value.code.value == "invalid_revision"
    with pytest.raises(ToolFailure) as refused:
        run(workspace, base=workspace["shas"]["ernie"][:12] + "^{tree}")
    assert refused.value.code.value == "invalid_revision"


def test_production_and_other_files_are_split_by_path_evidence(workspace: dict[str, Any], listed: Any) -> None:
    moe = by_sha(listed)[workspace["shas"]["moe"]]
    assert moe.files.model_dump() == {
        "mapped": [f"{V4}/nvidia/model.py"],
        "renamed_from": {},
        "production": [LAYERNORM],
        "production_total": 1,
        "other": ["tests/kernels/test_layernorm_eps.py"],
        "other_total": 1,
    }
    assert moe.subject.startswith("[Model]") and moe.author == "vLLM Contributor <contributor@vllm.invalid>"
    release = by_sha(listed)[workspace["shas"]["v0.33.0"]]
    assert release.files.production_total > 1000 and len(release.files.production) == tool.SHOWN
    assert all(is_production(p) for p in release.files.production)
    assert [
        is_production(p)
        for p in ("docs/a.md", "benchmarks/x.py", ".buildkite/t.yaml", "vllm/a/test_b.py", "csrc/x.cu", "vllm/x.json")
    ] == [
        False,
        False,
        False,
        False,
        True,
        False,
    ]


def test_renames_and_moves_are_followed(workspace: dict[str, Any], listed: Any) -> None:
    move = by_sha(listed)[workspace["shas"]["move"]]
    assert move.files.mapped == [f"{V4}/nvidia/attention.py"]
    assert move.files.renamed_from == {f"{V4}/nvidia/attention.py": f"{V4}/attention.py"}
    assert [(c.symbol, c.change) for c in move.changed_symbols] == [
        ("vllm.models.deepseek_v4.nvidia.attention:*", "moved")
    ]
    before = by_sha(listed)[workspace["shas"]["before_move"]]
    assert before.files.mapped == [f"{V4}/attention.py"]
    assert [(c.symbol, c.change) for c in before.changed_symbols] == [
        ("vllm.models.deepseek_v4.attention:_resolve_dsv4_kv_cache_dtype", "changed")
    ]
    status = run(workspace, action="status", releases=RELEASES)
    files = {f.local: f for f in status.files}
    assert files[f"{PKG}/attention.py"].followed == [f"{V4}/attention.py"]
    # 0.33 moved fused_qk_rmsnorm.py out of the family and rewrote it, too much for git's rename
    # detection: the path the pairing found at the base is listed as well, and the gap is said
    release = by_sha(listed)[workspace["shas"]["v0.33.0"]]
    old = f"{V4}/common/ops/fused_qk_rmsnorm.py"
    assert release.files.mapped == [
        "vllm/models/common/ops/fused_qk_rmsnorm.py",
        f"{V4}/attention.py",
        f"{V4}/nvidia/model.py",
    ]
    assert release.files.renamed_from == {"vllm/models/common/ops/fused_qk_rmsnorm.py": old}
    assert files[f"{PKG}/fused_qk_rmsnorm.py"].followed == [old]
    assert [u for u in status.unknowns if "git found no rename" in u] == [
        f"{PKG}/fused_qk_rmsnorm.py: git found no rename from {old} (the counterpart at the base) to "
        "vllm/models/common/ops/fused_qk_rmsnorm.py; commits touching it in range are listed too, "
        "from the pairing at the base."
    ]


def test_changed_symbols_and_dependent_plugin_symbols(workspace: dict[str, Any], listed: Any) -> None:
    moe = by_sha(listed)[workspace["shas"]["moe"]]
    changed = "vllm.models.deepseek_v4.nvidia.model:DeepseekV4MoE.__init__"
    assert [(c.file, c.symbol, c.change) for c in moe.changed_symbols] == [
        (f"{V4}/nvidia/model.py", changed, "changed")
    ]
    assert {(d.plugin_symbol, d.how) for d in moe.dependent_plugin_symbols} == {
        ("vllm_metax.models.deepseek_v4.model:DeepseekV4MoE.__init__", "copy"),
        ("vllm_metax.layers.maca_moe:MacaMoE", "subclass"),
        ("vllm_metax.layers.maca_moe:MacaMoE", "importer"),
        ("vllm_metax.layers.maca_moe:build_moe", "importer"),
        ("vllm_metax.patch.moe_patch", "module_importer"),
        ("vllm_metax.patch.moe_patch:maca_moe_init", "patch"),
    }
    assert {d.upstream_symbol for d in moe.dependent_plugin_symbols} == {changed}
    after = by_sha(listed)[workspace["shas"]["after_move"]]
    assert [(c.symbol, c.change) for c in after.changed_symbols] == [
        ("vllm.models.deepseek_v4.nvidia.attention:dsv4_backend_name", "added")
    ]


def test_dependencies_widen_the_mapped_files(workspace: dict[str, Any]) -> None:
    wide = run(workspace, base="v0.33.0", include_dependencies=True, limit=50)
    moe = by_sha(wide)[workspace["shas"]["moe"]]
    assert moe.files.mapped == [LAYERNORM, f"{V4}/nvidia/model.py"] and moe.files.production == []
    assert ("vllm.model_executor.layers.layernorm:rms_norm_eps_floor", "added") in {
        (c.symbol, c.change) for c in moe.changed_symbols
    }
    names = {sha: name for name, sha in workspace["shas"].items()}
    assert {names[c.sha] for c in wide.commits} == {"moe", "before_move", "move", "after_move", "ernie"}


def patch_pages(ws: dict[str, Any], **arguments: Any) -> list[Any]:
    """Every page of a patch, following next_step (the same call with the cursor) to the end."""
    pages = [run(ws, **arguments)]
    while pages[-1].next_cursor:
        assert pages[-1].next_step.arguments == {
            "plugin_repo": "plugin",
            "paths": FILES,
            **arguments,
            "cursor": pages[-1].next_cursor,
        }
        pages.append(call(ws, tool.SPEC, pages[-1].next_step.arguments))
    assert all(len(text_of(page)) <= RESULT_BUDGET for page in pages)
    return pages


def test_patch_on_request_is_paged(workspace: dict[str, Any]) -> None:
    sha = workspace["shas"]["moe"]
    (mapped,) = patch_pages(workspace, base="v0.33.0", commit=sha[:10], patch="mapped", limit=tool.MAX_LIMIT)
    assert [c.sha for c in mapped.commits] == [sha] and mapped.next_cursor is None
    assert f"diff --git a/{V4}/nvidia/model.py b/{V4}/nvidia/model.py" in mapped.patch
    assert "+        self.expert_bias = None" in mapped.patch and not any(LAYERNORM in line for line in mapped.patch)
    pages = patch_pages(workspace, base="v0.33.0", commit=sha, patch="all", limit=tool.MAX_LIMIT)
    whole = [line for page in pages for line in page.patch]
    assert any(line.startswith(f"diff --git a/{LAYERNORM}") for line in whole) and len(whole) == pages[0].total
    assert [len(page.commits) for page in pages] == [1] + [0] * (len(pages) - 1)  # the commit's row once
    first = run(workspace, base="v0.33.0", commit=sha, patch="all", limit=5)
    second = run(workspace, base="v0.33.0", commit=sha, patch="all", limit=5, cursor=first.next_cursor)
    assert first.patch + second.patch == whole[:10] and first.total == len(whole)
    with pytest.raises(ToolFailure) as refused:
        run(workspace, base="v0.33.0", commit=workspace["shas"]["docs_only"])
    assert refused.value.code.value == "not_found"


def test_default_pages_stay_small(workspace: dict[str, Any]) -> None:
    first = run(workspace, releases=RELEASES)
    assert len(first.commits) <= DEFAULT_LIMITS["commits"] and len(text_of(first)) <= RESULT_BUDGET


def entry(ws: dict[str, Any], commit: str, file: str, **extra: Any) -> dict[str, Any]:
    upstream_line = {"kind": "file", "path": f"{V4}/nvidia/model.py", "line": 207, "rev": ws["shas"]["moe"]}
    return {
        "commit": ws["shas"][commit],
        "file": file,
        "disposition": "merge",
        "local_edit": True,
        "affected_interface": "DeepseekV4MoE.__init__ sets expert_bias",
        "plugin_symbols": ["vllm_metax.models.deepseek_v4.model:DeepseekV4MoE.__init__"],
        "evidence": [upstream_line, {"kind": "note", "text": "copy needs the new attribute"}],
        **extra,
    }


def test_refusals_are_precise(workspace: dict[str, Any]) -> None:
    model = f"{PKG}/model.py"
    cases = {
        "note": entry(workspace, "moe", model, evidence=[{"kind": "note", "text": "the title says MoE"}]),
        "own_commit": entry(workspace, "moe", model, evidence=[{"kind": "commit", "sha": workspace["shas"]["moe"]}]),
        "no_line": entry(
            workspace,
            "moe",
            model,
            evidence=[{"kind": "file", "path": f"{V4}/nvidia/model.py", "line": 99999, "rev": "main"}],
        ),
        "no_path": entry(
            workspace, "moe", model, evidence=[{"kind": "file", "path": f"{V4}/attention.py", "line": 1, "rev": "main"}]
        ),
        "evidence_outside": entry(
            workspace, "moe", model, evidence=[{"kind": "commit", "sha": workspace["shas"]["v0.33.0"]}]
        ),
        "entry_outside": entry(workspace, "v0.33.0", "vllm_metax/models/ernie45.py", plugin_symbols=[]),
        "no_result": entry(
            workspace, "moe", model, evidence=[{"kind": "tool_result", "result_id": "r-0123456789abcdef01234567"}]
        ),
        "no_symbol": entry(workspace, "moe", model, plugin_symbols=["vllm_metax.models.deepseek_v4.model:NoSuchClass"]),
        "not_audited": entry(workspace, "moe", "vllm_metax/layers/maca_moe.py"),
    }
    result = run(workspace, action="record", base="v0.33.0", entries=list(cases.values()))
    answers = dict(zip(cases, result.results, strict=True))
    assert not any(r.accepted for r in result.results)
    assert "a note alone is not evidence" in answers["note"].error
    assert "the entry's own commit is what is being judged" in answers["own_commit"].error
    assert "line 99999 does not exist" in answers["no_line"].error
    assert answers["no_path"].code == "not_found" and "does not exist at main" in answers["no_path"].error  # moved away
    assert "is not in the range v0.33.0..main" in answers["evidence_outside"].error
    assert "outside vllm_metax/models/ernie45.py's range" in answers["entry_outside"].error
    assert answers["no_result"].code == "not_found"
    assert "defines no NoSuchClass" in answers["no_symbol"].error
    assert "not an audited file" in answers["not_audited"].error
    assert run(workspace, action="status").summary.with_entry == 0


def test_a_full_batch_is_answered_within_the_budget(workspace: dict[str, Any]) -> None:
    """MAX_ENTRIES refused entries: the answers go in order while they fit, the counts cover them all."""
    note = entry(workspace, "moe", f"{PKG}/model.py", evidence=[{"kind": "note", "text": "the title says MoE"}])
    result = run(workspace, action="record", base="v0.33.0", entries=[note] * tool.MAX_ENTRIES)
    assert len(text_of(result)) <= RESULT_BUDGET and (result.total, result.accepted) == (tool.MAX_ENTRIES, 0)
    assert [r.index for r in result.results] == list(range(len(result.results))) and result.results
    assert all("a note alone is not evidence" in (r.error or "") for r in result.results)
    assert result.next_step is not None and call(workspace, tool.SPEC, result.next_step.arguments).action == "status"


def test_batch_record_answers_each_entry_and_survives_a_restart(workspace: dict[str, Any]) -> None:
    shas = workspace["shas"]
    attention = f"{PKG}/attention.py"
    plugin_line = {"kind": "file", "path": attention, "line": 1, "rev": "HEAD"}
    entries = [
        entry(workspace, "moe", f"{PKG}/model.py"),
        entry(workspace, "docs_only", f"{PKG}/model.py", evidence=[{"kind": "note", "text": "docs"}]),
        {
            **entry(workspace, "move", attention),
            "disposition": "inherited",
            "local_edit": False,
            "plugin_symbols": [],
            "affected_interface": "module path only",
            "evidence": [plugin_line, {"kind": "commit", "sha": shas["before_move"][:12]}],
        },
    ]
    result = run(workspace, action="record", releases=RELEASES, entries=entries)
    assert [(r.index, r.accepted, r.code) for r in result.results] == [
        (0, True, None),
        (1, False, "bad_input"),
        (2, True, None),
    ]
    keys = {f"{shas['moe']} {PKG}/model.py", f"{shas['move']} {attention}"}
    assert (
        set(json.loads((workspace["root"] / "state" / "ledgers" / f"{result.ledger_id}.json").read_text())["entries"])
        == keys
    )
    # a new server on the same state directory: no releases or base needed, the ledger remembers the bases
    later = run(workspace, action="status")
    assert later.summary.model_dump() == {"total": 6, "with_entry": 2, "without_entry": 4}
    counts = {f.local: (f.commits, f.with_entry) for f in later.files}
    assert counts[f"{PKG}/model.py"] == (2, 1) and counts[attention] == (4, 1)

    async def served(uri: str) -> dict[str, Any]:
        runtime = Runtime.create([str(workspace["root"])], state_dir=str(workspace["root"] / "state"))
        async with Client(build_server(runtime), mode="auto") as client:
            return json.loads((await client.read_resource(uri)).contents[0].text)

    assert later.ledger_uri == f"vllm-metax://ledgers/{result.ledger_id}"
    assert set(anyio.run(served, later.ledger_uri)["entries"]) == keys
    listed = by_sha(run(workspace, limit=50))
    assert [e.disposition for e in listed[shas["move"]].entries] == ["inherited"]
    assert listed[shas["move"]].entries[0].evidence[1].sha == shas["before_move"]  # stored resolved


def test_plugin_commits_get_their_own_entries(workspace: dict[str, Any]) -> None:
    """A decision on a plugin commit (side=plugin) lies in local_range and names a file the commit
    touched: the fixture's last plugin commit added vllm_metax/layers/maca_moe.py."""
    plugin = workspace["plugin"]
    head = git(plugin, "rev-parse", "HEAD").strip()
    moe = "vllm_metax/layers/maca_moe.py"
    plugin_line = {"kind": "file", "path": moe, "line": 1, "rev": "HEAD"}
    mine = {**entry(workspace, "moe", moe), "commit": head[:12], "side": "plugin", "plugin_symbols": []}
    mine["evidence"] = [plugin_line]
    cases = [
        mine,
        {**mine, "file": f"{PKG}/model.py"},  # a file the commit did not touch
        {**mine, "commit": git(plugin, "rev-parse", "HEAD~1").strip()},  # outside HEAD~1..HEAD
    ]
    result = run(workspace, action="record", releases=RELEASES, local_range="HEAD~1..HEAD", entries=cases)
    assert [(r.accepted, r.code) for r in result.results] == [(True, None), (False, "bad_input"), (False, "bad_input")]
    assert "did not touch" in (result.results[1].error or "")
    assert "not in the plugin range HEAD~1..HEAD" in (result.results[2].error or "")
    stored = json.loads((workspace["root"] / "state" / "ledgers" / f"{result.ledger_id}.json").read_text())
    assert stored["local_entries"][f"{head} {moe}"]["side"] == "plugin"
    assert all(e.get("side", "upstream") == "upstream" for e in stored["entries"].values())
    # without the range a plugin-side entry cannot be checked
    refused = run(workspace, action="record", releases=RELEASES, entries=[mine])
    assert refused.results[0].code == "bad_input" and "needs local_range" in (refused.results[0].error or "")


def test_recording_needs_a_confirmed_target(workspace: dict[str, Any]) -> None:
    other = workspace["root"] / "state-unconfirmed"
    call(
        workspace,
        environment_tool.SPEC,
        {
            "action": "establish",
            "plugin_repo": "plugin",
            "upstream": "vllm",
            "target": "main",
            "python": str(workspace["python"]),
        },
        state=other.name,
    )
    for action, extra in (
        ("record", {"entries": [entry(workspace, "moe", f"{PKG}/model.py")]}),
        ("baseline", {}),
        (
            "annotate",
            {
                "entries": [
                    {
                        "node": "vllm.model_executor.layers.layernorm",
                        "disposition": "inherited",
                        "evidence": [{"kind": "test", "name": "t", "outcome": "passed"}],
                    }
                ]
            },
        ),
    ):
        with pytest.raises(ToolFailure) as refused:
            call(
                workspace,
                tool.SPEC,
                {"plugin_repo": "plugin", "paths": FILES, "base": "v0.33.0", "action": action, **extra},
                state=other.name,
            )
        assert refused.value.code.value == "target_unconfirmed", action
    assert (
        run(workspace, action="status", state=other.name, base="v0.33.0").summary.total == 5
    )  # reading needs no confirmation


def test_annotations_check_their_node(workspace: dict[str, Any]) -> None:
    evidence = [{"kind": "file", "path": LAYERNORM, "line": 1, "rev": "main"}]
    result = run(
        workspace,
        action="annotate",
        entries=[
            {"node": "vllm.model_executor.layers.layernorm:RMSNorm", "disposition": "inherited", "evidence": evidence},
            {"node": "vllm.model_executor.layers.no_such_module", "disposition": "inherited", "evidence": evidence},
            {
                "node": "torch",
                "disposition": "platform_specific",
                "evidence": [{"kind": "test", "name": "probe", "outcome": "passed"}],
            },
        ],
    )
    assert [(r.accepted, r.code) for r in result.results] == [(True, None), (False, "not_found"), (True, None)]
    arguments = {"plugin_repo": "plugin", "arch": "DeepseekV4ForCausalLM", "depth": 2, "limit": 1000}
    arguments |= {"view": "full", "section": "inventory"}
    rows, cursor = {}, None
    while "torch" not in rows:  # the inventory pages by size: follow it to the row
        traced = call(workspace, trace_tool.SPEC, {**arguments, **({"cursor": cursor} if cursor else {})}, "state")
        rows |= {r.name: r for r in traced.inventory}
        assert traced.next_cursor or "torch" in rows
        cursor = traced.next_cursor
    assert rows["torch"].annotation.startswith("platform_specific")


def test_recheck_reports_a_difference_until_the_baseline_or_an_entry_explains_it(workspace: dict[str, Any]) -> None:
    shutil.copytree(workspace["plugin"], workspace["root"] / "plugin2")
    confirm(workspace, "plugin2")
    args = {"plugin_repo": "plugin2", "releases": RELEASES, "limit": 500}
    before = run(workspace, action="recheck", **args)
    assert before.unaccounted and all(u.reason.startswith("no baseline was taken") for u in before.unaccounted)
    assert not before.complete
    baseline = run(workspace, action="baseline", plugin_repo="plugin2", releases=RELEASES)
    assert baseline.baseline_rows == before.total == sum(baseline.matrix_counts.values())
    clean = run(workspace, action="recheck", plugin_repo="plugin2", limit=500)
    assert clean.unaccounted == [] and not clean.complete  # every commit still needs an entry
    # the plugin adopts upstream's MoE change: a difference the baseline no longer explains
    model = workspace["root"] / "plugin2" / PKG / "model.py"
    text = model.read_text()
    at = text.index("        super().__init__()\n", text.index("class DeepseekV4MoE(")) + len(
        "        super().__init__()\n"
    )
    model.write_text(text[:at] + "        self.expert_bias = None\n" + text[at:])
    edited = run(workspace, action="recheck", plugin_repo="plugin2", limit=500)
    found = {(u.local, u.symbol): u for u in edited.unaccounted}
    assert set(found) == {(f"{PKG}/model.py", "DeepseekV4MoE.__init__")}
    moe = found[(f"{PKG}/model.py", "DeepseekV4MoE.__init__")]
    assert "changed since it was taken" in moe.reason and workspace["shas"]["moe"] in moe.commits
    record = run(
        workspace,
        action="record",
        plugin_repo="plugin2",
        entries=[entry(workspace, "moe", f"{PKG}/model.py", plugin_symbols=[])],
    )
    assert record.results[0].accepted
    explained = run(workspace, action="recheck", plugin_repo="plugin2", limit=500)
    assert explained.unaccounted == []
    exported = run(workspace, action="export", plugin_repo="plugin2")
    state = workspace["root"] / "state"
    markdown = (state / exported.export.markdown_path).read_text()  # written there, not repeated in the result
    document = json.loads((state / exported.export.json_path).read_text())
    assert workspace["shas"]["moe"][:12] in markdown and "| merge | yes |" in markdown
    assert document["summary"]["with_entry"] == 1 and exported.complete is False
    # complete only once every (commit, file) has a decision and nothing is unaccounted
    missing = [(m["commit"], f) for m in document["missing"] for f in m["files"]]
    assert len(missing) == exported.export.missing == 7  # 8 (commit, file) pairs over 6 commits, one recorded
    assert exported.next_step is not None and exported.next_step.arguments["action"] == "list"
    rest = [
        {
            "commit": c,
            "file": f,
            "disposition": "inherited",
            "local_edit": False,
            "affected_interface": "none",
            "evidence": [{"kind": "test", "name": "tests/models/test_v4.py::test_load", "outcome": "passed"}],
        }
        for c, f in missing
    ]
    assert all(r.accepted for r in run(workspace, action="record", plugin_repo="plugin2", entries=rest).results)
    done = run(workspace, action="recheck", plugin_repo="plugin2")
    assert done.complete and done.summary.without_entry == 0 and done.unaccounted == []
