"""The plugin build behind the ops on a model's path: which extension module registers each op's
namespace, the environment switch that gates it, and the precompiled package a switch takes instead
(a boundary: the kernels come from that package, not from the tree's sources)."""

from __future__ import annotations

from ..code.build_files import BuildFacts, BuiltExtension, EnvSwitch, PrecompiledSource
from .kernels import OpRow


def attach_build(rows: list[OpRow], build: BuildFacts) -> None:
    """Each op's extension modules (by the namespace `TORCH_EXTENSION_NAME` gives them) and the
    precompiled packages the same switch takes instead."""
    for row in rows:
        namespace = row.op.partition(".")[0]
        row.built_by = [e for e in build.extensions if e.namespace == namespace]
        switches = {e.switch.name for e in row.built_by if e.switch is not None}
        row.precompiled = [p for p in build.precompiled if p.switch.name in switches]


def switch_text(switch: EnvSwitch) -> str:
    """`built only when WITH_X is set (default "0", setup.py:49; decided at setup.py:344)`."""
    when = {True: "set (truthy)", False: "unset or false", None: "set in a way the build decides at run time"}
    default = f'default "{switch.default}"' if switch.default is not None else "no default"
    combined = f" (with {', '.join(switch.combined_with)})" if switch.combined_with else ""
    return (
        f"built only when {switch.name}{combined} is {when[switch.builds_when]} "
        f"({default}, {switch.where}; decided at {switch.gate})"
    )


def extension_text(extension: BuiltExtension) -> str:
    gate = f", {switch_text(extension.switch)}" if extension.switch else ", always built"
    sources = f" from {', '.join(extension.sources)}" if extension.sources else ""
    return f"{extension.module} ({extension.how} at {extension.where}{sources}{gate})"


def precompiled_text(source: PrecompiledSource) -> str:
    return f"{source.package} ({source.how} at {source.where}, when {source.switch.name} turns compiling off)"
