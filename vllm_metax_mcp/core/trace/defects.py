"""Defects of the plugin code on a model's path, each with a file, a line and checkable evidence.

Kinds: `unresolved_import` (resolves nowhere in the subject), `breaks_at_target` (resolves at
base, not at target: the first revision and release where it breaks, and where the name went),
`override_target_changed`, `skipped_base_init` (a subclass calls another class's `__init__`
instead of its base's, while inherited methods read attributes only that `__init__` sets),
`signature_drift` (a call, an override or a JIT launch that no longer fits the target's
signature) and `op_not_found` (no source registers the op and the probe does not find it).

This module holds the defect record and the import, override-target and op checks;
`base_init` and `signatures` hold the other two kinds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ..code.codebase import Codebase, Outcome, resolve_name
from ..code.module_index import ModuleIndex
from ..code.overrides import Override, Patch, Target
from ..foundation.evidence import (
    CommitEvidence,
    Evidence,
    FileEvidence,
    NoteEvidence,
    ProbeEvidence,
)
from .kernels import OpRow
from .revisions import UpstreamHistory

TRY_GUARDS = ("try (import may fail)", "except")
MOVED_CANDIDATES = 3


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


@dataclass(frozen=True)
class Place:
    """A module and a line in it."""

    module: str
    line: int


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
    if indexed is None:
        return []
    problems: list[ImportProblem] = []
    for record in indexed.record.imports:
        if record.branch == "not_taken" or any(g in (record.guard or "") for g in TRY_GUARDS):
            continue
        target = indexed.absolute(record.module)
        if target.split(".")[0] not in code.first_party:
            continue
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
    return problems


def _maybe_compiled(code: Codebase, target: str, name: str | None, outcome: Outcome) -> bool:
    """A private module, or a private name of a package, without source: possibly an extension."""
    if outcome is Outcome.MISSING_MODULE:
        return target.rsplit(".", 1)[-1].startswith("_")
    package = code.get(target)
    return bool(name and name.startswith("_") and package is not None and package.is_package)


def _definers(index: ModuleIndex, names: Iterable[str], exclude: str) -> list[Place]:
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
    return [Place(name, line) for name, (_, line) in ranked[:MOVED_CANDIDATES]]


def _moved(code: Codebase, base: ModuleIndex | None, problem: ImportProblem) -> list[Place]:
    if problem.name:
        names: list[str] = [problem.name]
    else:
        before = base.get(problem.target) if base else None
        names = [d.name for d in before.record.definitions] if before else []
    return _definers(code.index, names, problem.target) if names else []


def _moved_text(moved: list[Place], name: str | None) -> str:
    if not moved:
        return "no module of the target defines it (removed, or renamed)"
    places = ", ".join(m.module for m in moved)
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
        evidence: list[Evidence] = [where, *(code.evidence(m.module, m.line) for m in moved)]
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
                f"`{problem.written}` resolves nowhere in {scope} ({problem.outcome.value}); "
                + _moved_text(moved, problem.name),
                evidence,
                f"{problem.target}:{problem.name}" if problem.name else problem.target,
            )
        )
    return defects


def _breaks(
    problem: ImportProblem,
    history: UpstreamHistory | None,
    moved: list[Place],
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
        f"`{problem.written}` resolves at base but not at target ({problem.outcome.value}); {at}; "
        + _moved_text(moved, problem.name),
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
