"""The MetaX contract of one forked file: the systematic differences between the local file and its
base, read from the two versions, and re-applied to the code the merge takes from the target.

Three kinds, each with the local line that shows it:

- `import_swap`: a name the base imports from upstream module M, the local file imports from M'
  (`vllm.…` -> `vllm_metax.…`). Applied to a target import from M when every name M gives in both
  versions moved to M' and M' defines the name (the plugin tree is asked); otherwise listed as not
  applied, with why.
- `rename`: a class or function the base defines, the local file defines under a vendor-affixed
  name (`MacaFoo` for `Foo`, read through the plugin's affixes) and not under its own. References in
  target code follow the local name.
- `substitution`: a dotted name (`ops.fused_add_rms_norm`) the local file replaced by another on
  every changed line that had it, and kept nowhere. Target code gets the replacement.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from .units import Unit, import_module, render, render_expression, split_units

ContractKind = Literal["import_swap", "rename", "substitution"]
Defines = Callable[[str, str], bool | None]
"""(module, name) -> whether the module (plugin or upstream) defines the name; None where unknown."""
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Rule:
    kind: ContractKind
    upstream: str
    local: str
    line: int
    """Where the local file shows it."""


@dataclass(frozen=True)
class Applied:
    rule: Rule
    unit: str
    """The unit key the rule was applied in."""


@dataclass(frozen=True)
class Skipped:
    rule: Rule
    unit: str
    why: str


@dataclass
class Contract:
    swaps: dict[str, Rule] = field(default_factory=dict)
    """Upstream module -> its swap (every shared binding moved the same way)."""
    renames: dict[str, Rule] = field(default_factory=dict)
    """Upstream name -> the local name."""
    substitutions: dict[str, Rule] = field(default_factory=dict)
    """Upstream dotted name -> its replacement."""
    bound_swaps: dict[str, Rule] = field(default_factory=dict)
    """Bound name -> the swap of its binding (for keying local import statements)."""

    @property
    def rules(self) -> list[Rule]:
        return [*self.swaps.values(), *self.renames.values(), *self.substitutions.values()]

    def upstream_key(self, unit: Unit) -> str:
        """A local unit's key in the base's vocabulary: renamed definitions and swapped imports meet theirs."""
        upstream_of = {rule.local: name for name, rule in self.renames.items()}
        if unit.kind in ("class", "function") and unit.name in upstream_of:
            return f"{unit.key.split(':', 1)[0]}:{upstream_of[unit.name]}"
        if unit.kind == "import":
            bound = bound_names(unit.node)
            modules = {self.bound_swaps[b].upstream for b in bound if b in self.bound_swaps}
            if bound and len(modules) == 1 and all(b in self.bound_swaps for b in bound):
                return f"{unit.key.split(':', 1)[0]}:{modules.pop()}"
        return unit.key


@dataclass(frozen=True)
class Binding:
    module: str
    name: str
    """What is imported (the dotted module itself for `import m`)."""
    line: int
    plain: bool = False
    """`import a.b` without `as`: it binds `a`, whatever it loads (never a swap)."""


def bound_names(node: cst.BaseStatement) -> list[str]:
    return list(_bindings_of(node, 0))


def _bindings_of(node: cst.BaseStatement, line: int) -> dict[str, Binding]:
    found: dict[str, Binding] = {}
    if not isinstance(node, cst.SimpleStatementLine):
        return found
    for small in node.body:
        module = import_module(small)
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar) and module is not None:
            for alias in small.names:
                name = render_expression(alias.name)
                bound = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
                found[bound] = Binding(module, name, line)
        elif isinstance(small, cst.Import):
            for alias in small.names:
                dotted = render_expression(alias.name)
                if alias.asname and isinstance(alias.asname.name, cst.Name):
                    found[alias.asname.name.value] = Binding(dotted, dotted, line)
                else:
                    found.setdefault(dotted.split(".")[0], Binding(dotted, dotted, line, plain=True))
    return found


def module_bindings(units: list[Unit], lines: dict[str, int]) -> dict[str, Binding]:
    """Bound name -> binding over a module's top-level import statements (`lines`: unit key -> line)."""
    found: dict[str, Binding] = {}
    for unit in units:
        if unit.kind == "import":
            found.update(_bindings_of(unit.node, lines.get(unit.key, 0)))
    return found


def derive_swaps(base: dict[str, Binding], local: dict[str, Binding], contract: Contract) -> None:
    moved: dict[str, set[str]] = defaultdict(set)
    first: dict[str, Binding] = {}
    for bound, was in base.items():
        now = local.get(bound)
        if now is None or now.plain or was.plain or now.module == now.name or was.module == was.name:
            continue  # `import a.b as x` against `from a import b`: the same module, spelled two ways
        moved[was.module].add(now.module)
        if now.module != was.module:
            contract.bound_swaps[bound] = Rule("import_swap", was.module, now.module, now.line)
            first.setdefault(was.module, now)
    for module, targets in moved.items():
        if len(targets) == 1 and module not in targets:
            contract.swaps[module] = Rule("import_swap", module, first[module].module, first[module].line)


def derive_renames(
    base_names: set[str],
    local_defs: dict[str, int],
    local_bound: set[str],
    upstream_name: Callable[[str], str],
    contract: Contract,
) -> None:
    """Local-only definitions whose affix-stripped name the base defines and the local file neither
    defines nor imports (a local class extending the imported upstream one is no rename)."""
    for name, line in local_defs.items():
        if name in base_names:
            continue
        upstream = upstream_name(name)
        if upstream != name and upstream in base_names and upstream not in local_defs and upstream not in local_bound:
            contract.renames.setdefault(upstream, Rule("rename", upstream, name, line))


def _dotted_tokens(line: str) -> list[str]:
    parts: list[str] = []
    position = 0
    for match in DOTTED.finditer(line):
        parts += [line[position : match.start()].replace(" ", ""), match.group()]
        position = match.end()
    return [*parts, line[position:].replace(" ", "")]


def _replaced(old: str, new: str) -> tuple[str, str] | None:
    """The one dotted name a changed line swapped for another, where that is its only change."""
    a, b = _dotted_tokens(old.strip()), _dotted_tokens(new.strip())
    if len(a) != len(b):
        return None
    differing = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    if len(differing) != 1 or not DOTTED.fullmatch(differing[0][0]) or not DOTTED.fullmatch(differing[0][1]):
        return None
    if "." not in differing[0][0] and "." not in differing[0][1]:
        return None  # a plain name changed: a local edit, not a kernel path
    return differing[0]


def derive_substitutions(pairs: list[tuple[str, str, int]], vendor_roots: set[str], contract: Contract) -> None:
    """From (base code, local code, local first line) of the symbols both define: dotted names replaced
    on every changed line that had them and on no line the local side kept, and either replaced on at
    least two lines or replaced by a name the local file imports and the base does not (`mx_ops.…`): one
    edited line of upstream vocabulary (`torch.sigmoid` -> `torch.tanh`) is a local edit, not a kernel path."""
    seen: dict[str, dict[str, int]] = defaultdict(dict)
    times: dict[str, int] = defaultdict(int)
    kept: set[str] = set()
    for base_code, local_code, start in pairs:
        a, b = base_code.splitlines(), local_code.splitlines()
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
            if tag == "equal":
                kept.update(m.group() for line in a[i1:i2] for m in DOTTED.finditer(line))
            elif tag == "replace" and i2 - i1 == j2 - j1:
                for offset in range(i2 - i1):
                    found = _replaced(a[i1 + offset], b[j1 + offset])
                    if found:
                        seen[found[0]].setdefault(found[1], start + j1 + offset)
                        times[found[0]] += 1
    for old, news in seen.items():
        if len(news) == 1 and old not in kept:
            new, line = next(iter(news.items()))
            if times[old] >= 2 or new.split(".")[0] in vendor_roots:
                contract.substitutions[old] = Rule("substitution", old, new, line)


class _Apply(cst.CSTTransformer):
    """Renames and substitutions on one statement; Attribute tails, keywords and import names are not
    references to this file's definitions and keep their spelling."""

    def __init__(self, contract: Contract) -> None:
        super().__init__()
        self.contract = contract
        self.used: list[Rule] = []
        self.protected: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.protected.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.protected.add(id(node.keyword))

    def visit_Param(self, node: cst.Param) -> None:
        self.protected.add(id(node.name))

    def visit_ImportAlias(self, node: cst.ImportAlias) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if id(original) in self.protected:
            return updated
        rule = self.contract.renames.get(original.value)
        if rule is not None:
            self.used.append(rule)
            return updated.with_changes(value=rule.local)
        rule = self.contract.substitutions.get(original.value)
        if rule is not None:
            self.used.append(rule)
            return cst.parse_expression(rule.local)
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        rule = self.contract.substitutions.get(render_expression(original))
        if rule is None:
            return updated
        self.used.append(rule)
        return cst.parse_expression(rule.local)


def apply_contract(node: cst.BaseStatement, contract: Contract) -> tuple[cst.BaseStatement, list[Rule]]:
    """The statement with the contract's renames and substitutions applied, and the rules that changed it."""
    if not contract.renames and not contract.substitutions:
        return node, []
    visitor = _Apply(contract)
    changed = node.visit(visitor)
    assert isinstance(changed, cst.BaseStatement)
    return changed, list(dict.fromkeys(visitor.used))


def swap_import(
    node: cst.BaseStatement, contract: Contract, defines: Defines
) -> tuple[cst.BaseStatement, list[Rule], list[tuple[Rule, str]]]:
    """A target import statement with its module swapped where the contract and the plugin allow it."""
    if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
        return node, [], []
    small = node.body[0]
    module = import_module(small)
    rule = contract.swaps.get(module or "")
    if rule is None or not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
        return node, [], []
    names = [render_expression(alias.name) for alias in small.names]
    missing = [n for n in names if defines(rule.local, n) is False]
    if missing:
        return node, [], [(rule, f"{rule.local} does not define {', '.join(missing)}")]
    dots = len(rule.local) - len(rule.local.lstrip("."))
    module_node = cst.parse_expression(rule.local[dots:]) if rule.local[dots:] else None
    swapped = small.with_changes(module=module_node, relative=[cst.Dot()] * dots)
    return node.with_changes(body=[swapped]), [rule], []


def unit_lines(module: cst.Module, units: list[Unit]) -> dict[str, int]:
    """Unit key -> the line its statement starts on (after its leading comments)."""
    line = 1 + len(module.header)
    found: dict[str, int] = {}
    for unit in units:
        found[unit.key] = line + len(getattr(unit.node, "leading_lines", ()))
        line += render(unit.node).count("\n")
    return found


def derive_contract(base: cst.Module, local: cst.Module, upstream_name: Callable[[str], str]) -> Contract:
    """The contract one fork shows against its base (see the module docstring)."""
    contract = Contract()
    base_units, local_units = split_units(base.body), split_units(local.body)
    local_lines = unit_lines(local, local_units)
    local_bindings = module_bindings(local_units, local_lines)
    derive_swaps(module_bindings(base_units, {}), local_bindings, contract)
    definitions = ("class", "function")
    derive_renames(
        {u.name for u in base_units if u.kind in definitions},
        {u.name: local_lines[u.key] for u in local_units if u.kind in definitions},
        set(local_bindings),
        upstream_name,
        contract,
    )
    by_key = {u.key: u for u in base_units}
    rekeyed = split_units(local.body, contract.upstream_key)
    pairs = [
        (by_key[u.key].code, u.code, local_lines[original.key] - len(getattr(u.node, "leading_lines", ())))
        for u, original in zip(rekeyed, local_units, strict=True)
        if u.key in by_key and u.kind in definitions
    ]
    base_bound = set(module_bindings(base_units, {}))
    derive_substitutions(pairs, set(local_bindings) - base_bound, contract)
    return contract


class _Absolute(cst.CSTTransformer):
    def __init__(self, package: list[str]) -> None:
        super().__init__()
        self.package = package

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        level = len(updated.relative)
        if not level or level > len(self.package):
            return updated
        base = self.package[: len(self.package) - (level - 1)]
        dotted = ".".join([*base, *([render_expression(updated.module)] if updated.module else [])])
        module = cst.parse_expression(dotted)
        assert isinstance(module, (cst.Attribute, cst.Name))
        return updated.with_changes(relative=(), module=module)


def absolute_imports(module: cst.Module, own: str, is_package: bool) -> cst.Module:
    """Upstream code's relative imports read from the module's own package; moved into the plugin they
    must name it (`from .utils import x` in vllm/.../models/a.py -> `from vllm....models.utils import x`)."""
    package = own.split(".") if is_package else own.split(".")[:-1]
    return module.visit(_Absolute(package)) if package else module
