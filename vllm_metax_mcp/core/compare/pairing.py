"""Pairing: every plugin file with its true upstream counterpart, decided from evidence.

The rules run in order and the first that applies decides; each pair names its rule and cites
its evidence (the dispatch import, the shared symbols, the class bases, the deleting commit):

1. `override` — the caller's `mapping_overrides`.
2. `registration` — a plugin module that registers architectures is the plugin's own (local_only).
3. `same_path` — `vllm_metax/X` ↔ `vllm/X`; under `vllm_metax/models/` a family directory `F/` ↔
   `vllm/models/F/`, a flat file ↔ `vllm/models/` or `vllm/model_executor/models/`.
4. `platform_branch` / `shared_dir` / `other_platform` — inside a family the plugin flattens
   upstream's platform directories. The family `__init__` dispatch, evaluated with every platform
   predicate false (`core/compare/family.py`), says which sub-directory is the out-of-tree platform's
   branch and which are shared; a name found only in another platform's directory still pairs,
   flagged.
5. `renamed` / `upstream_original` — most shared top-level functions and classes (`Maca` prefix
   dropped), in the model directories (a renamed file) or elsewhere in `vllm/` (kernels, layers).
6. `subclass` — local classes extend upstream classes, resolved through the local imports.
7. `history` — the path counterpart existed upstream and was deleted before the target (status
   `removed`; git upstreams only).
8. `none` — nothing applies: local_only.

Content similarity never decides: it proposes candidates and raises `content_matches_other` when
another upstream file matches the local content better than the rule's counterpart.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..code.module_index import (
    Definition,
    IndexedModule,
    ModuleIndex,
    RecordCache,
    module_name,
)
from ..foundation.evidence import CommitEvidence, FileEvidence, NoteEvidence
from ..sources.subjects import RevisionSubject, Subject
from .family import FamilyLayout, SubdirKind, family_layout
from .symdiff import strip_maca
from .textdiff import line_profile, similarity

LOCAL_ROOT = "vllm_metax"
UPSTREAM_ROOT = "vllm"
LOCAL_MODELS = f"{LOCAL_ROOT}/models/"
FAMILIES = f"{UPSTREAM_ROOT}/models/"
CLASSIC = f"{UPSTREAM_ROOT}/model_executor/models/"
MODEL_DIRS = (FAMILIES, CLASSIC)

CONTENT_FLAG_MIN = 0.3
CONTENT_MARGIN = 0.1
CONTENT_PROPOSE_MIN = 0.5
POOL_SYMBOL_FILES = 5
DIR_COLLAPSE = 8
"""Target-only files of one directory beyond this count are reported as one directory entry."""

EvidenceItem = FileEvidence | CommitEvidence | NoteEvidence


class Rule(str, Enum):
    OVERRIDE = "override"
    REGISTRATION = "registration"
    SAME_PATH = "same_path"
    PLATFORM_BRANCH = "platform_branch"
    SHARED_DIR = "shared_dir"
    OTHER_PLATFORM = "other_platform"
    RENAMED = "renamed"
    UPSTREAM_ORIGINAL = "upstream_original"
    SUBCLASS = "subclass"
    HISTORY = "history"
    NONE = "none"


class Status(str, Enum):
    IDENTICAL = "identical"
    CHANGED = "changed"
    LOCAL_ONLY = "local_only"
    REMOVED = "removed"


KIND_RULE = {
    None: (Rule.SAME_PATH, 0.9),
    SubdirKind.BRANCH: (Rule.PLATFORM_BRANCH, 0.9),
    SubdirKind.SHARED: (Rule.SHARED_DIR, 0.85),
    SubdirKind.UNREFERENCED: (Rule.OTHER_PLATFORM, 0.4),
    SubdirKind.OTHER_PLATFORM: (Rule.OTHER_PLATFORM, 0.4),
}
KIND_RANK = {
    None: 0,
    SubdirKind.BRANCH: 0,
    SubdirKind.SHARED: 1,
    SubdirKind.UNREFERENCED: 2,
    SubdirKind.OTHER_PLATFORM: 3,
}


@dataclass(frozen=True)
class Candidate:
    upstream: str
    similarity: float
    shared_symbols: int


@dataclass
class Pair:
    local: str
    upstream: str | None
    rule: Rule
    confidence: float
    evidence: list[EvidenceItem]
    flags: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    extends: dict[str, str] = field(default_factory=dict)
    """Subclass pairs: local class -> the upstream class it extends."""
    status: Status = Status.LOCAL_ONLY

    def flag(self, name: str, penalty: float) -> None:
        if name not in self.flags:
            self.flags.append(name)
            self.confidence = round(max(0.0, self.confidence - penalty), 2)


@dataclass(frozen=True)
class TargetOnly:
    upstream: str
    """A file, or a directory (trailing `/`) standing for `files` files."""
    kind: str
    """family | branch | shared | other_platform | unreferenced | directory."""
    files: int
    guard: str | None = None


@dataclass
class Pairing:
    pairs: list[Pair]
    target_only: list[TargetOnly]
    unknowns: list[str]


@dataclass(frozen=True)
class _BaseRef:
    symbol: str
    module: str
    path: str
    line: int


@dataclass
class Trees:
    """Both sides of a comparison: the subjects and one module index over both."""

    local: Subject
    upstream: Subject
    index: ModuleIndex
    local_modules: dict[str, IndexedModule] = field(init=False)
    upstream_modules: dict[str, IndexedModule] = field(init=False)
    upstream_files: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.local_modules = {m.path: m for m in self.index.modules.values() if m.side == "plugin"}
        self.upstream_modules = {m.path: m for m in self.index.modules.values() if m.side == "upstream"}
        self.upstream_files = frozenset(p for p in self.upstream.list(UPSTREAM_ROOT + "/") if p.endswith(".py"))


def build_trees(
    local: Subject, upstream: Subject, cache: RecordCache, prefixes: Iterable[str], extra: Iterable[str] = ()
) -> Trees:
    """Index the plugin's `prefixes` and the whole upstream `vllm/` (plus `extra` upstream paths,
    e.g. override targets elsewhere): symbol and subclass rules search all of upstream."""
    index = ModuleIndex()
    index.add_tree("plugin", local, cache, prefixes)
    index.add_tree("upstream", upstream, cache, [UPSTREAM_ROOT + "/", *extra])
    return Trees(local, upstream, index)


def paired_modules(pairs: Iterable[Pair]) -> dict[str, str]:
    """Local module -> the upstream module it is paired with (tells a copy's own imports from overrides)."""
    return {module_name(p.local) or "": module_name(p.upstream) or "" for p in pairs if p.upstream}


def _note(text: str) -> NoteEvidence:
    return NoteEvidence(text=text)


class _Pairer:
    """The rules, with what they share: family layouts, the upstream symbol table, the local bytes."""

    def __init__(self, trees: Trees, local_data: Mapping[str, bytes], answers: Mapping[str, bool]) -> None:
        self.trees = trees
        self.local_data = local_data
        self.answers = answers
        self.layouts: dict[str, FamilyLayout] = {}
        self.families: dict[str, list[str]] = {}
        for path in sorted(trees.upstream_files):
            if path.startswith(FAMILIES) and path[len(FAMILIES) :].count("/"):
                self.families.setdefault(path[len(FAMILIES) :].split("/")[0], []).append(path)
        self.symbols: dict[str, dict[str, int]] = {}
        for module in trees.upstream_modules.values():
            for definition in module.record.definitions:
                if definition.kind in ("function", "class") and not definition.name.startswith("__"):
                    self.symbols.setdefault(definition.name, {}).setdefault(module.path, definition.line)

    # -- helpers ---------------------------------------------------------------------------

    def _file(self, path: str, line: int, local: bool = False) -> FileEvidence:
        subject = self.trees.local if local else self.trees.upstream
        return FileEvidence(path=path, line=max(1, line), rev=subject.sha(path))

    def layout(self, family: str) -> FamilyLayout:
        if family not in self.layouts:
            self.layouts[family] = family_layout(
                self.trees.index, FAMILIES + family, self.families[family], self.answers
            )
        return self.layouts[family]

    def local_family(self, local: str) -> str | None:
        """The upstream family a local file's directory mirrors (`vllm_metax/models/F/...`)."""
        if not local.startswith(LOCAL_MODELS):
            return None
        family, _, within = local[len(LOCAL_MODELS) :].partition("/")
        return family if within and family in self.families else None

    def _similarities(self, local: str, upstream: list[str]) -> dict[str, float]:
        mine = line_profile(self.local_data[local])
        data = self.trees.upstream.read_many(upstream)
        return {path: round(similarity(mine, line_profile(data[path])), 2) for path in upstream}

    def _bindings(self, module: IndexedModule) -> dict[str, str]:
        """Import-bound names of a module -> the absolute dotted target they stand for."""
        bound: dict[str, str] = {}
        for record in module.record.imports:
            if record.branch == "not_taken":
                continue
            target = module.absolute(record.module)
            if record.names:
                for original, alias in record.names:
                    bound.setdefault(alias, f"{target}.{original}")
            elif record.alias:
                bound.setdefault(record.alias, target)
            else:
                top = target.split(".")[0]
                bound.setdefault(top, top)
        return bound

    def _upstream_bases(self, module: IndexedModule, definition: Definition) -> list[_BaseRef]:
        """The bases of a local class that resolve to classes defined in the upstream tree."""
        bindings = self._bindings(module)
        refs = []
        for base in definition.bases:
            head, *rest = base.split("[")[0].split(".")
            if head not in bindings:
                continue
            owner, _, symbol = ".".join([bindings[head], *rest]).rpartition(".")
            if owner != UPSTREAM_ROOT and not owner.startswith(UPSTREAM_ROOT + "."):
                continue
            defining, name = self.trees.index.resolve_symbol(owner, symbol)
            found = self.trees.index.get(defining)
            target = found.record.definition(name) if found is not None and found.side == "upstream" and name else None
            if found is not None and target is not None and target.kind == "class":
                refs.append(_BaseRef(target.name, defining, found.path, target.line))
        return refs

    def local_names(self, local: str) -> dict[str, Definition]:
        """Top-level functions and classes of a local file by upstream name (`Maca` dropped),
        without classes that extend the upstream class of that name (an extension, not a copy)."""
        module = self.trees.local_modules.get(local)
        if module is None or module.record.error:
            return {}
        names: dict[str, Definition] = {}
        for definition in module.record.definitions:
            if definition.kind not in ("function", "class") or definition.name.startswith("__"):
                continue
            name = strip_maca(definition.name)
            if definition.kind == "class" and any(b.symbol == name for b in self._upstream_bases(module, definition)):
                continue
            names.setdefault(name, definition)
        return names

    def symbol_scores(self, names: Mapping[str, Definition]) -> dict[str, tuple[int, float, str]]:
        """Upstream path -> (shared symbols, their summed rarity, first shared symbol)."""
        scores: dict[str, tuple[int, float, str]] = {}
        for name in sorted(names):
            places = self.symbols.get(name, {})
            for path in places:
                count, rarity, first = scores.get(path, (0, 0.0, name))
                scores[path] = (count + 1, rarity + 1 / len(places), first)
        return scores

    # -- the rules -------------------------------------------------------------------------

    def override(self, local: str, upstream: str | None) -> Pair:
        if upstream is None:
            return Pair(local, None, Rule.OVERRIDE, 1.0, [_note("mapping_overrides: no upstream counterpart")])
        evidence: list[EvidenceItem] = [_note(f"mapping_overrides: {local} -> {upstream}")]
        if upstream in self.trees.upstream.entries():
            evidence.insert(0, self._file(upstream, 1))
        return Pair(local, upstream, Rule.OVERRIDE, 1.0, evidence)

    def registration(self, local: str, line: int, count: int) -> Pair:
        evidence = [
            self._file(local, line, local=True),
            _note(f"registers {count} architecture(s) with ModelRegistry.register_model"),
        ]
        return Pair(local, None, Rule.REGISTRATION, 1.0, evidence)

    def by_path(self, local: str) -> Pair | None:
        if not local.startswith(LOCAL_ROOT + "/"):
            return None
        rest = local[len(LOCAL_ROOT) + 1 :]
        if local.startswith(LOCAL_MODELS):
            family = self.local_family(local)
            if family:
                return self._family_match(local, family, local[len(LOCAL_MODELS) + len(family) + 1 :])
            inner = local[len(LOCAL_MODELS) :]
            options = [(FAMILIES + inner, LOCAL_MODELS, FAMILIES), (CLASSIC + inner, LOCAL_MODELS, CLASSIC)]
        else:
            options = [(f"{UPSTREAM_ROOT}/{rest}", f"{LOCAL_ROOT}/", f"{UPSTREAM_ROOT}/")]
        for upstream, mine, theirs in options:
            if upstream in self.trees.upstream_files:
                evidence = [self._file(upstream, 1), _note(f"same path under {mine} and {theirs}")]
                return Pair(local, upstream, Rule.SAME_PATH, 0.95, evidence)
        return None

    def _family_match(self, local: str, family: str, within: str) -> Pair | None:
        root = FAMILIES + family
        if f"{root}/{within}" in self.trees.upstream_files:
            evidence = [
                self._file(f"{root}/{within}", 1),
                _note(f"same path under {LOCAL_MODELS}{family}/ and {root}/"),
            ]
            return Pair(local, f"{root}/{within}", Rule.SAME_PATH, 0.95, evidence)
        layout = self.layout(family)
        keys = [within]
        head, _, tail = within.partition("/")
        if tail and head not in layout.kinds:
            keys.append(tail)  # the plugin's own platform directory `head/`
        options: dict[str, tuple[tuple[int, int, int], SubdirKind | None]] = {}
        for upstream in self.families[family]:
            subdir = layout.subdir_of(upstream)
            relative = upstream[len(root) + 1 :]
            if subdir is None:
                forms = [(0, relative)]
            else:
                inner = relative[len(subdir) + 1 :]
                forms = [(0, inner), (1, posixpath.basename(inner))]
            kind = layout.kinds.get(subdir) if subdir else None
            for depth, form in forms:
                if form in keys:
                    rank = (KIND_RANK[kind], depth, keys.index(form))
                    if upstream not in options or rank < options[upstream][0]:
                        options[upstream] = (rank, kind)
        if not options:
            return None
        best = min(rank for rank, _ in options.values())
        tied = sorted(u for u, (rank, _) in options.items() if rank == best)
        upstream = tied[0]
        scores: dict[str, float] = {}
        if len(tied) > 1:
            scores = self._similarities(local, tied)
            upstream = max(tied, key=lambda p: (scores[p], p == tied[0]))
        pair = self._flattened(local, upstream, within, layout, options[upstream][1])
        if len(tied) > 1:
            shared = self.symbol_scores(self.local_names(local))
            pair.flag("ambiguous", 0.1)
            pair.candidates = [Candidate(p, scores[p], shared.get(p, (0, 0.0, ""))[0]) for p in tied]
        return pair

    def _flattened(self, local: str, upstream: str, within: str, layout: FamilyLayout, kind: SubdirKind | None) -> Pair:
        rule, confidence = KIND_RULE[kind]
        relative = upstream[len(layout.root) + 1 :]
        subdir = layout.subdir_of(upstream)
        evidence: list[EvidenceItem] = []
        decided = layout.evidence.get(subdir or "")
        if kind is None:
            note = f"plugin platform directory dropped: {within} -> {relative}"
        elif kind is SubdirKind.UNREFERENCED or decided is None:
            note = f"nothing on the taken path imports {subdir}/; {relative} flattened to {within}"
        else:
            evidence.append(self._file(decided.path, decided.line))
            guard = decided.guard or "unconditional"
            if kind is SubdirKind.BRANCH:
                reason = f"{decided.outcome} branch [{guard}] of the dispatch imports {subdir}/"
            elif kind is SubdirKind.SHARED and decided.path == layout.init_path:
                reason = f"{subdir}/ is imported by the taken branch [{guard}] and by another platform's branch"
            elif kind is SubdirKind.SHARED:
                reason = f"{subdir}/ is imported on the taken path"
            else:
                reason = f"{subdir}/ is imported only when [{guard}], false for an out-of-tree platform"
            note = f"{reason}; {relative} flattened to {within}"
        evidence.append(_note(note))
        pair = Pair(local, upstream, rule, confidence, evidence)
        if kind is SubdirKind.OTHER_PLATFORM:
            pair.flag("other_platform", 0.0)
        elif kind is SubdirKind.UNREFERENCED:
            pair.flag("unreferenced_dir", 0.0)
        if decided is not None and decided.outcome == "conditional":
            pair.flag("conditional_branch", 0.1)
        return pair

    def by_symbols(self, local: str) -> Pair | None:
        names = self.local_names(local)
        scores = self.symbol_scores(names)
        if not scores:
            return None
        family = self.local_family(local)
        near = (FAMILIES + family + "/") if family else None

        def rank(path: str) -> tuple[int, bool, float]:
            return scores[path][0], bool(near and path.startswith(near)), round(scores[path][1], 6)

        top = max(rank(p) for p in scores)
        tied = sorted(p for p in scores if rank(p) == top)
        best = tied[0]
        count, _, first = scores[best]
        if count / len(names) < 0.5 or (count < 2 and len(self.symbols[first]) > 1):
            return None  # one shared name is evidence only when no other upstream file defines it
        similarities: dict[str, float] = {}
        if len(tied) > 1:
            similarities = self._similarities(local, tied)
            best = max(tied, key=lambda p: (similarities[p], p == tied[0]))
        shared = sorted(n for n in names if best in self.symbols.get(n, {}))
        listed = ", ".join(shared[:5]) + (", …" if len(shared) > 5 else "")
        rule = Rule.RENAMED if best.startswith(MODEL_DIRS) else Rule.UPSTREAM_ORIGINAL
        evidence = [
            self._file(best, self.symbols[shared[0]][best]),
            _note(f"shares {count} of {len(names)} top-level symbols: {listed}"),
        ]
        pair = Pair(local, best, rule, round(0.5 + 0.4 * count / len(names), 2), evidence)
        if len(tied) > 1:
            pair.flag("ambiguous", 0.1)
            pair.candidates = [Candidate(p, similarities[p], scores[p][0]) for p in tied]
        return pair

    def by_subclass(self, local: str) -> Pair | None:
        module = self.trees.local_modules.get(local)
        if module is None or module.record.error:
            return None
        links: dict[str, list[tuple[Definition, _BaseRef]]] = {}
        for definition in module.record.definitions:
            if definition.kind == "class":
                for ref in self._upstream_bases(module, definition):
                    links.setdefault(ref.path, []).append((definition, ref))
        if not links:
            return None
        best = max(sorted(links), key=lambda p: len(links[p]))
        chosen = links[best]
        definition, ref = chosen[0]
        more = f" (+{len(chosen) - 1} more)" if len(chosen) > 1 else ""
        evidence = [
            self._file(local, definition.line, local=True),
            self._file(best, ref.line),
            _note(f"{definition.name} extends {ref.module}:{ref.symbol}{more}"),
        ]
        named_alike = any(strip_maca(d.name) == r.symbol for d, r in chosen)
        pair = Pair(local, best, Rule.SUBCLASS, 0.8 if named_alike else 0.6, evidence)
        pair.extends = {d.name: r.symbol for d, r in chosen}
        return pair

    # -- history ---------------------------------------------------------------------------

    def _expected(self, local: str) -> tuple[list[str], str, str] | None:
        """(pathspecs, upstream directory, path within it) where a path counterpart would be."""
        family = self.local_family(local)
        if family:
            within = local[len(LOCAL_MODELS) + len(family) + 1 :]
            return [f":(glob){FAMILIES}{family}/**/{posixpath.basename(within)}"], FAMILIES + family, within
        if local.startswith(LOCAL_MODELS):
            inner = local[len(LOCAL_MODELS) :]
            return [FAMILIES + inner, CLASSIC + inner], "", inner
        if local.startswith(LOCAL_ROOT + "/"):
            rest = local[len(LOCAL_ROOT) + 1 :]
            return [f"{UPSTREAM_ROOT}/{rest}"], UPSTREAM_ROOT, rest
        return None

    def _hits(self, deleted: str, directory: str, within: str) -> bool:
        if not directory:
            return deleted in (FAMILIES + within, CLASSIC + within)
        if not deleted.startswith(directory + "/"):
            return False
        relative = deleted[len(directory) + 1 :]
        if directory.startswith(FAMILIES) and relative.count("/"):
            kind = self.layout(directory[len(FAMILIES) :]).kinds.get(relative.split("/")[0])
            if kind in (SubdirKind.OTHER_PLATFORM, SubdirKind.UNREFERENCED):
                return False
            return posixpath.basename(relative) == posixpath.basename(within)
        return relative == within

    def deletions(self, locals_: list[str]) -> dict[str, tuple[str, str]]:
        """local -> (deleted upstream path, deleting commit), from the upstream git history."""
        upstream = self.trees.upstream
        expected = {local: e for local in locals_ if (e := self._expected(local))}
        if not isinstance(upstream, RevisionSubject) or not expected:
            return {}
        specs = sorted({spec for specs, _, _ in expected.values() for spec in specs})
        log = upstream.repo.text(
            "log",
            "--no-renames",
            "--diff-filter=D",
            "--name-only",
            "--format=format:@%H",
            upstream.commit,
            "--",
            *specs,
        )
        deleted: dict[str, str] = {}
        commit = ""
        for line in log.splitlines():
            if line.startswith("@"):
                commit = line[1:]
            elif line and line not in deleted and line not in self.trees.upstream_files:
                deleted[line] = commit
        found: dict[str, tuple[str, str]] = {}
        for local, (_, directory, within) in expected.items():
            hit = next((p for p in deleted if self._hits(p, directory, within)), None)
            if hit:
                found[local] = (hit, deleted[hit])
        return found

    # -- content ---------------------------------------------------------------------------

    def judge_content(self, pairs: list[Pair]) -> None:
        """Propose better content matches: the rule's choice stands, a flag and candidates are added."""
        pools: dict[str, tuple[set[str], dict[str, tuple[int, float, str]]]] = {}
        for pair in pairs:
            if pair.rule is Rule.REGISTRATION or pair.local not in self.trees.local_modules:
                continue
            scores = self.symbol_scores(self.local_names(pair.local))
            pool = set(sorted(scores, key=lambda p: (-scores[p][1], p))[:POOL_SYMBOL_FILES])
            if pair.upstream in self.trees.upstream_files:
                pool.add(pair.upstream)
            family = self.local_family(pair.local)
            if family:
                pool.update(p for p in self.families[family] if posixpath.basename(p) == posixpath.basename(pair.local))
            pools[pair.local] = (pool, scores)
        wanted = sorted({p for pool, _ in pools.values() for p in pool})
        profiles = {path: line_profile(data) for path, data in self.trees.upstream.read_many(wanted).items()}
        for pair in pairs:
            if pair.local not in pools or not pools[pair.local][0]:
                continue
            pool, scores = pools[pair.local]
            mine = line_profile(self.local_data[pair.local])
            ranked = {p: round(similarity(mine, profiles[p]), 2) for p in pool}
            best = max(sorted(ranked), key=lambda p: ranked[p])
            current = ranked.get(pair.upstream or "", 0.0)
            shared = {p: scores.get(p, (0, 0.0, ""))[0] for p in ranked}
            if (
                pair.upstream
                and best != pair.upstream
                and ranked[best] >= max(CONTENT_FLAG_MIN, current + CONTENT_MARGIN)
            ):
                pair.flag("content_matches_other", 0.3)
                chosen = [Candidate(pair.upstream, current, shared[pair.upstream])] if pair.upstream in ranked else []
                known = {c.upstream for c in pair.candidates}
                pair.candidates += [
                    c for c in (*chosen, Candidate(best, ranked[best], shared[best])) if c.upstream not in known
                ]
            elif pair.upstream is None and ranked[best] >= CONTENT_PROPOSE_MIN:
                pair.flag("content_candidate", 0.0)
                pair.candidates = [Candidate(best, ranked[best], shared[best])]

    # -- target-only -----------------------------------------------------------------------

    def target_only(self, pairs: list[Pair]) -> list[TargetOnly]:
        """Upstream files of the mapped directories that no local file pairs with."""
        paired = {p.upstream for p in pairs if p.upstream}
        families = sorted({f for p in pairs if (f := self.local_family(p.local))})
        groups: dict[tuple[str, str, str | None], list[str]] = {}
        for family in families:
            layout = self.layout(family)
            for upstream in self.families[family]:
                if upstream in paired:
                    continue
                subdir = layout.subdir_of(upstream)
                kind = layout.kinds[subdir].value if subdir else "family"
                collapsed = kind in (SubdirKind.OTHER_PLATFORM.value, SubdirKind.UNREFERENCED.value)
                directory = f"{layout.root}/{subdir}" if collapsed else posixpath.dirname(upstream)
                decided = layout.evidence.get(subdir or "")
                guard = decided.guard if decided is not None and kind == SubdirKind.OTHER_PLATFORM.value else None
                groups.setdefault((directory, kind, guard), []).append(upstream)
        roots = tuple(FAMILIES + f + "/" for f in families)
        directories = sorted(
            {posixpath.dirname(u) for u in paired if u in self.trees.upstream_files and not u.startswith(roots)}
        )
        for directory in directories:
            rest = [u for u in self.trees.upstream_files if posixpath.dirname(u) == directory and u not in paired]
            if rest:
                groups.setdefault((directory, "directory", None), []).extend(rest)
        entries: list[TargetOnly] = []
        for (directory, kind, guard), files in sorted(groups.items(), key=lambda item: item[0][:2]):
            if kind in (SubdirKind.OTHER_PLATFORM.value, SubdirKind.UNREFERENCED.value) or len(files) > DIR_COLLAPSE:
                entries.append(TargetOnly(directory + "/", kind, len(files), guard))
            else:
                entries += [TargetOnly(f, kind, 1) for f in sorted(files)]
        return entries


def _status(pair: Pair, trees: Trees) -> Status:
    if pair.upstream is None:
        return Status.LOCAL_ONLY
    theirs = trees.upstream.entries().get(pair.upstream)
    if theirs is None:
        return Status.REMOVED
    return Status.IDENTICAL if theirs.sha == trees.local.sha(pair.local) else Status.CHANGED


def pair_files(
    trees: Trees,
    local_files: list[str],
    overrides: Mapping[str, str | None],
    registrations: Mapping[str, tuple[int, int]],
    answers: Mapping[str, bool] | None = None,
    judge_content: bool = True,
) -> Pairing:
    """Pair each of `local_files` (sorted) with its upstream counterpart and list the target-only files.

    `registrations` maps plugin files that call `register_model` to (first line, call count).
    `judge_content=False` skips the content flags and candidates, which never change a pair's
    counterpart (pairing against older releases only needs the counterparts).
    """
    local_data = trees.local.read_many(local_files)
    pairer = _Pairer(trees, local_data, answers or {})
    pairs: list[Pair] = []
    unmatched: list[Pair] = []
    for local in local_files:
        if local in overrides:
            pair = pairer.override(local, overrides[local])
        elif local in registrations:
            pair = pairer.registration(local, *registrations[local])
        else:
            found = pairer.by_path(local) or pairer.by_symbols(local) or pairer.by_subclass(local)
            pair = found or Pair(
                local, None, Rule.NONE, 0.6, [_note("no path, symbol, subclass or history counterpart")]
            )
            if found is None or found.rule in (Rule.RENAMED, Rule.UPSTREAM_ORIGINAL, Rule.SUBCLASS):
                unmatched.append(pair)
        pairs.append(pair)
    deleted = pairer.deletions([p.local for p in unmatched])
    for pair in unmatched:
        if pair.local not in deleted:
            continue
        path, commit = deleted[pair.local]
        evidence: list[EvidenceItem] = [
            CommitEvidence(sha=commit),
            _note(f"{path} was deleted upstream in {commit[:12]}"),
        ]
        if pair.upstream is None:
            pair.upstream, pair.rule, pair.confidence, pair.evidence = path, Rule.HISTORY, 0.8, evidence
        else:
            pair.evidence += evidence
            pair.flag("moved", 0.0)
    if judge_content:
        pairer.judge_content(pairs)
    for pair in pairs:
        pair.status = _status(pair, trees)
    unknowns = []
    if not isinstance(trees.upstream, RevisionSubject):
        unknowns.append(
            "The upstream is a directory without history: a local file whose counterpart upstream deleted reads as local_only, not removed."
        )
    for layout in pairer.layouts.values():
        if layout.error:
            unknowns.append(f"{layout.init_path} does not parse ({layout.error}): its platform dispatch is unknown.")
    return Pairing(pairs, pairer.target_only(pairs), unknowns)
