"""Kernels on a model's path, checked against the installed binaries.

`torch.ops.<ns>.<op>` uses come from the walked modules; registrations from the source scanners
(code/op_scanners.py). A probe in the target interpreter loads the installed
extensions and reports which ops exist and their schemas; without an interpreter, torch or a
package the answer is unknown (an evidence gap), never a guess. JIT kernels (Triton, TileLang)
launched from plugin code are listed with the parameters they require.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..code.codebase import Codebase, Ref
from ..code.dispatch import dotted
from ..code.module_index import ModuleIndex
from ..code.op_scanners import OpRegistration, PythonOpFacts, call_argument, const_string
from ..foundation.isolated import ProbeDeath, ProbeDied, run_isolated
from ..foundation.results import digest
from ..foundation.state import StateStore
from ..target import script_source

PROBE_MARKER = "@@OPPROBE@@"
OP_PROBE_TIMEOUT_S = 240
JIT_MARKERS = ("jit", "autotune")

SchemaSource = Literal["installed", "source"]
"""Where an op's schemas come from: the probe of the installed binaries, or the registering source."""


# -- assembly --------------------------------------------------------------------------------


@dataclass
class OpRow:
    op: str
    used_in: list[str] = field(default_factory=list)
    """Every use on the path, plugin modules first."""
    registered_in: list[OpRegistration] = field(default_factory=list)
    installed: bool | None = None
    schema: list[str] = field(default_factory=list)
    schema_from: SchemaSource | None = None


@dataclass
class KernelLaunch:
    kernel: Ref
    file: str
    line: int
    decorators: list[str]
    required: list[str]
    params: list[str]
    launched_from: list[str] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)
    """launch site -> required parameters it does not pass."""
    gained: list[str] = field(default_factory=list)
    """Parameters the target kernel has and the base kernel had not (with a base)."""


def op_rows(
    code: Codebase, facts: dict[str, PythonOpFacts], walked: list[str], registrations: list[OpRegistration]
) -> list[OpRow]:
    """Every op the walked modules use, with the sources that register it."""
    rows: dict[str, OpRow] = {}
    ordered = sorted(walked, key=lambda m: (i := code.get(m)) is None or i.side != "plugin")  # plugin uses first
    for module in ordered:
        for use in facts[module].uses if module in facts else []:
            rows.setdefault(use.op, OpRow(use.op)).used_in.append(code.where(module, use.line))
    for row in rows.values():
        row.registered_in = [r for r in registrations if r.matches(row.op)]
        declared = [r.schema for r in row.registered_in if r.schema]
        if declared:
            row.schema, row.schema_from = declared, "source"
    return sorted(rows.values(), key=lambda r: r.op)


# -- the probe -------------------------------------------------------------------------------


@dataclass
class ProbeOutcome:
    probe_id: str | None
    gaps: list[str] = field(default_factory=list)


def _probe_key(python: Path, identity: str | None, request: dict[str, Any]) -> str:
    info = os.stat(python)
    return digest(
        {"python": str(python), "stat": [info.st_size, info.st_mtime_ns], "record": identity, "request": request}, 20
    )


def probe_ops(
    python: Path, store: StateStore, rows: list[OpRow], packages: list[str], identity: str | None
) -> ProbeOutcome:
    """Ask the target interpreter which ops exist; fills `installed` and `schema` of each row.

    A complete report is reused for the same interpreter, environment record and request. A probe
    that dies (a signal, the deadline) is an answer too: what its last report held is kept, every
    other op is unknown, and the gap says how it died and at which step.
    """
    modules = sorted({r.module for row in rows for r in row.registered_in if r.module})
    request = {"ops": [row.op for row in rows], "packages": packages, "modules": modules}
    key = f"cache/opprobe/{_probe_key(python, identity, request)}.json"
    cached = store.read(key)
    report = store.read(f"probes/{cached['probe_id']}.json") if cached else None
    if cached and report is not None:
        return ProbeOutcome(cached["probe_id"], _apply(rows, report["report"], python))
    script = script_source("op_probe")
    died: ProbeDeath | None = None
    try:
        body = run_isolated(
            python,
            script,
            PROBE_MARKER,
            what="op probe",
            stdin=json.dumps(request).encode(),
            timeout_s=OP_PROBE_TIMEOUT_S,
        )
    except ProbeDied as death:
        died, body = death.death, death.partial or {}
    report = {"kind": "ops", "python": str(python), "request": request, "report": body}
    if died is not None:
        report["died"] = {"cause": died.cause, "step": died.step}
    probe_id = f"p-{digest(report)}"
    store.write(f"probes/{probe_id}.json", report)
    if died is None:
        store.write(key, {"probe_id": probe_id})
    gaps = _apply(rows, body, python)
    if died is not None:
        for row in rows:
            if not row.installed:
                row.installed = None
        kept = " (ops found before that are kept)" if any(row.installed for row in rows) else ""
        gaps.insert(
            0,
            f"The target's kernels could not all be checked here: {died.sentence()}{kept}; every other op is unknown.",
        )
    return ProbeOutcome(probe_id, gaps)


def _apply(rows: list[OpRow], report: dict[str, Any], python: Path) -> list[str]:
    """Mark each row found / not found / unknown, and say why an answer is unknown."""
    if "error" in report.get("torch", {}):
        return [f"torch does not import in {python} ({report['torch']['error']}): no op could be checked"]
    missing = [name for name, info in report.get("packages", {}).items() if not info.get("installed")]
    failed = {
        name: problem
        for name, problem in report.get("errors", {}).items()
        if "." in name and name.split(".")[0] in report.get("packages", {})
    }
    gaps = [f"{name} is not installed in {python}: ops it would provide cannot be checked" for name in missing]
    gaps += [f"{name} failed to load in {python}: {problem}" for name, problem in sorted(failed.items())]
    for row in rows:
        schemas = report.get("ops", {}).get(row.op, [])
        if schemas:
            row.installed, row.schema, row.schema_from = True, schemas, "installed"
        else:
            row.installed = None if (missing or failed) else False
    return gaps


# -- JIT kernels -----------------------------------------------------------------------------


def _provided(decorators: list[ast.expr]) -> tuple[set[str], bool]:
    """Meta-parameters autotune configs and heuristics supply; False when they cannot be read."""
    provided: set[str] = set()
    readable = True
    for decorator in decorators:
        if not isinstance(decorator, ast.Call):
            continue
        name = (dotted(decorator.func) or "").rsplit(".", 1)[-1]
        if name == "heuristics" and decorator.args and isinstance(decorator.args[0], ast.Dict):
            provided |= {k for k in map(const_string, decorator.args[0].keys) if k}
        elif name == "autotune":
            configs = call_argument(decorator, 0, "configs")
            calls = [c for c in ast.walk(configs) if isinstance(c, ast.Call)] if configs is not None else []
            dicts = [c.args[0] for c in calls if c.args and isinstance(c.args[0], ast.Dict)]
            if not dicts:
                readable = False
            for item in dicts:
                provided |= {k for k in map(const_string, item.keys) if k}
    return provided, readable


@dataclass(frozen=True)
class KernelDefinition:
    node: ast.FunctionDef
    decorators: list[str]
    required: list[str]
    """Parameters a launch must bind (those autotune configs and heuristics supply excluded)."""


def kernel_definition(code: Codebase, ref: Ref) -> KernelDefinition | None:
    """A JIT kernel's definition, decorators and required parameters, or None when unreadable."""
    tree = code.tree(ref.module)
    node = (
        next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ref.path[0]), None) if tree else None
    )
    if node is None:
        return None
    provided, readable = _provided(node.decorator_list)
    if not readable:
        return None
    params = [*node.args.posonlyargs, *node.args.args]
    required = [p.arg for p in params[: len(params) - len(node.args.defaults)] if p.arg not in provided]
    return KernelDefinition(node, [ast.unparse(d).split("(")[0] for d in node.decorator_list], required)


def _is_jit(code: Codebase, ref: Ref) -> bool:
    """A Triton / TileLang kernel: a module-level function under a `jit` or `autotune` decorator."""
    indexed = code.get(ref.module)
    if indexed is None or len(ref.path) != 1:
        return False
    heads = [k.split(" @", 1) for k in indexed.record.jit_kernels]
    return any(name == ref.path[0] and any(m in head.lower() for m in JIT_MARKERS) for name, head in heads)


def _passed(call: ast.Call, params: list[str]) -> set[str] | None:
    """Parameters a launch passes; None when it unpacks *args/**kwargs."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    return set(params[: len(call.args)]) | {k.arg for k in call.keywords if k.arg}


def _gained(base: ModuleIndex | None, ref: Ref, params: list[str]) -> list[str]:
    indexed = base.get(ref.module) if base else None
    before = indexed.record.definition(ref.path[0]) if indexed else None
    if before is None or not before.signature:
        return []
    try:
        arguments = ast.parse(f"def _f{before.signature}:\n    pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return []
    old = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    return [p for p in params if p not in old]


def kernel_launches(code: Codebase, modules: list[str], base: ModuleIndex | None) -> list[KernelLaunch]:
    """JIT kernels the given (plugin) modules launch (`k[grid](...)` or a call), with missing parameters."""
    launches: dict[str, KernelLaunch] = {}
    for module in modules:
        tree = code.tree(module)
        for node in ast.walk(tree) if tree else []:
            if not isinstance(node, ast.Call):
                continue
            head = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            name = dotted(head)
            ref = code.bind(module, name) if name else None
            if ref is None or not _is_jit(code, ref):
                continue
            launch = launches.get(ref.symbol)
            if launch is None:
                found = kernel_definition(code, ref)
                indexed = code.get(ref.module)
                if found is None or indexed is None:
                    continue
                params = [a.arg for a in (*found.node.args.posonlyargs, *found.node.args.args)]
                launch = launches[ref.symbol] = KernelLaunch(
                    ref, indexed.path, found.node.lineno, found.decorators, found.required, params
                )
                launch.gained = _gained(base, ref, params)
            site = code.where(module, node.lineno)
            launch.launched_from.append(site)
            passed = _passed(node, launch.params)
            if passed is not None and (absent := [p for p in launch.required if p not in passed]):
                launch.missing[site] = absent
    return sorted(launches.values(), key=lambda k: k.kernel.symbol)
