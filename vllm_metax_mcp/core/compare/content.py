"""Content judgement after the rules: similarity proposes candidates and raises flags, never decides.

Each pair's pool is the upstream files sharing most of its top-level names, its counterpart, the
family files of the same base name and, for a name-only twin, its counterpart's siblings; the
upstream bytes of all pools are read once.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .pairing_context import PairingContext, SymbolScore, shared_count
from .pairs import Candidate, Pair, Rule
from .textdiff import line_profile, similarity

CONTENT_FLAG_MIN = 0.3
CONTENT_MARGIN = 0.1
CONTENT_PROPOSE_MIN = 0.5
POOL_SYMBOL_FILES = 5


@dataclass(frozen=True)
class _Pool:
    paths: frozenset[str]
    scores: dict[str, SymbolScore]


def _pool(context: PairingContext, pair: Pair) -> _Pool:
    scores = context.symbol_scores(context.local_names(pair.local))
    paths = set(sorted(scores, key=lambda p: (-scores[p].rarity, p))[:POOL_SYMBOL_FILES])
    if pair.upstream in context.trees.upstream_files:
        paths.add(pair.upstream)
    if "name_only" in pair.flags and pair.upstream:
        directory = posixpath.dirname(pair.upstream)  # a twin's code most often comes from a sibling
        paths.update(p for p in context.trees.upstream_files if posixpath.dirname(p) == directory)
    family = context.local_family(pair.local)
    if family:
        paths.update(p for p in context.families[family] if posixpath.basename(p) == posixpath.basename(pair.local))
    return _Pool(frozenset(paths), scores)


def propose_content_matches(context: PairingContext, pairs: list[Pair]) -> None:
    """Propose better content matches: the rule's choice stands, a flag and candidates are added."""
    pools = {
        pair.local: _pool(context, pair)
        for pair in pairs
        if pair.rule is not Rule.REGISTRATION and pair.local in context.trees.local_modules
    }
    wanted = sorted({p for pool in pools.values() for p in pool.paths})
    profiles = {path: line_profile(data) for path, data in context.trees.upstream.read_many(wanted).items()}
    for pair in pairs:
        pool = pools.get(pair.local)
        if pool is None or not pool.paths:
            continue
        mine = line_profile(context.local_data[pair.local])
        if not mine:
            continue  # comments only (a license header): nothing to compare
        ranked = {p: round(similarity(mine, profiles[p]), 2) for p in pool.paths}
        best = max(sorted(ranked), key=lambda p: ranked[p])
        current = ranked.get(pair.upstream or "", 0.0)
        if pair.upstream and best != pair.upstream and ranked[best] >= max(CONTENT_FLAG_MIN, current + CONTENT_MARGIN):
            pair.flag("content_matches_other", 0.3)
            chosen = (
                [Candidate(pair.upstream, current, shared_count(pool.scores, pair.upstream))]
                if pair.upstream in ranked
                else []
            )
            known = {c.upstream for c in pair.candidates}
            proposed = Candidate(best, ranked[best], shared_count(pool.scores, best))
            pair.candidates += [c for c in (*chosen, proposed) if c.upstream not in known]
        elif "name_only" in pair.flags and best != pair.upstream and ranked[best] > 0:
            pair.candidates.append(Candidate(best, ranked[best], shared_count(pool.scores, best)))
        elif pair.upstream is None and ranked[best] >= CONTENT_PROPOSE_MIN:
            pair.flag("content_candidate", 0.0)
            pair.candidates = [Candidate(best, ranked[best], shared_count(pool.scores, best))]
