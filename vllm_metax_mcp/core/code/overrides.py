"""How the plugin changes upstream behaviour, found by mechanism rather than by directory name.

Mechanisms: `CustomOp.register_oot` (and any upstream class's `register_oot`), quant-config
registration, attention-backend selection in a platform class (a method overriding an upstream
platform hook that returns backend class paths), monkey-patches (attribute assignment or
`setattr` on an imported upstream module or class — or on a module bound from a string —, the
plugin's own patch decorators — functions that `setattr` on their arguments —, calls of the
plugin's own helpers that patch a module named by a string (`patch_forms`), a library patcher
started by hand (`mock.patch("a.b.c", new).start()`), and `sys.modules` replacement), and same-path modules
(`vllm_metax/a/b.py` sharing definitions with `vllm/a/b.py`). Each finding names the upstream
symbol it replaces, whether that symbol existed at base, exists at the target and changed between
them, and the file and line; each patch also whether it is active (`activity`).

The per-file facts come from `override_scan` (cached by blob sha); this module resolves them
against the codebase.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Literal

from ..foundation.state import StateStore
from .codebase import Codebase, Outcome, Ref
from .fact_cache import FactCache
from .module_index import Definition, ModuleIndex
from .override_scan import (
    CLASS_PATH,
    FACTS_VERSION,
    Assignment,
    Decoration,
    ModuleFacts,
    ModuleReplacement,
    PatchDecorator,
    SetAttr,
    StringCall,
    scan_facts,
)
from .patch_forms import dotted_ref, expand

MAX_CHAIN = 8

OverrideKind = Literal["custom_op", "quant_config", "attention_backend", "same_path"]
PatchHow = Literal["assignment", "setattr", "decorator", "helper", "mock_patch", "module_replacement"]
Site = Assignment | SetAttr | Decoration | StringCall | ModuleReplacement
"""The fact a patch was found in: its line, the unit it runs in and the guard around it there."""
MOCK_PATCHERS = frozenset({"unittest.mock.patch", "mock.patch"})
"""The standard library's patcher (and its backport): `patch("a.b.c", new)`, `patch.object(T, "a", new)`."""
Workflow = Literal["patch", "registry", "attention_backend"]
"""The workflow that owns a plugin module holding overrides or patches."""


@dataclass
class Target:
    """An upstream symbol something replaces, and what happened to it between base and target."""

    ref: Ref
    exists: bool | None
    changed: bool | None
    """None when no base was given (or the symbol cannot be compared)."""
    file: str | None = None
    line: int | None = None
    at_base: bool | None = None
    """Whether the base defined it (None without a base)."""

    @property
    def symbol(self) -> str:
        return self.ref.symbol


@dataclass
class Override:
    kind: OverrideKind
    name: str
    """The plugin symbol (or module) that takes effect."""
    key: str | None
    """The registration key (op or layer name, quantization method), or the selection guard."""
    file: str
    line: int
    replaces: list[Target] = field(default_factory=list)
    on_path: bool = False
    detail: str = ""
    bypassed_by: list[str] = field(default_factory=list)


@dataclass
class Patch:
    how: PatchHow
    target: Target
    replacement: str | None
    file: str
    line: int
    module: str
    on_path: bool = False
    helper: str | None = None
    """The plugin helper (`module:function`) or library patcher the patch is a call of."""
    scope: str = ""
    """The function or method the patch runs in ("" for module-level code)."""
    guard: str | None = None
    """The `if` tests around it inside that function or module."""
    active: bool | None = None
    """Reached from the plugin's entry points through imports and calls (None: no entry points known)."""
    activation: list[str] = field(default_factory=list)
    """How it is reached: `file:line unit` from the entry point to the patch's own function or module."""
    active_if: list[str] = field(default_factory=list)
    """The conditions on that way (none: it always runs)."""


@dataclass
class Overrides:
    overrides: list[Override] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    owned: dict[str, Workflow] = field(default_factory=dict)
    """Plugin module -> the workflow that owns it."""
    unknowns: list[str] = field(default_factory=list)
    facts: dict[str, ModuleFacts] = field(default_factory=dict, repr=False)
    """The facts they were found in (what `activity` walks)."""


def _hashes(index: ModuleIndex, ref: Ref) -> tuple[bool | None, str | None]:
    """(exists, identity hash) of a module-level symbol or class member in one index."""
    indexed = index.get(ref.module)
    if indexed is None:
        return False, None
    if not ref.path:
        return True, "|".join(d.body_hash for d in indexed.record.definitions)
    definition = indexed.record.definition(ref.path[0])
    if definition is None:
        return False, None
    if len(ref.path) == 1:
        return True, definition.body_hash
    member = definition.members.get(ref.path[1])
    if member is not None:
        return True, member
    return None, None  # a class attribute or a nested name: not compared


def describe_target(code: Codebase, base: ModuleIndex | None, ref: Ref) -> Target:
    exists, now = _hashes(code.index, ref)
    changed = before_exists = None
    if base is not None:
        before_exists, before = _hashes(base, ref)
        if before_exists and now is None and before is not None:
            exists, changed = False, True  # the base defined it here; the target does not
        elif before_exists and now is not None and before is not None:
            changed = before != now
    target = Target(ref, exists, changed, at_base=before_exists)
    indexed = code.get(ref.module)
    definition = indexed.record.definition(ref.path[0]) if indexed and ref.path else None
    if indexed is not None:
        target.file, target.line = indexed.path, definition.line if definition else 1
    return target


def class_chain(code: Codebase, module: str, name: str) -> list[tuple[str, Definition]]:
    """A class and its bases, resolved through imports, as far as the index knows them."""
    chain: list[tuple[str, Definition]] = []
    pending = [(module, name)]
    while pending and len(chain) < MAX_CHAIN:
        current_module, current = pending.pop(0)
        found = code.resolve(current_module, current)
        indexed = code.get(found.module) if found.outcome is Outcome.DEFINED else None
        definition = indexed.record.definition(found.name or current) if indexed else None
        if definition is None or definition.kind != "class" or any(d is definition for _, d in chain):
            continue
        chain.append((found.module, definition))
        for base in definition.bases:
            ref = code.bind(found.module, base.split("[")[0])
            if ref is not None and len(ref.path) == 1:
                pending.append((ref.module, ref.path[0]))
    return chain


def _side(code: Codebase, module: str) -> str | None:
    indexed = code.get(module)
    if indexed is not None:
        return indexed.side
    return "upstream" if module.split(".")[0] == "vllm" else None


def _upstream_bases(code: Codebase, module: str, cls: str) -> list[Ref]:
    return [Ref(m, (d.name,)) for m, d in class_chain(code, module, cls)[1:] if _side(code, m) == "upstream"][:1]


class _Finder:
    def __init__(self, code: Codebase, facts: dict[str, ModuleFacts], base: ModuleIndex | None) -> None:
        self.code = code
        self.base = base
        self.result = Overrides()
        self.decorators = {(module, d.name): d for module, f in facts.items() for d in f.patch_decorators}
        self.helpers = {(module, h["name"]): h for module, f in facts.items() for h in f.helpers}

    def target(self, ref: Ref) -> Target:
        return describe_target(self.code, self.base, ref)

    def own(self, module: str, workflow: Workflow) -> None:
        self.result.owned.setdefault(module, workflow)

    def path(self, module: str) -> str:
        indexed = self.code.get(module)
        return indexed.path if indexed else module

    # -- registrations ---------------------------------------------------------------------

    def registrations(self, module: str, facts: ModuleFacts) -> None:
        for item in facts.decorations:
            ref = self.code.bind(module, item.decorator)
            if ref is None or not ref.path:
                continue
            side = _side(self.code, ref.module)
            if side == "plugin" and len(ref.path) == 1 and (ref.module, ref.path[0]) in self.decorators:
                self._decorator_patch(module, item, self.decorators[(ref.module, ref.path[0])])
            elif side == "plugin" and len(ref.path) == 1 and (ref.module, ref.path[0]) in self.helpers:
                decorated = (item.target, f"{module}:{item.target}")
                self._helper_patch(module, ref, item, decorated)
            elif side == "upstream" and ref.path[-1] == "register_oot" and len(ref.path) == 2:
                self._custom_op(module, item, ref)
            elif side == "upstream" and ref.path == ("register_quantization_config",):
                self._quant_config(module, item)

    def _custom_op(self, module: str, item: Decoration, ref: Ref) -> None:
        owner = ref.path[0]
        chain = class_chain(self.code, ref.module, owner)
        if not any("register_oot" in d.members for _, d in chain):
            return
        key = item.key("name", positional=False) or owner
        bases = [b for b in _upstream_bases(self.code, module, item.target) if b.path[0] == key]
        replaced = bases or [Ref(m, (key,)) for m in self._defining(key)]
        if not bases and not replaced and key == owner:
            replaced = [Ref(ref.module, (owner,))]
        self._add("custom_op", module, item, key, replaced, f"out-of-tree replacement registered for {key}")

    def _quant_config(self, module: str, item: Decoration) -> None:
        key = item.key("quantization", positional=True)
        replaced = _upstream_bases(self.code, module, item.target)
        self._add("quant_config", module, item, key, replaced, f"quantization method {key!r}")

    def _add(
        self, kind: OverrideKind, module: str, item: Decoration, key: str | None, replaced: list[Ref], detail: str
    ) -> None:
        """A registration: an override owned by the registry workflow."""
        targets = [self.target(r) for r in replaced]
        self.result.overrides.append(
            Override(kind, f"{module}:{item.target}", key, self.path(module), item.line, targets, detail=detail)
        )
        self.own(module, "registry")

    def _defining(self, name: str) -> list[str]:
        """Upstream modules whose first definition of `name` is a class (the outline finds the ones
        defining such a class at all, so only those are parsed)."""
        index = self.code.index
        outlined = [m for m, o in index.outlines("upstream").items() if any(d.name == name for d in o.definitions)]
        return [m for m in outlined if (d := index.modules[m].record.definition(name)) and d.kind == "class"][:3]

    # -- patches ---------------------------------------------------------------------------

    def _decorator_patch(self, module: str, item: Decoration, spec: PatchDecorator) -> None:
        target = item.argument(spec.target_index, spec.target_param)
        if target is None or target.name is None:
            return
        name_arg = item.argument(spec.name_index, spec.name_param) if spec.name_param else None
        attr = (name_arg.text if name_arg is not None else None) or item.target
        owner = self.code.bind(module, target.name)
        if owner is not None:
            ref = Ref(owner.module, (*owner.path, attr))
            self._patch("decorator", module, ref, f"{module}:{item.target}", item)

    def _helper_patch(
        self, module: str, helper: Ref, site: Decoration | StringCall, decorated: tuple[str, str] | None
    ) -> None:
        """A call of a plugin helper that patches a module named by a string: its sites, expanded."""
        recipe = self.helpers[(helper.module, helper.path[0])]
        pairs = [(a.text, a.name) for a in site.args]
        named = {k: (a.text, a.name) for k, a in site.kwargs.items()}
        for text, value in expand(recipe, pairs, named, decorated):
            ref = dotted_ref(self.code, self.base, text)
            if ref is not None and ref.path and _side(self.code, ref.module) == "upstream":
                replacement = self._replacement(module, value) if value and ":" not in value else value
                self._patch("helper", module, ref, replacement, site, helper.symbol)

    def _bound(self, module: str, facts: ModuleFacts, expression: str, scope: str) -> Ref | None:
        """`expression` bound through the module's imports, or through a module bound from a string."""
        head, _, rest = expression.partition(".")
        for binding in facts.bindings:
            if binding.name == head and binding.scope in ("", scope):
                return dotted_ref(self.code, self.base, f"{binding.module}.{rest}" if rest else binding.module)
        return self.code.bind(module, expression)

    def _calls(self, module: str, call: StringCall) -> None:
        ref = self.code.bind(module, call.func)
        if ref is None:
            return
        if (
            _side(self.code, ref.module) == "plugin"
            and len(ref.path) == 1
            and (ref.module, ref.path[0]) in self.helpers
        ):
            self._helper_patch(module, ref, call, None)
            return
        name = ".".join((ref.module, *ref.path))
        if not call.started or not call.args or name.removesuffix(".object") not in MOCK_PATCHERS:
            return
        if name.endswith(".object"):
            owner = self.code.bind(module, call.args[0].name or "")
            attr = call.args[1].text if len(call.args) > 1 else None
            target = Ref(owner.module, (*owner.path, attr)) if owner is not None and attr else None
            new = call.args[2] if len(call.args) > 2 else call.kwargs.get("new")
        else:
            target = dotted_ref(self.code, self.base, call.args[0].text or "")
            new = call.args[1] if len(call.args) > 1 else call.kwargs.get("new")
        if target is not None and target.path and _side(self.code, target.module) == "upstream":
            replacement = self._replacement(module, new.name if new else None)
            self._patch("mock_patch", module, target, replacement, call, name)

    def patches(self, module: str, facts: ModuleFacts) -> None:
        for assignment in facts.assignments:
            ref = self._bound(module, facts, assignment.target, assignment.scope)
            if ref is not None and ref.path and _side(self.code, ref.module) == "upstream":
                value = self._replacement(module, assignment.value)
                self._patch("assignment", module, ref, value, assignment)
        for item in facts.calls:
            self._calls(module, item)
        for call in facts.setattrs:
            owner = self._bound(module, facts, call.target, call.scope)
            if owner is None or _side(self.code, owner.module) != "upstream":
                continue
            if call.attr is None:
                self.result.unknowns.append(
                    f"{self.code.where(module, call.line)}: setattr on {owner.symbol} with a computed name"
                )
                continue
            replaced = Ref(owner.module, (*owner.path, call.attr))
            value = self._replacement(module, call.value)
            self._patch("setattr", module, replaced, value, call)
        for replacement in facts.module_replacements:
            if _side(self.code, replacement.module) == "upstream":
                value = self._replacement(module, replacement.value)
                ref = Ref(replacement.module)
                self._patch("module_replacement", module, ref, value, replacement)

    def _replacement(self, module: str, value: str | None) -> str | None:
        if value is None:
            return None
        ref = self.code.bind(module, value)
        return ref.symbol if ref is not None else value

    def _patch(
        self, how: PatchHow, module: str, ref: Ref, replacement: str | None, site: Site, helper: str | None = None
    ) -> None:
        target, file = self.target(ref), self.path(module)
        patch = Patch(
            how, target, replacement, file, site.line, module, helper=helper, scope=site.scope, guard=site.guard
        )
        self.result.patches.append(patch)
        self.own(module, "patch")

    # -- attention backends ----------------------------------------------------------------

    def backends(self, module: str, facts: ModuleFacts) -> None:
        for item in facts.path_returns:
            hook = self._upstream_hook(module, item.cls, item.method)
            if hook is None:
                continue
            path = item.value if item.how == "path" else self._enum_path(module, item.value)
            if path is None:
                self.result.unknowns.append(
                    f"{self.code.where(module, item.line)}: backend {item.value} could not be resolved to a class path"
                )
                continue
            backend_module, _, backend = path.rpartition(".")
            side = _side(self.code, backend_module)
            replaced = _upstream_bases(self.code, backend_module, backend) if side == "plugin" else []
            override = Override(
                "attention_backend",
                f"{backend_module}:{backend}",
                item.guard,
                self.path(module),
                item.line,
                [self.target(r) for r in replaced],
                on_path=True,
                detail=f"selected by {item.cls}.{item.method} (overrides {hook.symbol})"
                + ("" if side == "plugin" else "; an upstream backend, used as is"),
            )
            self.result.overrides.append(override)
            self.own(module, "attention_backend")
            if side == "plugin":
                self.own(backend_module, "attention_backend")

    def _upstream_hook(self, module: str, cls: str, method: str) -> Ref | None:
        for owner, definition in class_chain(self.code, module, cls)[1:]:
            if _side(self.code, owner) == "upstream" and method in definition.members:
                return Ref(owner, (definition.name, method))
        return None

    def _enum_path(self, module: str, member: str) -> str | None:
        """`AttentionBackendEnum.X` -> the class-path string the enum member holds upstream."""
        ref = self.code.bind(module, member)
        if ref is None or len(ref.path) != 2:
            return None
        tree = self.code.tree(ref.module)
        for node in ast.walk(tree) if tree else []:
            if isinstance(node, ast.ClassDef) and node.name == ref.path[0]:
                for item in node.body:
                    if isinstance(item, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == ref.path[1] for t in item.targets
                    ):
                        text = "".join(
                            c.value
                            for c in ast.walk(item.value)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                        )
                        return text if CLASS_PATH.match(text) else None
        return None


def _top_names(definitions: list[Definition]) -> set[str]:
    return {d.name for d in definitions if d.kind in ("class", "function") and not d.name.startswith("__")}


def override_facts(store: StateStore, code: Codebase, packages: frozenset[str]) -> dict[str, ModuleFacts]:
    """Override facts of every module of the plugin's packages (not its tests or tools), by module name."""
    plugin = code.subjects["plugin"]
    modules = {
        m.path: m.name for m in code.index.modules.values() if m.side == "plugin" and m.name.split(".")[0] in packages
    }
    facts = FactCache(store, "overrides", FACTS_VERSION).get_many(plugin, sorted(modules), scan_facts)
    return {modules[path]: ModuleFacts.from_json(value) for path, value in facts.items()}


def find_overrides(code: Codebase, facts: dict[str, ModuleFacts], base: ModuleIndex | None) -> Overrides:
    """Every registration, backend selection and patch of the plugin, and the modules that own them."""
    finder = _Finder(code, facts, base)
    finder.result.facts = facts
    for module, module_facts in sorted(facts.items()):
        finder.registrations(module, module_facts)
        finder.patches(module, module_facts)
        finder.backends(module, module_facts)
    return finder.result


def mark_reached(found: Overrides, reached: set[str]) -> None:
    """An override or patch is on the model's path when the walk reaches what it replaces."""

    def hit(target: Target) -> bool:
        return target.ref.module in reached or target.ref.symbol in reached

    for override in found.overrides:
        override.on_path = override.on_path or any(hit(t) for t in override.replaces)
    for patch in found.patches:
        patch.on_path = hit(patch.target)


def same_path_overrides(
    code: Codebase, base: ModuleIndex | None, reached: set[str], plugin_packages: frozenset[str]
) -> list[Override]:
    """`vllm_metax/a/b.py` sharing definitions with `vllm/a/b.py`, where either is on the path,
    with the walked plugin modules that import the upstream module anyway."""
    walked = sorted(m for m in reached if (i := code.get(m)) is not None and i.side == "plugin")
    found = []
    for indexed in code.index.modules.values():
        top, _, rest = indexed.name.partition(".")
        if indexed.side != "plugin" or top not in plugin_packages or not rest:
            continue
        upstream = code.get(f"vllm.{rest}")
        if upstream is None or upstream.side != "upstream":
            continue
        shared = _top_names(indexed.record.definitions) & _top_names(upstream.record.definitions)
        if not shared or not ({indexed.name, upstream.name} & reached):
            continue
        found.append(
            Override(
                "same_path",
                indexed.name,
                None,
                indexed.path,
                1,
                [describe_target(code, base, Ref(upstream.name))],
                on_path=True,
                detail=f"shadows {upstream.path} ({len(shared)} shared definitions: {', '.join(sorted(shared)[:4])})",
                bypassed_by=[w for m in walked if m != indexed.name for w in _imports_of(code, m, upstream.name)],
            )
        )
    return found


def _imports_of(code: Codebase, module: str, upstream: str) -> list[str]:
    indexed = code.get(module)
    if indexed is None:
        return []
    found = []
    for record in indexed.record.imports:
        target = indexed.absolute(record.module)
        if record.branch != "not_taken" and (
            target == upstream or any(f"{target}.{name}" == upstream for name, _ in record.names)
        ):
            found.append(f"{indexed.path}:{record.line}")
    return found
