"""Pairing: every plugin file with its true upstream counterpart, decided from evidence.

The rules run in order and the first that applies decides; each pair names its rule and cites
its evidence (the registration, the dispatch import, the shared symbols, the import sites):

1. `override` — the caller's `mapping_overrides`.
2. `registration` — a plugin module that registers architectures is the plugin's own (local_only).
3. `registry` — the file defines a class the plugin registers; upstream's registry maps that
   architecture to its upstream module, followed through a family `__init__` on the out-of-tree
   branch (`core/compare/registry_pairs.py`); other branches' files are alternatives, and a path or
   symbol rule naming another file is a `conflict`.
4. `same_path` — `<package>/X` ↔ `vllm/X` (the plugin's package, e.g. `vllm_metax`, as the call's
   paths name it); under `<package>/models/` a family directory `F/` ↔ `vllm/models/F/`, a flat
   file ↔ `vllm/models/` or `vllm/model_executor/models/`, and `<name>/<file>.py` ↔ the flat file.
5. `platform_branch` / `shared_dir` / `other_platform` — inside a family the plugin flattens
   upstream's platform directories. The family `__init__` dispatch, evaluated with every platform
   predicate false (`core/compare/family.py`), says which sub-directory is the out-of-tree platform's
   branch and which are shared; a name found only in another platform's directory still pairs,
   flagged.
6. `renamed` / `upstream_original` — most shared top-level functions and classes (the plugin's
   vendor affixes dropped, `core/compare/affixes.py`), in the model directories (a renamed file)
   or elsewhere in `vllm/` (kernels, layers).
7. `subclass` — local classes extend upstream classes, resolved through the local imports; for
   model files only bases defined in upstream model files count (not interfaces such as SupportsPP).
8. `none` — nothing applies: local_only.

Then, over all pairs: `import_site` pairs what paired files import from where their counterparts
import the same names (`core/compare/import_sites.py`); `package` re-pairs a package `__init__` by
its members or its re-exports and flags name-only twins (`core/compare/packages.py`); `history`
gives a file still unpaired what became of its path counterpart: the file upstream renamed it to
(git rename detection, chains followed; flagged `moved`), else the deleted path (status `removed`);
a rename to another file than the pair's is an alternative (`conflict`). Git upstreams only
(`core/compare/history.py`).

Content similarity never decides (`core/compare/content.py`): it proposes candidates and raises
`content_matches_other` when another upstream file matches the local content better than the
rule's counterpart. The upstream files nothing pairs with are listed by `core/compare/target_only.py`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..code.module_index import Definition, ModuleIndex, RecordCache
from ..code.registration import RegisteringFile, Registration, cached_upstream_registry
from ..foundation.evidence import CommitEvidence, NoteEvidence
from ..foundation.progress import advance, phase
from ..sources.subjects import RevisionSubject, Subject
from .content import propose_content_matches
from .family import FamilyLayout, SubdirKind
from .history import trails
from .import_sites import apply_import_sites, last_note
from .inputs import PairingInputs
from .packages import infer_packages
from .pairing_context import PairingContext, UpstreamBase, shared_count
from .pairs import (
    CLASSIC,
    FAMILIES,
    MODEL_DIRS,
    UPSTREAM_ROOT,
    Candidate,
    EvidenceItem,
    Pair,
    Pairing,
    PluginPackage,
    Rule,
    Status,
    Trees,
)
from .registry_pairs import RegistryMatch, registry_matches
from .target_only import local_imports, target_only


@dataclass(frozen=True)
class _KindRule:
    """The rule and confidence of a family match, by the kind of sub-directory its counterpart lies in."""

    rule: Rule
    confidence: float
    rank: int
    """Preference among matches of one file: the out-of-tree platform's own files first."""


KIND_RULE: dict[SubdirKind | None, _KindRule] = {
    None: _KindRule(Rule.SAME_PATH, 0.9, 0),
    SubdirKind.BRANCH: _KindRule(Rule.PLATFORM_BRANCH, 0.9, 0),
    SubdirKind.SHARED: _KindRule(Rule.SHARED_DIR, 0.85, 1),
    SubdirKind.UNREFERENCED: _KindRule(Rule.OTHER_PLATFORM, 0.4, 2),
    SubdirKind.OTHER_PLATFORM: _KindRule(Rule.OTHER_PLATFORM, 0.4, 3),
}


ONE_NAME_CONFIDENCE = 0.6
"""A counterpart that rests on one shared name is weak evidence, however few names the file has."""
INTERFACE_FAN_IN = 6
"""Upstream files with classes extending a base, from which on the base is an interface."""


def _span(link: _SubclassLink) -> int:
    return link.definition.end_line - link.definition.line + 1


@dataclass(frozen=True)
class _FamilyOption:
    rank: tuple[int, int, int]
    """(kind rank, flattened depth, which form of the local path matched): lower is better."""
    kind: SubdirKind | None


@dataclass(frozen=True)
class _SubclassLink:
    definition: Definition
    base: UpstreamBase


def _note(text: str) -> NoteEvidence:
    return NoteEvidence(text=text)


class _Rules:
    """The pairing rules in their order, each returning the pair it decides (or None: the next rule)."""

    def __init__(self, context: PairingContext, registered: list[Registration]) -> None:
        self.context = context
        self.trees = context.trees
        self.registry: dict[str, RegistryMatch] = registry_matches(context, registered)

    def by_registry(self, local: str) -> Pair | None:
        """The registered architecture's upstream file; a path or symbol rule that disagrees is a conflict.

        A file registering several architectures defined in different upstream files carries them all:
        the one a path or symbol rule agrees with (else its largest class) is the counterpart, the
        others are `merged_from`."""
        match = self.registry.get(local)
        if match is None:
            return None
        others = [p for p in (self.by_path(local), self.by_symbols(local)) if p is not None and p.upstream]
        chosen = match.primary({p.upstream for p in others if p.upstream})
        pair = Pair(local, chosen.upstream, Rule.REGISTRY, 0.95, list(chosen.evidence))
        pair.alternatives = list(chosen.alternatives)
        pair.merged_from = [f.upstream for f in match.finds if f is not chosen]
        for other in others:
            if other.upstream and other.upstream not in (chosen.upstream, *pair.merged_from):
                pair.alternative(other.upstream, f"{other.rule.value}: {last_note(other)}")
                pair.flag("conflict", 0.1)
        return pair

    def override(self, local: str, upstream: str | None) -> Pair:
        if upstream is None:
            return Pair(local, None, Rule.OVERRIDE, 1.0, [_note("mapping_overrides: no upstream counterpart")])
        evidence: list[EvidenceItem] = [_note(f"mapping_overrides: {local} -> {upstream}")]
        if upstream in self.trees.upstream.entries():
            evidence.insert(0, self.context.cite(upstream, 1))
        return Pair(local, upstream, Rule.OVERRIDE, 1.0, evidence)

    def registration(self, local: str, registering: RegisteringFile) -> Pair:
        evidence: list[EvidenceItem] = [
            self.context.cite(local, registering.first_line, local=True),
            _note(f"registers {registering.calls} architecture(s) with ModelRegistry.register_model"),
        ]
        return Pair(local, None, Rule.REGISTRATION, 1.0, evidence)

    def by_path(self, local: str) -> Pair | None:
        package = self.trees.package
        if not local.startswith(package.root):
            return None
        rest = local[len(package.root) :]
        if local.startswith(package.models):
            family = self.context.local_family(local)
            if family:
                return self._family_match(local, family, local[len(package.models) + len(family) + 1 :])
            inner = local[len(package.models) :]
            options = [(FAMILIES + inner, package.models, FAMILIES), (CLASSIC + inner, package.models, CLASSIC)]
            directory, _, name = inner.rpartition("/")
            if directory and name == posixpath.basename(directory) + ".py":
                # `<package>/models/<name>/<name>.py`: the plugin's own directory around a flat upstream file
                mine = f"{package.models}{directory}/"
                options += [(FAMILIES + name, mine, FAMILIES), (CLASSIC + name, mine, CLASSIC)]
        else:
            options = [(f"{UPSTREAM_ROOT}/{rest}", package.root, f"{UPSTREAM_ROOT}/")]
        for upstream, mine, theirs in options:
            if upstream in self.trees.upstream_files:
                evidence: list[EvidenceItem] = [
                    self.context.cite(upstream, 1),
                    _note(f"same path under {mine} and {theirs}"),
                ]
                return Pair(local, upstream, Rule.SAME_PATH, 0.95, evidence)
        return None

    def _family_match(self, local: str, family: str, within: str) -> Pair | None:
        root = FAMILIES + family
        if f"{root}/{within}" in self.trees.upstream_files:
            evidence: list[EvidenceItem] = [
                self.context.cite(f"{root}/{within}", 1),
                _note(f"same path under {self.trees.package.models}{family}/ and {root}/"),
            ]
            return Pair(local, f"{root}/{within}", Rule.SAME_PATH, 0.95, evidence)
        layout = self.context.layout(family)
        keys = [within]
        head, _, tail = within.partition("/")
        if tail and head not in layout.kinds:
            keys.append(tail)  # the plugin's own platform directory `head/`
        options: dict[str, _FamilyOption] = {}
        for upstream in self.context.families[family]:
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
                    rank = (KIND_RULE[kind].rank, depth, keys.index(form))
                    if upstream not in options or rank < options[upstream].rank:
                        options[upstream] = _FamilyOption(rank, kind)
        if not options:
            return None
        best = min(option.rank for option in options.values())
        tied = sorted(u for u, option in options.items() if option.rank == best)
        upstream = tied[0]
        scores: dict[str, float] = {}
        if len(tied) > 1:
            scores = self.context.similarities(local, tied)
            upstream = max(tied, key=lambda p: (scores[p], p == tied[0]))
        pair = self._flattened(local, upstream, within, layout, options[upstream].kind)
        if len(tied) > 1:
            shared = self.context.symbol_scores(self.context.local_names(local))
            pair.flag("ambiguous", 0.1)
            pair.candidates = [Candidate(p, scores[p], shared_count(shared, p)) for p in tied]
        return pair

    def _flattened(self, local: str, upstream: str, within: str, layout: FamilyLayout, kind: SubdirKind | None) -> Pair:
        rule, confidence = KIND_RULE[kind].rule, KIND_RULE[kind].confidence
        relative = upstream[len(layout.root) + 1 :]
        subdir = layout.subdir_of(upstream)
        evidence: list[EvidenceItem] = []
        decided = layout.evidence.get(subdir or "")
        if kind is None:
            note = f"plugin platform directory dropped: {within} -> {relative}"
        elif kind is SubdirKind.UNREFERENCED or decided is None:
            note = f"nothing on the taken path imports {subdir}/; {relative} flattened to {within}"
        else:
            evidence.append(self.context.cite(decided.path, decided.line))
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
        names = self.context.local_names(local)
        scores = self.context.symbol_scores(names)
        if not scores:
            return None
        family = self.context.local_family(local)
        near = (FAMILIES + family + "/") if family else None

        def rank(path: str) -> tuple[int, bool, float]:
            return scores[path].shared, bool(near and path.startswith(near)), round(scores[path].rarity, 6)

        top = max(rank(p) for p in scores)
        tied = sorted(p for p in scores if rank(p) == top)
        best = tied[0]
        count = scores[best].shared
        if count / len(names) < 0.5 or (count < 2 and len(self.context.symbols[scores[best].first]) > 1):
            return None  # one shared name is evidence only when no other upstream file defines it
        similarities: dict[str, float] = {}
        if len(tied) > 1:
            similarities = self.context.similarities(local, tied)
            best = max(tied, key=lambda p: (similarities[p], p == tied[0]))
        shared = sorted(n for n in names if best in self.context.symbols.get(n, {}))
        listed = ", ".join(shared[:5]) + (", …" if len(shared) > 5 else "")
        rule = Rule.RENAMED if best.startswith(MODEL_DIRS) else Rule.UPSTREAM_ORIGINAL
        evidence: list[EvidenceItem] = [
            self.context.cite(best, self.context.symbols[shared[0]][best]),
            _note(f"shares {count} of {len(names)} top-level symbols: {listed}"),
        ]
        confidence = round(0.5 + 0.4 * count / len(names), 2) if count > 1 else ONE_NAME_CONFIDENCE
        pair = Pair(local, best, rule, confidence, evidence)
        if len(tied) > 1:
            pair.flag("ambiguous", 0.1)
            pair.candidates = [Candidate(p, similarities[p], scores[p].shared) for p in tied]
        return pair

    def by_subclass(self, local: str) -> Pair | None:
        module = self.trees.local_modules.get(local)
        if module is None or module.record.error:
            return None
        links: dict[str, list[_SubclassLink]] = {}
        models_only = local.startswith(self.trees.package.models)
        for definition in module.record.definitions:
            if definition.kind == "class":
                for base in self.context.upstream_bases(module, definition):
                    if models_only and base.path not in self.context.model_files:
                        continue  # an interface or framework base (SupportsPP, AttentionBackend): not a fork
                    if self.context.base_fan_in(base.symbol) >= INTERFACE_FAN_IN:
                        continue  # a base many upstream files implement is an interface, not a fork's origin
                    links.setdefault(base.path, []).append(_SubclassLink(definition, base))
        if not links:
            return None
        best = max(sorted(links), key=lambda p: (len(links[p]), sum(_span(link) for link in links[p])))
        chosen = links[best]
        definition, ref = chosen[0].definition, chosen[0].base
        more = f" (+{len(chosen) - 1} more)" if len(chosen) > 1 else ""
        evidence: list[EvidenceItem] = [
            self.context.cite(local, definition.line, local=True),
            self.context.cite(best, ref.line),
            _note(f"{definition.name} extends {ref.module}:{ref.symbol}{more}"),
        ]
        named_alike = any(
            self.context.affixes.upstream_name(link.definition.name) == link.base.symbol for link in chosen
        )
        pair = Pair(local, best, Rule.SUBCLASS, 0.8 if named_alike else 0.6, evidence)
        pair.extends = {link.definition.name: link.base.symbol for link in chosen}
        return pair


def build_trees(
    local: Subject,
    upstream: Subject,
    cache: RecordCache,
    package: PluginPackage,
    prefixes: Iterable[str],
    extra: Iterable[str] = (),
) -> Trees:
    """Index the plugin's whole package (its registrations and vendor affixes lie anywhere in it; the
    compared files are `prefixes`) and the whole upstream `vllm/` (plus `extra` upstream paths, e.g.
    override targets elsewhere): symbol and subclass rules search all of upstream."""
    index = ModuleIndex()
    with phase("indexing plugin and upstream modules", 0.9):  # nearly all of a cold call: parsing
        index.add_tree("plugin", local, cache, sorted({package.root, *prefixes}))
        index.add_tree("upstream", upstream, cache, [UPSTREAM_ROOT + "/", *extra])
    registry = cached_upstream_registry(cache.store, upstream, UPSTREAM_ROOT + "/", index.reader("upstream", upstream))
    return Trees(local, upstream, index, package, registry)


def _status(pair: Pair, trees: Trees) -> Status:
    if pair.upstream is None:
        return Status.LOCAL_ONLY
    theirs = trees.upstream.entries().get(pair.upstream)
    if theirs is None:
        return Status.REMOVED
    return Status.IDENTICAL if theirs.sha == trees.local.sha(pair.local) else Status.CHANGED


def _apply_history(context: PairingContext, unmatched: list[Pair]) -> None:
    """What became of the path counterpart upstream amends the pairs the path rule left open.

    A file nothing paired gets it (rule `history`): the file its counterpart was renamed to (flagged
    `moved`, status from that file), else the deleted path (status `removed`). A file symbols, class
    bases or import sites paired keeps its pair: the history is its evidence (flagged `moved`) when it
    ends at that file or in a deletion; a rename to another file is an alternative, flagged `conflict`.
    """
    found = trails(context, [p.local for p in unmatched])
    for pair in unmatched:
        trail = found.get(pair.local)
        if trail is None:
            continue
        evidence: list[EvidenceItem] = []
        for step in trail.steps:
            evidence += [CommitEvidence(sha=step.commit), _note(step.note)]
        if pair.upstream is None:
            if trail.current:
                evidence.insert(0, context.cite(trail.current, 1))
            pair.upstream, pair.rule, pair.confidence = trail.current or trail.last, Rule.HISTORY, 0.8
            pair.evidence = evidence
            if trail.current:
                pair.flag("moved", 0.0)
        elif trail.current in (None, pair.upstream):
            pair.evidence += evidence
            pair.flag("moved", 0.0)
        else:
            pair.alternative(trail.current, "; ".join(step.note for step in trail.steps))
            pair.flag("conflict", 0.1)


def pair_files(
    trees: Trees,
    inputs: PairingInputs,
    answers: Mapping[str, bool] | None = None,
    judge_content: bool = True,
) -> Pairing:
    """Pair each of the compared files (sorted) with its upstream counterpart and list the target-only files.

    `judge_content=False` skips the content flags and candidates, which never change a pair's
    counterpart, and the target-only list (pairing against older releases only needs the counterparts).
    """
    local_data = trees.local.read_many(inputs.local_files)
    context = PairingContext(trees, local_data, answers or {}, inputs.registered)
    rules = _Rules(context, inputs.registered)
    pairs: list[Pair] = []
    unmatched: list[Pair] = []
    for local in inputs.local_files:
        advance(len(pairs), len(inputs.local_files), f"pairing {len(inputs.local_files)} files")
        if local in inputs.overrides:
            pair = rules.override(local, inputs.overrides[local])
        elif local in inputs.registrations:
            pair = rules.registration(local, inputs.registrations[local])
        else:
            found = rules.by_registry(local) or rules.by_path(local) or rules.by_symbols(local)
            found = found or rules.by_subclass(local)
            pair = found or Pair(
                local, None, Rule.NONE, 0.6, [_note("no registry, path, symbol, subclass or history counterpart")]
            )
            if found is None or found.rule in (Rule.RENAMED, Rule.UPSTREAM_ORIGINAL, Rule.SUBCLASS):
                unmatched.append(pair)
        pairs.append(pair)
    apply_import_sites(context, pairs)
    infer_packages(context, pairs)
    _apply_history(context, unmatched)
    if judge_content:
        propose_content_matches(context, pairs)
    for pair in pairs:
        pair.status = _status(pair, trees)
    if not judge_content:
        return Pairing(pairs, [], _unknowns(context))  # releases and audits read pairs only
    imports = local_imports(context)
    listed = target_only(context, pairs, imports)
    return Pairing(pairs, listed, [*_unknowns(context), *imports.unknowns])


def _unknowns(context: PairingContext) -> list[str]:
    unknowns = []
    if not isinstance(context.trees.upstream, RevisionSubject):
        unknowns.append(
            "The upstream is a directory without history: a local file whose counterpart upstream deleted "
            "reads as local_only, not removed."
        )
    for layout in context.layouts.values():
        if layout.error:
            unknowns.append(f"{layout.init_path} does not parse ({layout.error}): its platform dispatch is unknown.")
    return unknowns
