"""Vendor affixes: the words a plugin adds to the upstream names it forks (`AscendFoo`, `QuantFoo`, `FooGCU`).

A fork renames what it copies by a word of its own, which differs per vendor, so the affixes are
read from the plugin itself, never listed: a word is an affix when stripping it turns at least
`MIN_NAMES` of the plugin's top-level names (in `MIN_FILES` files) that upstream does not define
into names it does, or
when a registered class is the upstream architecture name plus that word (`register_model(
"DeepseekV4ForCausalLM", "...:AscendDeepseekV4ForCausalLM")`). `Maca`, the MetaX plugin's own
documented convention (the seeds' "Maca-style renames"), is always one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

MIN_NAMES = 3
"""Names an affix must explain before it counts, unless a registration proves it."""
MIN_FILES = 2
"""Files those names must come from, unless one file renamed most of its names with it."""
WHOLE_FILE_MIN = 3
"""A word on at least this many names, and half of one file's names, is that file's consistent rename."""
MAX_AFFIX = 16
"""Longest affix considered (characters): a vendor word, not half a name."""
MACA = ("Maca", "MACA")

MIN_WORD = 3
"""Shortest affix word (`Fn` in `LayerNormFn` is a name's own word, not a vendor's)."""
ONE_WORD = re.compile(r"^(?:[A-Z][a-z0-9]+|[A-Z][A-Z0-9]+|_[a-z0-9]+|[a-z0-9]+_)$")
"""One CamelCase word (`Ascend`, `GCU`) or one snake_case segment (`_npu`, `npu_`): an affix is one word."""

Position = Literal["prefix", "suffix"]


@dataclass(frozen=True)
class Affix:
    text: str
    position: Position

    def strip(self, name: str) -> str | None:
        """`name` without the affix, when it has it at a word boundary (`Ascend|Foo`, `ascend_|foo`)."""
        if self.position == "prefix":
            rest = name[len(self.text) :]
            boundary = self.text.endswith("_") or rest[:1].isupper()
            return rest if name.startswith(self.text) and rest and boundary else None
        rest = name[: -len(self.text)]
        boundary = self.text.startswith("_") or self.text[:1].isupper()
        return rest if name.endswith(self.text) and rest and boundary and not rest.endswith("_") else None


def boundaries(name: str) -> Iterable[Affix]:
    """Every one-word prefix and suffix cut of a name: before a capital letter, or at an underscore."""
    for index in range(2, len(name) - 1):
        head, tail = name[:index], name[index:]
        if name[index].isupper() and len(head) <= MAX_AFFIX and head[0].isupper():
            yield Affix(head, "prefix")
        if name[index].isupper() and len(tail) <= MAX_AFFIX:
            yield Affix(tail, "suffix")
        if name[index] == "_" and name[0] != "_":
            if len(head) < MAX_AFFIX:
                yield Affix(head + "_", "prefix")
            if len(tail) <= MAX_AFFIX:
                yield Affix(tail, "suffix")


@dataclass(frozen=True)
class VendorAffixes:
    """The affixes of one plugin, shortest first, and the upstream names they lead to."""

    affixes: tuple[Affix, ...] = tuple(Affix(text, "prefix") for text in MACA)
    known: frozenset[str] = frozenset()
    """Upstream's top-level names: a name upstream defines is never stripped (empty: strip any)."""

    def forms(self, name: str) -> list[str]:
        """The name, then its one-affix strips (shortest affix first), then a prefix and a suffix stripped."""
        found = [name]
        for affix in self.affixes:
            rest = affix.strip(name)
            if rest and rest not in found:
                found.append(rest)
        for first in list(found[1:]):
            for affix in self.affixes:
                rest = affix.strip(first)
                if rest and rest not in found:
                    found.append(rest)
        return found

    def upstream_name(self, name: str) -> str:
        """The upstream name a local name stands for (`AscendFoo` -> `Foo`): the first of its forms
        upstream defines; the name itself when upstream defines it or no form is known."""
        if not self.known:
            return next(iter(self.forms(name)[1:]), name)
        return next((form for form in self.forms(name) if form in self.known), name)


def _word(affix: Affix) -> bool:
    return bool(ONE_WORD.match(affix.text)) and len(affix.text.strip("_")) >= MIN_WORD


def _length(affix: Affix) -> int:
    return len(affix.text)


def discover_affixes(
    local_names: Iterable[tuple[str, str]], upstream_names: Collection[str], registered: Iterable[tuple[str, str]] = ()
) -> VendorAffixes:
    """The plugin's affixes from its own names (see the module docstring).

    `local_names`: (file, name) of the plugin's top-level definitions. A word counts when it explains
    at least `MIN_NAMES` names in at least `MIN_FILES` files (one file's naming habit is not a vendor's),
    is one word of at least `MIN_WORD` letters,
    or at least `WHOLE_FILE_MIN` names making up half of one file's names (a file renamed as a whole,
    `QuantDeepseekMLP`, `QuantDeepseekMoE`, ...), each name voting for its shortest cut upstream defines.
    `registered`: (architecture, registered class name) pairs of the plugin's `register_model` calls;
    these prove an affix alone.
    """
    files: dict[Affix, Counter[str]] = {}
    names: Counter[Affix] = Counter()
    per_file: Counter[str] = Counter()
    for path, name in sorted(set(local_names)):
        per_file[path] += 1
        if name in upstream_names:
            continue
        cuts = sorted((a for a in boundaries(name) if _word(a) and a.strip(name) in upstream_names), key=_length)
        if cuts:
            files.setdefault(cuts[0], Counter())[path] += 1
            names[cuts[0]] += 1
    proven = set()
    for arch, cls in registered:
        if cls != arch and cls.endswith(arch) and cls[: -len(arch)]:
            proven.add(Affix(cls[: -len(arch)], "prefix"))
        elif cls != arch and cls.startswith(arch) and cls[len(arch) :]:
            proven.add(Affix(cls[len(arch) :], "suffix"))
    spread = {a for a, count in names.items() if count >= MIN_NAMES and len(files[a]) >= MIN_FILES}
    whole_file = {
        a
        for a, by_file in files.items()
        if any(n >= WHOLE_FILE_MIN and 2 * n >= per_file[path] for path, n in by_file.items())
    }
    found = spread | whole_file | proven
    found |= set(VendorAffixes().affixes)
    ordered = tuple(sorted(found, key=lambda a: (len(a.text), a.position, a.text)))
    return VendorAffixes(ordered, frozenset(upstream_names))
