"""Package inference: what a local package's members pair with says where the package itself lies.

When at least `MIN_MEMBERS` members of a local package, and most of them, pair into one upstream
package, the package maps there: its `__init__` pairs with that package's `__init__` (over a path guess that flattened a
platform directory), and members nothing paired pair by base name inside it. A package `__init__`
that re-exports names from its submodules pairs with the upstream `__init__` that re-exports most
of the corresponding names. A pair by name whose files share no top-level symbol is flagged
`name_only` (with the plugin commit that created the file, and the file it was renamed or copied
from, when the plugin is a git subject), with its best content match beside it; similarity never
decides it.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass

from ..foundation.evidence import CommitEvidence, NoteEvidence
from ..sources.git import path_origin
from ..sources.subjects import Subject, git_position
from .import_sites import last_note
from .pairing_context import PairingContext
from .pairs import UPSTREAM_ROOT, EvidenceItem, Pair, Rule

MIN_MEMBERS = 2
INIT = "__init__.py"
GUESSED = frozenset({Rule.NONE, Rule.SUBCLASS, Rule.PLATFORM_BRANCH, Rule.SHARED_DIR, Rule.OTHER_PLATFORM})
"""Rules an `__init__` pair may be re-decided from: nothing, a class base, or a flattened path."""
BY_NAME = frozenset({Rule.SAME_PATH, Rule.PLATFORM_BRANCH, Rule.SHARED_DIR, Rule.OTHER_PLATFORM, Rule.PACKAGE})


@dataclass(frozen=True)
class _PackageMap:
    upstream: str
    """The upstream package directory."""
    members: tuple[str, ...]
    """The local members that pair into it."""


def _package_maps(pairs: list[Pair]) -> dict[str, _PackageMap]:
    """Local package directory -> the upstream directory a majority of its members pair into.

    A package whose members all pair with one upstream file is that file split up, not a package
    counterpart, so it maps nowhere."""
    seen: dict[str, Counter[str]] = {}
    members: dict[tuple[str, str], set[str]] = {}
    counterparts: dict[str, set[str]] = {}
    members_of: Counter[str] = Counter()
    for pair in pairs:
        if posixpath.basename(pair.local) == INIT:
            continue
        directory = posixpath.dirname(pair.local)
        members_of[directory] += 1
        if pair.upstream is None:
            continue
        for upstream in {pair.upstream, *pair.merged_from}:
            counterparts.setdefault(directory, set()).add(upstream)
            target = posixpath.dirname(upstream)
            if pair.local not in members.get((directory, target), set()):
                seen.setdefault(directory, Counter())[target] += 1
                members.setdefault((directory, target), set()).add(pair.local)
    found: dict[str, _PackageMap] = {}
    for directory, counts in seen.items():
        (target, count), *_ = counts.most_common()
        if count >= MIN_MEMBERS and 2 * count > members_of[directory] and len(counterparts[directory]) > 1:
            found[directory] = _PackageMap(target, tuple(sorted(members[(directory, target)])))
    return found


def _repair(pair: Pair, upstream: str, evidence: list[EvidenceItem], confidence: float) -> None:
    """Re-pair by package evidence; the path guess it replaces stays as an alternative."""
    before, reason = pair.upstream, f"{pair.rule.value}: {last_note(pair)}"
    pair.upstream, pair.rule, pair.confidence, pair.evidence = upstream, Rule.PACKAGE, confidence, evidence
    if before:
        pair.alternative(before, reason)
    pair.flags = [f for f in pair.flags if f not in ("other_platform", "unreferenced_dir", "conditional_branch")]
    pair.extends = {}


def _by_members(context: PairingContext, pairs: list[Pair]) -> None:
    for directory, mapped in _package_maps(pairs).items():
        listed = ", ".join(posixpath.basename(m) for m in mapped.members)
        for pair in pairs:
            if posixpath.dirname(pair.local) != directory:
                continue
            name = posixpath.basename(pair.local)
            counterpart = f"{mapped.upstream}/{name}"
            if counterpart not in context.trees.upstream_files or pair.upstream == counterpart:
                continue
            if (name == INIT and pair.rule in GUESSED) or pair.rule is Rule.NONE:
                note = f"{directory}/ maps to {mapped.upstream}/: its members {listed} pair there"
                _repair(pair, counterpart, [context.cite(counterpart, 1), NoteEvidence(text=note)], 0.7)


def _reexports(context: PairingContext, pairs: list[Pair]) -> None:
    """A local `__init__` re-exporting paired submodules' names pairs with the upstream `__init__`
    whose package holds those submodules' counterparts and re-exports the same names."""
    paired = {p.local: p.upstream for p in pairs if p.upstream}
    index = context.trees.index
    for pair in pairs:
        module = context.trees.local_modules.get(pair.local)
        if posixpath.basename(pair.local) != INIT or module is None or pair.rule not in GUESSED:
            continue
        votes: Counter[str] = Counter()
        exported = 0
        for record in module.record.imports:
            for original, _ in record.names:
                defining, _ = index.resolve_symbol(module.absolute(record.module), original)
                source = index.get(defining)
                counterpart = paired.get(source.path) if source is not None and source.side == "plugin" else None
                if source is not None and source.side == "plugin":
                    exported += 1
                if counterpart:
                    for init in _upstream_inits(context, counterpart, context.affixes.upstream_name(original)):
                        votes[init] += 1
        (init, count), *_ = votes.most_common() or [("", 0)]
        if count >= MIN_MEMBERS and 2 * count > exported:  # most of what it re-exports, not one submodule's share
            note = f"re-exports {count} name(s) from paired submodules that {init} re-exports too"
            _repair(pair, init, [context.cite(init, 1), NoteEvidence(text=note)], 0.8)


def _upstream_inits(context: PairingContext, counterpart: str, name: str) -> list[str]:
    """The upstream package `__init__`s above `counterpart` that bind `name` from it."""
    found = []
    directory = posixpath.dirname(counterpart)
    while directory.startswith(UPSTREAM_ROOT + "/") or directory == UPSTREAM_ROOT:
        init = f"{directory}/{INIT}"
        module = context.trees.upstream_modules.get(init)
        if module is not None:
            for record in module.record.imports:
                if any(alias == name for _, alias in record.names) and record.branch != "not_taken":
                    found.append(init)
                    break
        directory = posixpath.dirname(directory)
    return found


def flag_name_only(context: PairingContext, pairs: list[Pair]) -> None:
    """Pairs by name where both files define top-level names and share none (nor extend one another)."""
    for pair in pairs:
        module = context.trees.local_modules.get(pair.local)
        theirs = context.trees.upstream_modules.get(pair.upstream or "")
        if pair.rule not in BY_NAME or module is None or theirs is None or module.record.error:
            continue
        mine = {context.affixes.upstream_name(d.name) for d in module.record.definitions if d.kind != "assignment"}
        defined = {d.name for d in theirs.record.definitions if d.kind != "assignment"}
        extends = any(
            base.path == theirs.path
            for d in module.record.definitions
            if d.kind == "class"
            for base in context.upstream_bases(module, d)
        )
        if mine and defined and not mine & defined and not extends:
            pair.flag("name_only", 0.2)
            pair.evidence += _origin(context.trees.local, pair.local)


def _origin(local: Subject, path: str) -> list[EvidenceItem]:
    """A name-only twin's history: the plugin commit that created the file, and the file it was
    renamed or copied from (git subjects only)."""
    position = git_position(local)
    origin = path_origin(position.repo, position.revision, path) if position is not None else None
    if origin is None:
        return []
    source = f", renamed or copied from {origin.source}" if origin.source else ""
    note = f"name-only twin: plugin commit {origin.commit[:12]} ({origin.subject!r}) created it{source}"
    return [CommitEvidence(sha=origin.commit), NoteEvidence(text=note)]


def infer_packages(context: PairingContext, pairs: list[Pair]) -> None:
    """Mechanisms 2 and 3 of the pairing (see the module docstring), then the name-only flags: an
    `__init__` the members do not decide may still be decided by what it re-exports."""
    _by_members(context, pairs)
    _reexports(context, pairs)
    flag_name_only(context, pairs)
