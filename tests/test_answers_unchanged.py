"""The tools' answers on the test workbench and on the real plugins stay exactly the stored ones.

Issue 26 makes the module index lazy and changes the caches; no answer may change with it. Each
scenario below rebuilds a setup of the existing tests (the real plugin snapshots of
test_real_plugins.py and test_real_plugins_audit.py, the workbench of test_trace_dependency.py and
bench/bench_diff_model.py, one real config of test_inspect_config.py), makes the same calls and
compares what comes back with tests/data/answers/, produced by the code before the change
(meta.json names the commit; tests/data/answers/regenerate.py made them and says how to again).

Pages are merged (the paged list concatenated over all pages), so where a size budget cuts a page,
which depends on path lengths, does not matter (later_pages keeps the rest of the pages after the
first, once per distinct content: only whether there is more than one page shows there). Values in
VOLATILE are masked; temporary and cache paths and the shas of commits made at the current time are
replaced by placeholders; everything else compares exactly.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_inspect_config import deepseek_v4_tensors, fixture, write_model
from test_real_plugins import ARCHIVE, GCU_ARCHIVE, PLUGINS, needs_snapshots, snapshot_repo
from test_trace_dependency import ARCH, PLUGIN_FILES
from workbench import build_plugin_repo, build_upstream_history, cache_root, git, upstream_source

from vllm_metax_mcp.tools import audit_commits, diff_model, inspect_config, plan_trim, trace_dependency
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv, ToolSpec

ANSWERS = Path(__file__).resolve().parent / "data" / "answers"
VOLATILE = {
    "result_id": "a digest of the call's inputs (temporary paths) and of its output (the cache counters)",
    "modules_indexed": "cache counter: the modules the call's index holds; a lazy index changes it on purpose",
    "cache_hits": "cache counter: records the call read from the fact cache (depends on earlier calls)",
    "parsed": "cache counter: modules the call parsed (depends on what earlier calls cached)",
    "next_cursor": "encodes a fingerprint of the inputs, which hold temporary paths; pages are merged instead",
    "cursor": "the same cursor, inside next_step.arguments",
    "probe_id": "a digest of the op probe's report, which holds the interpreter's path",
    "ledger_id": "a digest of the plugin repository's git directory (a temporary path)",
    "ledger_uri": "holds ledger_id",
}
"""Keys whose values are masked wherever they occur (null stays null, so presence still compares)."""
LATER_PAGES_DROPPED = ("next_step",)
"""A later page's next_step names the page after it or a row of its own: it depends on where pages are cut."""
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
Answer = dict[str, Any]


@dataclass
class Context:
    """One scenario's scratch directory and what its answers must not depend on."""

    base: Path
    places: dict[str, str] = field(default_factory=dict)
    """Path -> placeholder: the scratch directory, the test cache (upstream trees), the interpreter."""
    commits: dict[str, str] = field(default_factory=dict)
    """Sha -> placeholder, for repositories committed at the current time (their shas change each run)."""

    def __post_init__(self) -> None:
        for path, name in ((self.base, "<tmp>"), (cache_root(), "<cache>"), (Path(sys.executable), "<python>")):
            self.places[str(path)] = name
            self.places[str(path.resolve())] = name

    def dated_now(self, repo: Path, label: str) -> None:
        """Mask the shas of `repo`, committed with the current date, as <label~N> (N: oldest first)."""
        shas = git(repo, "rev-list", "--all", "--reverse").split()
        self.commits.update({sha: f"<{label}~{n}>" for n, sha in enumerate(shas)})

    def text(self, value: str) -> str:
        for path in sorted(self.places, key=len, reverse=True):
            value = value.replace(path, self.places[path])
        return HEX.sub(lambda m: self._sha(m.group()), value) if self.commits else value

    def _sha(self, hexits: str) -> str:
        return next((name for sha, name in self.commits.items() if sha.startswith(hexits)), hexits)

    def normal(self, value: Any, key: str | None = None) -> Any:
        """`value` with VOLATILE masked and paths and dated shas replaced, in keys too."""
        if key in VOLATILE and value is not None:
            return f"<{key}>"
        if isinstance(value, dict):
            return {self.text(str(k)): self.normal(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.normal(v) for v in value]
        return self.text(value) if isinstance(value, str) else value


Call = Callable[[dict[str, Any]], dict[str, Any]]


def tool(spec: ToolSpec, roots: list[Path], state: Path, mode: str = "edit") -> Call:
    """One call of `spec` through the dispatcher (as a client makes it), its output as JSON."""

    def call(arguments: dict[str, Any]) -> dict[str, Any]:
        runtime = Runtime.create([str(r) for r in roots], mode=mode, state_dir=str(state))
        env = ToolEnv(runtime=runtime, tool=spec.name)
        output = anyio.run(lambda: invoke(spec, arguments, env))
        return output.model_dump(mode="json")

    return call


def walk(ctx: Context, call: Call, arguments: dict[str, Any], paged: str) -> Answer:
    """Every page of one call: the first page with `paged` (a list, or the diff text) concatenated over
    all pages, and the distinct rest of the later pages."""
    first = page = call(arguments)
    merged, later = page[paged], []
    while page.get("next_cursor"):
        page = call({**arguments, "cursor": page["next_cursor"]})
        merged = merged + page[paged]
        rest = {k: v for k, v in page.items() if k not in (paged, "next_cursor", *LATER_PAGES_DROPPED)}
        later.append(json.dumps(ctx.normal(rest), sort_keys=True))
    answer = {k: v for k, v in first.items() if k != "next_cursor"} | {paged: merged}
    distinct = [json.loads(p) for p in sorted(set(later))]
    return {"arguments": ctx.normal(arguments), "answer": ctx.normal(answer), "later_pages": distinct}


@contextmanager
def environ(name: str, value: str) -> Iterator[None]:
    """`name` set to `value` for the block (the scenarios also run outside pytest, without monkeypatch)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


# -- the scenarios ---------------------------------------------------------------------------------

REAL_PLUGINS = {
    # snapshot -> (the upstream release it targets, its models directory, the extra detail levels asked)
    ARCHIVE: ("0.26.0", "vllm_ascend/models", ("matrix", "diff")),
    "vllm-ascend-351879064c.tar.gz": ("0.26.0", "vllm_ascend/models", ()),
    "vllm-ascend-b4b04c5eb1.tar.gz": ("0.27.1", "vllm_ascend/models", ()),
    GCU_ARCHIVE: ("0.9.2", "vllm_gcu/models", ()),
}


def model_diffs(ctx: Context, call: Call, base: dict[str, Any], extra: tuple[str, ...]) -> dict[str, Answer]:
    """summary and symbols as test_real_plugins.py asks them (all pages); matrix; the diff the summary's
    next_step names."""
    answers = {d: walk(ctx, call, {**base, "detail": d, "limit": 500}, "pairs") for d in ("summary", "symbols")}
    if "matrix" in extra:
        answers["matrix"] = walk(ctx, call, {**base, "detail": "matrix"}, "matrix")
    step = answers["summary"]["answer"]["next_step"]
    if "diff" in extra and step and step["arguments"].get("detail") == "diff":
        answers["diff"] = walk(ctx, call, {**base, "detail": "diff", "file": step["arguments"]["file"]}, "diff")
    return answers


def real_plugin(ctx: Context, archive: str) -> dict[str, Answer]:
    """diff_model over a snapshot's models/ against the release it targets (test_real_plugins.py)."""
    version, models, extra = REAL_PLUGINS[archive]
    assert PLUGINS is not None
    root = ctx.base / "real-plugins"
    root.mkdir()
    repo = snapshot_repo(PLUGINS / archive, root)
    ctx.dated_now(repo, "snapshot")
    upstream = upstream_source(version)
    call = tool(diff_model.SPEC, [root, upstream], ctx.base / "state", mode="review")
    base = {"plugin_repo": str(repo), "upstream": str(upstream), "paths": [f"{models}/"]}
    return model_diffs(ctx, call, base, extra)


BENCH_FAMILY = "vllm/models/deepseek_v4"
BENCH_CLASSIC = (
    *("deepseek_v2", "deepseek_mtp", "deepseek_eagle", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next"),
    *("llama", "mixtral", "glm4", "glm4_moe", "glm4_moe_mtp", "kimi_linear", "minimax_m2", "ernie45_moe"),
)
BENCH_REGISTRATIONS = {
    "DeepseekV4ForCausalLM": "vllm_metax.models.deepseek_v4.model:DeepseekV4ForCausalLM",
    "DeepseekV2ForCausalLM": "vllm_metax.models.deepseek_v2:DeepseekV2ForCausalLM",
}
"""The plugin of bench/bench_diff_model.py as it was when the answers were made (a copy, so that the
scenario does not move with the benchmark)."""


def bench_files(tree: Path) -> dict[str, str]:
    """Plugin path -> upstream path: the family flattened from nvidia/ and common/, classic models beside."""
    files: dict[str, str] = {}
    for source in sorted((tree / BENCH_FAMILY).rglob("*.py")):
        relative = source.relative_to(tree / BENCH_FAMILY).as_posix()
        if relative.split("/")[0] not in ("amd", "xpu", "cpu") and source.name != "__init__.py":
            files.setdefault(f"vllm_metax/models/deepseek_v4/{source.name}", f"{BENCH_FAMILY}/{relative}")
    for name in BENCH_CLASSIC:
        if (tree / f"vllm/model_executor/models/{name}.py").is_file():
            files[f"vllm_metax/models/{name}.py"] = f"vllm/model_executor/models/{name}.py"
    return files


def bench_plugin(ctx: Context) -> dict[str, Answer]:
    """diff_model over the plugin bench/bench_diff_model.py builds from 0.26.0 (DeepSeek V4 and 16 classic models)."""
    tree = upstream_source("0.26.0")
    build_plugin_repo(ctx.base / "plugin", tree, bench_files(tree), registrations=BENCH_REGISTRATIONS)
    call = tool(diff_model.SPEC, [ctx.base, tree], ctx.base / "state")
    base = {"plugin_repo": "plugin", "upstream": str(tree)}
    return model_diffs(ctx, call, base, ("diff",))


TRACE_SECTIONS = (
    "inventory",
    "defects",
    "ops",
    "overrides",
    "patches",
    "kernels",
    "config_rewrites",
    "weight_loading",
    "inherited",
    "boundaries",
    "unknowns",
    "parse_errors",
    "inactive",
)
VIEWS = {"inventory": ("changes", "full"), "boundaries": ("changes", "full")}
"""The sections view chooses the rows of; the others take no view."""


def trace_workbench(ctx: Context) -> dict[str, Answer]:
    """trace_dependency on the workspace of test_trace_dependency.py at v0.26.0: the summary, every section
    the summary counts rows in (all pages, each view), and the consumers of a shared helper."""
    root = ctx.base / "trace"
    build_upstream_history(root / "vllm", ["0.26.0", "0.33.0"], include=["vllm/"])
    registrations = {ARCH: "vllm_metax.models.deepseek_v4:DeepseekV4ForCausalLM"}
    plugin = build_plugin_repo(root / "plugin", upstream_source("0.26.0"), PLUGIN_FILES, registrations=registrations)
    package = plugin / "vllm_metax/models/deepseek_v4"
    (package / "__init__.py").write_text("from .model import DeepseekV4ForCausalLM\nfrom .mtp import DeepSeekV4MTP\n")
    (package / "unused_kernel.py").write_text("def never_called():\n    return 1\n")
    git(plugin, "add", "-A")
    git(plugin, "commit", "-qm", "package exports and an unreferenced kernel")
    ctx.dated_now(plugin, "plugin")
    call = tool(trace_dependency.SPEC, [root], ctx.base / "trace-state")
    base = {"plugin_repo": "plugin", "upstream": "vllm", "target": "v0.26.0", "arch": ARCH, "depth": 3}
    summary = call({**base, "section": "summary"})
    answers = {"summary": {"arguments": ctx.normal(base), "answer": ctx.normal(summary), "later_pages": []}}
    for section in (s for s in TRACE_SECTIONS if summary["counts"].get(s)):
        for view in VIEWS.get(section, (None,)):
            arguments = {**base, "section": section, "limit": 1000, **({"view": view} if view else {})}
            answers[f"{section}.{view}" if view else section] = walk(ctx, call, arguments, section)
    consumers = {
        **base,
        "direction": "consumers",
        "symbol": "vllm.models.deepseek_v4.compressor:DeepseekCompressor",
        "depth": 1,
        "arch": None,
        "section": "inventory",
        "limit": 1000,
    }
    answers["consumers"] = walk(ctx, call, consumers, "inventory")
    return answers


def real_plugin_audit(ctx: Context) -> dict[str, Answer]:
    """audit_commits status and list on vllm-ascend 7662ec925a over v0.26.0..v0.27.0 (test_real_plugins_audit.py)."""
    assert PLUGINS is not None
    root = ctx.base / "real-audit"
    sources = {v: upstream_source(v) for v in ("0.26.0", "0.27.0")}
    history = build_upstream_history(root / "vllm", list(sources), sources=sources)
    repo = snapshot_repo(PLUGINS / ARCHIVE, root)
    ctx.dated_now(repo, "snapshot")
    call = tool(audit_commits.SPEC, [root], ctx.base / "state", mode="review")
    base = {
        "upstream": str(history.path),
        "target": "v0.27.0",
        "plugin_repo": str(repo),
        "paths": ["vllm_ascend/models/"],
        "releases": ["v0.26.0"],
        "limit": 50,
    }
    return {
        "status": walk(ctx, call, {**base, "action": "status"}, "files"),
        "list": walk(ctx, call, {**base, "action": "list"}, "commits"),
    }


def real_config(ctx: Context) -> dict[str, Answer]:
    """inspect_config and plan_trim on DeepSeek-V4-Flash's real config with its tensor layout (shard headers)."""
    config, root, state = fixture("v4"), ctx.base / "models", ctx.base / "state"
    write_model(root / "m", config, deepseek_v4_tensors(config), ["model-00001-of-00046.safetensors"])
    with environ("HF_HUB_CACHE", str(ctx.base / "hf-cache")):
        inspected = walk(ctx, tool(inspect_config.SPEC, [root], state), {"model": "m", "construct": False}, "layers")
        planned = tool(plan_trim.SPEC, [root], state)({"model": "m"})
    plan = {"arguments": {"model": "m"}, "answer": ctx.normal(planned), "later_pages": []}
    return {"inspect_config": inspected, "plan_trim": plan}


SCENARIOS: dict[str, Callable[[Context], dict[str, Answer]]] = {
    "real_plugin_ascend_7662ec925a": lambda ctx: real_plugin(ctx, ARCHIVE),
    "real_plugin_ascend_351879064c": lambda ctx: real_plugin(ctx, "vllm-ascend-351879064c.tar.gz"),
    "real_plugin_ascend_b4b04c5eb1": lambda ctx: real_plugin(ctx, "vllm-ascend-b4b04c5eb1.tar.gz"),
    "real_plugin_gcu_7b5aaca941": lambda ctx: real_plugin(ctx, GCU_ARCHIVE),
    "real_plugin_audit": real_plugin_audit,
    "workbench_bench_diff_model": bench_plugin,
    "workbench_trace_dependency": trace_workbench,
    "real_config_v4": real_config,
}
NEEDS_SNAPSHOTS = {name for name in SCENARIOS if name.startswith("real_plugin")}
FAST = {"real_config_v4"}
"""Needs no upstream tree."""


# -- stored answers and the comparison -------------------------------------------------------------

GZIP_ABOVE = 200_000


def answer_file(name: str) -> Path:
    plain = ANSWERS / f"{name}.json"
    return plain if plain.is_file() else ANSWERS / f"{name}.json.gz"


def dump(answers: dict[str, Answer]) -> bytes:
    return (json.dumps(answers, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def store(name: str, answers: dict[str, Answer]) -> Path:
    """Write a scenario's answers (gzipped when large, mtime 0 so the bytes depend on the answers only)."""
    for stale in (ANSWERS / f"{name}.json", ANSWERS / f"{name}.json.gz"):
        stale.unlink(missing_ok=True)
    body = dump(answers)
    path = ANSWERS / (f"{name}.json.gz" if len(body) > GZIP_ABOVE else f"{name}.json")
    path.write_bytes(gzip.compress(body, mtime=0) if path.suffix == ".gz" else body)
    return path


def load(name: str) -> dict[str, Answer]:
    path = answer_file(name)
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def _key(item: Any) -> str | None:
    """What names a row in a message: its local path, name, sha or target, where it has one."""
    if isinstance(item, dict):
        for key in ("local", "name", "sha", "target", "upstream", "symbol", "id"):
            if isinstance(item.get(key), str | int):
                return f"{key}={item[key]}"
    return None


def first_difference(expected: Any, actual: Any, where: str = "") -> str | None:
    """The first place the two JSON values differ, in words (None: equal)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual or key not in expected:
                side = "missing now" if key not in actual else "new now"
                shown = expected.get(key, actual.get(key))
                return f"{where}.{key}: {side} (value {json.dumps(shown)[:400]})"
            found = first_difference(expected[key], actual[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for index, (old, new) in enumerate(zip(expected, actual, strict=False)):
            named = _key(old)
            found = first_difference(old, new, f"{where}[{index}{f' {named}' if named else ''}]")
            if found:
                return found
        if len(expected) != len(actual):
            longer, what = (expected, "missing now") if len(expected) > len(actual) else (actual, "new now")
            extra = longer[min(len(expected), len(actual))]
            return f"{where}: {len(expected)} items before, {len(actual)} now; first {what}: {json.dumps(extra)[:400]}"
        return None
    if isinstance(expected, str) and isinstance(actual, str) and "\n" in expected + actual and expected != actual:
        return _line_difference(expected, actual, where)
    if expected != actual or type(expected) is not type(actual):
        return f"{where}: was {json.dumps(expected)[:400]}, now {json.dumps(actual)[:400]}"
    return None


def _line_difference(expected: str, actual: str, where: str) -> str:
    """The first differing line of two texts (a diff of many lines), with its number."""
    old, new = expected.splitlines(), actual.splitlines()
    line = next((n for n, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    shown = [json.dumps(lines[line] if line < len(lines) else "<no line>")[:400] for lines in (old, new)]
    return f"{where}, line {line + 1} of {len(old)} before, {len(new)} now: was {shown[0]}, now {shown[1]}"


def _param(name: str) -> Any:
    marks = [] if name in FAST else [pytest.mark.slow]
    return pytest.param(name, marks=[*marks, needs_snapshots] if name in NEEDS_SNAPSHOTS else marks, id=name)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("name", [_param(name) for name in SCENARIOS])
def test_answers_are_the_stored_ones(name: str, tmp_path: Path) -> None:
    base = tmp_path / "s"
    base.mkdir()
    stored = load(name)
    answers = json.loads(dump(SCENARIOS[name](Context(base))))
    assert set(answers) == set(stored), f"{name}: calls {sorted(answers)}, stored {sorted(stored)}"
    for call in sorted(stored):
        difference = first_difference(stored[call], answers[call], call)
        assert difference is None, f"{name}: the answer changed at {difference}"
