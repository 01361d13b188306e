"""port_model on a real vendor plugin: vllm-ascend at 351879064c (its Dockerfile:44 pins VLLM_TAG v0.26.0)
carried onto the real upstream v0.27.1, with v0.25.0 and v0.26.0 as the releases its forks may come from.

One call of the tool (through `dispatch.invoke`, in its worker process) over `vllm_ascend/models/`;
every test reads what it wrote. The reference is `git merge-file` on the same three inputs (the plugin
file, the base the report names, the target's counterpart), run here with no git configuration; the
vendor's own port to v0.27.1 is vllm-ascend at b4b04c5eb1 (its Dockerfile:44 pins VLLM_TAG v0.27.1).
Expected values are read from the real code; each names its evidence as file:line (a plugin path is
in the 351879064c snapshot, a `vllm/` path in the upstream release named beside it).
"""

from __future__ import annotations

import ast
import builtins
import difflib
import json
import os
import subprocess
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_real_plugins import PLUGINS, needs_snapshots, snapshot_repo
from workbench import build_upstream_history

from vllm_metax_mcp.tools import port_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), needs_snapshots]

VERSIONS = ["0.25.0", "0.26.0", "0.27.1"]
TARGET = "v0.27.1"
RELEASES = ["v0.25.0", "v0.26.0"]
PATHS = ["vllm_ascend/models/"]
FORK = "vllm-ascend-351879064c.tar.gz"
VENDOR = "vllm-ascend-b4b04c5eb1.tar.gz"
WRITTEN = ("ported", "conflicts", "unverified")
MARKER = "# <<<<<<< port_model conflict "
COMMENTED = "# |"
MTP = "vllm_ascend/models/deepseek_mtp.py"
V4 = "vllm_ascend/models/deepseek_v4.py"
V4_MTP = "vllm_ascend/models/deepseek_v4_mtp.py"
DSPARK = "vllm_ascend/models/qwen3_dspark.py"
DSPARK_V4 = "vllm_ascend/models/deepseek_v4_dspark.py"


@dataclass(frozen=True)
class Ported:
    """The inputs and what the one call wrote."""

    upstream: Path
    """The upstream history (one commit per release, tagged)."""
    repo: Path
    """The plugin snapshot (a git repository)."""
    output: Path
    report: dict[str, Any]
    result: Any
    home: Path
    """An empty HOME for git with no configuration."""

    @property
    def written(self) -> list[dict[str, Any]]:
        return [e for e in self.report["files"] if e["status"] in WRITTEN]

    def entry(self, local: str) -> dict[str, Any]:
        (found,) = [e for e in self.report["files"] if e["local"] == local]
        return found

    def local(self, local: str) -> str:
        return (self.repo / local).read_text()

    def out(self, local: str) -> str:
        return (self.output / local).read_text()

    def show(self, spec: str) -> str:
        return clean_git(self.home, self.upstream, "show", spec).stdout

    def base(self, entry: dict[str, Any]) -> str:
        return self.show(f"{entry['base']}:{entry['base_path']}")

    def target(self, entry: dict[str, Any]) -> str:
        return self.show(f"{TARGET}:{entry['upstream']}")


@dataclass(frozen=True)
class Merged:
    text: str
    conflicts: int
    parses: bool


def clean_git(
    home: Path, cwd: Path, *args: str, extra: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """git with no system or user configuration (HOME an empty directory)."""
    done = subprocess.run(["git", *args], cwd=cwd, env=_git_env(home, extra), capture_output=True, text=True)
    if check and done.returncode:
        raise AssertionError(f"git {' '.join(args)} in {cwd}: {done.stderr.strip()}")
    return done


def clean_git_bytes(home: Path, cwd: Path, *args: str, extra: dict[str, str] | None = None) -> bytes:
    """What clean_git prints, as bytes (line endings as they are)."""
    done = subprocess.run(["git", *args], cwd=cwd, env=_git_env(home, extra), capture_output=True, check=True)
    return done.stdout


def _git_env(home: Path, extra: dict[str, str] | None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1"}
    return env | (extra or {})


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True


def markers(text: str) -> int:
    """Conflict blocks as the output file shows them."""
    return sum(1 for line in text.splitlines() if line.lstrip().startswith(MARKER))


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> Ported:
    assert PLUGINS is not None
    root = tmp_path_factory.mktemp("port-real")
    build_upstream_history(root / "vllm", VERSIONS, include=["vllm/"])
    repo = snapshot_repo(PLUGINS / FORK, root / "fork")
    outputs = tmp_path_factory.mktemp("port-real-out")
    runtime = Runtime.create(
        [str(root)], [str(outputs)], mode="edit", state_dir=str(tmp_path_factory.mktemp("port-real-state"))
    )
    arguments = {
        "plugin_repo": str(repo),
        "upstream": str(root / "vllm"),
        "target": TARGET,
        "releases": RELEASES,
        "paths": PATHS,
        "output": str(outputs / "port"),
    }
    env = ToolEnv(runtime=runtime, tool="port_model")
    result = anyio.run(lambda: invoke(tool.SPEC, arguments, env))
    output = outputs / "port"
    report = json.loads((output / "port_report.json").read_text())
    home = tmp_path_factory.mktemp("port-real-home")
    return Ported(root / "vllm", repo, output, report, result, home)


@pytest.fixture(scope="module")
def by_git(ported: Ported, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Merged]]:
    """Per written file: `git merge-file -p` of local, base and target, in its default style ("merge")
    and with `--diff3` (the benchmark's, bench/bench_port_model.py)."""
    work = tmp_path_factory.mktemp("port-real-git")
    merged: dict[str, dict[str, Merged]] = {}
    for entry in ported.written:
        (work / "base").write_text(ported.base(entry))
        (work / "target").write_text(ported.target(entry))
        merged[entry["local"]] = {}
        for style, options in (("merge", []), ("diff3", ["--diff3"])):
            labels = ["-L", "local", "-L", "base", "-L", "target"]
            local = str(ported.repo / entry["local"])
            done = clean_git(ported.home, work, "merge-file", "-p", *options, *labels, local, "base", "target",
                             check=False)  # fmt: skip
            assert 0 <= done.returncode <= 127, done.stderr  # the number of conflicts, capped at 127
            text = done.stdout
            count = sum(1 for line in text.splitlines() if line.startswith("<<<<<<<"))
            merged[entry["local"]][style] = Merged(text, count, parses(text))
    return merged


def test_every_written_file_parses_and_passed_verification(ported: Ported) -> None:
    written = ported.written
    # 14 of the 18 plugin files have an upstream counterpart and a base (port_report.json summary); the
    # other four (models/__init__.py, layer/...) are the plugin's own.
    assert len(written) == 14
    assert sorted(e["local"] for e in ported.report["files"] if e["status"] == "local_only") == [
        "vllm_ascend/models/__init__.py",
        "vllm_ascend/models/layer/__init__.py",
        "vllm_ascend/models/layer/attention/__init__.py",
        "vllm_ascend/models/layer/attention/layer.py",
    ]
    on_disk = sorted(str(p.relative_to(ported.output)) for p in ported.output.rglob("*.py"))
    assert on_disk == sorted(e["local"] for e in written)
    for entry in written:
        ast.parse(ported.out(entry["local"]), filename=entry["local"])
        check = entry["verification"]
        assert check["parses"] and check["error"] is None, entry["local"]
        # every list of problems empty: imports resolve, names bound before use, nothing unaccounted or lost
        problems = {kind: found for kind, found in check.items() if isinstance(found, list) and found}
        assert problems == {}, entry["local"]
        assert check["passed"], entry["local"]
    assert ported.report["summary"]["verified"] == len(written)
    assert sum(e["verification"]["imports_checked"] for e in written) > 0
    assert ported.result.summary == ported.report["summary"]


def test_the_conflicts_the_report_lists_are_the_blocks_the_files_show(ported: Ported) -> None:
    shown = {e["local"]: markers(ported.out(e["local"])) for e in ported.written}
    listed = {e["local"]: len(e["conflicts"]) for e in ported.written}
    assert shown == listed
    assert sum(shown.values()) == ported.report["summary"]["conflicts"]


def test_fewer_conflicts_and_more_parseable_files_than_git_merge_file(
    ported: Ported, by_git: dict[str, dict[str, Merged]]
) -> None:
    ours = {e["local"]: ported.out(e["local"]) for e in ported.written}
    ours_blocks = sum(markers(text) for text in ours.values())
    plain = sum(m["merge"].conflicts for m in by_git.values())
    diff3 = sum(m["diff3"].conflicts for m in by_git.values())
    # measured: port_model 17 blocks in its files; git merge-file -p 50, with --diff3 64 (not zealous then)
    assert ours_blocks < plain
    assert ours_blocks <= 0.6 * plain, (ours_blocks, plain)
    assert ours_blocks <= 0.5 * diff3, (ours_blocks, diff3)
    # measured: all 14 of port_model's outputs parse, 6 of git's (the 6 it merges without a conflict)
    ours_parse = sum(parses(text) for text in ours.values())
    git_parse = sum(m["merge"].parses for m in by_git.values())
    assert ours_parse == len(ours)
    assert git_parse <= ours_parse - 5, (git_parse, ours_parse)
    # where git merges cleanly, port_model finds no conflict either
    clean = [local for local, m in by_git.items() if m["merge"].conflicts == 0]
    assert clean and all(markers(ours[local]) == 0 for local in clean), clean


def _import_lines(text: str) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return found


def _code_lines(text: str) -> list[str]:
    """Stripped lines, blank lines and the lines of import statements left out."""
    imports = _import_lines(text)
    return [line.strip() for n, line in enumerate(text.splitlines(), 1) if line.strip() and n not in imports]


def _present(text: str) -> Counter[str]:
    """The output's stripped lines, active or commented in a conflict block (`# | ` + the target's line)."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(COMMENTED):
            stripped = stripped[len(COMMENTED) :].strip()
        if stripped:
            found[stripped] += 1
    return found


def test_no_line_the_fork_added_is_lost(ported: Ported) -> None:
    """Every line the local file added or changed against its base (difflib over stripped lines, blank and
    import lines left out) is in the output as often as the local file added it."""
    lost: dict[str, list[str]] = {}
    added_in_all = 0
    for entry in ported.written:
        base, local = _code_lines(ported.base(entry)), _code_lines(ported.local(entry["local"]))
        added: Counter[str] = Counter()
        for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, base, local, autojunk=False).get_opcodes():
            if tag in ("insert", "replace"):
                added.update(local[j1:j2])
        added_in_all += sum(added.values())
        present = _present(ported.out(entry["local"]))
        missing = [line for line, count in added.items() if present[line] < count]
        if missing:
            lost[entry["local"]] = missing[:5]
    assert lost == {}
    assert added_in_all > 4000  # measured 4856: the check is not vacuous


def _classes(text: str) -> list[str]:
    return [n.name for n in ast.parse(text).body if isinstance(n, ast.ClassDef)]


def _imported(text: str) -> dict[str, tuple[int, str]]:
    """Bound name -> (relative level, module) of the module-level `from` imports."""
    found: dict[str, tuple[int, str]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom):
            found.update({a.asname or a.name: (node.level, node.module or "") for a in node.names})
    return found


def _keys(actions: list[str]) -> set[str]:
    return {shown.split(" (", 1)[0] for shown in actions}


def test_an_extension_leaves_upstreams_classes_upstream(ported: Ported) -> None:
    local = ported.local(MTP).splitlines()
    # deepseek_mtp.py:7 imports the upstream class, :16 extends it: the file reuses its counterpart module
    assert local[6] == "from vllm.model_executor.models.deepseek_mtp import DeepSeekMTP"
    assert local[15] == "class AscendDeepSeekMTP(DeepSeekMTP):"
    entry = ported.entry(MTP)
    assert entry["upstream"] == "vllm/model_executor/models/deepseek_mtp.py"
    target = ported.target(entry)
    lines = target.splitlines()
    # v0.27.1 deepseek_mtp.py:47, :67, :137, :230: the counterpart's own classes
    assert [lines[46], lines[66], lines[136], lines[229]] == [
        "class SharedHead(nn.Module):",
        "class DeepSeekMultiTokenPredictorLayer(nn.Module):",
        "class DeepSeekMultiTokenPredictor(nn.Module):",
        "class DeepSeekMTP(nn.Module, DeepseekV2MixtureOfExperts):",
    ]
    upstream_classes = _classes(target)
    assert upstream_classes == ["SharedHead", "DeepSeekMultiTokenPredictorLayer", "DeepSeekMultiTokenPredictor",
                                "DeepSeekMTP"]  # fmt: skip

    out = ported.out(MTP)
    assert "class DeepSeekMultiTokenPredictorLayer" not in out
    assert _classes(out) == ["AscendDeepSeekMTP", "AscendGlmMoeDsaForCausalLM"]  # the local file's (:16, :52)
    assert "class AscendDeepSeekMTP(DeepSeekMTP):" in out.splitlines()
    assert _imported(out)["DeepSeekMTP"] == (0, "vllm.model_executor.models.deepseek_mtp")
    upstream_only = entry["symbols"]["upstream_only"]
    assert {f"class:{name}" for name in upstream_classes} <= _keys(upstream_only)
    assert all(shown.endswith("(the local file imports from the upstream module)") for shown in upstream_only)


def _methods(node: ast.ClassDef) -> dict[str, str]:
    return {n.name: ast.dump(n) for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _inherited_copies(local: str, target: str, output: str, counterpart: str) -> list[str]:
    """Methods an output class has that its local class does not, equal to the method of the counterpart's
    class it extends (imported from `counterpart`): code the subclass inherits anyway."""
    tree = ast.parse(local)
    imported = {
        alias.asname or alias.name: alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == counterpart
        for alias in node.names
    }
    upstream = {n.name: n for n in ast.parse(target).body if isinstance(n, ast.ClassDef)}
    own = {n.name: _methods(n) for n in tree.body if isinstance(n, ast.ClassDef)}
    copies: list[str] = []
    for node in ast.parse(output).body:
        if not isinstance(node, ast.ClassDef) or node.name not in own:
            continue
        extended = [imported[b.id] for b in node.bases if isinstance(b, ast.Name) and imported.get(b.id) in upstream]
        for name, code in _methods(node).items():
            copies += [f"{node.name}.{name} = {e}.{name}" for e in extended
                       if name not in own[node.name] and _methods(upstream[e]).get(name) == code]  # fmt: skip
    return copies


def test_an_extension_does_not_copy_what_its_classes_inherit(ported: Ported) -> None:
    """E.g. llama_eagle3_vwn.py imports `LlamaDecoderLayer as Eagle3LlamaDecoderLayer` from upstream's
    llama_eagle3 and extends it; v0.27.1 llama_eagle3.py:35 defines that class, :74 its get_quant_config."""
    found: dict[str, list[str]] = {}
    for entry in ported.written:
        counterpart = entry["upstream"].removesuffix(".py").replace("/", ".")
        texts = ported.local(entry["local"]), ported.target(entry), ported.out(entry["local"])
        copies = _inherited_copies(*texts, counterpart)
        if copies:
            found[entry["local"]] = copies
    assert found == {}


def _too_early(text: str) -> list[tuple[int, str]]:
    """(line, name) of each name a module-level class or function statement evaluates when the module runs
    (decorators, bases, class keywords; not inside lambdas or comprehensions) that no statement above binds."""
    bound = set(dir(builtins))
    early: list[tuple[int, str]] = []
    for statement in ast.parse(text).body:
        evaluated: list[ast.expr] = []
        if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            evaluated += statement.decorator_list
        if isinstance(statement, ast.ClassDef):
            evaluated += [*statement.bases, *(k.value for k in statement.keywords)]
        for name in _loaded(evaluated):
            if name.id not in bound:
                early.append((name.lineno, name.id))
        if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            bound.add(statement.name)
            continue
        for node in ast.walk(statement):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
    return early


def _loaded(expressions: list[ast.expr]) -> Iterator[ast.Name]:
    scopes = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    stack: list[ast.AST] = list(expressions)
    while stack:
        node = stack.pop()
        if isinstance(node, scopes):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def test_module_level_names_are_bound_before_the_module_uses_them(ported: Ported) -> None:
    """E.g. deepseek_mtp.py:52 `class AscendGlmMoeDsaForCausalLM(GlmMoeDsaForCausalLM)` needs its import (:8) above
    it; the target's counterpart of that import (v0.27.1 deepseek_mtp.py:34, `from .deepseek_v2 import`) comes
    after `from vllm.sequence import` (:32), the local unit the local classes follow: placed by the target's order
    alone, the classes land between the two (an earlier port_model did so: NameError on import)."""
    for entry in ported.written:  # the local files themselves bind before use
        assert _too_early(ported.local(entry["local"])) == [], entry["local"]
    early = {e["local"]: _too_early(ported.out(e["local"])) for e in ported.written}
    assert {local: names for local, names in early.items() if names} == {}


def test_a_vendor_rename_is_applied_to_the_target_class(ported: Ported) -> None:
    entry = ported.entry(V4)
    assert (entry["base"], entry["base_path"]) == ("v0.26.0", "vllm/models/deepseek_v4/nvidia/model.py")
    rule = {"kind": "rename", "upstream": "DeepseekV4ForCausalLM", "local": "AscendDeepseekV4ForCausalLM"}
    assert {**rule, "evidence": f"{V4}:1235"} in entry["contract"]["rules"]
    # deepseek_v4.py:1235 defines the Ascend class; v0.26.0 model.py:1385 the upstream one it stands for
    assert ported.local(V4).splitlines()[1234].startswith("class AscendDeepseekV4ForCausalLM(nn.Module, SupportsPP,")
    base = ported.base(entry)
    assert base.splitlines()[1384] == "class DeepseekV4ForCausalLM("
    assert "DeepseekV4ForCausalLM" not in _classes(ported.local(V4))
    assert "AscendDeepseekV4ForCausalLM" not in base
    # v0.27.1 model.py:1457: the target still defines it under its own name
    assert ported.target(entry).splitlines()[1456] == "class DeepseekV4ForCausalLM("
    applied = [a for a in entry["contract"]["applied"] if {k: a[k] for k in rule} == rule]
    assert len(applied) == 1 and "class:DeepseekV4ForCausalLM" in applied[0]["units"]
    classes = _classes(ported.out(V4))
    assert "AscendDeepseekV4ForCausalLM" in classes and "DeepseekV4ForCausalLM" not in classes


def test_a_vendor_import_swap_holds_in_the_output(ported: Ported) -> None:
    entry = ported.entry(V4_MTP)
    assert (entry["base"], entry["base_path"]) == ("v0.26.0", "vllm/models/deepseek_v4/nvidia/mtp.py")
    swap = {"kind": "import_swap", "upstream": "vllm.model_executor.models.deepseek_v2", "local": ".deepseek_v4"}
    assert {**swap, "evidence": f"{V4_MTP}:28"} in entry["contract"]["rules"]
    assert any({k: a[k] for k in swap} == swap for a in entry["contract"]["applied"])
    line = "from vllm.model_executor.models.deepseek_v2 import get_spec_layer_idx_from_weight_name"
    # v0.26.0 mtp.py:42 and v0.27.1 mtp.py:47 import it from deepseek_v2; deepseek_v4_mtp.py:28-33 from
    # the plugin's .deepseek_v4, which defines it (deepseek_v4.py:300)
    assert ported.base(entry).splitlines()[41] == line
    assert ported.target(entry).splitlines()[46] == line
    local = ported.local(V4_MTP).splitlines()
    assert (local[27], local[31]) == ("from .deepseek_v4 import (", "    get_spec_layer_idx_from_weight_name,")
    assert ported.local(V4).splitlines()[299].startswith("def get_spec_layer_idx_from_weight_name(")
    out = ported.out(V4_MTP)
    assert _imported(out)["get_spec_layer_idx_from_weight_name"] == (1, "deepseek_v4")
    modules = {n.module for n in ast.walk(ast.parse(out)) if isinstance(n, ast.ImportFrom)}
    assert "vllm.model_executor.models.deepseek_v2" not in modules
    # the local file dropped that statement (the name moved into :28-33): a decision, not a conflict
    key = "from:vllm.model_executor.models.deepseek_v2"
    assert key in _keys(entry["symbols"]["removed_local"])
    assert key not in [c["key"] for c in entry["conflicts"]]


def test_an_import_upstream_did_not_change_is_said_unchanged(ported: Ported) -> None:
    removed = ported.entry(V4_MTP)["symbols"]["removed_local"]
    (shown,) = [s for s in removed if s.startswith("from:vllm.model_executor.models.deepseek_v2 (")]
    assert shown.endswith("(the local file removed it; upstream did not change it)")


def _relative(text: str) -> set[tuple[int, str]]:
    return {(n.level, n.module or "") for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.level}


def test_upstream_relative_imports_are_made_absolute(ported: Ported) -> None:
    """Upstream's `from .x import` read from upstream's package; in the plugin's tree they must name it."""
    with_relative = []
    for entry in ported.written:
        target = ported.target(entry)
        if _relative(target):
            with_relative.append(entry["local"])
        # the output's relative imports are the local file's own (deepseek_v4_mtp.py:28), none of the target's
        assert _relative(ported.out(entry["local"])) <= _relative(ported.local(entry["local"])), entry["local"]
    assert len(with_relative) >= 6  # measured 8 of the 14 targets
    # v0.27.1 dspark.py:51 `from .model import (` (v0.26.0 dspark.py:44 imported fewer names): the local file
    # has no such import, the output keeps the target's in a conflict block, spelled from upstream's package
    # (as `.model` it would read vllm_ascend/models/model.py, which does not exist)
    entry = ported.entry(DSPARK_V4)
    assert ported.target(entry).splitlines()[50] == "from .model import ("
    assert ported.base(entry).splitlines()[43] == "from .model import ("
    (conflict,) = [c for c in entry["conflicts"] if c["key"] == "from:vllm.models.deepseek_v4.nvidia.model"]
    assert conflict["local"] == "" and "from vllm.models.deepseek_v4.nvidia.model import (" in conflict["target"]
    out = ported.out(DSPARK_V4)
    assert "# | from vllm.models.deepseek_v4.nvidia.model import (" in out.splitlines()
    assert "from .model import" not in out
    assert not (ported.repo / "vllm_ascend/models/model.py").exists()


def _vendor_bytes(path: str) -> bytes:
    assert PLUGINS is not None
    with tarfile.open(PLUGINS / VENDOR) as opened:
        member = opened.extractfile(f"vllm-ascend/{path}")
        assert member is not None
        return member.read()


def _vendor(path: str) -> str:
    """The vendor's file as text, its line endings read as `\\n` (as Path.read_text reads them)."""
    return "\n".join(_vendor_bytes(path).decode().splitlines()) + "\n"


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False).ratio()


def test_the_vendors_port_to_the_target_kept_the_models_as_they_were(ported: Ported) -> None:
    """b4b04c5eb1 is the vendor's move to v0.27.1 (Dockerfile:44 there; v0.26.0 in 351879064c): it changed other
    parts of the plugin and no file under vllm_ascend/models/, so closeness to it is closeness to the fork."""
    fork_docker, vendor_docker = ported.local("Dockerfile").splitlines(), _vendor("Dockerfile").splitlines()
    assert (fork_docker[43], vendor_docker[43]) == ("ARG VLLM_TAG=v0.26.0", "ARG VLLM_TAG=v0.27.1")
    assert ported.report["files"]
    for entry in ported.report["files"]:
        assert _vendor_bytes(entry["local"]) == (ported.repo / entry["local"]).read_bytes(), entry["local"]


@pytest.mark.parametrize(
    ("local", "evidence", "ours_at_least", "git_at_most"),
    [
        # qwen3_dspark.py:7 imports upstream's Qwen3DSparkForCausalLM, :56 extends it; upstream changed that
        # module (DSparkMarkovHead, a quantization import): the changes reach the plugin by import
        # (measured: port_model 99%, git merge-file 77%, 65% with --diff3)
        pytest.param(
            DSPARK,
            {
                7: "from vllm.model_executor.models.qwen3_dspark import Qwen3DSparkForCausalLM",
                56: "class AscendQwen3DSparkForCausalLM(Qwen3DSparkForCausalLM):",
            },
            0.97,
            0.85,
            id="qwen3_dspark",
        ),
        # deepseek_mtp.py:16 extends upstream's DeepSeekMTP, whose load_weights upstream changed; the override
        # (:36) delegates to it (:43) (measured: port_model 98%, git merge-file 21%, 12% with --diff3)
        pytest.param(
            MTP,
            {
                16: "class AscendDeepSeekMTP(DeepSeekMTP):",
                43: "        return super().load_weights(weights_mapper.apply(weights))",
            },
            0.95,
            0.4,
            id="deepseek_mtp",
        ),
    ],
)
def test_an_extension_ported_as_the_vendor_did_where_git_does_not(
    ported: Ported,
    by_git: dict[str, dict[str, Merged]],
    local: str,
    evidence: dict[int, str],
    ours_at_least: float,
    git_at_most: float,
) -> None:
    vendor = _vendor(local)
    assert {n: vendor.splitlines()[n - 1] for n in evidence} == evidence
    entry = ported.entry(local)
    assert entry["upstream_changed"] and entry["status"] == "ported" and entry["conflicts"] == []
    out = ported.out(local)
    # the vendor's lines, no more and no fewer (their order and blank lines aside)
    assert Counter(line for line in out.splitlines() if line.strip()) == Counter(
        line for line in vendor.splitlines() if line.strip()
    )
    assert _similarity(out, vendor) >= ours_at_least
    git = by_git[local]
    for style in ("merge", "diff3"):
        assert _similarity(git[style].text, vendor) <= git_at_most, style
        assert git[style].conflicts >= 1 and not git[style].parses, style


def test_the_output_keeps_the_local_files_line_endings(ported: Ported) -> None:
    crlf = [e["local"] for e in ported.written if b"\r\n" in (ported.repo / e["local"]).read_bytes()]
    assert crlf == ["vllm_ascend/models/llama_eagle3_vwn.py"]  # the one CRLF file under models/ (`file` says so)
    for local in crlf:
        out = (ported.output / local).read_bytes()
        assert out.count(b"\r\n") == out.count(b"\n"), local


def test_the_output_directory_and_its_patch(ported: Ported, tmp_path: Path) -> None:
    names = sorted(p.name for p in ported.output.iterdir())
    assert names == ["PORT_REPORT.md", "port.patch", "port_report.json", "vllm_ascend"]
    text = (ported.output / "port_report.json").read_text()
    first = next(iter(json.loads(text)))
    assert first == "format" and ported.report["format"].startswith("vllm-metax-mcp/port-report/")
    assert ported.report["target"].startswith(TARGET)
    assert ported.result.report.endswith("/port_report.json")
    markdown = (ported.output / "PORT_REPORT.md").read_text()
    assert all(f"| {e['local']} | {e['status']} |" in markdown for e in ported.report["files"])

    patch = ported.output / "port.patch"
    clean_git(ported.home, ported.repo, "apply", "--check", str(patch))
    # applied to a copy of the snapshot's index (the repository's own index and files stay as they are)
    index = {"GIT_INDEX_FILE": str(tmp_path / "index")}
    clean_git(ported.home, ported.repo, "read-tree", "HEAD", extra=index)
    clean_git(ported.home, ported.repo, "apply", "--cached", str(patch), extra=index)
    changed = clean_git(ported.home, ported.repo, "diff", "--cached", "--name-only", "HEAD", extra=index).stdout.split()
    assert changed, "the patch changes nothing"
    for entry in ported.written:
        applied = clean_git_bytes(ported.home, ported.repo, "show", f":{entry['local']}", extra=index)
        assert applied == (ported.output / entry["local"]).read_bytes(), entry["local"]
        assert (entry["local"] in changed) == ((ported.repo / entry["local"]).read_bytes() != applied), entry["local"]
    assert clean_git(ported.home, ported.repo, "status", "--porcelain").stdout == ""
