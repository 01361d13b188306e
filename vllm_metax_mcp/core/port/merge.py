"""The structure-aware three-way merge of one forked file: base (the release the fork was taken from),
local (the fork) and target (the counterpart at the target release).

Per unit (top-level symbol, class member, import statement; see `units`), with the MetaX contract
applied to base and target first (so a rename or swap alone is not a local change):

- changed only upstream: the target's; changed only locally: the local one; equal: the target's;
- added upstream: added in the target's order; added locally: kept after the local unit before it;
- removed upstream: removed, unless the local side changed it or the output still uses what it
  defines (then kept, and said); removed locally: stays removed (a conflict where upstream changed it);
- in an extension (a local file that imports from its upstream counterpart module): what the local
  file does not define stays upstream (`upstream_only`: it reaches the plugin by import), and a local
  class extending an upstream class merges its overrides against that class's methods;
- changed on both sides: a class merges its shell and its members one by one; an import statement
  merges its names; anything else merges its lines (`lines3`), and a conflicting hunk is kept with
  both versions: the local lines active, the target's commented above them, under a numbered marker.

The module's order follows the target. Nothing is chosen silently: every unit gets a `Decision`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import libcst as cst

from .contract import Applied, Contract, Defines, Skipped, apply_contract, bound_names, module_bindings, swap_import
from .imports import merge_import_names, one_module_moved, split_import
from .lines3 import Conflict, merge3
from .units import Unit, align, class_body, class_shell, normalized, parse_statement, render, split_units
from .usage import Prune, missing_names

Action = Literal[
    "taken", "kept", "merged", "added_upstream", "added_local", "removed_upstream", "removed_local",
    "kept_removed", "conflict", "upstream_only", "restored",
]  # fmt: skip
MARK = "port_model conflict"
FORCE_ROUNDS = 4


@dataclass(frozen=True)
class Decision:
    key: str
    """The unit: `class:Foo`, a member `class:Foo/def:bar`, `from:vllm.x`."""
    action: Action
    why: str = ""


@dataclass(frozen=True)
class ConflictRecord:
    id: int
    key: str
    local: str
    target: str
    base: str
    whole: bool
    """The whole unit (its merged lines did not parse, or one side removed it) rather than a hunk."""


@dataclass
class FileMerge:
    code: str
    measured: dict[str, str] = field(default_factory=dict)
    """What the output is measured against: base and target with the contract applied, and local."""
    decisions: list[Decision] = field(default_factory=list)
    conflicts: list[ConflictRecord] = field(default_factory=list)
    applied: list[Applied] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


@dataclass
class Slot:
    """One statement of the output body (or a comment block where a conflict left no code)."""

    key: str
    node: cst.BaseStatement | None
    defines: list[str] = field(default_factory=list)
    tentative: bool = False
    """Removed upstream and unchanged locally: kept only if the output uses what it defines."""
    comments: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Extension:
    """How the local file reuses its upstream counterpart module rather than copying it."""

    reuses: bool = False
    """It imports from the counterpart module (at the base or the target)."""
    extends: dict[str, str] = field(default_factory=dict)
    """Local class -> the counterpart's class it extends."""

    @classmethod
    def of(cls, local: cst.Module, counterparts: set[str]) -> Extension:
        bindings = module_bindings(split_units(local.body), {})
        imported = {bound: b.name for bound, b in bindings.items() if b.module in counterparts}
        extends = {}
        for node in local.body:
            if isinstance(node, cst.ClassDef):
                names = [a.value.value for a in node.bases if isinstance(a.value, cst.Name)]
                found = [imported[n] for n in names if n in imported]
                if found:
                    extends[node.name.value] = found[0]
        return cls(bool(imported), extends)


@dataclass
class _Merger:
    contract: Contract
    defines: Defines
    result: FileMerge
    extension: Extension = field(default_factory=Extension)
    force: frozenset[str] = frozenset()
    """Units removed locally and changed upstream whose names the output uses: conflicts."""
    tentative: list[Slot] = field(default_factory=list)
    deleted_changed: list[tuple[str, list[str]]] = field(default_factory=list)
    left_upstream: list[tuple[str, list[str]]] = field(default_factory=list)
    """An extension's upstream-only units: added after all where the output uses their names."""

    # -- one body (module or class) -------------------------------------------------------------

    def body(self, base: Sequence[cst.BaseStatement], local: Sequence[cst.BaseStatement],
             target: Sequence[cst.BaseStatement], prefix: str) -> list[Slot]:  # fmt: skip
        b_units = split_units(base)
        b = {u.key: u for u in b_units}
        l_units = align(b_units, split_units(local, self.contract.upstream_key), "local")
        lmap = {u.key: u for u in l_units}
        t_units = align(b_units, split_units(target), "target")
        slots = [s for u in t_units for s in self.from_target(prefix + u.key, u, b.get(u.key), lmap.get(u.key))]
        tmap = {u.key: u for u in t_units}
        extra: dict[str, list[Slot]] = {}
        previous: str | None = None
        for unit in l_units:
            if unit.key not in tmap:
                upstream = f"class:{self.extension.extends.get(unit.name, '')}" if unit.kind == "class" else ""
                if upstream in tmap and not prefix:
                    found = self.override(prefix + unit.key, unit, b.get(upstream), tmap[upstream])
                else:
                    found = self.local_extra(prefix + unit.key, unit, b.get(unit.key))
                extra.setdefault(previous or "", []).extend(found)
            previous = prefix + unit.key
        return _placed(slots, extra, [prefix + u.key for u in l_units])

    def from_target(self, key: str, t: Unit, b: Unit | None, local: Unit | None) -> list[Slot]:
        t_node = self.contracted(key, t)
        # the base is read the way the target is (swaps too), so an import both releases share stays equal
        b_node = swap_import(apply_contract(b.node, self.contract)[0], self.contract, self.defines)[0] if b else None
        if local is None and self.extension.reuses and key not in self.force:
            self.left_upstream.append((key, _names(t)))
            return self.decide(key, "upstream_only", [], "the local file imports from the upstream module")
        if local is None and self.extension.reuses:
            why = "an extension leaves it upstream, but the merged code uses it"
            return self.decide(key, "added_upstream", [Slot(key, t_node, _names(t))], why)
        if local is None:
            if b is None:
                return self.decide(key, "added_upstream", [Slot(key, t_node, _names(t))])
            if normalized(render(t_node)) == normalized(render(b_node or t_node)):
                return self.decide(key, "removed_local", [], "the local file removed it; upstream did not change it")
            if key not in self.force:
                self.deleted_changed.append((key, _names(t)))
                why = "the local file removed it; upstream changed it; the output does not use it"
                return self.decide(key, "removed_local", [], why)
            conflict = self.conflict(key, "", render(t_node), render(b_node or t_node), whole=True)
            why = "removed locally, changed upstream"
            return self.decide(key, "conflict", [Slot(key, None, comments=conflict)], why)
        l_norm, t_norm = normalized(render(local.node)), normalized(render(t_node))
        b_norm = normalized(render(b_node)) if b_node else None
        if l_norm in (b_norm, t_norm):
            return self.decide(key, "taken", [Slot(key, t_node, _names(t))])
        if t_norm == b_norm:
            return self.decide(key, "kept", [Slot(key, local.node, _names(local))])
        return self.both_changed(key, b_node, local, t_node, t)

    def override(self, key: str, local: Unit, base: Unit | None, target: Unit) -> list[Slot]:
        """A local class extending the counterpart's: its members merged against that class's members."""
        assert isinstance(local.node, cst.ClassDef) and isinstance(target.node, cst.ClassDef)
        base_class = base.node if base is not None and isinstance(base.node, cst.ClassDef) else None
        target_class = apply_contract(target.node, self.contract)[0]
        base_contracted = apply_contract(base_class, self.contract)[0] if base_class else None
        assert isinstance(target_class, cst.ClassDef)
        assert base_contracted is None or isinstance(base_contracted, cst.ClassDef)
        node = self.klass(key, base_contracted, local.node, target_class, keep_shell=True)
        return self.decide(key, "merged", [Slot(key, node, _names(local))], f"extends {target.name}")

    def local_extra(self, key: str, local: Unit, b: Unit | None) -> list[Slot]:
        if b is None:
            return self.decide(key, "added_local", [Slot(key, local.node, _names(local))])
        b_node = apply_contract(b.node, self.contract)[0]
        if normalized(render(local.node)) != normalized(render(b_node)):
            return self.decide(key, "kept_removed", [Slot(key, local.node, _names(local))],
                               "removed upstream, changed locally")  # fmt: skip
        slots = [Slot(key, node, names, tentative=True) for node, names in split_import(local, _names(local))]
        self.tentative += slots
        return slots

    def both_changed(self, key: str, b_node: cst.BaseStatement | None, local: Unit, t_node: cst.BaseStatement,
                     t: Unit) -> list[Slot]:  # fmt: skip
        names = _names(local)
        if self.extension.reuses and "/" in key and _delegates(local.node):
            why = f"the override calls super().{local.name}, which carries upstream's change"
            return self.decide(key, "kept", [Slot(key, local.node, names)], why)
        blocks = all(
            isinstance(n, cst.ClassDef) and isinstance(n.body, cst.IndentedBlock) for n in (local.node, t_node)
        )
        if blocks and isinstance(local.node, cst.ClassDef) and isinstance(t_node, cst.ClassDef):
            base_class = b_node if isinstance(b_node, cst.ClassDef) else None
            return self.decide(key, "merged", [Slot(key, self.klass(key, base_class, local.node, t_node), names)])
        if local.kind == "import" and t.kind == "import" and b_node is not None and one_module_moved(b_node, local, t):
            merged = merge_import_names(b_node, local.node, t_node)
            if merged is not None:
                return self.decide(key, "merged", [Slot(key, merged, _names(t) + names)])
        return self.lines(key, b_node, local, t_node)

    def klass(
        self, key: str, base: cst.ClassDef | None, local: cst.ClassDef, target: cst.ClassDef, keep_shell: bool = False
    ) -> cst.ClassDef:
        shells = [class_shell(n) if n else "" for n in (base, local, target)]
        shell: cst.ClassDef = local if keep_shell else target
        if not keep_shell and shells[1] not in (shells[0], shells[2]):
            shell = local
            if shells[2] != shells[0]:
                merged = self.text(key + "/shell", shells[0], shells[1], shells[2])
                parsed = parse_statement(merged)
                shell = parsed if isinstance(parsed, cst.ClassDef) else local
        members = self.body(class_body(base) if base else [], class_body(local), class_body(target), key + "/")
        statements, trailing = _statements(members)
        block = shell.body if isinstance(shell.body, cst.IndentedBlock) else cst.IndentedBlock(body=[])
        body = block.with_changes(body=statements or [cst.SimpleStatementLine([cst.Pass()])],
                                  footer=[*block.footer, *trailing])  # fmt: skip
        return shell.with_changes(body=body)

    def lines(self, key: str, b_node: cst.BaseStatement | None, local: Unit, t_node: cst.BaseStatement) -> list[Slot]:
        base_code = render(b_node) if b_node else ""
        recorded = len(self.result.conflicts)
        merged = self.text(key, base_code, render(local.node), render(t_node))
        node = parse_statement(merged)
        if node is None:
            del self.result.conflicts[recorded:]  # the hunks of lines that are not kept
            comments = self.conflict(key, render(local.node), render(t_node), base_code, whole=True)
            node = local.node.with_changes(leading_lines=[*_comment_lines(comments), *_leading(local.node)])
            why = "both changed; the merged lines do not parse"
            return self.decide(key, "conflict", [Slot(key, node, _names(local))], why)
        conflicted = MARK in merged and any(c.key == key for c in self.result.conflicts)
        return self.decide(key, "conflict" if conflicted else "merged", [Slot(key, node, _names(local))])

    def text(self, key: str, base: str, local: str, target: str) -> str:
        """The merged lines, conflicting hunks kept with both sides (local active, target commented)."""
        merged = merge3(base.splitlines(True), local.splitlines(True), target.splitlines(True))
        out: list[str] = []
        for chunk in merged.chunks:
            if isinstance(chunk, Conflict):
                out += self.hunk(key, chunk)
            else:
                out += chunk
        return "".join(out)

    def hunk(self, key: str, chunk: Conflict) -> list[str]:
        first = next((x for x in [*chunk.local, *chunk.target] if x.strip()), "")
        indent = first[: len(first) - len(first.lstrip())]
        comments = self.conflict(key, "".join(chunk.local), "".join(chunk.target), "".join(chunk.base), whole=False)
        return [f"{indent}{c}\n" for c in comments] + chunk.local

    # -- records ------------------------------------------------------------------------------

    def contracted(self, key: str, unit: Unit) -> cst.BaseStatement:
        node, rules = apply_contract(unit.node, self.contract)
        if unit.kind == "import":
            node, swapped, skipped = swap_import(node, self.contract, self.defines)
            rules += swapped
            self.result.skipped += [Skipped(rule, key, why) for rule, why in skipped]
        self.result.applied += [Applied(rule, key) for rule in rules]
        return node

    def conflict(self, key: str, local: str, target: str, base: str, whole: bool) -> list[str]:
        number = len(self.result.conflicts) + 1
        self.result.conflicts.append(ConflictRecord(number, key, local, target, base, whole))
        shown = [f"# | {line.rstrip()}" for line in target.splitlines()] or ["# | (the target has no lines here)"]
        head = f"# <<<<<<< {MARK} {number} ({key}): the target's lines, commented"
        count = len(local.splitlines())
        follows = (
            "no local lines" if not count else "the local statement follows" if whole else f"{count} local lines follow"
        )
        return [head, *shown, f"# >>>>>>> {MARK} {number}: {follows}"]

    def decide(self, key: str, action: Action, slots: list[Slot], why: str = "") -> list[Slot]:
        self.result.decisions.append(Decision(key, action, why))
        return slots


class _SuperCall(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.found = name, False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        call = node.value
        if node.attr.value == self.name and isinstance(call, cst.Call) and isinstance(call.func, cst.Name):
            self.found |= call.func.value == "super"


def _delegates(node: cst.BaseStatement) -> bool:
    """A method that calls the method it overrides (`super().name(...)`)."""
    if not isinstance(node, cst.FunctionDef):
        return False
    visitor = _SuperCall(node.name.value)
    node.visit(visitor)
    return visitor.found


def _names(unit: Unit) -> list[str]:
    if unit.kind == "import":
        return bound_names(unit.node)
    return [n for n in unit.name.split(",") if n] if unit.kind != "doc" else []


def _leading(node: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    lines: Sequence[cst.EmptyLine] = getattr(node, "leading_lines", ())
    return lines


def _comment_lines(comments: list[str]) -> list[cst.EmptyLine]:
    return [cst.EmptyLine(indent=True, comment=cst.Comment(c)) for c in comments]


def _statements(slots: list[Slot]) -> tuple[list[cst.BaseStatement], list[cst.EmptyLine]]:
    """The slots' statements, comment-only slots (a conflict that left no code) as leading lines of the
    next statement; what follows the last one is returned for the footer."""
    body: list[cst.BaseStatement] = []
    waiting: list[str] = []
    for slot in slots:
        if slot.node is None:
            waiting += slot.comments
            continue
        node = slot.node
        if waiting:
            node = node.with_changes(leading_lines=[*_comment_lines(waiting), *_leading(node)])
            waiting = []
        body.append(node)
    return body, _comment_lines(waiting)


def _placed(slots: list[Slot], extra: dict[str, list[Slot]], local_order: list[str]) -> list[Slot]:
    """The target's slots in order, each local extra after the local unit before it (or first, after a
    docstring, where none is in the output)."""
    out = list(slots)
    present = {s.key for s in out}
    for anchor in ["", *local_order]:
        for slot in extra.get(anchor, []):
            index = _after(out, anchor, local_order, present)
            out.insert(index, slot)
            present.add(slot.key)
    return out


def _after(out: list[Slot], anchor: str, local_order: list[str], present: set[str]) -> int:
    """The index after every output slot of the local units up to `anchor` (where the two orders differ,
    a local addition still follows everything the local file had before it)."""
    before = set(local_order[: local_order.index(anchor) + 1]) if anchor in local_order else set()
    positions = [i for i, s in enumerate(out) if s.key in before and s.key in present]
    if positions:
        return max(positions) + 1
    return 1 if out and out[0].key.endswith("doc") else 0


# -- the whole file -----------------------------------------------------------------------------


def _header_text(lines: Sequence[cst.EmptyLine]) -> str:
    return cst.Module(body=[], header=lines).code


def _merged_lines(merger: _Merger, key: str, sides: tuple[Sequence[cst.EmptyLine], ...]) -> Sequence[cst.EmptyLine]:
    """The module's header or footer comments, merged as lines."""
    base, local, target = (_header_text(lines) for lines in sides)
    if local in (base, target):
        return sides[2]
    if target == base:
        return sides[1]
    merged = merger.text(key, base, local, target)
    try:
        return cst.parse_module(merged).header
    except cst.ParserSyntaxError:
        return sides[1]


def _keep_used(merger: _Merger, module: cst.Module) -> cst.Module:
    """Drop the tentative slots the output does not use; a kept one is decided `kept_removed`."""
    pending = {id(s.node): s for s in merger.tentative if s.node is not None}
    kept: set[int] = set()
    while True:
        pruned = module.visit(Prune(set(pending) - kept))
        missing = missing_names(pruned, _names)
        new = {i for i, s in pending.items() if i not in kept and missing(s.defines)}
        if not new:
            break
        kept |= new
    for node_id, slot in pending.items():
        if node_id in kept:
            why = "removed upstream; the output still uses " + ", ".join(slot.defines)
            merger.decide(slot.key, "kept_removed", [], why)
        else:
            merger.decide(slot.key, "removed_upstream", [])
    return pruned


def merge_file(modules: Sequence[cst.Module], contract: Contract, defines: Defines, extension: Extension) -> FileMerge:
    """The merged module (libcst round-trip exact outside what changed) with every decision on the way;
    `modules`: base, local, target (upstream relative imports made absolute). A unit the local file
    removed and upstream changed is a conflict only where the output still uses its names: the merge
    runs again with those."""
    merger, module = _merge_once(modules, contract, defines, extension, frozenset())
    force: frozenset[str] = frozenset()
    for _ in range(FORCE_ROUNDS):  # what a forced unit brings in may use more
        missing = missing_names(module, _names)
        # an extension's class members are inherited from upstream: only its top-level units are added
        candidates = [*merger.deleted_changed, *((k, n) for k, n in merger.left_upstream if "/" not in k)]
        more = {key for key, names in candidates if missing(names)}
        if more <= force:
            break
        force |= more
        merger, module = _merge_once(modules, contract, defines, extension, force)
    sides = _contracted_sides(modules[0], modules[2], contract, defines)
    module = _restore_imports(merger, module, sides["target"])
    merger.result.code = module.code
    merger.result.measured = {"local": modules[1].code, "base": sides["base"].code, "target": sides["target"].code}
    return merger.result


def _merge_once(
    modules: Sequence[cst.Module], contract: Contract, defines: Defines, extension: Extension, force: frozenset[str]
) -> tuple[_Merger, cst.Module]:
    merger = _Merger(contract, defines, FileMerge(code=""), extension, force)
    slots = merger.body(modules[0].body, modules[1].body, modules[2].body, "")
    body, trailing = _statements(slots)
    header = _merged_lines(merger, "header", tuple(m.header for m in modules))
    footer = _merged_lines(merger, "footer", tuple(m.footer for m in modules))
    module = modules[2].with_changes(
        header=header, body=body, footer=[*trailing, *footer], default_newline=modules[1].default_newline
    )
    return merger, _keep_used(merger, module)


def _restore_imports(merger: _Merger, module: cst.Module, target: cst.Module) -> cst.Module:
    """Names the output reads and nothing in it binds, which the (contracted) target imports: the target's
    import of each is added after the output's last top-level import (a local file that dropped an import
    its own code no longer needed, while code taken from the target still does)."""
    missing = missing_names(module, _names)
    wanted: list[cst.BaseStatement] = []
    for unit in split_units(target.body):
        if unit.kind != "import":
            continue
        for node, names in split_import(unit, bound_names(unit.node)):
            if missing(names) and all(names):
                wanted.append(node)
    if not wanted:
        return module
    body: list[Any] = list(module.body)
    last = max((i for i, u in enumerate(split_units(body)) if u.kind == "import"), default=-1)
    body = [*body[: last + 1], *wanted, *body[last + 1 :]]
    added = {id(node) for node in wanted}
    for unit in split_units(body):
        if id(unit.node) in added:
            why = "the output reads " + ", ".join(_names(unit)) + "; the target imports it"
            merger.decide(unit.key, "restored", [], why)
    return module.with_changes(body=body)


def _contracted_sides(
    base: cst.Module, target: cst.Module, contract: Contract, defines: Defines
) -> dict[str, cst.Module]:
    base_body = [swap_import(apply_contract(node, contract)[0], contract, defines)[0] for node in base.body]
    target_body = [swap_import(apply_contract(node, contract)[0], contract, defines)[0] for node in target.body]
    return {"base": base.with_changes(body=base_body), "target": target.with_changes(body=target_body)}
