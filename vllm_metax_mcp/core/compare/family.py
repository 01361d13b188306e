"""The sub-directories of an upstream model family, as an out-of-tree platform sees them.

Upstream keeps newer families in `vllm/models/<family>/` with per-platform sub-directories and
picks one in the family's `__init__.py` (`if current_platform.is_rocm(): from .amd… else: from
.nvidia…`). The module index already records, per import, the branch an out-of-tree platform
takes (every `is_*` predicate false); this module turns those records into a verdict per
sub-directory, with the import that decided it as evidence. Directory names are never consulted:
`nvidia/` is the platform directory because the taken branch imports from it, and `common/` is
shared because both the taken and another platform's branch (or the taken branch's own modules)
import from it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from ..code.dispatch import evaluate, platform_predicate
from ..code.module_index import ImportRecord, IndexedModule, ModuleIndex, module_name


class SubdirKind(str, Enum):
    BRANCH = "branch"
    """Imported only by the branch the out-of-tree platform takes: its files are the counterparts."""
    SHARED = "shared"
    """Used by the taken branch and by other platforms (or only by the family's own modules)."""
    OTHER_PLATFORM = "other_platform"
    """Imported only under a platform predicate the out-of-tree platform answers no to."""
    UNREFERENCED = "unreferenced"
    """Nothing on the taken path imports it."""


Outcome = Literal["taken", "conditional", "not_taken"]
"""What an out-of-tree platform does with an import: runs it, may run it (undecidable), or skips it."""


@dataclass(frozen=True)
class DispatchImport:
    """One import that names a family sub-directory, and what the out-of-tree platform does with it."""

    subdir: str
    path: str
    line: int
    guard: str | None
    outcome: Outcome


@dataclass
class FamilyLayout:
    root: str
    """Upstream family directory, e.g. `vllm/models/deepseek_v4`."""
    init_path: str | None
    kinds: dict[str, SubdirKind] = field(default_factory=dict)
    evidence: dict[str, DispatchImport] = field(default_factory=dict)
    """The import that decided each sub-directory's kind (absent for unreferenced ones)."""
    error: str | None = None

    def subdir_of(self, path: str) -> str | None:
        """The family sub-directory `path` lies in (None for files at the family root)."""
        rest = path[len(self.root) + 1 :].split("/")
        return rest[0] if len(rest) > 1 else None


def _guard_expression(guard: str | None) -> ast.expr | None:
    """The recorded guard as an expression (`try`/`except` guards are not expressions)."""
    if not guard:
        return None
    try:
        return ast.parse(guard, mode="eval").body
    except SyntaxError:
        return None


class _ForgetPlatform(ast.NodeTransformer):
    """Replaces platform predicate calls by an undecidable name."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if platform_predicate(node):
            return ast.copy_location(ast.Name(id="_platform_predicate", ctx=ast.Load()), node)
        return self.generic_visit(node)


@dataclass(frozen=True)
class ImportOutcome:
    outcome: Outcome
    by_platform: bool
    """The platform predicates decide the outcome (it would differ with them unknown)."""


def _branch_outcome(branch: str) -> Outcome:
    """The outcome the scanner recorded; an import inside a function (`lazy`) runs when called."""
    if branch == "not_taken":
        return "not_taken"
    if branch == "conditional":
        return "conditional"
    return "taken"


def import_outcome(record: ImportRecord, answers: Mapping[str, bool]) -> ImportOutcome:
    """What the out-of-tree platform does with an import, and whether the platform predicates decide it.

    An import under `TYPE_CHECKING and not is_rocm()` is not taken, but not because of the
    platform: its guard stays false with the predicates unknown, so it says nothing about
    platform directories. Imports inside functions (`lazy`, e.g. a module `__getattr__`) are
    judged by their own guard, whose undecidable parts are about the call, not the platform.
    """
    expression = _guard_expression(record.guard)
    if expression is None:
        return ImportOutcome(_branch_outcome(record.branch), False)
    outcome: Outcome
    if record.branch == "lazy":
        # Inside a function the other conditions are about the call (`name == "X"` in a module
        # `__getattr__`): only a false platform answer keeps the import from running.
        outcome = "not_taken" if evaluate(expression, answers) is False else "taken"
    else:
        outcome = _branch_outcome(record.branch)
    forgotten = evaluate(_ForgetPlatform().visit(expression), answers)
    return ImportOutcome(outcome, forgotten is None and outcome != "conditional")


def _subdir_targets(module: IndexedModule, record: ImportRecord, family: str, subdirs: set[str]) -> set[str]:
    target = module.absolute(record.module)
    if target == family:
        return {name for name, _ in record.names if name in subdirs}
    if target.startswith(family + "."):
        head = target[len(family) + 1 :].split(".")[0]
        return {head} if head in subdirs else set()
    return set()


def family_layout(
    index: ModuleIndex, root: str, files: list[str], answers: Mapping[str, bool] | None = None
) -> FamilyLayout:
    """Classify the immediate sub-directories of the family at `root` from its dispatch imports.

    `files` are the upstream paths under `root`. A sub-directory imported by the taken (or an
    undecidable) branch and never by a not-taken platform branch is the platform's own; one
    imported by both is shared; one only behind a false platform predicate is another platform's.
    A sub-directory the dispatch never names is shared when a module on the taken path imports it.
    """
    answers = answers or {}
    family = root.replace("/", ".")
    init_path = f"{root}/__init__.py"
    subdirs = {p[len(root) + 1 :].split("/")[0] for p in files if p[len(root) + 1 :].count("/")}
    layout = FamilyLayout(root=root, init_path=init_path if init_path in files else None)
    init = index.get(family)
    if init is None or init.path != init_path:
        layout.kinds = {s: SubdirKind.UNREFERENCED for s in sorted(subdirs)}
        _shared_by_use(index, layout, files, subdirs)
        return layout
    layout.error = init.record.error
    positive: dict[str, DispatchImport] = {}
    negative: dict[str, DispatchImport] = {}
    for record in init.record.imports:
        decided = import_outcome(record, answers)
        for subdir in sorted(_subdir_targets(init, record, family, subdirs)):
            item = DispatchImport(subdir, init.path, record.line, record.guard, decided.outcome)
            if decided.outcome == "not_taken":
                if decided.by_platform:
                    negative.setdefault(subdir, item)
            else:
                positive.setdefault(subdir, item)
    for subdir in sorted(subdirs):
        if subdir in positive and subdir in negative:
            layout.kinds[subdir], layout.evidence[subdir] = SubdirKind.SHARED, positive[subdir]
        elif subdir in positive:
            layout.kinds[subdir], layout.evidence[subdir] = SubdirKind.BRANCH, positive[subdir]
        elif subdir in negative:
            layout.kinds[subdir], layout.evidence[subdir] = SubdirKind.OTHER_PLATFORM, negative[subdir]
        else:
            layout.kinds[subdir] = SubdirKind.UNREFERENCED
    _shared_by_use(index, layout, files, subdirs)
    return layout


def _shared_by_use(index: ModuleIndex, layout: FamilyLayout, files: list[str], subdirs: set[str]) -> None:
    """Unreferenced sub-directories imported by a module on the taken path become shared.

    The taken path grows with each directory found (a shared directory's modules may import
    another), so this repeats until nothing changes.
    """
    family = layout.root.replace("/", ".")
    on_path = {None, SubdirKind.BRANCH, SubdirKind.SHARED}
    changed = True
    while changed:
        changed = False
        for path in sorted(files):
            subdir = layout.subdir_of(path)
            name = module_name(path)
            module = index.get(name) if name else None
            if (subdir and layout.kinds.get(subdir)) not in on_path or module is None or module.path != path:
                continue
            for record in module.record.imports:
                if record.branch == "not_taken":
                    continue
                for target in sorted(_subdir_targets(module, record, family, subdirs)):
                    if layout.kinds.get(target) is SubdirKind.UNREFERENCED:
                        layout.kinds[target] = SubdirKind.SHARED
                        layout.evidence[target] = DispatchImport(
                            target, path, record.line, record.guard, _branch_outcome(record.branch)
                        )
                        changed = True
