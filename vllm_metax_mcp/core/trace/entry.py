"""Where a dependency trace starts: the architecture's registrations in the plugin and upstream.

"The model" is the package of the registered plugin module (or the module alone when it sits in
the package that registers it); its registrations also say where the upstream registry table is,
which the config-rewrite check reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..code.codebase import Codebase, Ref
from ..code.module_index import module_name
from ..code.registration import Registration, plugin_registrations, upstream_registrations
from ..foundation.errors import not_found
from ..foundation.state import StateStore
from ..sources.subjects import Subject
from .walk import Start


@dataclass
class TraceEntry:
    """The registrations a trace starts from, as reported."""

    arch: str | None = None
    plugin: str | None = None
    """module:Class the plugin registers."""
    plugin_registration: str | None = None
    """file:line of the register_model call."""
    upstream: str | None = None
    upstream_registration: str | None = None


@dataclass(frozen=True)
class Model:
    """Where the traced model lives, from its registrations."""

    plugin_module: str | None
    registration_path: str | None
    upstream_module: str | None
    registry_path: str | None
    classes: tuple[Ref, ...] = ()
    """The registered classes."""

    def members(self, code: Codebase) -> set[str]:
        """The registered plugin module's package (or the module alone, beside its registration)."""
        if not self.plugin_module:
            return set()
        indexed = code.get(self.plugin_module)
        registering = module_name(self.registration_path or "") or ""
        registering_package = (
            registering if (self.registration_path or "").endswith("__init__.py") else registering.rpartition(".")[0]
        )
        package = self.plugin_module if indexed and indexed.is_package else self.plugin_module.rpartition(".")[0]
        if package == registering_package:
            return {self.plugin_module}
        return {name for name in code.index.modules if name == package or name.startswith(package + ".")}


@dataclass
class Entry:
    """A trace's starting points, the model they define, and what could not be found."""

    entry: TraceEntry
    starts: list[Start]
    model: Model
    unknowns: list[str] = field(default_factory=list)


def _where(registration: Registration) -> str:
    return f"{registration.path}:{registration.line}"


def find_entry(store: StateStore, arch: str | None, plugin: Subject, upstream: Subject) -> Entry:
    """The first plugin registration and the first upstream registry entry of `arch`; a missing side
    is an unknown, both missing is not_found."""
    entry = TraceEntry(arch=arch)
    starts: list[Start] = []
    unknowns: list[str] = []
    local = [r for r in plugin_registrations(plugin) if r.arch == arch]
    if local:
        reg = local[0]
        entry.plugin, entry.plugin_registration = f"{reg.module}:{reg.symbol}", _where(reg)
        starts.append(Start(reg.module, reg.symbol))
        if len(local) > 1:
            unknowns.append(
                f"{arch} is registered {len(local)} times in the plugin; the first ({_where(reg)}) was traced."
            )
    else:
        unknowns.append(f"No register_model call for {arch} in the plugin subject: only the upstream side was traced.")
    remote = upstream_registrations(store, upstream, arch or "")
    if remote:
        reg = remote[0]
        entry.upstream, entry.upstream_registration = f"{reg.module}:{reg.symbol}", _where(reg)
        starts.append(Start(reg.module, reg.symbol))
    else:
        unknowns.append(f"{arch} is not in the upstream registry tables at the target: a new or removed architecture?")
    if not starts:
        raise not_found(
            f"{arch} is registered neither in the plugin nor upstream; check the architecture name in config.json."
        )
    model = Model(
        local[0].module if local else None,
        local[0].path if local else None,
        remote[0].module if remote else None,
        remote[0].path if remote else None,
        tuple(Ref(start.module, (start.symbol,)) for start in starts if start.symbol),
    )
    return Entry(entry, starts, model, unknowns)
