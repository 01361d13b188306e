"""The port_model workflow: pair the plugin's files with the target (diff_model's pairing and closest
releases), merge each fork three ways, verify every output, and say per file what happened.

Base per file: the release the caller names in `bases`; else the release the plugin declares
(Dockerfile ARG, requirements pin; the same declarations audit_commits reads) where the file has a
counterpart there; else its closest release. Declared before closest: on vllm-ascend 351879064c
(declares v0.26.0), six files are closest to v0.25.0 because the vendor kept older code; with v0.25.0
as base those lines read as upstream changes to apply (42 conflicts), with v0.26.0 as local choices
(19), and the vendor's own port (b4b04c5eb1) kept them. Target: the counterpart at the target
(pairing follows renames and moves); local: the subject's file. A file without a base at any release
is not merged (there is no telling which side changed a line) and says so.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from ..audit.lagging import declared_bases
from ..code.module_index import ModuleIndex, module_name
from ..compare.affixes import VendorAffixes
from ..compare.model_diff import Comparison, ModelDiffRequest, compare_models
from ..compare.pairs import Pair, Status
from ..foundation.errors import bad_input
from ..foundation.policy import Policy
from ..foundation.progress import advance, phase
from ..foundation.state import StateStore
from ..sources.subjects import Subject
from .contract import Contract, absolute_imports, derive_contract
from .merge import Extension, FileMerge, merge_file
from .units import split_units
from .verify import Verification, verify_file

FileStatus = Literal[
    "ported", "conflicts", "unverified", "identical", "local_only", "removed_upstream", "no_base", "parse_error"
]
UPSTREAM_PACKAGE = "vllm"
STAR_HOPS = 4


@dataclass(frozen=True)
class PortRequest:
    paths: list[str]
    mapping_overrides: Mapping[str, str | None]
    releases: list[str]
    bases: Mapping[str, str]
    """Local path -> the release to take as its base instead of the closest one."""


@dataclass
class FilePort:
    local: str
    upstream: str | None
    status: FileStatus
    base: str | None = None
    base_path: str | None = None
    upstream_changed: bool | None = None
    """The target's file differs from the base's."""
    base_why: str = ""
    contract: Contract | None = None
    merge: FileMerge | None = None
    verification: Verification | None = None
    note: str = ""


@dataclass
class Port:
    files: list[FilePort]
    releases: list[str]
    package: str
    """The plugin's top-level package."""
    unknowns: list[str] = field(default_factory=list)

    @property
    def written(self) -> list[FilePort]:
        return [f for f in self.files if f.merge is not None and f.status in ("ported", "conflicts", "unverified")]


def port_files(plugin: Subject, upstream: Subject, request: PortRequest, policy: Policy, store: StateStore) -> Port:
    if not request.releases:
        raise bad_input("port_model needs releases: the upstream release(s) the fork may have been taken from.")
    with phase("pairing and measuring releases", 0.6):
        comparison = compare_models(
            plugin,
            upstream,
            ModelDiffRequest(request.paths, request.mapping_overrides, request.releases),
            policy,
            store,
        )
    _check_bases(request.bases, comparison)
    package = comparison.trees.package.root
    unknowns = list(comparison.pairing.unknowns)
    declared = _declared(plugin, [r.label for r in comparison.releases], unknowns)
    files: list[FilePort] = []
    with phase("merging files", 0.3):
        pairs = sorted(comparison.pairing.pairs, key=lambda p: p.local)
        for done, pair in enumerate(pairs):
            files.append(_port_pair(pair, comparison, request.bases, declared))
            advance(done + 1, len(pairs))
    port = Port(files, [r.label for r in comparison.releases], package, unknowns)
    with phase("verifying outputs", 0.1):
        _verify(port, comparison.trees.index)
    return port


@dataclass(frozen=True)
class Declared:
    """The release the plugin declares it targets (Dockerfile ARG, requirements pin), as a release label."""

    label: str
    where: str


def _declared(plugin: Subject, labels: list[str], unknowns: list[str]) -> Declared | None:
    found = declared_bases(plugin)
    versions = list(dict.fromkeys(d.version for d in found))
    if not versions:
        return None
    if len(versions) > 1:
        shown = ", ".join(f"{d.version} at {d.where}" for d in found)
        unknowns.append(f"The declared upstream releases disagree ({shown}): {versions[0]} is taken as the base.")
    label = next((label for label in labels if label.lstrip("vV") == versions[0]), None)
    if label is None:
        unknowns.append(
            f"The plugin declares {versions[0]} ({found[0].where}); it is not among releases: closest used."
        )
        return None
    return Declared(label, found[0].where)


def _base(pair: Pair, comparison: Comparison, bases: Mapping[str, str], declared: Declared | None) -> tuple[str, str]:
    """(release, why): the caller's, else the declared release (the fork says it was taken from it; a
    file closer to an older release lags it, and the vendor kept that code), else the closest."""
    found = comparison.closest.get(pair.local)
    if pair.local in bases:
        return bases[pair.local], "named in bases"
    closest = found.closest if found else None
    if declared is not None and found is not None and declared.label in found.counterparts:
        note = f"; closest by lines: {closest}" if closest and closest != declared.label else ""
        return declared.label, f"declared at {declared.where}{note}"
    return closest or "", "closest release by differing lines"


def _check_bases(bases: Mapping[str, str], comparison: Comparison) -> None:
    labels = {r.label for r in comparison.releases}
    for local, label in bases.items():
        if label not in labels:
            raise bad_input(f"bases names {label!r} for {local}, not one of releases; add it to releases.")
        found = comparison.closest.get(local)
        if found is None:
            raise bad_input(f"bases names {local}, which is not a compared plugin file; check paths.")
        if label not in found.counterparts:
            raise bad_input(f"{local} has no counterpart at {label}; name another release or leave it to the closest.")


def _port_pair(pair: Pair, comparison: Comparison, bases: Mapping[str, str], declared: Declared | None) -> FilePort:
    if pair.status is Status.LOCAL_ONLY or pair.upstream is None:
        return FilePort(pair.local, None, "local_only", note="no upstream counterpart: the plugin's own file")
    if pair.status is Status.REMOVED:
        return FilePort(pair.local, pair.upstream, "removed_upstream", note="the target no longer has its counterpart")
    if pair.status is Status.IDENTICAL:
        return FilePort(pair.local, pair.upstream, "identical", note="already equal to the target's file")
    found = comparison.closest.get(pair.local)
    label, why = _base(pair, comparison, bases, declared)
    if found is None or not label:
        return FilePort(pair.local, pair.upstream, "no_base", note="no counterpart at any release: pass older releases")
    counterpart = found.counterparts[label]
    release = next(r for r in comparison.releases if r.label == label)
    texts = [
        release.subject.read(counterpart.path),
        comparison.trees.local.read(pair.local),
        comparison.trees.upstream.read(pair.upstream),
    ]
    result = FilePort(pair.local, pair.upstream, "ported", label, counterpart.path, texts[0] != texts[2], why)
    try:
        modules = [cst.parse_module(t.decode("utf-8")) for t in texts]
    except (UnicodeDecodeError, cst.ParserSyntaxError) as error:
        result.status, result.note = "parse_error", f"a version does not parse: {str(error).splitlines()[0]}"
        return result
    anchors = [module_name(counterpart.path) or "", module_name(pair.upstream) or ""]
    modules[0] = absolute_imports(modules[0], anchors[0], counterpart.path.endswith("__init__.py"))
    modules[2] = absolute_imports(modules[2], anchors[1], pair.upstream.endswith("__init__.py"))
    affixes = comparison.trees.affixes
    known = VendorAffixes(affixes.affixes, frozenset(u.name for u in split_units(modules[0].body)))
    result.contract = derive_contract(modules[0], modules[1], known.upstream_name)
    defines = _Defines(comparison.trees.index, {UPSTREAM_PACKAGE, comparison.trees.package.root})
    result.merge = merge_file(modules, result.contract, defines, Extension.of(modules[1], set(anchors)))
    return result


@dataclass
class _Defines:
    """Whether a module of the indexed trees (target upstream, plugin) or a ported output defines a name."""

    index: ModuleIndex
    roots: set[str]
    """The packages checked: upstream's and the plugin's."""
    outputs: dict[str, set[str]] = field(default_factory=dict)

    def __call__(self, module: str, name: str) -> bool | None:
        return self.why_not(module, name) is None if module.split(".")[0] in self.roots else None

    def why_not(self, module: str, name: str) -> str | None:
        if module in self.outputs:
            names = self.outputs[module]
            known = not name or name in names or f"{module}.{name}" in self.index.modules
            return None if known else f"{module} (ported here) does not define {name}"
        if self.index.get(module) is None:
            return f"no module {module} in the target upstream tree or the plugin"
        return None if self._defines(module, name, STAR_HOPS) else f"{module} does not define {name}"

    def _defines(self, module: str, name: str, hops: int) -> bool:
        """Defined, bound by an import, or reached through a `from x import *` (followed `hops` deep)."""
        indexed = self.index.get(module)
        if indexed is None:
            return False
        record = indexed.record
        if not name or f"{module}.{name}" in self.index.modules or record.definition(name) is not None:
            return True
        if name in record.guarded_names or name in (record.exports or []):
            return True
        for item in record.imports:
            if any(alias == name for _, alias in item.names) or (not item.names and item.alias == name):
                return True
        stars = [indexed.absolute(i.module) for i in record.imports if any(n == "*" for n, _ in i.names)]
        return hops > 0 and any(self._defines(star, name, hops - 1) for star in stars)


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """What a module binds at its top level, inside its top-level if/try blocks included."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.If):
            names |= _top_level_names(node.body) | _top_level_names(node.orelse)
        elif isinstance(node, ast.Try):
            blocks = [node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)]
            names.update(n for block in blocks for n in _top_level_names(block))
    return names


def _verify(port: Port, index: ModuleIndex) -> None:
    defines = _Defines(index, {UPSTREAM_PACKAGE, port.package})
    for file in port.written:
        assert file.merge is not None
        try:
            defines.outputs[module_name(file.local) or ""] = _top_level_names(ast.parse(file.merge.code).body)
        except SyntaxError:
            pass
    for file in port.written:
        assert file.merge is not None and file.contract is not None
        contract = file.contract
        file.verification = verify_file(
            file.merge,
            module_name(file.local) or "",
            file.local.endswith("__init__.py"),
            lambda module, name: defines.why_not(module, name),
            {UPSTREAM_PACKAGE, port.package},
            contract.upstream_key,
        )
        if not file.verification.passed:
            file.status = "unverified"
        elif file.merge.conflicts:
            file.status = "conflicts"
