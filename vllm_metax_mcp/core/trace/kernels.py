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

from ..code.build_files import BuiltExtension, PrecompiledSource
from ..code.codebase import Codebase, Ref
from ..code.dispatch import dotted
from ..code.literals import own_nodes
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
    implemented_in: list[OpRegistration] = field(default_factory=list)
    """Kernel (`impl`, per dispatch key) and fake registrations, in either tree."""
    built_by: list[BuiltExtension] = field(default_factory=list)
    """The plugin build's extension modules whose default namespace is the op's."""
    precompiled: list[PrecompiledSource] = field(default_factory=list)
    """Packages the build takes those extensions' kernels from when a switch turns compiling off."""


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
    lost: list[str] = field(default_factory=list)
    """Parameters the base kernel had and the target kernel has not."""
    constexpr_changed: list[str] = field(default_factory=list)
    """Parameters whose `constexpr` annotation was added or dropped since base."""
    stale: dict[str, list[str]] = field(default_factory=dict)
    """launch site -> keywords it passes that the kernel lost since base."""
    via: dict[str, str] = field(default_factory=dict)
    """launch site -> the local name it launches through, when that name may hold several kernels."""


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
        row.registered_in = [r for r in registrations if r.matches(row.op) and r.kind == "def"]
        row.implemented_in = [r for r in registrations if r.matches(row.op) and r.kind != "def"]
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


@dataclass(frozen=True)
class BaseParameters:
    """The kernel's parameters at base, and those annotated `constexpr` there."""

    names: list[str]
    constexpr: set[str]


def _parameters(signature: str) -> BaseParameters | None:
    try:
        arguments = ast.parse(f"def _f{signature}:\n    pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return None
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    return BaseParameters([a.arg for a in every], {a.arg for a in every if _is_constexpr(a.annotation)})


def _is_constexpr(annotation: ast.expr | None) -> bool:
    return annotation is not None and (dotted(annotation) or "").rsplit(".", 1)[-1] == "constexpr"


def _at_base(base: ModuleIndex | None, ref: Ref) -> BaseParameters | None:
    indexed = base.get(ref.module) if base else None
    before = indexed.record.definition(ref.path[0]) if indexed else None
    return _parameters(before.signature) if before is not None and before.signature else None


def _compare_with_base(launch: KernelLaunch, node: ast.FunctionDef, before: BaseParameters | None) -> None:
    """What the kernel gained, lost and re-declared constexpr since base."""
    if before is None:
        return
    arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    now = {a.arg for a in arguments}
    launch.gained = [p for p in launch.params if p not in before.names]
    launch.lost = [p for p in before.names if p not in now]
    launch.constexpr_changed = [
        a.arg for a in arguments if a.arg in before.names and _is_constexpr(a.annotation) != (a.arg in before.constexpr)
    ]


# -- which kernel a launch runs ----------------------------------------------------------------

NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
OPAQUE: list[ast.expr] = []
"""The value list of a name bound to something the scan does not follow (a parameter, a loop or
`with` target, a local import): it shadows any module-level name and resolves to nothing."""


def _bound_parameters(scope: ast.AST) -> list[str]:
    if not isinstance(scope, NESTED_SCOPES):
        return []
    arguments = scope.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
    return [a.arg for a in every if a is not None]


def _opaque_targets(node: ast.AST) -> list[str]:
    """Names a statement binds to values the scan does not follow."""
    targets: list[ast.expr] = []
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]


def _local_values(scope: ast.AST, nodes: list[ast.AST], outer: dict[str, list[ast.expr]]) -> dict[str, list[ast.expr]]:
    """Every value a plain name is assigned in the scope (each branch of an if counts), over the
    module's own assignments; names bound otherwise in the scope are opaque."""
    values: dict[str, list[ast.expr]] = {}
    for name in _bound_parameters(scope):
        values[name] = OPAQUE
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and values.get(target.id) is not OPAQUE:
                    values.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            if values.get(node.target.id) is not OPAQUE:
                values.setdefault(node.target.id, []).append(node.value)
        elif isinstance(scope, NESTED_SCOPES):
            for name in _opaque_targets(node):
                values[name] = OPAQUE
    return {**outer, **values}


class _Resolver:
    """The dotted names an expression may evaluate to: through local assignments, conditional
    expressions, `or`/`and`, and subscripts of a dict (or list) of kernels. Each name's answer is
    memoised, so chains of reassignments cost one step each."""

    def __init__(self, values: dict[str, list[ast.expr]]) -> None:
        self.values = values
        self.known: dict[str, list[str]] = {}
        self.open: set[str] = set()

    def names(self, expression: ast.expr) -> list[str]:
        if isinstance(expression, ast.Name) and expression.id in self.values:
            return self._name(expression.id)
        if isinstance(expression, ast.IfExp):
            return _unique(self.names(expression.body) + self.names(expression.orelse))
        if isinstance(expression, ast.BoolOp):
            return _unique([name for value in expression.values for name in self.names(value)])
        if isinstance(expression, ast.Subscript):
            return _unique([name for held in self._held(expression.value) for name in self.names(held)])
        name = dotted(expression)
        return [name] if name else []

    def _name(self, name: str) -> list[str]:
        if name in self.known:
            return self.known[name]
        if name in self.open:
            return []  # a cycle: what the name already holds comes from its other assignments
        self.open.add(name)
        found = _unique([found for value in self.values[name] for found in self.names(value)])
        self.open.discard(name)
        self.known[name] = found
        return found

    def _held(self, container: ast.expr) -> list[ast.expr]:
        """The values of the dict (or list / tuple) literals a subscripted expression holds."""
        literals = (
            self.values[container.id]
            if isinstance(container, ast.Name) and container.id in self.values
            else [container]
        )
        held: list[ast.expr] = []
        for literal in literals:
            if isinstance(literal, ast.Dict):
                held += [v for v in literal.values if v is not None]
            elif isinstance(literal, (ast.List, ast.Tuple)):
                held += literal.elts
        return held


def _unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class LaunchSite:
    call: ast.Call
    kernels: list[Ref]
    via: str | None
    """The local name (or subscript) the launch goes through, when it is not the kernel's own name."""


def _launch_sites(code: Codebase, module: str, tree: ast.Module) -> list[LaunchSite]:
    """Every call of a JIT kernel in a module, direct or through a name chosen among kernels."""
    sites = []
    top = list(own_nodes(tree))
    module_values = _local_values(tree, top, {})
    scopes: list[ast.AST] = [tree, *(n for n in ast.walk(tree) if isinstance(n, NESTED_SCOPES))]
    for scope in scopes:
        nodes = top if scope is tree else list(own_nodes(scope))
        values = module_values if scope is tree else _local_values(scope, nodes, module_values)
        resolver = _Resolver(values)
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            head = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            refs: dict[str, Ref] = {}
            for name in resolver.names(head):
                ref = code.bind(module, name)
                if ref is not None and _is_jit(code, ref):
                    refs[ref.symbol] = ref
            if refs:
                direct = dotted(head)
                via = None if direct is not None and direct not in values else ast.unparse(head)
                sites.append(LaunchSite(node, list(refs.values()), via))
    return sorted(sites, key=lambda s: (s.call.lineno, s.call.col_offset))


def _new_launch(code: Codebase, ref: Ref, base: ModuleIndex | None) -> KernelLaunch | None:
    found = kernel_definition(code, ref)
    indexed = code.get(ref.module)
    if found is None or indexed is None:
        return None
    params = [a.arg for a in (*found.node.args.posonlyargs, *found.node.args.args)]
    launch = KernelLaunch(ref, indexed.path, found.node.lineno, found.decorators, found.required, params)
    _compare_with_base(launch, found.node, _at_base(base, ref))
    return launch


def kernel_launches(code: Codebase, modules: list[str], base: ModuleIndex | None) -> list[KernelLaunch]:
    """JIT kernels the given (plugin) modules launch (`k[grid](...)`, a call, or either through a
    local name chosen among several kernels), with the parameters each launch misses or passes in vain."""
    launches: dict[str, KernelLaunch | None] = {}
    for module in modules:
        tree = code.tree(module)
        for site in _launch_sites(code, module, tree) if tree else []:
            where = code.where(module, site.call.lineno)
            for ref in site.kernels:
                if ref.symbol not in launches:
                    launches[ref.symbol] = _new_launch(code, ref, base)
                launch = launches[ref.symbol]
                if launch is None:
                    continue
                launch.launched_from.append(where)
                if site.via is not None:
                    count = len(site.kernels)
                    launch.via[where] = f"{site.via} (one of {count})" if count > 1 else site.via
                _check_arguments(launch, site.call, where)
    return sorted((k for k in launches.values() if k is not None), key=lambda k: k.kernel.symbol)


def _check_arguments(launch: KernelLaunch, call: ast.Call, where: str) -> None:
    passed = _passed(call, launch.params)
    if passed is not None and (absent := [p for p in launch.required if p not in passed]):
        launch.missing[where] = absent
    if stale := [k.arg for k in call.keywords if k.arg in launch.lost]:
        launch.stale[where] = stale
