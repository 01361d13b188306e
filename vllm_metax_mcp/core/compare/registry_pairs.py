"""The registry rule's evidence: the architecture a plugin registers names its upstream module.

`register_model("DeepseekV3ForCausalLM", "plugin.models.deepseek_v3:DeepseekV3ForCausalLM")` says
which local file defines the architecture; upstream's registry table says which upstream module
does (`"DeepseekV3ForCausalLM": ("deepseek_v2", ...)`), however either file is named. A family
package (`vllm.models.deepseek_v4`) is followed through its `__init__` on the branch an out-of-tree
platform takes; the files the other branches would import are the alternatives, with their guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..code.module_index import IndexedModule, ModuleIndex
from ..code.registration import Registration
from ..foundation.evidence import NoteEvidence
from .pairing_context import PairingContext
from .pairs import Alternative, EvidenceItem

MAX_HOPS = 8


@dataclass(frozen=True)
class _Definer:
    path: str
    symbol: str
    line: int
    span: int
    hops: tuple[EvidenceItem, ...]
    """The re-export imports followed to reach the definition (dispatch included)."""


@dataclass
class RegistryFind:
    """One registered architecture of a local file and the upstream file that defines it."""

    upstream: str
    arch: str
    evidence: list[EvidenceItem]
    span: int
    """Lines of the local registered class: the larger class is the file's main model."""
    alternatives: list[Alternative] = field(default_factory=list)


@dataclass
class RegistryMatch:
    """A local file and the upstream files defining the architectures it registers."""

    finds: list[RegistryFind] = field(default_factory=list)

    def primary(self, preferred: set[str]) -> RegistryFind:
        """The find another rule agrees with, else the file's largest registered class."""
        return min(self.finds, key=lambda f: (f.upstream not in preferred, -f.span, f.arch))


@dataclass(frozen=True)
class _Binding:
    module: str
    name: str
    line: int
    guard: str | None


def _bindings(module: IndexedModule, name: str, taken: bool) -> list[_Binding]:
    """The imports of `module` binding `name` on (or off) the taken path, surely-taken ones first."""
    records = [r for r in module.record.imports if (r.branch != "not_taken") == taken]
    records.sort(key=lambda r: r.branch != "taken")
    return [
        _Binding(module.absolute(record.module), original, record.line, record.guard)
        for record in records
        for original, alias in record.names
        if alias == name
    ]


def _definer(context: PairingContext, index: ModuleIndex, module: str, name: str) -> _Definer | None:
    """Where `module.name` is defined as a class, following re-exports on the taken path."""
    hops: list[EvidenceItem] = []
    for _ in range(MAX_HOPS):
        indexed = index.get(module)
        if indexed is None or f"{module}.{name}" in index.modules:
            return None
        definition = indexed.record.definition(name)
        if definition is not None:
            if definition.kind != "class":
                return None
            span = definition.end_line - definition.line + 1
            return _Definer(indexed.path, name, definition.line, span, tuple(hops))
        found = _bindings(indexed, name, taken=True)
        if not found:
            return None
        module, name = found[0].module, found[0].name
        hops.append(context.cite(indexed.path, found[0].line, local=indexed.side == "plugin"))
    return None


def _other_branches(context: PairingContext, module: str, name: str) -> list[Alternative]:
    """The files that define `module.name` on the branches an out-of-tree platform does not take."""
    index = context.trees.index
    found: list[Alternative] = []
    for _ in range(MAX_HOPS):
        indexed = index.get(module)
        if indexed is None or indexed.record.definition(name) is not None:
            return found
        for other in _bindings(indexed, name, taken=False):
            target = _definer(context, index, other.module, other.name)
            if target is not None and all(a.upstream != target.path for a in found):
                where = f"{indexed.path}:{other.line}"
                found.append(Alternative(target.path, f"the [{other.guard or 'other'}] branch of {where} imports it"))
        taken = _bindings(indexed, name, taken=True)
        if not taken:
            return found
        module, name = taken[0].module, taken[0].name
    return found


def _local_definer(context: PairingContext, registration: Registration) -> _Definer | None:
    """The local file defining the registered class (a `module:Class` string, or a class resolved
    through the registering module's imports)."""
    index = context.trees.index
    module = registration.module
    if not module:
        registering = context.trees.local_modules.get(registration.path)
        bound = context.bindings(registering).get(registration.symbol) if registering else None
        if bound is None:
            return None
        module = bound.rpartition(".")[0]
        symbol = bound.rpartition(".")[2]
        return _definer(context, index, module, symbol)
    return _definer(context, index, module, registration.symbol)


def registry_matches(context: PairingContext, registered: list[Registration]) -> dict[str, RegistryMatch]:
    """Compared local file -> the upstream files of the architectures it registers (each once)."""
    matches: dict[str, RegistryMatch] = {}
    index = context.trees.index
    for registration in registered:
        local = _local_definer(context, registration)
        upstream_entries = context.registry.get(registration.arch, [])
        if local is None or local.path not in context.local_data or not upstream_entries:
            continue
        entry = upstream_entries[0]
        upstream = _definer(context, index, entry.module, entry.symbol)
        match = matches.setdefault(local.path, RegistryMatch())
        if upstream is None or any(f.upstream == upstream.path for f in match.finds):
            continue
        evidence: list[EvidenceItem] = [
            context.cite(registration.path, registration.line, local=True),
            context.cite(entry.path, entry.line),
            *upstream.hops,
            context.cite(upstream.path, upstream.line),
            NoteEvidence(
                text=f"registers {registration.arch}, which upstream's registry maps to {entry.module}:{entry.symbol}"
            ),
        ]
        others = _other_branches(context, entry.module, entry.symbol)
        match.finds.append(RegistryFind(upstream.path, registration.arch, evidence, local.span, others))
    return {local: match for local, match in matches.items() if match.finds}
