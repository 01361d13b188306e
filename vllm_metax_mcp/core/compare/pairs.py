"""What a comparison pairs: both sides (`Trees`) and the records pairing produces (`Pair`, `Pairing`).

The plugin keeps its code under its own top-level package (`PluginPackage`: `vllm_metax/`,
`vllm_ascend/`, decided from the paths a call compares), upstream under `vllm/`; upstream model
files lie in family directories `vllm/models/<family>/` (newer families) or flat in
`vllm/model_executor/models/`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from ..code.module_index import IndexedModule, ModuleIndex, module_name
from ..code.registration import Registration
from ..foundation.evidence import CommitEvidence, FileEvidence, NoteEvidence
from ..sources.subjects import Subject
from .affixes import VendorAffixes

UPSTREAM_ROOT = "vllm"
FAMILIES = f"{UPSTREAM_ROOT}/models/"
CLASSIC = f"{UPSTREAM_ROOT}/model_executor/models/"
MODEL_DIRS = (FAMILIES, CLASSIC)

EvidenceItem = FileEvidence | CommitEvidence | NoteEvidence


@dataclass(frozen=True)
class PluginPackage:
    """The plugin's top-level package, the local side of every path rule (`vllm_metax/X` <-> `vllm/X`).

    Decided once per call from the paths it compares (`core/compare/inputs.py`), never assumed:
    another vendor's plugin (`vllm_ascend`, `vllm_gcu`) keeps its forks under its own package.
    """

    name: str

    @property
    def root(self) -> str:
        """`<package>/`, the prefix of every plugin file."""
        return f"{self.name}/"

    @property
    def models(self) -> str:
        """`<package>/models/`, where the plugin keeps its model files."""
        return f"{self.name}/models/"

    def holds(self, module: str) -> bool:
        """Whether a dotted module name is the package or one of its sub-modules."""
        return module == self.name or module.startswith(self.name + ".")


class Rule(str, Enum):
    """The pairing rule that decided a pair (their order is in `core/compare/pairing.py`)."""

    OVERRIDE = "override"
    REGISTRATION = "registration"
    REGISTRY = "registry"
    SAME_PATH = "same_path"
    PLATFORM_BRANCH = "platform_branch"
    SHARED_DIR = "shared_dir"
    OTHER_PLATFORM = "other_platform"
    RENAMED = "renamed"
    UPSTREAM_ORIGINAL = "upstream_original"
    SUBCLASS = "subclass"
    IMPORT_SITE = "import_site"
    PACKAGE = "package"
    HISTORY = "history"
    NONE = "none"


class Status(str, Enum):
    IDENTICAL = "identical"
    CHANGED = "changed"
    LOCAL_ONLY = "local_only"
    REMOVED = "removed"


PairFlag = Literal[
    "content_matches_other",
    "content_candidate",
    "ambiguous",
    "other_platform",
    "unreferenced_dir",
    "conditional_branch",
    "moved",
    "name_only",
    "conflict",
    "parse_error",
]
"""What a reader of a pair should know besides its rule; `parse_error` is raised when a pair is reported."""

TargetKind = Literal["family", "branch", "shared", "other_platform", "unreferenced", "directory"]
"""Where a target-only file lies: a family root, a family sub-directory by its kind, or a mapped directory."""

TargetReason = Literal["imported_by_local", "other_platform", "new_at_target", "not_ported"]
"""Why a target-only file has no local counterpart: a plugin file imports it as it is, it is another
platform's, it is absent at the base release of its directory, or none of these (not ported)."""


@dataclass(frozen=True)
class Alternative:
    """Another upstream file a different piece of evidence points to; shown, never chosen silently."""

    upstream: str
    reason: str


@dataclass(frozen=True)
class Candidate:
    upstream: str
    similarity: float
    shared_symbols: int


@dataclass
class Pair:
    """A plugin file and its counterpart; the later rules (history, content) amend it in place."""

    local: str
    upstream: str | None
    rule: Rule
    confidence: float
    evidence: list[EvidenceItem]
    flags: list[PairFlag] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    extends: dict[str, str] = field(default_factory=dict)
    """Subclass pairs: local class -> the upstream class it extends."""
    alternatives: list[Alternative] = field(default_factory=list)
    merged_from: list[str] = field(default_factory=list)
    """Other upstream files whose code the local file also carries (a merge of several)."""
    status: Status = Status.LOCAL_ONLY

    @property
    def counterpart(self) -> str | None:
        """The upstream file compared with the local one: paired, and present there (changed or identical)."""
        return self.upstream if self.status in (Status.CHANGED, Status.IDENTICAL) else None

    def alternative(self, upstream: str, reason: str) -> None:
        if upstream != self.upstream and all(a.upstream != upstream for a in self.alternatives):
            self.alternatives.append(Alternative(upstream, reason))

    def flag(self, name: PairFlag, penalty: float) -> None:
        if name not in self.flags:
            self.flags.append(name)
            self.confidence = round(max(0.0, self.confidence - penalty), 2)


@dataclass(frozen=True)
class TargetOnly:
    """Upstream files of a mapped directory no plugin file pairs with: one file, or a directory of them."""

    upstream: str
    """A file, or a directory (trailing `/`) standing for `files` files."""
    kind: TargetKind
    reason: TargetReason
    files: int
    guard: str | None = None
    """other_platform: the dispatch condition that selects the directory."""
    by: str | None = None
    """imported_by_local: the first importing `plugin path:line` (and how many other files import it);
    new_at_target: the base release the files are absent from."""
    members: tuple[str, ...] = ()
    """The files the entry stands for (kept to split it again once the base releases are known)."""


@dataclass(frozen=True)
class Pairing:
    pairs: list[Pair]
    target_only: list[TargetOnly]
    unknowns: list[str]


@dataclass
class Trees:
    """Both sides of a comparison: the subjects, the plugin's package and one module index over both."""

    local: Subject
    upstream: Subject
    index: ModuleIndex
    package: PluginPackage
    registry: list[Registration] = field(default_factory=list)
    """Upstream's registry table entries (architecture -> module, class)."""
    affixes: VendorAffixes = field(default_factory=VendorAffixes)
    """The plugin's vendor affixes, read from both sides' names when pairing starts (`PairingContext`)."""
    local_modules: dict[str, IndexedModule] = field(init=False)
    upstream_modules: dict[str, IndexedModule] = field(init=False)
    upstream_files: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.local_modules = {m.path: m for m in self.index.modules.values() if m.side == "plugin"}
        self.upstream_modules = {m.path: m for m in self.index.modules.values() if m.side == "upstream"}
        self.upstream_files = frozenset(p for p in self.upstream.list(UPSTREAM_ROOT + "/") if p.endswith(".py"))


def paired_modules(pairs: Iterable[Pair]) -> dict[str, str]:
    """Local module -> the upstream module it is paired with (tells a copy's own imports from overrides)."""
    return {module_name(p.local) or "": module_name(p.upstream) or "" for p in pairs if p.upstream}
