"""What a comparison of plugin files starts from: the files a call names, the plugin package they lie
in, the caller's mapping overrides checked against them, and the files that register architectures
(diff_model and audit_commits)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..code.registration import RegisteringFile, Registration, plugin_registrations, registering_files
from ..foundation.errors import bad_input, not_found
from ..sources.environment import UpstreamMapping
from ..sources.subjects import Subject, clean_path
from .pairs import UPSTREAM_ROOT, PluginPackage


@dataclass(frozen=True)
class PairingInputs:
    """What pairing needs besides the trees, the same for every release."""

    local_files: list[str]
    prefixes: list[str]
    package: PluginPackage
    overrides: Mapping[str, str | None]
    registrations: Mapping[str, RegisteringFile]
    """The compared files that call `register_model` (plugin-only)."""
    registered: list[Registration]
    """Every `register_model` call of the plugin's package: the registry rule's evidence."""


def python_files(plugin: Subject, paths: list[str]) -> list[str]:
    """The Python files under `paths` in the plugin subject; not_found when there are none."""
    prefixes = [clean_path(p) for p in paths]
    found = sorted({p for prefix in prefixes for p in plugin.list(prefix) if p.endswith(".py")})
    if not found:
        raise not_found(
            f"No Python files under {', '.join(paths)} in the {plugin.label} subject; "
            "pass paths inside the plugin's package, such as vllm_metax/models/."
        )
    return found


def plugin_package(plugin: Subject, prefixes: list[str]) -> PluginPackage:
    """The top-level package the paths lie in: their first component, a Python package of the subject.

    The paths are the evidence: a plugin keeps its forks in its own package (`vllm_ascend/models/`),
    so the same-path, family and import-swap rules compare that package with `vllm/`. Paths outside
    a package, or in several, are refused rather than guessed.
    """
    tops = sorted({prefix.split("/")[0] for prefix in prefixes})
    if "" in tops:
        raise bad_input(
            "paths names the whole subject; pass paths inside the plugin's package, such as vllm_metax/models/."
        )
    for top in tops:
        if f"{top}/__init__.py" not in plugin.entries():
            raise bad_input(
                f"paths lie in {top}, which is not a Python package of the {plugin.label} subject "
                f"(no {top}/__init__.py); pass paths inside the plugin's package, such as vllm_metax/models/."
            )
    if len(tops) > 1:
        raise bad_input(
            f"paths span several top-level packages ({', '.join(tops)}); the compared files must lie in one "
            "plugin package: pass the paths of one package per call."
        )
    if tops[0] == UPSTREAM_ROOT:
        raise bad_input(
            f"paths lie in {UPSTREAM_ROOT}/, the upstream's own package: the plugin's forks are compared from the "
            "plugin's package (such as vllm_metax/models/), which must be named apart from upstream's."
        )
    return PluginPackage(tops[0])


def checked_overrides(raw: Mapping[str, str | None], local_files: list[str]) -> dict[str, str | None]:
    """The caller's mapping_overrides, each naming one of the compared files (paths normalised)."""
    checked: dict[str, str | None] = {}
    for local, upstream in raw.items():
        path = clean_path(local)
        if path not in local_files:
            raise bad_input(
                f"mapping_overrides names {local}, which is not a Python file under paths; "
                "name a file the paths hold (a pair's `local`)."
            )
        checked[path] = clean_path(upstream) if upstream else None
    return checked


def pairing_inputs(plugin: Subject, paths: list[str], overrides: Mapping[str, str | None]) -> PairingInputs:
    """The files a call compares and what pairs them besides the trees."""
    prefixes = [clean_path(p) for p in paths]
    local_files = python_files(plugin, paths)
    package = plugin_package(plugin, prefixes)
    checked = checked_overrides(overrides, local_files)
    registered = plugin_registrations(plugin, package.root)
    return PairingInputs(local_files, prefixes, package, checked, registering_files(registered, prefixes), registered)


def target_label(upstream: Subject, mapping: UpstreamMapping) -> str:
    """How results name the upstream target: `<revision> (<commit>)`, the commit alone, or the directory."""
    commit = mapping.target_commit
    if commit:
        return f"{mapping.target} ({commit[:12]})" if mapping.target and mapping.target != commit else commit[:12]
    return f"{upstream.label} (no revision)"
