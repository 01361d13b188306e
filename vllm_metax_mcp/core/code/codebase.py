"""The code a trace reads, asked the questions every mechanism needs: where a name really comes
from (through re-exports and star imports), what a dotted expression in a module refers to,
the AST of a module, and file evidence pointing at a line of it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from ..foundation.evidence import FileEvidence
from ..sources.subjects import RevisionSubject, Subject
from .module_index import IndexedModule, ModuleIndex, Side

Lookup = Callable[[str], IndexedModule | None]
MAX_HOPS = 12


class Outcome(str, Enum):
    DEFINED = "defined"
    MODULE = "module"
    MISSING_MODULE = "missing_module"
    MISSING_NAME = "missing_name"
    DYNAMIC = "dynamic"
    """The module answers unknown names with a module-level `__getattr__`: not decidable statically."""


@dataclass(frozen=True)
class Resolved:
    outcome: Outcome
    module: str
    name: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.DEFINED, Outcome.MODULE, Outcome.DYNAMIC)


def resolve_name(lookup: Lookup, module: str, name: str | None, hops: int = MAX_HOPS) -> Resolved:
    """Where `from module import name` (or `import module` when name is None) lands."""
    if name is None:
        return Resolved(Outcome.MODULE, module) if lookup(module) else Resolved(Outcome.MISSING_MODULE, module)
    if lookup(f"{module}.{name}") is not None:
        return Resolved(Outcome.MODULE, f"{module}.{name}")
    indexed = lookup(module)
    if indexed is None:
        return Resolved(Outcome.MISSING_MODULE, module, name)
    return _in_module(lookup, indexed, name, hops, set())


def _in_module(lookup: Lookup, indexed: IndexedModule, name: str, hops: int, seen: set[str]) -> Resolved:
    if indexed.record.definition(name) is not None or name in indexed.record.guarded_names:
        return Resolved(Outcome.DEFINED, indexed.name, name)
    seen.add(indexed.name)
    stars: list[str] = []
    for record in indexed.record.imports:
        if record.branch == "not_taken":
            continue
        target = indexed.absolute(record.module)
        for original, alias in record.names:
            if original == "*":
                stars.append(target)
            elif alias == name and hops > 0:
                return resolve_name(lookup, target, original, hops - 1)
        if not record.names and (record.alias or record.module.split(".")[0]) == name:
            return Resolved(Outcome.MODULE, record.module if record.alias else name)
    for target in stars:
        star = lookup(target)
        if star is None or target in seen or hops <= 0:
            continue
        if star.record.exports is not None and name not in star.record.exports:
            continue
        found = _in_module(lookup, star, name, hops - 1, seen)
        if found.outcome is not Outcome.MISSING_NAME:
            return found
    if indexed.record.definition("__getattr__") is not None or "__getattr__" in indexed.record.guarded_names:
        return Resolved(Outcome.DYNAMIC, indexed.name, name)  # a module `__getattr__`, also one under `else:`
    return Resolved(Outcome.MISSING_NAME, indexed.name, name)


@dataclass(frozen=True)
class Ref:
    """What a dotted expression refers to: a module and an attribute path inside it."""

    module: str
    path: tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return f"{self.module}:{'.'.join(self.path)}" if self.path else self.module


@dataclass
class Codebase:
    """The plugin subject and the upstream target, indexed together (plugin modules win)."""

    index: ModuleIndex
    subjects: dict[Side, Subject]
    first_party: frozenset[str]
    _trees: dict[str, ast.Module | None] = field(default_factory=dict)

    def get(self, name: str) -> IndexedModule | None:
        return self.index.get(name)

    def module(self, name: str) -> IndexedModule:
        """A module known to be indexed (one a walk reached); KeyError otherwise."""
        return self.index.modules[name]

    def resolve(self, module: str, name: str | None) -> Resolved:
        return resolve_name(self.index.get, module, name)

    def source(self, name: str) -> bytes | None:
        indexed = self.get(name)
        return self.subjects[indexed.side].read(indexed.path) if indexed else None

    def tree(self, name: str) -> ast.Module | None:
        """The module's AST (parsed once per trace); None for unknown or unparsable modules."""
        if name not in self._trees:
            source = self.source(name)
            try:
                self._trees[name] = ast.parse(source) if source is not None else None
            except (SyntaxError, ValueError):
                self._trees[name] = None
        return self._trees[name]

    def where(self, name: str, line: int) -> str:
        indexed = self.get(name)
        return f"{indexed.path if indexed else name}:{line}"

    def evidence(self, name: str, line: int) -> FileEvidence:
        """A file item: path and line, and the commit (git upstream) or blob sha the line is in."""
        indexed = self.get(name)
        if indexed is None:
            raise KeyError(name)
        subject = self.subjects[indexed.side]
        rev = subject.commit if isinstance(subject, RevisionSubject) else subject.sha(indexed.path)
        return FileEvidence(path=indexed.path, line=max(line, 1), rev=rev)

    def bind(self, module: str, expression: str) -> Ref | None:
        """What `a.b.c` written in `module` refers to, through that module's imports and definitions."""
        indexed = self.get(module)
        if indexed is None:
            return None
        head, *rest = expression.split(".")
        for record in indexed.record.imports:
            if record.branch == "not_taken":
                continue
            target = indexed.absolute(record.module)
            if record.names:
                for original, alias in record.names:
                    if alias == head:
                        return self._descend(Ref(target, (original,)), rest)
            elif record.alias == head:
                return self._descend(Ref(target), rest)
            elif record.alias is None and target.split(".")[0] == head:
                return self._descend(Ref(head), rest)
        if indexed.record.definition(head) is not None:
            return Ref(module, (head, *rest))
        return None

    def _descend(self, ref: Ref, rest: list[str]) -> Ref:
        """Follow attribute access through submodules and re-exports while the path names modules."""
        module = ref.module
        path: list[str] = []
        for part in [*ref.path, *rest]:
            if path:
                path.append(part)
                continue
            found = self.resolve(module, part)
            if found.outcome is Outcome.MODULE:
                module = found.module
            elif found.outcome is Outcome.DEFINED:
                module, path = found.module, [found.name or part]
            else:
                path = [part]
        return Ref(module, tuple(path))
