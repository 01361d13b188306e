"""Inherited behaviour of plugin subclasses of upstream classes, between base and target.

A plugin class keeps running upstream code it does not see: the methods it inherits, and through
`super()` the methods it overrides. Per plugin class whose method resolution order reaches an
upstream class, and per member, what changed between base and target: an overridden upstream
method whose body or signature changed, vanished, or appeared (the plugin's method now overrides
it), or whose new parameters the override lacks; an inherited method that changed, appeared or
vanished (the last only when the class uses it); a plugin method that an upstream class now
shadows. And per class: its MRO at base and at target (C3, bases resolved through imports and
guarded aliases such as `Base = Other` under `if TYPE_CHECKING: ... else:`), and a target MRO
Python cannot linearize. A finding another plugin class in the MRO also has is left to that class;
one inherited upstream change is one finding, naming the other plugin classes that inherit it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Literal, get_args

from ..code.codebase import Codebase, Outcome, Ref
from ..code.dispatch import dotted, evaluate
from ..code.module_index import Definition, ModuleIndex
from ..foundation.evidence import Evidence, FileEvidence
from ..sources.subjects import Subject
from .signatures import Params

MAX_ALIAS_HOPS = 4
MAX_MRO = 64
SHOWN_MRO = 8
SHOWN_OTHERS = 3

InheritedKind = Literal[
    "lacks_parameter",
    "mro_conflict",
    "override_gone",
    "override_shadowed",
    "override_new",
    "override_changed",
    "mro_changed",
    "inherited_gone",
    "inherited_changed",
    "inherited_added",
]
"""In the order findings are listed: what breaks first, what to review last."""
ORDER = {kind: rank for rank, kind in enumerate(get_args(InheritedKind))}


@dataclass
class Inherited:
    kind: InheritedKind
    symbol: str
    """The plugin class (`module:Class`) and the member (`.name`) the finding is about."""
    file: str
    line: int
    upstream: str | None
    """The upstream member at the target (at base when it is gone there), or the class for MRO kinds."""
    detail: str
    evidence: list[Evidence] = field(default_factory=list)
    """The plugin line, the upstream line at the target, the upstream line at base."""


@dataclass(frozen=True)
class _Class:
    """One entry of an MRO: an indexed class, or a base the index does not define (a leaf)."""

    symbol: str
    module: str | None = None
    definition: Definition | None = field(default=None, compare=False)


def base_codebase(code: Codebase, base: ModuleIndex | None, tree: Subject | None) -> Codebase | None:
    """The plugin modules with upstream at base, so plugin classes resolve against base's upstream."""
    if base is None or tree is None:
        return None
    merged = ModuleIndex()
    merged.modules = {**base.modules, **{n: m for n, m in code.index.modules.items() if m.side == "plugin"}}
    return Codebase(merged, {"plugin": code.subjects["plugin"], "upstream": tree}, code.first_party)


class _Linearizer:
    """C3 linearizations of classes in one codebase, memoized (None: Python raises TypeError)."""

    def __init__(self, code: Codebase) -> None:
        self.code = code
        self.memo: dict[str, list[_Class] | None] = {}
        self.pending: set[str] = set()

    def upstream(self, entry: _Class) -> bool:
        indexed = self.code.get(entry.module) if entry.module else None
        return indexed is not None and indexed.side == "upstream"

    def of(self, module: str, name: str) -> list[_Class] | None:
        definition = (indexed := self.code.get(module)) and indexed.record.definition(name)
        if not definition or definition.kind != "class":
            return None
        return self.mro(_Class(f"{module}:{name}", module, definition))

    def mro(self, entry: _Class) -> list[_Class] | None:
        if entry.definition is None or entry.symbol in self.pending:
            return [entry]
        if entry.symbol not in self.memo:
            self.pending.add(entry.symbol)
            bases = [b for text in entry.definition.bases if (b := self.entry(entry.module or "", text))]
            lines = [self.mro(b) for b in bases]
            self.pending.discard(entry.symbol)
            merged = None if any(line is None for line in lines) else _c3([*lines, bases])  # type: ignore[list-item]
            self.memo[entry.symbol] = [entry, *merged][:MAX_MRO] if merged is not None else None
        return self.memo[entry.symbol]

    def entry(self, module: str, text: str, hops: int = 0) -> _Class | None:
        """What a base written in `module` is; None for `object` and `Generic[...]`-style parameters."""
        name = text.split("[")[0]
        if name in ("object", "typing.Generic", "Generic"):
            return None
        indexed = self.code.get(module)
        ref = self.code.bind(module, name)
        if ref is None and indexed is not None and name in indexed.record.guarded_names:
            ref = Ref(module, (name,))
        if ref is None or len(ref.path) != 1:
            return _Class(ref.symbol if ref else name)
        found = self.code.resolve(ref.module, ref.path[0])
        if found.outcome is not Outcome.DEFINED:
            return _Class(ref.symbol)
        owner = found.name or ref.path[0]
        definition = (defining := self.code.get(found.module)) and defining.record.definition(owner)
        if definition and definition.kind == "class":
            return _Class(f"{found.module}:{owner}", found.module, definition)
        alias = _alias(self.code.tree(found.module), owner) if hops < MAX_ALIAS_HOPS else None
        return self.entry(found.module, alias, hops + 1) if alias else _Class(f"{found.module}:{owner}")


def linearization(code: Codebase, module: str, name: str) -> list[str] | None:
    """The MRO of a class as `module:Class` symbols (bases the index does not define as written);
    None when Python could not linearize it."""
    mro = _Linearizer(code).of(module, name)
    return [e.symbol for e in mro] if mro is not None else None


def _c3(sequences: list[list[_Class]]) -> list[_Class] | None:
    pending = [list(s) for s in sequences if s]
    merged: list[_Class] = []
    while pending:
        head = next((s[0] for s in pending if not any(s[0] in t[1:] for t in pending)), None)
        if head is None:
            return None
        merged.append(head)
        pending = [rest for s in pending if (rest := s[1:] if s[0] == head else s)]
    return merged


def _alias(tree: ast.Module | None, name: str) -> str | None:
    """The dotted name `name = X` binds at module level, in the branch an out-of-tree platform runs."""

    def search(statements: list[ast.stmt]) -> str | None:
        for statement in statements:
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in statement.targets
            ):
                return dotted(statement.value)
            if isinstance(statement, ast.If):
                answer = evaluate(statement.test)
                blocks = [statement.body] if answer else [statement.orelse] if answer is False else [statement.body]
                blocks += [statement.orelse] if answer is None else []
            elif isinstance(statement, ast.Try):
                blocks = [statement.body, statement.orelse]
            else:
                continue
            found = next((f for block in blocks if (f := search(block))), None)
            if found:
                return found
        return None

    return search(tree.body) if tree else None


# -- members ---------------------------------------------------------------------------------


def _owner(mro: list[_Class], member: str, upstream: _Linearizer | None = None) -> _Class | None:
    """The first class of `mro` defining `member` (the first upstream one when `upstream` is given)."""
    for entry in mro:
        if entry.definition and member in entry.definition.members and (upstream is None or upstream.upstream(entry)):
            return entry
    return None


def _class_node(code: Codebase, entry: _Class) -> ast.ClassDef | None:
    tree = code.tree(entry.module) if entry.module else None
    name = entry.symbol.rpartition(":")[2]
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None


def _member_node(code: Codebase, entry: _Class, member: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    node = _class_node(code, entry)
    body = node.body if node else []
    found = [i for i in body if isinstance(i, (ast.FunctionDef, ast.AsyncFunctionDef)) and i.name == member]
    return found[-1] if found else None


def _evidence(code: Codebase, entry: _Class, member: str | None) -> FileEvidence | None:
    if entry.module is None or entry.definition is None or code.get(entry.module) is None:
        return None
    node = _member_node(code, entry, member) if member else None
    return code.evidence(entry.module, node.lineno if node else entry.definition.line)


def _abstract(node: ast.FunctionDef | ast.AsyncFunctionDef | None) -> bool:
    """An `@abstractmethod`, or a body that only raises NotImplementedError."""
    if node is None:
        return False
    if any((dotted(d) or "").split(".")[-1] == "abstractmethod" for d in node.decorator_list):
        return True
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    error = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return dotted(error) == "NotImplementedError"


def _params(signature: str) -> Params | None:
    first = Params.parse(signature, False)
    return Params.parse(signature, bool(first and first.positional[:1] in (["self"], ["cls"])))


def parameter_gaps(override: str, before: str, after: str) -> list[str]:
    """How an override's parameters fall short of what its upstream method gained between base and
    target: names it lacks, parameters the base now defaults that it still requires, and parameters
    the base now takes positionally that it takes keyword-only."""
    mine, old, new = _params(override), _params(before), _params(after)
    if mine is None or old is None or new is None:
        return []
    accepted = set(mine.positional + mine.keyword_only)
    gained = [p for p in new.positional + new.keyword_only if p not in old.positional + old.keyword_only]
    gaps = [f"lacks {p}" for p in gained if p not in accepted and not mine.var_keyword]
    gaps += [
        f"requires {p}, which the base now defaults"
        for p in old.required
        if p not in new.required and p in mine.required
    ]
    gaps += [
        f"takes {p} keyword-only, the base now positionally"
        for p in new.positional
        if p in old.keyword_only and p in mine.keyword_only
    ]
    return gaps


def _follows(override: str, base: str) -> bool:
    """Whether an override follows its base method's signature (accepts most of the parameters the
    base had) rather than having a shape of its own, as constructors of composite layers do."""
    mine, theirs = _params(override), _params(base)
    if mine is None or theirs is None:
        return False
    names = theirs.positional + theirs.keyword_only
    shared = set(names) & set(mine.positional + mine.keyword_only)
    return mine.var_keyword or not names or 2 * len(shared) > len(names)


# -- per class -------------------------------------------------------------------------------


@dataclass
class _Pair:
    """The two codebases and their linearizers."""

    code: Codebase
    target: _Linearizer
    base_code: Codebase | None
    base: _Linearizer | None


def _uses(node: ast.ClassDef | None) -> dict[str, int]:
    """Attributes the class reads on `self`, `cls` or `super()`, with the line of the first read."""
    found: dict[str, int] = {}
    for child in ast.walk(node) if node else []:
        if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
            owner = child.value
            if (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                isinstance(owner, ast.Call) and dotted(owner.func) == "super"
            ):
                found[child.attr] = min(found.get(child.attr, child.lineno), child.lineno)
    return found


@dataclass
class _View:
    """One plugin class seen at target and at base."""

    me: _Class
    after: list[_Class]
    """The MRO at the target."""
    before: list[_Class]
    uses: dict[str, int]
    lost: set[str] = field(default_factory=set)
    """Classes of the base MRO the target reaches no more because a base does not resolve there
    (that import breaks: a defect), with what only they brought in."""


def _lost(base: _Linearizer, after: list[_Class], before: list[_Class]) -> set[str]:
    leaves = {e.symbol for e in after if e.definition is None}
    gone = [e for e in before if e.definition is not None and e.symbol in leaves]
    kept = {e.symbol for e in after}
    return {e.symbol for e in gone} | {c.symbol for e in gone for c in base.mro(e) or [] if c.symbol not in kept}


def _changed(before: _Class | None, after: _Class | None, member: str) -> bool:
    old = before.definition.members.get(member) if before and before.definition else None
    new = after.definition.members.get(member) if after and after.definition else None
    return old != new


def _signature(entry: _Class | None, member: str) -> str:
    return entry.definition.member_signatures.get(member, "") if entry and entry.definition else ""


def _member(pair: _Pair, view: _View, member: str) -> tuple[InheritedKind, _Class | None, _Class | None, str] | None:
    """The kind of change of one member, the upstream owners at target and at base, and the detail."""
    assert pair.base is not None
    now, then = _owner(view.after, member), _owner(view.before, member)
    up_now, up_then = _owner(view.after, member, pair.target), _owner(view.before, member, pair.base)
    if up_then is not None and up_then.symbol in view.lost:
        return None
    if now is not None and now.symbol == view.me.symbol:
        if up_now is None:
            return ("override_gone", None, up_then, "the upstream method it overrode is gone") if up_then else None
        if up_then is None:
            return "override_new", up_now, None, "the upstream class gained it: the plugin's method now overrides it"
        if not _changed(up_then, up_now, member):
            return None
        old, new, mine = _signature(up_then, member), _signature(up_now, member), _signature(view.me, member)
        gaps = parameter_gaps(mine, old, new)
        if gaps and _follows(mine, old):
            return "lacks_parameter", up_now, up_then, "; ".join(gaps)
        return "override_changed", up_now, up_then, _delta(old, new)
    if now is None or not pair.target.upstream(now):
        if now is None and up_then is not None and member in view.uses:
            return "inherited_gone", None, up_then, "used by the class, gone upstream"
        return None
    if then is not None and not pair.base.upstream(then):
        return "override_shadowed", now, then, f"{then.symbol}.{member} no longer wins: {now.symbol} precedes it"
    if then is None:
        abstract = _abstract(_member_node(pair.code, now, member))
        return "inherited_added", now, None, "new upstream method" + (", abstract: implement it" if abstract else "")
    if not _changed(then, now, member):
        return None
    return "inherited_changed", now, then, _delta(_signature(then, member), _signature(now, member))


def _delta(old: str, new: str) -> str:
    """A signature change in a few words (the evidence lines show both)."""
    if old == new:
        return "body changed, signature unchanged"
    before, after = _params(old), _params(new)
    if before is None or after is None:
        return "signature changed"
    names, now = before.positional + before.keyword_only, after.positional + after.keyword_only
    parts = [
        f"{what} {', '.join(ps)}"
        for what, ps in (("gained", [p for p in now if p not in names]), ("lost", [p for p in names if p not in now]))
        if ps
    ]
    return "signature " + ("; ".join(parts) if parts else "changed (annotations, defaults or order)")


def _mro_change(view: _View) -> tuple[str, str]:
    """What changed in the MRO, and the first class it names."""
    leaves = {e.symbol for e in view.after if e.definition is None}
    unresolved = sorted(e.symbol for e in view.before if e.definition is not None and e.symbol in leaves)
    added = [e.symbol for e in view.after if e not in view.before and e.symbol not in leaves]
    removed = [e.symbol for e in view.before if e not in view.after and e.symbol not in view.lost]
    named = (("unresolved", unresolved), ("adds", added), ("drops", removed))
    parts = [f"{what} {', '.join(names)}" for what, names in named if names]
    first = next(iter([*unresolved, *added, *removed]), view.after[1].symbol)
    return "; ".join(parts) or "same classes, new order", first


def _short(mro: list[_Class]) -> str:
    names = [e.symbol.rpartition(":")[2] for e in mro[1 : SHOWN_MRO + 1]]
    return " > ".join(names) + (" > …" if len(mro) > SHOWN_MRO + 1 else "")


def _swap(pair: _Pair, module: str, definition: Definition) -> str:
    """How the class puts a plugin base before an upstream one (its own classes ahead of upstream's)."""
    bases = [b for text in definition.bases if (b := pair.target.entry(module, text))]
    plugin = next((b for b in bases if b.module and not pair.target.upstream(b)), None)
    after = [b for b in bases[bases.index(plugin) + 1 :] if pair.target.upstream(b)] if plugin else []
    return f"; puts plugin {plugin.symbol} before upstream {after[0].symbol}" if plugin and after else ""


SHARED = ("inherited_changed", "inherited_added")
"""Kinds grouped across the plugin classes that inherit the same upstream change."""
OWN = ("lacks_parameter", "override_gone", "override_new", "override_changed")
"""Kinds about a member the class itself defines: never left to another class."""
Keyed = tuple[tuple[str, str, str | None, str], Inherited]
"""A finding and what makes it the same as another class's: kind, member, upstream, change."""


def _class_findings(pair: _Pair, module: str, definition: Definition) -> list[Keyed]:
    """Findings of one plugin class (none when no upstream class is in its MRO)."""
    me = _Class(f"{module}:{definition.name}", module, definition)
    mro = pair.target.mro(me)
    before = pair.base.mro(me) if pair.base else None
    where = pair.code.evidence(module, definition.line)
    if mro is None:
        conflict = Inherited("mro_conflict", me.symbol, where.path, where.line, None, "no consistent MRO", [where])
        return [] if pair.base is not None and before is None else [(("mro_conflict", "", None, ""), conflict)]
    if pair.base is None or before is None:
        return []
    if not any(pair.target.upstream(e) for e in mro[1:]) and not any(pair.base.upstream(e) for e in before[1:]):
        return []
    view = _View(me, mro, before, _uses(_class_node(pair.code, me)), _lost(pair.base, mro, before))
    found = [_mro_finding(pair, view, where)] if [e.symbol for e in mro] != [e.symbol for e in before] else []
    for member in sorted({m for e in [*mro, *before] if e.definition for m in e.definition.members}):
        result = _member(pair, view, member)
        if result is not None:
            found.append(_member_finding(pair, view, member, result, where))
    return found


def _mro_finding(pair: _Pair, view: _View, where: FileEvidence) -> Keyed:
    """The MRO change, with the plugin class and the first class it names at target and at base."""
    change, first = _mro_change(view)
    assert view.me.definition is not None and view.me.module is not None
    swap = _swap(pair, view.me.module, view.me.definition)
    detail = f"{change}{swap}; MRO at base {_short(view.before)}; at target {_short(view.after)}"
    sides = ((pair.code, view.after), (pair.base_code, view.before))
    named = [_evidence(code, e, None) for code, line in sides if code for e in line if e.symbol == first]
    evidence: list[Evidence] = [where, *(e for e in named if e)]
    return ("mro_changed", "", None, change), Inherited(
        "mro_changed", view.me.symbol, where.path, where.line, first, detail, evidence
    )


def _member_finding(
    pair: _Pair,
    view: _View,
    member: str,
    result: tuple[InheritedKind, _Class | None, _Class | None, str],
    where: FileEvidence,
) -> Keyed:
    """One member's finding: the plugin line (its override, or where it uses a vanished member, or
    the class), then the upstream member at the target and at base."""
    kind, up_now, up_then, detail = result
    code, me = pair.code, view.me
    own = _evidence(code, me, member) if kind in OWN else where
    if kind == "inherited_gone" and me.module:
        own = code.evidence(me.module, view.uses[member])
    evidence: list[Evidence] = [e for e in (own, up_now and _evidence(code, up_now, member)) if e]
    if up_then is not None and pair.base_code and (old := _evidence(pair.base_code, up_then, member)):
        evidence.append(old)
    upstream = up_now or up_then
    upstream_member = f"{upstream.symbol}.{member}" if upstream else None
    line = own.line if own else where.line
    finding = Inherited(kind, f"{me.symbol}.{member}", where.path, line, upstream_member, detail, evidence)
    return (kind, member, upstream_member, detail), finding


def inherited_behaviour(code: Codebase, base_code: Codebase | None, modules: list[str]) -> list[Inherited]:
    """Findings for the classes of `modules` (plugin modules on the path); without a base only MRO
    conflicts. A finding a plugin class further up the MRO has too is reported there only."""
    pair = _Pair(code, _Linearizer(code), base_code, _Linearizer(base_code) if base_code else None)
    per_class: dict[str, list[Keyed]] = {}
    for module in modules:
        indexed = code.get(module)
        for definition in indexed.record.definitions if indexed else []:
            if definition.kind == "class":
                per_class[f"{module}:{definition.name}"] = _class_findings(pair, module, definition)
    found = []
    for symbol, keyed in per_class.items():
        module, _, name = symbol.partition(":")
        above = {key for e in (pair.target.of(module, name) or [])[1:] for key, _ in per_class.get(e.symbol, [])}
        found += [f for key, f in keyed if f.kind in OWN or key not in above]
    return _grouped(sorted(found, key=lambda f: (ORDER[f.kind], f.file, f.line, f.symbol)))


def _grouped(found: list[Inherited]) -> list[Inherited]:
    """One finding per inherited upstream change, naming the other plugin classes that inherit it
    too (sibling subclasses of one upstream base all see the same change)."""
    first: dict[tuple[str, str | None, str], Inherited] = {}
    others: dict[tuple[str, str | None, str], list[str]] = {}
    kept = []
    for finding in found:
        key: tuple[str, str | None, str] = (finding.kind, finding.upstream, finding.detail)
        if finding.kind not in SHARED or key not in first:
            first.setdefault(key, finding)
            kept.append(finding)
            continue
        others.setdefault(key, []).append(finding.symbol.partition(":")[2].partition(".")[0])
    for same, names in others.items():
        shown = ", ".join(names[:SHOWN_OTHERS]) + (", …" if len(names) > SHOWN_OTHERS else "")
        first[same].detail += f"; also inherited by {len(names)} more: {shown}"
    return kept
