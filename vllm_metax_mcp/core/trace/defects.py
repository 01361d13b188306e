"""Defects of the plugin code on a model's path, each with a file, a line and checkable evidence.

Kinds: `unresolved_import` (resolves nowhere in the subject), `breaks_at_target` (resolves at
base, not at target: the first revision and release where it breaks, and where the name went),
`override_target_changed`, `skipped_base_init` (a subclass calls another class's `__init__`
instead of its base's, while inherited methods read attributes only that `__init__` sets),
`signature_drift` (a call, an override or a JIT launch that no longer fits the target's
signature) and `op_not_found` (no source registers the op and the probe does not find it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..code.codebase import Codebase, Outcome, Ref, resolve_name
from ..code.dispatch import dotted
from ..code.module_index import ModuleIndex
from ..code.overrides import Override, Patch, Target, class_chain
from ..foundation.evidence import (
    CommitEvidence,
    Evidence,
    FileEvidence,
    NoteEvidence,
    ProbeEvidence,
)
from .kernels import KernelLaunch, OpRow
from .revisions import UpstreamHistory

TRY_GUARDS = ("try (import may fail)", "except")
MOVED_CANDIDATES = 3


@dataclass
class Defect:
    kind: str
    file: str
    line: int
    detail: str
    evidence: list[Evidence] = field(default_factory=list)
    symbol: str | None = None


@dataclass(frozen=True)
class ImportProblem:
    module: str
    line: int
    target: str
    name: str | None
    outcome: Outcome

    @property
    def written(self) -> str:
        return f"from {self.target} import {self.name}" if self.name else f"import {self.target}"


# -- imports ---------------------------------------------------------------------------------


def import_problems(code: Codebase, module: str, unknowns: list[str]) -> list[ImportProblem]:
    """First-party imports of `module` that do not resolve in the subject plus upstream target.

    Imports guarded by try/except ImportError are fallbacks by design and are not checked;
    a missing private module (or private name of a package) may be a compiled extension and is
    reported as an unknown instead.
    """
    indexed = code.get(module)
    problems: list[ImportProblem] = []
    for record in indexed.record.imports if indexed else []:
        if record.branch == "not_taken" or any(g in (record.guard or "") for g in TRY_GUARDS):
            continue
        target = indexed.absolute(record.module)
        if target.split(".")[0] not in code.first_party:
            continue
        for name in [n for n, _ in record.names if n != "*"] or [None]:
            found = code.resolve(target, name)
            if found.ok:
                continue
            if _maybe_compiled(code, target, name, found.outcome):
                unknowns.append(
                    f"{code.where(module, record.line)}: {target}{'.' + name if name else ''} has no Python source (a compiled extension?)"
                )
                continue
            problems.append(ImportProblem(module, record.line, target, name, found.outcome))
    return problems


def _maybe_compiled(code: Codebase, target: str, name: str | None, outcome: Outcome) -> bool:
    """A private module, or a private name of a package, without source: possibly an extension."""
    if outcome is Outcome.MISSING_MODULE:
        return target.rsplit(".", 1)[-1].startswith("_")
    package = code.get(target)
    return bool(name and name.startswith("_") and package is not None and package.is_package)


def _definers(index: ModuleIndex, names: Iterable[str], exclude: str) -> list[tuple[str, int]]:
    """Modules of the target index defining these top-level names, most names first."""
    wanted = set(names)
    scores: dict[str, tuple[int, int]] = {}
    for indexed in index.modules.values():
        if indexed.name == exclude:
            continue
        hits = [d for d in indexed.record.definitions if d.name in wanted and d.kind in ("class", "function")]
        if hits:
            scores[indexed.name] = (len(hits), hits[0].line)
    ranked = sorted(scores.items(), key=lambda item: (-item[1][0], item[0]))
    return [(name, line) for name, (_, line) in ranked[:MOVED_CANDIDATES]]


def _moved(code: Codebase, base: ModuleIndex | None, problem: ImportProblem) -> list[tuple[str, int]]:
    if problem.name:
        names: list[str] = [problem.name]
    else:
        before = base.get(problem.target) if base else None
        names = [d.name for d in before.record.definitions] if before else []
    return _definers(code.index, names, problem.target) if names else []


def _moved_text(moved: list[tuple[str, int]], name: str | None) -> str:
    if not moved:
        return "no module of the target defines it (removed, or renamed)"
    places = ", ".join(m for m, _ in moved)
    return f"{'`' + name + '`' if name else 'its definitions'} now in {places}"


def import_defects(
    code: Codebase,
    problems: list[ImportProblem],
    base: ModuleIndex | None,
    history: UpstreamHistory | None,
    plugin_packages: frozenset[str],
) -> list[Defect]:
    defects = []
    for problem in problems:
        where = code.evidence(problem.module, problem.line)
        moved = _moved(code, base, problem)
        evidence: list[Evidence] = [where, *(code.evidence(m, line) for m, line in moved)]
        upstream = problem.target.split(".")[0] not in plugin_packages
        if upstream and base is not None and resolve_name(base.get, problem.target, problem.name).ok:
            defects.append(_breaks(problem, history, moved, where, evidence))
            continue
        scope = (
            "the plugin subject"
            if not upstream
            else ("upstream at base or target" if base else "upstream at the target (pass base to find where it broke)")
        )
        defects.append(
            Defect(
                "unresolved_import",
                where.path,
                problem.line,
                f"`{problem.written}` resolves nowhere in {scope} ({problem.outcome.value}); {_moved_text(moved, problem.name)}",
                evidence,
                f"{problem.target}:{problem.name}" if problem.name else problem.target,
            )
        )
    return defects


def _breaks(
    problem: ImportProblem,
    history: UpstreamHistory | None,
    moved: list[tuple[str, int]],
    where: FileEvidence,
    evidence: list[Evidence],
) -> Defect:
    first = release = None
    if history is not None:
        first = history.first_failing(lambda modules: resolve_name(modules.get, problem.target, problem.name).ok)
        release = history.release(first) if first else None
    if first:
        evidence.insert(1, CommitEvidence(sha=first))
    at = f"first fails at {release or 'the target'}" + (f" (commit {first[:12]})" if first else "")
    return Defect(
        "breaks_at_target",
        where.path,
        problem.line,
        f"`{problem.written}` resolves at base but not at target ({problem.outcome.value}); {at}; {_moved_text(moved, problem.name)}",
        evidence,
        f"{problem.target}:{problem.name}" if problem.name else problem.target,
    )


# -- overrides -------------------------------------------------------------------------------


def _target_defect(code: Codebase, what: str, target: Target, file: str, line: int, rev: FileEvidence) -> Defect | None:
    if target.exists is False:
        state = "no longer exists at the target"
    elif target.changed:
        state = "changed between base and target"
    else:
        return None
    evidence: list[Evidence] = [rev]
    if target.file and target.exists:
        indexed = code.get(target.ref.module)
        if indexed is not None:
            evidence.append(code.evidence(indexed.name, target.line or 1))
    return Defect(
        "override_target_changed",
        file,
        line,
        f"{what} replaces {target.ref.symbol}, which {state}",
        evidence,
        target.ref.symbol,
    )


def override_defects(
    code: Codebase, overrides: list[Override], patches: list[Patch], module_of: dict[str, str]
) -> list[Defect]:
    """Overrides and patches on the model's path whose upstream target changed or vanished."""
    defects = []
    for override in overrides:
        if not override.on_path:
            continue
        for target in override.replaces:
            found = _target_defect(
                code,
                f"{override.kind} {override.name}",
                target,
                override.file,
                override.line,
                code.evidence(module_of[override.file], override.line),
            )
            if found:
                defects.append(found)
    for patch in patches:
        if patch.on_path:
            found = _target_defect(
                code,
                f"{patch.how} patch",
                patch.target,
                patch.file,
                patch.line,
                code.evidence(patch.module, patch.line),
            )
            if found:
                defects.append(found)
    return defects


# -- __init__ chains -------------------------------------------------------------------------


def _self_attributes(node: ast.AST, ctx: type) -> dict[str, int]:
    found: dict[str, int] = {}
    for child in ast.walk(node):
        if (
            isinstance(child, ast.Attribute)
            and isinstance(child.ctx, ctx)
            and isinstance(child.value, ast.Name)
            and child.value.id == "self"
        ):
            found.setdefault(child.attr, child.lineno)
    return found


def _methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {item.name: item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _class_level(node: ast.ClassDef) -> set[str]:
    names = set(_methods(node))
    for item in node.body:
        targets = (
            item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(item, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _class_node(code: Codebase, ref: Ref) -> ast.ClassDef | None:
    tree = code.tree(ref.module)
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ref.path[0]), None) if tree else None


def _skipping_call(code: Codebase, module: str, init: ast.AST, base: Ref) -> ast.Call | None:
    """A call in `__init__` to another class's `__init__` (or `super(Base, self)`), none to the base's."""
    skipping = None
    for call in ast.walk(init):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"):
            continue
        owner = call.func.value
        if isinstance(owner, ast.Call) and dotted(owner.func) == "super":
            first = dotted(owner.args[0]) if owner.args else None
            bound = code.bind(module, first) if first else None
            if bound is None or bound != base:
                return None
            skipping = call
            continue
        name = dotted(owner)
        bound = code.bind(module, name) if name else None
        if bound == base:
            return None
        skipping = skipping or call
    return skipping


def skipped_base_init(code: Codebase, module: str) -> list[Defect]:
    defects = []
    tree = code.tree(module)
    for node in tree.body if tree else []:
        if not isinstance(node, ast.ClassDef) or "__init__" not in _methods(node) or not node.bases:
            continue
        name = dotted(node.bases[0])
        base = code.bind(module, name) if name else None
        base_node = _class_node(code, base) if base is not None and len(base.path) == 1 else None
        if base is None or base_node is None or "__init__" not in _methods(base_node):
            continue
        call = _skipping_call(code, module, _methods(node)["__init__"], base)
        if call is None:
            continue
        set_by_base = _self_attributes(_methods(base_node)["__init__"], ast.Store)
        set_here = set(_self_attributes(node, ast.Store)) | _class_level(node) | _class_level(base_node)
        reads: dict[str, tuple[str, int]] = {}
        for method, body in _methods(base_node).items():
            if method == "__init__" or method in _methods(node):
                continue
            for attr, line in _self_attributes(body, ast.Load).items():
                if attr in set_by_base and attr not in set_here:
                    reads.setdefault(attr, (method, line))
        if not reads:
            continue
        shown = ", ".join(f"self.{a}" for a in sorted(reads))
        methods = ", ".join(sorted({m for m, _ in reads.values()}))
        _, first_line = min(reads.values(), key=lambda r: r[1])
        defects.append(
            Defect(
                "skipped_base_init",
                code.get(module).path,
                call.lineno,
                f"{node.name}.__init__ calls {ast.unparse(call.func)} instead of {base.symbol}.__init__; inherited methods read "
                f"{len(reads)} attribute(s) only that __init__ sets: {shown} (in {methods})",
                [
                    code.evidence(module, call.lineno),
                    code.evidence(base.module, _methods(base_node)["__init__"].lineno),
                    code.evidence(base.module, first_line),
                ],
                f"{module}:{node.name}",
            )
        )
    return defects


# -- signatures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    positional: list[str]
    required: list[str]
    keyword_only: list[str]
    var_positional: bool
    var_keyword: bool

    @classmethod
    def parse(cls, signature: str, drop_first: bool) -> Params | None:
        try:
            args = ast.parse(f"def _f{signature}:\n    pass").body[0].args  # type: ignore[attr-defined]
        except (SyntaxError, IndexError, AttributeError):
            return None
        positional = [a.arg for a in (*args.posonlyargs, *args.args)]
        required = positional[: len(positional) - len(args.defaults)]
        required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
        if drop_first and positional:
            required = [r for r in required if r != positional[0]]
            positional = positional[1:]
        return cls(
            positional, required, [a.arg for a in args.kwonlyargs], args.vararg is not None, args.kwarg is not None
        )

    def problems(self, call: ast.Call) -> list[str] | None:
        """Why `call` does not bind; None when it unpacks arguments (undecidable)."""
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        found = []
        if len(call.args) > len(self.positional) and not self.var_positional:
            found.append(f"{len(call.args)} positional arguments, {len(self.positional)} accepted")
        bound = set(self.positional[: len(call.args)])
        for keyword in call.keywords:
            if keyword.arg in self.positional or keyword.arg in self.keyword_only:
                bound.add(keyword.arg)  # type: ignore[arg-type]
            elif not self.var_keyword:
                found.append(f"unexpected keyword {keyword.arg}")
        missing = [r for r in self.required if r not in bound]
        if missing:
            found.append(f"missing required {', '.join(missing)}")
        return found


def _callable_signature(index: ModuleIndex, code: Codebase, ref: Ref) -> tuple[str, bool] | None:
    """(signature, drop self) of an upstream function or class constructor in `index`."""
    indexed = index.get(ref.module)
    definition = indexed.record.definition(ref.path[0]) if indexed and len(ref.path) == 1 else None
    if definition is None or any(k.split(" @")[0] == ref.path[0] for k in indexed.record.jit_kernels):
        return None
    if definition.kind == "function":
        return definition.signature, False
    if definition.kind == "class" and index is code.index:
        for _, klass in class_chain(code, ref.module, ref.path[0]):
            if "__init__" in klass.member_signatures:
                return klass.member_signatures["__init__"], True
    if definition.kind == "class" and "__init__" in definition.member_signatures:
        return definition.member_signatures["__init__"], True
    return None


def _fits(index: ModuleIndex | None, code: Codebase, ref: Ref, call: ast.Call) -> bool | None:
    found = _callable_signature(index, code, ref) if index is not None else None
    params = Params.parse(*found) if found else None
    problems = params.problems(call) if params else None
    return None if problems is None else not problems


def call_drift(code: Codebase, base: ModuleIndex | None, module: str) -> list[Defect]:
    """Calls from `module` to upstream functions and classes that do not bind to the target's signature.

    With a base, a call that did not bind at base either is left out: that is not drift.
    """
    defects = []
    tree = code.tree(module)
    for node in ast.walk(tree) if tree else []:
        if not isinstance(node, ast.Call) or isinstance(node.func, ast.Subscript):
            continue
        name = dotted(node.func)
        ref = code.bind(module, name) if name else None
        indexed = code.get(ref.module) if ref else None
        if ref is None or indexed is None or indexed.side != "upstream":
            continue
        found = _callable_signature(code.index, code, ref)
        params = Params.parse(*found) if found else None
        problems = params.problems(node) if params else None
        if not problems or (base is not None and _fits(base, code, ref, node) is False):
            continue
        defects.append(
            Defect(
                "signature_drift",
                code.get(module).path,
                node.lineno,
                f"call to {ref.symbol}{found[0] if found else ''} does not bind at the target: {'; '.join(problems)}",
                [
                    code.evidence(module, node.lineno),
                    code.evidence(ref.module, indexed.record.definition(ref.path[0]).line),
                ],
                ref.symbol,
            )
        )
    return defects


def override_drift(code: Codebase, base: ModuleIndex | None, module: str) -> list[Defect]:
    """Methods of plugin subclasses whose upstream counterpart's parameters changed incompatibly."""
    defects = []
    indexed = code.get(module)
    for definition in indexed.record.definitions if indexed else []:
        if definition.kind != "class":
            continue
        chain = class_chain(code, module, definition.name)[1:]
        for method, signature in definition.member_signatures.items():
            if method.startswith("__"):
                continue
            owner = next(((m, d) for m, d in chain if method in d.member_signatures), None)
            if owner is None or code.get(owner[0]).side != "upstream":
                continue
            upstream = owner[1].member_signatures[method]
            mine, theirs = Params.parse(signature, True), Params.parse(upstream, True)
            if mine is None or theirs is None:
                continue
            lacking = (
                [] if mine.var_keyword else [p for p in theirs.required if p not in mine.positional + mine.keyword_only]
            )
            extra = (
                []
                if theirs.var_keyword
                else [p for p in mine.required if p not in theirs.positional + theirs.keyword_only]
            )
            before = _base_member(base, owner[0], owner[1].name, method)
            if not (lacking or extra) or (before is not None and before == upstream):
                continue
            parts = ([f"the target requires {', '.join(lacking)}"] if lacking else []) + (
                [f"it requires {', '.join(extra)} the target does not pass"] if extra else []
            )
            defects.append(
                Defect(
                    "signature_drift",
                    indexed.path,
                    definition.line,
                    f"{definition.name}.{method}{signature} overrides {owner[0]}:{owner[1].name}.{method}{upstream}: {'; '.join(parts)}",
                    [code.evidence(module, definition.line), code.evidence(owner[0], owner[1].line)],
                    f"{module}:{definition.name}.{method}",
                )
            )
    return defects


def _base_member(base: ModuleIndex | None, module: str, cls: str, method: str) -> str | None:
    indexed = base.get(module) if base else None
    definition = indexed.record.definition(cls) if indexed else None
    return definition.member_signatures.get(method) if definition else None


def kernel_drift(code: Codebase, launches: list[KernelLaunch], plugin_modules: set[str]) -> list[Defect]:
    """Launches from plugin code that do not pass every parameter the target kernel requires."""
    defects = []
    for launch in launches:
        for site, missing in launch.missing.items():
            path, _, line = site.rpartition(":")
            module = next((m for m in plugin_modules if code.get(m) and code.get(m).path == path), None)
            if module is None:
                continue
            gained = f"; the kernel gained {', '.join(launch.gained)} since base" if launch.gained else ""
            defects.append(
                Defect(
                    "signature_drift",
                    path,
                    int(line),
                    f"launch of JIT kernel {launch.kernel.symbol} binds no argument to required parameter(s) {', '.join(missing)} of the target kernel{gained}",
                    [code.evidence(module, int(line)), code.evidence(launch.kernel.module, launch.line)],
                    launch.kernel.symbol,
                )
            )
    return defects


# -- ops -------------------------------------------------------------------------------------


def op_defects(code: Codebase, rows: list[OpRow], plugin_paths: dict[str, str], probe_id: str | None) -> list[Defect]:
    """Ops the plugin uses that no source registers and the probe does not find ("not found", not "broken").

    Without a probe nothing is reported here: the ops' `installed` stays unknown and an unknown says why.
    """
    defects = []
    for row in rows:
        if row.registered_in or row.installed or not probe_id:
            continue
        sites = [s for s in row.used_in if s.rpartition(":")[0] in plugin_paths]
        if not sites:
            continue
        path, _, line = sites[0].rpartition(":")
        evidence: list[Evidence] = [code.evidence(plugin_paths[path], int(line)), ProbeEvidence(probe_id=probe_id)]
        probe = (
            "the installed binaries do not provide it"
            if row.installed is False
            else "the probe could not decide (see unknowns)"
        )
        evidence.append(NoteEvidence(text=f"no C++ or Python source in either tree registers {row.op}; {probe}"))
        defects.append(
            Defect(
                "op_not_found",
                path,
                int(line),
                f"torch.ops.{row.op} was not found: no source registers it and {probe}",
                evidence,
                row.op,
            )
        )
    return defects
