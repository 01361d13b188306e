"""Defects of the plugin code on a model's path, each with a file, a line and checkable evidence.

Kinds: `unresolved_import` (resolves nowhere in the subject), `breaks_at_target` (an import, an
import that now lands on a submodule, or an upstream module attribute used through an import, that
resolves at base and not at target: the first revision and release where it breaks, and where the
name went, `moves`),
`override_target_changed`, `skipped_base_init` (a subclass calls another class's `__init__`
instead of its base's, while inherited methods read attributes only that `__init__` sets),
`signature_drift` (a call, an override or a JIT launch that no longer fits the target's
signature) and `op_not_found` (no source registers the op and the probe does not find it).

This module holds the defect record and the import, override-target and op checks;
`base_init` and `signatures` hold the other two kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..code.codebase import Codebase, Lookup, Outcome, resolve_name
from ..code.module_index import ImportRecord, IndexedModule, ModuleIndex
from ..code.overrides import Override, Patch, Target
from ..foundation.evidence import (
    CommitEvidence,
    Evidence,
    FileEvidence,
    NoteEvidence,
    ProbeEvidence,
)
from ..sources.git import last_removal
from ..sources.subjects import git_position
from .kernels import OpRow
from .moves import Move, Moves, attribute_uses, base_definition, bound_names, chain_failure, where_went
from .revisions import History

TRY_GUARDS = ("try (import may fail)", "except")

DefectKind = Literal[
    "unresolved_import",
    "breaks_at_target",
    "override_target_changed",
    "skipped_base_init",
    "signature_drift",
    "op_not_found",
]


@dataclass
class Defect:
    kind: DefectKind
    file: str
    line: int
    detail: str
    evidence: list[Evidence] = field(default_factory=list)
    symbol: str | None = None
    release: str | None = None
    """breaks_at_target: the first release where it fails (a version tag containing the first failing
    commit, or a release of the series); None when no history says."""


@dataclass(frozen=True)
class ImportProblem:
    """An import, or a module attribute used through one, that does not resolve at the target."""

    module: str
    line: int
    target: str
    """The module the name is looked up in at the target."""
    name: str | None
    outcome: Outcome
    expression: str | None = None
    """An attribute use as written up to the part that fails (`layer.FusedMoE`), checked along
    `chain` from the module `root`."""
    root: str = ""
    chain: tuple[str, ...] = ()
    shadowed: bool = False
    """The import resolves, to a submodule, where base had an attribute."""
    uses: int = 1
    """Uses of the same lost attribute in the module (the first is `line`)."""

    @property
    def written(self) -> str:
        if self.expression is not None:
            return self.expression
        return f"from {self.target} import {self.name}" if self.name else f"import {self.target}"

    @property
    def symbol(self) -> str:
        return f"{self.target}:{self.name}" if self.name else self.target

    def holds(self, lookup: Lookup) -> bool:
        """Whether the use works in the tree `lookup` reads (base, a revision, a release)."""
        if self.expression is not None:
            return lookup(self.root) is not None and chain_failure(lookup, self.root, self.chain) is None
        if self.shadowed and self.name:
            return _lands_on_attribute(lookup, self.target, self.name)
        return resolve_name(lookup, self.target, self.name).ok


# -- imports ---------------------------------------------------------------------------------


def import_problems(
    code: Codebase, module: str, unknowns: list[str], base: ModuleIndex | None = None
) -> list[ImportProblem]:
    """First-party imports of `module` that do not resolve in the subject plus upstream target; with
    a base also imports that now land on a submodule and upstream module attributes that broke.

    Imports guarded by try/except ImportError are fallbacks by design and are not checked;
    a missing private module (or private name of a package) may be a compiled extension and is
    reported as an unknown instead.
    """
    indexed = code.get(module)
    if indexed is None:
        return []
    problems: list[ImportProblem] = []
    for record in _checked_imports(indexed, code):
        target = indexed.absolute(record.module)
        names: list[str | None] = [n for n, _ in record.names if n != "*"]
        for name in names or [None]:
            found = code.resolve(target, name)
            if found.ok:
                continue
            if _maybe_compiled(code, target, name, found.outcome):
                written = f"{target}{'.' + name if name else ''}"
                unknowns.append(
                    f"{code.where(module, record.line)}: {written} has no Python source (a compiled extension?)"
                )
                continue
            problems.append(ImportProblem(module, record.line, target, name, found.outcome))
    if base is not None:
        problems += _shadowed(code, base, indexed) + _attribute_problems(code, base, indexed)
    return problems


def _checked_imports(indexed: IndexedModule, code: Codebase) -> list[ImportRecord]:
    return [
        record
        for record in indexed.record.imports
        if record.branch != "not_taken"
        and not any(g in (record.guard or "") for g in TRY_GUARDS)
        and indexed.absolute(record.module).split(".")[0] in code.first_party
    ]


def _maybe_compiled(code: Codebase, target: str, name: str | None, outcome: Outcome) -> bool:
    """A private module, or a private name of a package, without source: possibly an extension."""
    if outcome is Outcome.MISSING_MODULE:
        return target.rsplit(".", 1)[-1].startswith("_")
    package = code.get(target)
    return bool(name and name.startswith("_") and package is not None and package.is_package)


def _upstream(code: Codebase, name: str) -> bool:
    found = code.get(name)
    return found is not None and found.side == "upstream"


def _shadowed(code: Codebase, base: ModuleIndex, indexed: IndexedModule) -> list[ImportProblem]:
    """`from pkg import name` where base had an attribute and the target a submodule the package no longer binds."""
    problems = []
    for record in _checked_imports(indexed, code):
        target = indexed.absolute(record.module)
        if not _upstream(code, target):
            continue
        for name, _ in record.names:
            sub = f"{target}.{name}"
            if name == "*" or code.get(sub) is None or base.get(sub) is not None:
                continue
            if resolve_name(base.get, target, name).outcome is Outcome.DEFINED and not _lands_on_attribute(
                code.get, target, name
            ):
                problems.append(ImportProblem(indexed.name, record.line, target, name, Outcome.MODULE, shadowed=True))
    return problems


def _lands_on_attribute(lookup: Lookup, module: str, name: str) -> bool:
    """Whether `from module import name` gives an attribute of the package (not its submodule)."""
    package = lookup(module)
    if package is None:
        return False
    if lookup(f"{module}.{name}") is None:
        found = resolve_name(lookup, module, name)
        return found.outcome in (Outcome.DEFINED, Outcome.DYNAMIC)
    return name in bound_names(package)


def _roots(code: Codebase, base: ModuleIndex, indexed: IndexedModule) -> dict[str, str]:
    """Names the module's imports bind to upstream modules (at base and target alike)."""
    roots: dict[str, str] = {}
    for record in _checked_imports(indexed, code):
        target = indexed.absolute(record.module)
        if record.names:
            for original, alias in record.names:
                sub = f"{target}.{original}"
                if _upstream(code, sub) and base.get(sub) is not None:
                    roots[alias] = sub
        elif _upstream(code, target):
            head = target.split(".")[0]
            roots[record.alias or head] = target if record.alias else head
    return roots


def _attribute_problems(code: Codebase, base: ModuleIndex, indexed: IndexedModule) -> list[ImportProblem]:
    """Module attributes used through upstream imports (`layer.FusedMoE`) that resolve at base, not at target."""
    roots = _roots(code, base, indexed)
    tree = code.tree(indexed.name) if roots else None
    if tree is None:
        return []
    found: dict[tuple[str, str], ImportProblem] = {}
    uses: dict[tuple[str, str], int] = {}
    for use in attribute_uses(tree, set(roots)):
        head, *rest = use.expression.split(".")
        parts = tuple(rest)
        failed = chain_failure(code.get, roots[head], parts)
        if failed is None or chain_failure(base.get, roots[head], parts) is not None:
            continue
        key = (failed.module, failed.name)
        uses[key] = uses.get(key, 0) + 1
        expression = ".".join([head, *parts[: failed.at]])
        found.setdefault(
            key,
            ImportProblem(
                indexed.name, use.line, failed.module, failed.name, failed.outcome, expression, roots[head], parts
            ),
        )
    return [replace(p, uses=uses[key]) for key, p in found.items()]


def import_defects(
    code: Codebase,
    problems: list[ImportProblem],
    base: ModuleIndex | None,
    history: History | None,
    plugin_packages: frozenset[str],
) -> list[Defect]:
    """Defects of the import problems: breaks at the target (with base) and imports that resolve nowhere,
    each with where the name went."""
    lost: dict[str, set[str]] = {}
    for problem in problems:
        if problem.name:
            lost.setdefault(problem.target, set()).add(problem.name)
    defects = []
    for problem in problems:
        where = code.evidence(problem.module, problem.line)
        upstream = problem.target.split(".")[0] not in plugin_packages
        moves = _moves(code, base, problem, lost.get(problem.target, set()), upstream)
        evidence: list[Evidence] = [where, *(_move_evidence(code, m) for m in moves.found)]
        if upstream and base is not None and problem.holds(base.get):
            defects.append(_breaks(code, problem, base, history, moves, evidence))
            continue
        scope = (
            "the plugin subject"
            if not upstream
            else ("upstream at base or target" if base else "upstream at the target (pass base to find where it broke)")
        )
        removed = "" if upstream else _removal_text(code, problem, evidence)
        defects.append(
            Defect(
                "unresolved_import",
                where.path,
                problem.line,
                f"`{problem.written}` resolves nowhere in {scope} ({problem.outcome.value}); "
                + _moves_text(code, moves)
                + removed,
                evidence,
                problem.symbol,
            )
        )
    return defects


def _removal_text(code: Codebase, problem: ImportProblem, evidence: list[Evidence]) -> str:
    """The plugin commit that deleted or moved the module a stale plugin import names (git subjects
    only), added to the evidence as a commit."""
    position = git_position(code.subjects["plugin"])
    if position is None:
        return ""
    modules = [problem.target] + ([f"{problem.target}.{problem.name}"] if problem.name else [])
    paths = [p for m in modules for p in (f"{m.replace('.', '/')}.py", f"{m.replace('.', '/')}/__init__.py")]
    removal = last_removal(position.repo, position.revision, paths)
    if removal is None:
        return ""
    evidence.append(CommitEvidence(sha=removal.commit))
    went = f"moved it to {removal.renamed_to}" if removal.renamed_to else "deleted it"
    return f"; plugin commit {removal.commit[:12]} ({removal.subject!r}) {went} ({removal.path})"


def _moves(code: Codebase, base: ModuleIndex | None, problem: ImportProblem, lost: set[str], upstream: bool) -> Moves:
    if problem.shadowed and problem.name:
        return Moves([Move("submodule", f"{problem.target}.{problem.name}", None, 1, "module")], 1)
    return where_went(code, base, problem.target, problem.name, sorted(lost), "upstream" if upstream else "plugin")


def _move_evidence(code: Codebase, move: Move) -> Evidence:
    return code.evidence(move.what if move.kind == "imported_from" else move.module, move.line)


def _moves_text(code: Codebase, moves: Moves) -> str:
    if not moves.found:
        return "no module of the target defines it (removed, or renamed)"
    kind = moves.found[0].kind
    shown = [m for m in moves.found if m.kind == kind]
    more = f", … {moves.total - len(shown)} more" if moves.total > len(shown) else ""
    if kind == "imported_from":
        places = ", ".join(f"`{m.module}` ({code.where(m.what, m.line)})" for m in shown)
        return f"no upstream module defines it; upstream imports it from {places}{more}"
    if kind == "submodule":
        return f"now lands on the module {shown[0].module} ({code.where(shown[0].module, 1)}), not an attribute"
    places = ", ".join(
        f"{m.what} `{m.module}:{m.name}` ({code.where(m.module, m.line)})"
        if m.name
        else f"`{m.module}` ({code.where(m.module, m.line)}; {m.what})"
        for m in shown
    )
    if kind == "renamed":
        return f"{'renamed? candidates' if moves.ambiguous else 'renamed to'}: {places}{more}"
    return f"{'defined in several target modules, best first' if moves.ambiguous else 'now defined in'}: {places}{more}"


def _breaks(
    code: Codebase,
    problem: ImportProblem,
    base: ModuleIndex,
    history: History | None,
    moves: Moves,
    evidence: list[Evidence],
) -> Defect:
    """The defect of a use that holds at base: its first break, base's definition and where it went.
    `evidence` starts with the plugin site."""
    found = history.first_break(problem.holds) if history is not None else None
    at_base = base_definition(base, problem.target, problem.name)
    if at_base is not None:
        path, line = at_base[0].path, at_base[1]
        evidence.insert(
            1,
            history.base_evidence(path, line)
            if history is not None
            else NoteEvidence(text=f"base defines it at {path}:{line}"),
        )
    if found is not None:
        evidence[1:1] = found.evidence
    at = found.text if found else "first fails at the target (no upstream history between base and target)"
    uses = f" ({problem.uses} uses)" if problem.uses > 1 else ""
    resolved = (
        "resolves at base to an attribute, at target to a submodule"
        if problem.shadowed
        else f"resolves at base but not at target ({problem.outcome.value})"
    )
    return Defect(
        "breaks_at_target",
        code.module(problem.module).path,
        problem.line,
        f"`{problem.written}`{uses} {resolved}; {at}; " + _moves_text(code, moves),
        evidence,
        problem.symbol,
        found.release if found else None,
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
    """Overrides and patches on the model's path whose upstream target changed or vanished. A patch
    the plugin's entry points never reach (`active` false) changes nothing at run time: no defect."""
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
        if patch.on_path and patch.active is not False:
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
