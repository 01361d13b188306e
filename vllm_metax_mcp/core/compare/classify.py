"""The classes a MACA edit is proposed under, from the AST of the lines that differ between B and L.

The rules, in order (the first that applies is the class, the others are listed in `also`):
`maca_kernel` (a call bound to the plugin package, e.g. `vllm_metax.*`, an `mx_*` op, or a
`torch.ops` op the plugin registers), `platform_predicate` (a platform `is_*` check the dispatch
evaluation decides, e.g. `is_out_of_tree()`), `capability_predicate` (NVIDIA capability /
architecture checks, answered from the plugin's platform class where its source shows a constant,
else marked as needing MACA evidence), `dtype_path` (FP8/FP4 names on B's side with none on L's: a
BF16/INT8 path that must not be overwritten to shrink the diff), `import_swap` (an import from the
plugin package); none applies: `unverified`. `upstream_change` and `obsolete_override` are decided
from the versions, not the lines (`core/compare/matrix.py`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from ..code.dispatch import dotted, evaluate, platform_predicate
from ..code.module_index import IndexedModule
from ..code.plugin_facts import PluginFacts
from .pairs import EvidenceItem, PluginPackage
from .symdiff import Binding
from .versions import ChangedLines, SourceView

MAX_HITS = 2
"""Hits cited per rule: the first two locate the pattern; more add nothing a reviewer needs."""
LOW_PRECISION = re.compile(r"float8|fp8|fp4|float4|e4m3|e5m2|e8m0|e2m1|mxfp|nvfp", re.IGNORECASE)
KEPT_PRECISION = re.compile(r"bfloat16|bf16|int8|w8a8", re.IGNORECASE)
CAPABILITY_CALL = re.compile(
    r"^(is|has)_device_capability(_family)?$|^get_device_capability$|^is_cuda(_alike)?$"
    r"|^is_(blackwell|hopper|ampere)\w*$|^is_sm_?\d+\w*$"
)
SM_STRING = re.compile(r"^sm_?\d{2,3}[a-z]?$", re.IGNORECASE)


class DiffClass(str, Enum):
    IMPORT_SWAP = "import_swap"
    MACA_KERNEL = "maca_kernel"
    PLATFORM_PREDICATE = "platform_predicate"
    DTYPE_PATH = "dtype_path"
    CAPABILITY_PREDICATE = "capability_predicate"
    OBSOLETE_OVERRIDE = "obsolete_override"
    UPSTREAM_CHANGE = "upstream_change"
    UNVERIFIED = "unverified"


@dataclass(frozen=True)
class RuleContext:
    """What the rules read besides the differing lines."""

    facts: PluginFacts
    package: PluginPackage
    bindings: dict[str, Binding]
    """Local names bound by imports from the plugin, copies of paired modules excluded."""
    plugin_modules: frozenset[str]
    """Every module the plugin subject has, so an import of a missing one is not taken for a swap."""


@dataclass(frozen=True)
class Hit:
    """A class whose rule applied, with what it saw."""

    cls: DiffClass
    evidence: list[EvidenceItem]
    why: str


@dataclass(frozen=True)
class _NamedCall:
    call: ast.Call
    name: str
    """The callee as a dotted name."""


@dataclass(frozen=True)
class _PrecisionName:
    line: int
    text: str


def plugin_bindings(module: IndexedModule, paired: Mapping[str, str], package: PluginPackage) -> dict[str, Binding]:
    """Names the local module binds from the plugin package's modules that are not copies of upstream ones."""
    bound: dict[str, Binding] = {}
    for record in module.record.imports:
        target = module.absolute(record.module)
        if record.branch == "not_taken" or not package.holds(target):
            continue
        if target in paired:
            continue
        for original, alias in record.names or [[target, record.alias or target.split(".")[0]]]:
            if alias != "*":
                bound.setdefault(alias, Binding(f"{target}.{original}" if record.names else target, record.line))
    return bound


def _calls(nodes: list[ast.AST]) -> list[_NamedCall]:
    return [_NamedCall(n, name) for n in nodes if isinstance(n, ast.Call) and (name := dotted(n.func))]


def _maca_kernel(local: SourceView, plus: list[int], context: RuleContext) -> Hit | None:
    evidence: list[EvidenceItem] = []
    said: list[str] = []
    for found in _calls(local.at(plus)):
        call, name = found.call, found.name
        parts = name.split(".")
        bound = context.bindings.get(parts[0])
        binding = [local.cite(bound.line)] if bound else []
        if (
            len(parts) == 4
            and parts[:2] == ["torch", "ops"]
            and (where := context.facts.registered_op(".".join(parts[2:])))
        ):
            evidence += [local.cite(call.lineno), where]
            said.append(f"{name} (registered by the plugin at {where.path}:{where.line})")
        elif parts[-1].startswith("mx_"):
            evidence += [local.cite(call.lineno), *binding]
            said.append(f"{name} (an mx_ op{f' from {bound.target}' if bound else ''})")
        elif bound:
            evidence += [local.cite(call.lineno), *binding]
            said.append(f"{name} (bound to {bound.target} at line {bound.line})")
        if len(said) >= MAX_HITS:
            break
    return Hit(DiffClass.MACA_KERNEL, evidence, "calls " + "; ".join(said)) if said else None


def _platform_predicate(local: SourceView, plus: list[int]) -> Hit | None:
    for found in _calls(local.at(plus)):
        predicate = platform_predicate(found.call)
        if predicate and not CAPABILITY_CALL.match(predicate):
            answer = evaluate(found.call)
            told = "undecided" if answer is None else str(answer)
            return Hit(
                DiffClass.PLATFORM_PREDICATE,
                [local.cite(found.call.lineno)],
                f"checks {predicate}() — an out-of-tree platform answers {told}",
            )
    return None


def _capability_predicate(local: SourceView, plus: list[int], facts: PluginFacts) -> Hit | None:
    for node in local.at(plus):
        if (
            isinstance(node, ast.Call)
            and (name := dotted(node.func))
            and CAPABILITY_CALL.match(name.rsplit(".", 1)[-1])
        ):
            method = name.rsplit(".", 1)[-1]
            answer = facts.answers.get(method)
            evidence: list[EvidenceItem] = [local.cite(node.lineno)]
            if answer is not None:
                evidence.append(answer.evidence)
                told = f"the plugin's platform class {facts.platform_class} returns {answer.value!r}"
            else:
                where = facts.platform_class or f"no platform class named by {facts.package}/__init__.py"
                told = f"needs MACA evidence: {where} shows no constant answer for {method}()"
            return Hit(DiffClass.CAPABILITY_PREDICATE, evidence, f"checks {name}(); {told}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SM_STRING.match(node.value):
            why = (
                f"names {node.value!r}; needs MACA evidence: an SM number is an NVIDIA architecture, "
                "not a MACA contract"
            )
            return Hit(DiffClass.CAPABILITY_PREDICATE, [local.cite(node.lineno)], why)
    return None


def _precision_names(nodes: list[ast.AST], pattern: re.Pattern[str]) -> list[_PrecisionName]:
    found = []
    for node in nodes:
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if pattern.search(text):
            found.append(_PrecisionName(node.lineno, text))
    return found


def _dtype_path(base: SourceView, minus: list[int], local: SourceView, plus: list[int]) -> Hit | None:
    dropped = _precision_names(base.at(minus), LOW_PRECISION)
    if not dropped or _precision_names(local.at(plus), LOW_PRECISION):
        return None
    kept = _precision_names(local.at(plus), KEPT_PRECISION)
    evidence: list[EvidenceItem] = [
        *(base.cite(n.line) for n in dropped[:MAX_HITS]),
        *(local.cite(n.line) for n in kept[:MAX_HITS]),
    ]
    instead = f"; local has {', '.join(sorted({n.text for n in kept}))}" if kept else "; the local copy drops that path"
    why = (
        f"upstream has {', '.join(sorted({n.text for n in dropped})[:4])}{instead}: keep the MACA path rather than "
        "overwrite it to shrink the diff, and verify the MACA kernel supports its dtype "
        "(a dtype name is no MACA contract)"
    )
    return Hit(DiffClass.DTYPE_PATH, evidence, why)


def _import_swap(local: SourceView, plus: list[int], module: IndexedModule, package: PluginPackage) -> Hit | None:
    for node in local.at(plus):
        if isinstance(node, ast.ImportFrom):
            target = module.absolute("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            target = node.names[0].name
        else:
            continue
        if package.holds(target):
            return Hit(DiffClass.IMPORT_SWAP, [local.cite(node.lineno)], f"imports from {target}")
    return None


def classify(
    base: SourceView, local: SourceView, lines: ChangedLines, module: IndexedModule, context: RuleContext
) -> list[Hit]:
    """Every rule that applies to the lines the plugin changed, in rule order (none: unverified)."""
    found = [
        _maca_kernel(local, lines.plus, context),
        _platform_predicate(local, lines.plus),
        _capability_predicate(local, lines.plus, context.facts),
        _dtype_path(base, lines.minus, local, lines.plus),
        _import_swap(local, lines.plus, module, context.package),
    ]
    return [hit for hit in found if hit is not None]
