"""The MACA/upstream difference matrix: every differing symbol with a proposed class and its evidence.

A row is keyed by (local path, symbol); `symbol` is a top-level name or `Class.method` as the
symbol diff names them (local names; an upstream-only symbol by its upstream name),
`import:<name>` for a module-level import swap, or `*` for the whole file. Rows are what
audit_commits imports as its baseline, so their shape is stable: see `MatrixRow`.

Each file has three versions: local (L), target (T) and base (B: the counterpart at the file's
closest release; T when no releases were given). A symbol that differs between L and T is
- `upstream_change` when L equals B (the plugin left it alone; upstream changed it since), or when
  T has it and B did not (upstream added it);
- `obsolete_override` when B had it and T removed it (the local copy overrides something gone),
  when the whole file equals T, or when a subclass overrides a method with the target's own body;
- otherwise a MACA edit, classified from the AST of the lines that differ between B and L:
  `maca_kernel` (a call bound to `vllm_metax.*`, an `mx_*` op, or a `torch.ops` op the plugin
  registers), `platform_predicate` (a platform `is_*` check the dispatch evaluation decides, e.g.
  `is_out_of_tree()`), `capability_predicate` (NVIDIA capability / architecture checks, answered
  from the plugin's platform class where its source shows a constant, else marked as needing
  MACA evidence), `dtype_path` (FP8/FP4 names on B's side with none on L's: a BF16/INT8 path
  that must not be overwritten to shrink the diff), `import_swap` (an import from `vllm_metax`),
  else `unverified`. The first rule that applies is the class; the others are listed in `also`.
Module-level import swaps (`import:<name>`) are `import_swap`, or `unverified` when the plugin has
no such module (the import would fail). Comments on the differing lines (and a new comment block
above a symbol) are quoted as leads and never decide. Every row is a proposal.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ..code.dispatch import dotted, evaluate, platform_predicate
from ..code.module_index import (
    Definition,
    IndexedModule,
    ModuleRecord,
    RecordCache,
    module_name,
)
from ..code.plugin_facts import PluginFacts
from ..foundation.evidence import CommitEvidence, FileEvidence, NoteEvidence
from ..sources.subjects import Subject
from .pairing import Pair, Rule, Status, Trees, paired_modules
from .releases import FileReleases, Release
from .symdiff import SymbolDiff, diff_extension, diff_symbols, import_swaps
from .textdiff import split_lines

FILE_SYMBOL = "*"
IMPORT_PREFIX = "import:"
PLUGIN_ROOT = "vllm_metax"
MAX_HITS = 2
"""Hits cited per rule: the first two locate the pattern; more add nothing a reviewer needs."""
MAX_LEADS = 3
LOW_PRECISION = re.compile(r"float8|fp8|fp4|float4|e4m3|e5m2|e8m0|e2m1|mxfp|nvfp", re.IGNORECASE)
KEPT_PRECISION = re.compile(r"bfloat16|bf16|int8|w8a8", re.IGNORECASE)
CAPABILITY_CALL = re.compile(
    r"^(is|has)_device_capability(_family)?$|^get_device_capability$|^is_cuda(_alike)?$|^is_(blackwell|hopper|ampere)\w*$|^is_sm_?\d+\w*$"
)
SM_STRING = re.compile(r"^sm_?\d{2,3}[a-z]?$", re.IGNORECASE)

EvidenceItem = FileEvidence | CommitEvidence | NoteEvidence


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
class MatrixRow:
    """One difference between a plugin file and its target counterpart, with a proposed class.

    Key: (`local`, `symbol`). `change` is added | removed | changed | renamed | subclass |
    import_swap | identical_file | removed_file | identical_override.
    """

    local: str
    symbol: str
    upstream: str | None
    upstream_symbol: str | None
    change: str
    proposed_class: DiffClass
    also: tuple[DiffClass, ...]
    upstream_changed: bool | None
    """T differs from B for this symbol; None when no base release is known."""
    base: str | None
    """Release label of B; None when B is the target."""
    evidence: tuple[EvidenceItem, ...]
    leads: tuple[str, ...]
    """Comments on the differing lines, quoted `path:line: # text` — leads to read, never proof."""
    rationale: str


@dataclass(frozen=True)
class Version:
    """One version of a file: where it is, its blob, its index record and its bytes."""

    path: str
    sha: str
    record: ModuleRecord
    data: bytes


@dataclass(frozen=True)
class FileVersions:
    local: Version
    target: Version
    base: Version
    base_label: str | None
    local_module: IndexedModule
    target_module: IndexedModule
    extends: Mapping[str, str] = field(default_factory=dict)
    """Subclass pairs: local class -> upstream class it extends."""


# -- one version's source: spans, nodes by line, comments ---------------------------------------


class _Source:
    """A parsed version, indexed by line, so rules look only at the nodes on the differing lines."""

    def __init__(self, version: Version) -> None:
        self.version = version
        self.lines = split_lines(version.data)
        tree = ast.parse(version.data)
        self.spans = _spans(tree)
        self.nodes: dict[int, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Call, ast.Attribute, ast.Name, ast.Constant, ast.Import, ast.ImportFrom)):
                self.nodes.setdefault(node.lineno, []).append(node)
        self.comments = _comments(version.data)

    def cite(self, line: int) -> FileEvidence:
        return FileEvidence(path=self.version.path, line=max(1, line), rev=self.version.sha)

    def at(self, lines: Iterable[int]) -> list[ast.AST]:
        return [node for line in sorted(lines) for node in self.nodes.get(line, [])]

    def leads(self, lines: Iterable[int]) -> list[str]:
        return [f"{self.version.path}:{n}: {self.comments[n]}" for n in sorted(set(lines)) if n in self.comments]

    def comments_above(self, symbol: str | None) -> dict[int, str]:
        """The comment-only lines directly above a symbol (its header comment block)."""
        found: dict[int, str] = {}
        line = self.spans[symbol][0] - 1 if symbol in self.spans else 0
        while line >= 1 and self.lines[line - 1].strip().startswith("#"):
            found[line] = self.lines[line - 1].strip()
            line -= 1
        return found


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([d.lineno for d in decorators] + [node.lineno])


def _spans(tree: ast.Module) -> dict[str, list[int]]:
    """Lines of each top-level symbol and `Class.method` (a class without its methods' lines)."""
    spans: dict[str, list[int]] = {}
    for node in tree.body:
        whole = list(range(_first_line(node), (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            inner: set[int] = set()
            for method in methods:
                lines = list(range(_first_line(method), (method.end_lineno or method.lineno) + 1))
                spans.setdefault(f"{node.name}.{method.name}", lines)
                inner.update(lines)
            spans.setdefault(node.name, [n for n in whole if n not in inner])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans.setdefault(node.name, whole)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        spans.setdefault(name.id, whole)
    return spans


def _comments(data: bytes) -> dict[int, str]:
    found: dict[int, str] = {}
    try:
        for token in tokenize.tokenize(io.BytesIO(data).readline):
            if token.type == tokenize.COMMENT:
                found.setdefault(token.start[0], token.string)
    except (tokenize.TokenError, SyntaxError):
        pass
    return found


def _digest(record: ModuleRecord, symbol: str) -> str | None:
    """The body identity the symbol diff compares: class own hash, function/assignment body, method."""
    owner, _, method = symbol.partition(".")
    definition: Definition | None = record.definition(owner)
    if definition is None:
        return None
    if method:
        return definition.members.get(method)
    return definition.own_hash if definition.kind == "class" else definition.body_hash


def _changed_lines(
    before: _Source, before_symbol: str | None, after: _Source, after_symbol: str | None
) -> tuple[list[int], list[int]]:
    """(lines only in `before`'s symbol, lines only in `after`'s), compared stripped."""
    old = before.spans.get(before_symbol or "", [])
    new = after.spans.get(after_symbol or "", [])
    a = [before.lines[n - 1].strip() for n in old]
    b = [after.lines[n - 1].strip() for n in new]
    minus: list[int] = []
    plus: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            minus += [old[i] for i in range(i1, i2) if a[i]]
            plus += [new[j] for j in range(j1, j2) if b[j]]
    return minus, plus


# -- the rules ------------------------------------------------------------------------------------


@dataclass
class _Context:
    """What the rules read besides the differing lines."""

    facts: PluginFacts
    bindings: dict[str, tuple[str, int]]
    """Local names bound by imports from the plugin -> (module, import line), copies of paired modules excluded."""
    plugin_modules: frozenset[str]
    """Every module the plugin subject has, so an import of a missing one is not taken for a swap."""


@dataclass
class _Hits:
    cls: DiffClass
    evidence: list[EvidenceItem]
    why: str


def _plugin_bindings(module: IndexedModule, paired: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """Names the local module binds from `vllm_metax.*` modules that are not copies of upstream ones."""
    bound: dict[str, tuple[str, int]] = {}
    for record in module.record.imports:
        target = module.absolute(record.module)
        if record.branch == "not_taken" or not (target == PLUGIN_ROOT or target.startswith(PLUGIN_ROOT + ".")):
            continue
        if target in paired:
            continue
        for original, alias in record.names or [[target, record.alias or target.split(".")[0]]]:
            if alias != "*":
                bound.setdefault(alias, (f"{target}.{original}" if record.names else target, record.line))
    return bound


def _calls(nodes: list[ast.AST]) -> list[tuple[ast.Call, str]]:
    return [(n, name) for n in nodes if isinstance(n, ast.Call) and (name := dotted(n.func))]


def _maca_kernel(local: _Source, plus: list[int], context: _Context) -> _Hits | None:
    evidence: list[EvidenceItem] = []
    said: list[str] = []
    for call, name in _calls(local.at(plus)):
        parts = name.split(".")
        bound = context.bindings.get(parts[0])
        binding = [local.cite(bound[1])] if bound else []
        if (
            len(parts) == 4
            and parts[:2] == ["torch", "ops"]
            and (where := context.facts.registered_op(".".join(parts[2:])))
        ):
            evidence += [local.cite(call.lineno), where]
            said.append(f"{name} (registered by the plugin at {where.path}:{where.line})")
        elif parts[-1].startswith("mx_"):
            evidence += [local.cite(call.lineno), *binding]
            said.append(f"{name} (an mx_ op{f' from {bound[0]}' if bound else ''})")
        elif bound:
            evidence += [local.cite(call.lineno), *binding]
            said.append(f"{name} (bound to {bound[0]} at line {bound[1]})")
        if len(said) >= MAX_HITS:
            break
    return _Hits(DiffClass.MACA_KERNEL, evidence, "calls " + "; ".join(said)) if said else None


def _platform_predicate(local: _Source, plus: list[int]) -> _Hits | None:
    for call, _name in _calls(local.at(plus)):
        predicate = platform_predicate(call)
        if predicate and not CAPABILITY_CALL.match(predicate):
            answer = evaluate(call)
            told = "undecided" if answer is None else str(answer)
            return _Hits(
                DiffClass.PLATFORM_PREDICATE,
                [local.cite(call.lineno)],
                f"checks {predicate}() — an out-of-tree platform answers {told}",
            )
    return None


def _capability_predicate(local: _Source, plus: list[int], facts: PluginFacts) -> _Hits | None:
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
                where = facts.platform_class or "no platform class named by vllm_metax/__init__.py"
                told = f"needs MACA evidence: {where} shows no constant answer for {method}()"
            return _Hits(DiffClass.CAPABILITY_PREDICATE, evidence, f"checks {name}(); {told}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SM_STRING.match(node.value):
            why = f"names {node.value!r}; needs MACA evidence: an SM number is an NVIDIA architecture, not a MACA contract"
            return _Hits(DiffClass.CAPABILITY_PREDICATE, [local.cite(node.lineno)], why)
    return None


def _precision_names(nodes: list[ast.AST], pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    found = []
    for node in nodes:
        text = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        if text and pattern.search(text):
            found.append((node.lineno, text))
    return found


def _dtype_path(base: _Source, minus: list[int], local: _Source, plus: list[int]) -> _Hits | None:
    dropped = _precision_names(base.at(minus), LOW_PRECISION)
    if not dropped or _precision_names(local.at(plus), LOW_PRECISION):
        return None
    kept = _precision_names(local.at(plus), KEPT_PRECISION)
    evidence: list[EvidenceItem] = [base.cite(line) for line, _ in dropped[:MAX_HITS]] + [
        local.cite(line) for line, _ in kept[:MAX_HITS]
    ]
    instead = f"; local has {', '.join(sorted({t for _, t in kept}))}" if kept else "; the local copy drops that path"
    why = (
        f"upstream has {', '.join(sorted({t for _, t in dropped})[:4])}{instead}: keep the MACA path rather than "
        "overwrite it to shrink the diff, and verify the MACA kernel supports its dtype (a dtype name is no MACA contract)"
    )
    return _Hits(DiffClass.DTYPE_PATH, evidence, why)


def _import_swap(local: _Source, plus: list[int], module: IndexedModule) -> _Hits | None:
    for node in local.at(plus):
        if isinstance(node, ast.ImportFrom):
            target = module.absolute("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            target = node.names[0].name
        else:
            continue
        if target == PLUGIN_ROOT or target.startswith(PLUGIN_ROOT + "."):
            return _Hits(DiffClass.IMPORT_SWAP, [local.cite(node.lineno)], f"imports from {target}")
    return None


def _classify(
    base: _Source, minus: list[int], local: _Source, plus: list[int], module: IndexedModule, context: _Context
) -> list[_Hits]:
    found = [
        _maca_kernel(local, plus, context),
        _platform_predicate(local, plus),
        _capability_predicate(local, plus, context.facts),
        _dtype_path(base, minus, local, plus),
        _import_swap(local, plus, module),
    ]
    return [hit for hit in found if hit is not None]


# -- rows of one file -------------------------------------------------------------------------


class _FileRows:
    """Builds the rows of one changed pair from its three versions."""

    def __init__(self, versions: FileVersions, context: _Context) -> None:
        self.v = versions
        self.context = context
        self.local = _Source(versions.local)
        self.target = _Source(versions.target)
        self.base = self.target if versions.base.sha == versions.target.sha else _Source(versions.base)
        self.rows: list[MatrixRow] = []

    def row(
        self,
        symbol: str,
        upstream_symbol: str | None,
        change: str,
        hits: list[_Hits],
        evidence: list[EvidenceItem],
        leads: list[str],
        upstream_changed: bool | None,
        why: str,
    ) -> None:
        cls = hits[0].cls if hits else DiffClass.UNVERIFIED
        rationale = "; ".join(h.why for h in hits) if hits else why
        cited = evidence + [item for hit in hits for item in hit.evidence]
        unique = list({item.model_dump_json(): item for item in cited}.values())
        self.rows.append(
            MatrixRow(
                local=self.v.local.path,
                symbol=symbol,
                upstream=self.v.target.path,
                upstream_symbol=upstream_symbol,
                change=change,
                proposed_class=cls,
                also=tuple(h.cls for h in hits[1:]),
                upstream_changed=upstream_changed,
                base=self.v.base_label,
                evidence=tuple(unique),
                leads=tuple(leads[:MAX_LEADS]),
                rationale=f"proposal: {rationale}",
            )
        )

    def _upstream_changed(self, upstream_symbol: str) -> bool | None:
        if self.v.base_label is None:
            return None
        return _digest(self.v.base.record, upstream_symbol) != _digest(self.v.target.record, upstream_symbol)

    def _def_line(self, source: _Source, symbol: str | None) -> list[FileEvidence]:
        lines = source.spans.get(symbol or "")
        return [source.cite(lines[0])] if lines else []

    def maca_edit(self, symbol: str | None, upstream_symbol: str | None, change: str) -> None:
        """A symbol the plugin changed (or added, or dropped) relative to B: classified from the differing lines."""
        in_base = upstream_symbol is not None and upstream_symbol in self.base.spans
        before = self.base if in_base else self.target
        minus, plus = _changed_lines(before, upstream_symbol, self.local, symbol)
        hits = _classify(before, minus, self.local, plus, self.v.local_module, self.context)
        evidence = self._def_line(self.local, symbol) or self._def_line(before, upstream_symbol)
        known = set(before.comments_above(upstream_symbol).values())
        header = [n for n, text in self.local.comments_above(symbol).items() if text not in known]
        leads = self.local.leads(plus + header) + before.leads(minus)
        upstream_changed = self._upstream_changed(upstream_symbol) if upstream_symbol else None
        self.row(
            symbol or upstream_symbol or "",
            upstream_symbol,
            change,
            hits,
            evidence,
            leads,
            upstream_changed,
            "no rule applies to the differing lines; read them",
        )

    def upstream_change(self, symbol: str, upstream_symbol: str, change: str, added: bool) -> None:
        evidence = self._def_line(self.target, upstream_symbol) + (
            [] if added else self._def_line(self.base, upstream_symbol)
        )
        since = self.v.base_label or "the base"
        why = (
            f"the target added {upstream_symbol} since {since}"
            if added
            else f"the plugin kept {since}'s {upstream_symbol}; the target changed it"
        )
        self.row(symbol, upstream_symbol, change, [_Hits(DiffClass.UPSTREAM_CHANGE, [], why)], evidence, [], True, why)

    def obsolete(
        self, symbol: str, upstream_symbol: str, change: str, why: str, evidence: list[EvidenceItem], removed: bool
    ) -> None:
        changed = True if removed else self._upstream_changed(upstream_symbol)
        self.row(
            symbol, upstream_symbol, change, [_Hits(DiffClass.OBSOLETE_OVERRIDE, [], why)], evidence, [], changed, why
        )

    # -- the symbol diff, entry by entry ------------------------------------------------------

    def build(self, diff: SymbolDiff, paired: Mapping[str, str]) -> list[MatrixRow]:
        renamed = {r.local: r.upstream for r in diff.renamed}
        for rename in diff.renamed:
            self.changed(rename.local, rename.upstream, "subclass" if rename.how == "subclass" else "renamed")
        for symbol in diff.changed:
            owner, _, method = symbol.partition(".")
            upstream = f"{renamed.get(owner, owner)}.{method}" if method else renamed.get(owner, owner)
            self.changed(symbol, upstream, "changed")
        for symbol in diff.added:
            owner, _, method = symbol.partition(".")
            upstream = f"{renamed.get(owner, owner)}.{method}" if method else symbol
            if upstream in self.base.spans and self.v.base_label is not None:
                why = f"{self.v.base_label} had {upstream}; the target removed it, so the local copy overrides something gone"
                self.obsolete(
                    symbol,
                    upstream,
                    "added",
                    why,
                    self._def_line(self.local, symbol) + self._def_line(self.base, upstream),
                    True,
                )
            else:
                self.maca_edit(symbol, None, "added")
        for upstream in diff.removed:
            if self.v.base_label is not None and upstream not in self.base.spans:
                self.upstream_change(upstream, upstream, "removed", added=True)
            else:
                self.maca_edit(None, upstream, "removed")
        self.import_swaps(paired)
        self.identical_overrides()
        return self.rows

    def changed(self, symbol: str, upstream_symbol: str, change: str) -> None:
        mine = _digest(self.v.local.record, symbol)
        based = _digest(self.v.base.record, upstream_symbol)
        if self.v.base_label is not None and based is not None and mine == based:
            self.upstream_change(symbol, upstream_symbol, change, added=False)
        else:
            self.maca_edit(symbol, upstream_symbol, change)

    def import_swaps(self, paired: Mapping[str, str]) -> None:
        for swap in import_swaps(self.v.local_module, self.v.target_module, PLUGIN_ROOT, "vllm", paired):
            follows = "follows the paired copy of" if swap.paired else "routes to the plugin's own"
            why = f"{swap.name} {follows} {swap.local_module} instead of {swap.upstream_module}"
            evidence: list[EvidenceItem] = [self.local.cite(swap.line), self.target.cite(swap.upstream_line)]
            hits = [_Hits(DiffClass.IMPORT_SWAP, [], why)]
            if swap.local_module not in self.context.plugin_modules:
                hits = []
                why = f"{swap.name} is imported from {swap.local_module}, which the plugin does not have: the import fails"
            self.row(
                f"{IMPORT_PREFIX}{swap.name}",
                f"{IMPORT_PREFIX}{swap.name}",
                "import_swap",
                hits,
                evidence,
                self.local.leads([swap.line]),
                None,
                why,
            )

    def identical_overrides(self) -> None:
        """Methods a subclass overrides with exactly the target's body: the override is redundant."""
        for local_class, upstream_class in self.v.extends.items():
            mine = self.v.local.record.definition(local_class)
            theirs = self.v.target.record.definition(upstream_class)
            if mine is None or theirs is None:
                continue
            for method, digest in sorted(mine.members.items()):
                if theirs.members.get(method) == digest:
                    symbol, upstream = f"{local_class}.{method}", f"{upstream_class}.{method}"
                    why = f"{symbol} repeats the target's {upstream} unchanged"
                    evidence = self._def_line(self.local, symbol) + self._def_line(self.target, upstream)
                    self.obsolete(symbol, upstream, "identical_override", why, evidence, False)


def file_rows(
    versions: FileVersions, facts: PluginFacts, paired: Mapping[str, str], plugin_modules: frozenset[str]
) -> list[MatrixRow]:
    """The rows of one changed pair (both sides parse)."""
    context = _Context(facts, _plugin_bindings(versions.local_module, paired), plugin_modules)
    builder = _FileRows(versions, context)
    lines_local, lines_target = split_lines(versions.local.data), split_lines(versions.target.data)
    if versions.extends:
        diff = diff_extension(versions.local.record, versions.target.record, versions.extends)
    else:
        diff = diff_symbols(versions.local.record, versions.target.record, lines_local, lines_target)
    return sorted(builder.build(diff, paired), key=lambda r: r.symbol)


def file_level_row(
    local: str, upstream: str | None, change: str, cls: DiffClass, evidence: list[EvidenceItem], why: str
) -> MatrixRow:
    """A row about the whole file (`*`): identical to the target, removed by it, or not parseable."""
    return MatrixRow(
        local=local,
        symbol=FILE_SYMBOL,
        upstream=upstream,
        upstream_symbol=None,
        change=change,
        proposed_class=cls,
        also=(),
        upstream_changed=None,
        base=None,
        evidence=tuple(evidence),
        leads=(),
        rationale=f"proposal: {why}",
    )


# -- the whole matrix ---------------------------------------------------------------------------


def _version(subject: Subject, path: str, record: ModuleRecord) -> Version:
    return Version(path, subject.sha(path), record, subject.read(path))


def _whole_file(trees: Trees, pair: Pair) -> MatrixRow | None:
    """The `*` row of a pair without symbol rows: identical (and defining something), removed, unparseable."""
    cite = FileEvidence(path=pair.local, line=1, rev=trees.local.sha(pair.local))
    local = trees.local_modules.get(pair.local)
    if pair.status is Status.IDENTICAL:
        if local is None or not local.record.definitions or pair.upstream is None:
            return None
        why = "the local file is byte-identical to the target's (same blob): the copy overrides nothing"
        evidence: list[EvidenceItem] = [cite, FileEvidence(path=pair.upstream, line=1, rev=cite.rev)]
        return file_level_row(pair.local, pair.upstream, "identical_file", DiffClass.OBSOLETE_OVERRIDE, evidence, why)
    if pair.status is Status.REMOVED:
        why = f"the target no longer has {pair.upstream}: the local file overrides something removed"
        evidence = [cite, *(e for e in pair.evidence if e.kind == "commit")]
        return file_level_row(pair.local, pair.upstream, "removed_file", DiffClass.OBSOLETE_OVERRIDE, evidence, why)
    target = trees.upstream_modules.get(pair.upstream or "")
    if local is None or target is None or local.record.error or target.record.error:
        why = "a side is not an importable module or does not parse: no symbol rows; read the diff"
        return file_level_row(pair.local, pair.upstream, "changed", DiffClass.UNVERIFIED, [cite], why)
    return None


def difference_matrix(
    trees: Trees,
    pairs: list[Pair],
    facts: PluginFacts,
    cache: RecordCache,
    closest: Mapping[str, FileReleases],
    releases: list[Release],
    only: set[str] | None = None,
) -> tuple[list[MatrixRow], list[str]]:
    """Rows for every compared pair (or the local paths in `only`) and the gaps met on the way.

    Local-only files and files that define nothing (package markers identical to upstream's) have
    no rows. B is each file's closest release (`closest`, over `releases`); without one, the target.
    """
    paired = paired_modules(pairs)
    plugin_modules = frozenset(name for path in trees.local.entries() if (name := module_name(path)))
    by_label = {release.label: release for release in releases}
    rows: list[MatrixRow] = []
    unknowns: list[str] = []
    for pair in pairs:
        if pair.status is Status.LOCAL_ONLY or pair.upstream is None or (only is not None and pair.local not in only):
            continue
        whole = _whole_file(trees, pair)
        if whole is not None or pair.status is not Status.CHANGED:
            rows += [whole] if whole else []
            continue
        local, target = trees.local_modules[pair.local], trees.upstream_modules[pair.upstream]
        target_version = _version(trees.upstream, pair.upstream, target.record)
        base, label = target_version, None
        found = closest.get(pair.local)
        if found is not None and found.closest:
            release, path = by_label[found.closest], found.counterparts[found.closest].path
            record = cache.get_many(release.subject, [path])[path]
            if record.error:
                unknowns.append(
                    f"{path} at {release.label} does not parse: {pair.local} is compared with the target only."
                )
            else:
                base, label = _version(release.subject, path, record), release.label
        versions = FileVersions(
            _version(trees.local, pair.local, local.record),
            target_version,
            base,
            label,
            local,
            target,
            pair.extends if pair.rule is Rule.SUBCLASS else {},
        )
        rows += file_rows(versions, facts, paired, plugin_modules)
    return rows, unknowns
