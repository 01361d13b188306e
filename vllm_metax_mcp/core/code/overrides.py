"""How the plugin changes upstream behaviour, found by mechanism rather than by directory name.

Mechanisms: `CustomOp.register_oot` (and any upstream class's `register_oot`), quant-config
registration, attention-backend selection in a platform class (a method overriding an upstream
platform hook that returns backend class paths), monkey-patches (attribute assignment or
`setattr` on an imported upstream module or class, the plugin's own patch decorators — functions
that `setattr` on their arguments —, and `sys.modules` replacement), and same-path modules
(`vllm_metax/a/b.py` sharing definitions with `vllm/a/b.py`). Each finding names the upstream
symbol it replaces, whether that symbol changed between base and target, and the file and line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..foundation.state import StateStore
from .codebase import Codebase, Outcome, Ref
from .dispatch import dotted
from .fact_cache import FactCache
from .module_index import Definition, ModuleIndex

FACTS_VERSION = 1
CLASS_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
BACKEND_PATH_METHODS = frozenset({"get_path", "get_class"})
"""Methods of upstream's backend enum that turn a member into the backend class (path)."""
MAX_CHAIN = 8


# -- per-file facts (cached by blob sha) -----------------------------------------------------


def _value(node: ast.AST) -> dict[str, Any]:
    """An argument as facts: a constant, a dotted name, or opaque."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool)):
        return {"const": node.value}
    name = dotted(node)
    return {"name": name} if name else {}


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


def _patch_decorator(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any] | None:
    """A function that `setattr`s onto one of its own parameters (possibly in a nested wrapper)."""
    params = _params(node)
    for call in ast.walk(node):
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "setattr"
            and len(call.args) == 3
        ):
            continue
        owner = call.args[0]
        if isinstance(owner, ast.Name) and owner.id in params:
            names = [n.id for n in ast.walk(call.args[1]) if isinstance(n, ast.Name) and n.id in params]
            return {
                "name": node.name,
                "target_index": params.index(owner.id),
                "target_param": owner.id,
                "name_index": params.index(names[0]) if names else None,
                "name_param": names[0] if names else None,
            }
    return None


class _FactScanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.facts: dict[str, list[Any]] = {
            "assignments": [],
            "setattrs": [],
            "decorations": [],
            "patch_decorators": [],
            "module_replacements": [],
            "path_returns": [],
        }
        self.scope: list[str] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._decorations(node)
        found = _patch_decorator(node)
        if found and not self.scope:
            self.facts["patch_decorators"].append(found)
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._decorations(node)
        if not self.scope:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._path_returns(node.name, item)
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assignment(target, node.value, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(node.args) == 3:
            owner, attr = dotted(node.args[0]), node.args[1]
            if owner:
                self.facts["setattrs"].append(
                    {
                        "target": owner,
                        "attr": attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else None,
                        "value": dotted(node.args[2]),
                        "line": node.lineno,
                    }
                )
        elif isinstance(node.func, ast.Call) and node.args and isinstance(node.args[0], ast.Name):
            # decorator applied by hand: `register(...)(Cls)`
            self._decoration(node.func, node.args[0].id, node.lineno)
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_oot"
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            # `Base.register_oot(Cls, name=...)`: the class travels as the first argument
            self._decoration(node, node.args[0].id, node.lineno, skip_first=True)
        self.generic_visit(node)

    def _assignment(self, target: ast.expr, value: ast.expr, line: int) -> None:
        if isinstance(target, ast.Attribute):
            name = dotted(target)
            if name and name.split(".")[0] not in ("self", "cls"):
                self.facts["assignments"].append({"target": name, "value": dotted(value), "line": line})
        elif isinstance(target, ast.Subscript) and dotted(target.value) == "sys.modules":
            key = target.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                self.facts["module_replacements"].append({"module": key.value, "value": dotted(value), "line": line})

    def _decorations(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self._decoration(decorator, node.name, decorator.lineno)

    def _decoration(self, decorator: ast.expr, target: str, line: int, skip_first: bool = False) -> None:
        """A decorator (or a decorator applied by hand) with its arguments and what it decorates."""
        call = decorator if isinstance(decorator, ast.Call) else None
        func = dotted(call.func if call else decorator)
        if not func:
            return
        args = [_value(a) for a in (call.args[1:] if skip_first else call.args)] if call else []
        kwargs = {k.arg: _value(k.value) for k in call.keywords if k.arg} if call else {}
        self.facts["decorations"].append(
            {"decorator": func, "args": args, "kwargs": kwargs, "target": target, "line": line}
        )

    def _path_returns(self, cls: str, method: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        guards: list[str] = []

        def visit(statements: Iterable[ast.stmt]) -> None:
            for statement in statements:
                if isinstance(statement, ast.If):
                    guards.append(ast.unparse(statement.test))
                    visit(statement.body)
                    guards[-1] = f"not ({guards[-1]})"
                    visit(statement.orelse)
                    guards.pop()
                elif isinstance(statement, ast.Return) and statement.value is not None:
                    found = _backend_value(statement.value)
                    if found:
                        self.facts["path_returns"].append(
                            {
                                "class": cls,
                                "method": method.name,
                                **found,
                                "line": statement.lineno,
                                "guard": " and ".join(guards) or None,
                            }
                        )
                elif isinstance(statement, (ast.For, ast.While, ast.With, ast.Try)):
                    for child in ("body", "orelse", "finalbody"):
                        visit(getattr(statement, child, []) or [])
                    for handler in getattr(statement, "handlers", []) or []:
                        visit(handler.body)

        visit(method.body)


def _backend_value(node: ast.expr) -> dict[str, str] | None:
    """A returned class path: a dotted-path string, or `Enum.MEMBER.get_path()`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and CLASS_PATH.match(node.value):
        return {"value": node.value, "how": "path"}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BACKEND_PATH_METHODS:
        member = dotted(node.func.value)
        if member and "." in member:
            return {"value": member, "how": "enum"}
    return None


def scan_facts(source: bytes) -> dict[str, Any]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    scanner = _FactScanner()
    scanner.visit(tree)
    return scanner.facts


# -- findings --------------------------------------------------------------------------------


@dataclass
class Target:
    """An upstream symbol something replaces, and what happened to it between base and target."""

    ref: Ref
    exists: bool | None
    changed: bool | None
    """None when no base was given (or the symbol cannot be compared)."""
    file: str | None = None
    line: int | None = None

    @property
    def symbol(self) -> str:
        return self.ref.symbol


@dataclass
class Override:
    kind: str
    """custom_op | quant_config | attention_backend | same_path."""
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
    how: str
    """assignment | setattr | decorator | module_replacement."""
    target: Target
    replacement: str | None
    file: str
    line: int
    module: str
    on_path: bool = False


@dataclass
class Overrides:
    overrides: list[Override] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    owned: dict[str, str] = field(default_factory=dict)
    """Plugin module -> the workflow that owns it (patch, registry, attention_backend)."""
    unknowns: list[str] = field(default_factory=list)


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
    changed = None
    if base is not None:
        before_exists, before = _hashes(base, ref)
        if before_exists and now is None and before is not None:
            exists, changed = False, True  # the base defined it here; the target does not
        elif before_exists and now is not None and before is not None:
            changed = before != now
    target = Target(ref, exists, changed)
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
    def __init__(self, code: Codebase, facts: dict[str, dict[str, Any]], base: ModuleIndex | None) -> None:
        self.code = code
        self.base = base
        self.result = Overrides()
        self.decorators = {(module, d["name"]): d for module, f in facts.items() for d in f.get("patch_decorators", [])}

    def target(self, ref: Ref) -> Target:
        return describe_target(self.code, self.base, ref)

    def own(self, module: str, workflow: str) -> None:
        self.result.owned.setdefault(module, workflow)

    # -- registrations ---------------------------------------------------------------------

    def registrations(self, module: str, facts: dict[str, Any]) -> None:
        for item in facts.get("decorations", []):
            ref = self.code.bind(module, item["decorator"])
            if ref is None or not ref.path:
                continue
            side = _side(self.code, ref.module)
            if side == "plugin" and len(ref.path) == 1 and (ref.module, ref.path[0]) in self.decorators:
                self._decorator_patch(module, item, self.decorators[(ref.module, ref.path[0])])
            elif side == "upstream" and ref.path[-1] == "register_oot" and len(ref.path) == 2:
                self._custom_op(module, item, ref)
            elif side == "upstream" and ref.path == ("register_quantization_config",):
                self._quant_config(module, item)

    @staticmethod
    def _key(item: dict[str, Any], keyword: str, positional: bool) -> str | None:
        value = item["kwargs"].get(keyword) or (item["args"][0] if positional and item["args"] else {})
        return value.get("const") if isinstance(value.get("const"), str) else None

    def _custom_op(self, module: str, item: dict[str, Any], ref: Ref) -> None:
        owner = ref.path[0]
        chain = class_chain(self.code, ref.module, owner)
        if not any("register_oot" in d.members for _, d in chain):
            return
        key = self._key(item, "name", positional=False) or owner
        bases = [b for b in _upstream_bases(self.code, module, item["target"]) if b.path[0] == key]
        replaced = bases or [Ref(m, (key,)) for m in self._defining(key)]
        if not bases and not replaced and key == owner:
            replaced = [Ref(ref.module, (owner,))]
        self._add("custom_op", module, item, key, replaced, "registry", f"out-of-tree replacement registered for {key}")

    def _quant_config(self, module: str, item: dict[str, Any]) -> None:
        key = self._key(item, "quantization", positional=True)
        replaced = _upstream_bases(self.code, module, item["target"])
        self._add("quant_config", module, item, key, replaced, "registry", f"quantization method {key!r}")

    def _add(
        self,
        kind: str,
        module: str,
        item: dict[str, Any],
        key: str | None,
        replaced: list[Ref],
        owner: str,
        detail: str,
    ) -> None:
        targets = [self.target(r) for r in replaced]
        indexed = self.code.get(module)
        self.result.overrides.append(
            Override(
                kind,
                f"{module}:{item['target']}",
                key,
                indexed.path if indexed else module,
                item["line"],
                targets,
                detail=detail,
            )
        )
        self.own(module, owner)

    def _defining(self, name: str) -> list[str]:
        return [
            m.name
            for m in self.code.index.modules.values()
            if m.side == "upstream" and (d := m.record.definition(name)) and d.kind == "class"
        ][:3]

    # -- patches ---------------------------------------------------------------------------

    def _decorator_patch(self, module: str, item: dict[str, Any], spec: dict[str, Any]) -> None:
        target = self._argument(item, spec["target_index"], spec["target_param"])
        if not target or "name" not in target:
            return
        name_arg = self._argument(item, spec["name_index"], spec["name_param"]) if spec["name_param"] else None
        attr = (name_arg or {}).get("const") or item["target"]
        owner = self.code.bind(module, target["name"])
        if owner is not None:
            self._patch(
                "decorator", module, Ref(owner.module, (*owner.path, attr)), f"{module}:{item['target']}", item["line"]
            )

    @staticmethod
    def _argument(item: dict[str, Any], index: int | None, name: str | None) -> dict[str, Any] | None:
        if name and name in item["kwargs"]:
            return item["kwargs"][name]
        if index is not None and index < len(item["args"]):
            return item["args"][index]
        return None

    def patches(self, module: str, facts: dict[str, Any]) -> None:
        for item in facts.get("assignments", []):
            ref = self.code.bind(module, item["target"])
            if ref is not None and ref.path and _side(self.code, ref.module) == "upstream":
                self._patch("assignment", module, ref, self._replacement(module, item["value"]), item["line"])
        for item in facts.get("setattrs", []):
            owner = self.code.bind(module, item["target"])
            if owner is None or _side(self.code, owner.module) != "upstream":
                continue
            if item["attr"] is None:
                self.result.unknowns.append(
                    f"{self.code.where(module, item['line'])}: setattr on {owner.symbol} with a computed name"
                )
                continue
            self._patch(
                "setattr",
                module,
                Ref(owner.module, (*owner.path, item["attr"])),
                self._replacement(module, item["value"]),
                item["line"],
            )
        for item in facts.get("module_replacements", []):
            if _side(self.code, item["module"]) == "upstream":
                self._patch(
                    "module_replacement",
                    module,
                    Ref(item["module"]),
                    self._replacement(module, item["value"]),
                    item["line"],
                )

    def _replacement(self, module: str, value: str | None) -> str | None:
        if value is None:
            return None
        ref = self.code.bind(module, value)
        return ref.symbol if ref is not None else value

    def _patch(self, how: str, module: str, ref: Ref, replacement: str | None, line: int) -> None:
        indexed = self.code.get(module)
        self.result.patches.append(
            Patch(how, self.target(ref), replacement, indexed.path if indexed else module, line, module)
        )
        self.own(module, "patch")

    # -- attention backends ----------------------------------------------------------------

    def backends(self, module: str, facts: dict[str, Any]) -> None:
        for item in facts.get("path_returns", []):
            hook = self._upstream_hook(module, item["class"], item["method"])
            if hook is None:
                continue
            path = item["value"] if item["how"] == "path" else self._enum_path(module, item["value"])
            if path is None:
                self.result.unknowns.append(
                    f"{self.code.where(module, item['line'])}: backend {item['value']} could not be resolved to a class path"
                )
                continue
            backend_module, _, backend = path.rpartition(".")
            side = _side(self.code, backend_module)
            replaced = _upstream_bases(self.code, backend_module, backend) if side == "plugin" else []
            indexed = self.code.get(module)
            override = Override(
                "attention_backend",
                f"{backend_module}:{backend}",
                item["guard"],
                indexed.path if indexed else module,
                item["line"],
                [self.target(r) for r in replaced],
                on_path=True,
                detail=f"selected by {item['class']}.{item['method']} (overrides {hook.symbol})"
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


def override_facts(store: StateStore, code: Codebase, packages: frozenset[str]) -> dict[str, dict[str, Any]]:
    """Override facts of every module of the plugin's packages (not its tests or tools), by module name."""
    plugin = code.subjects["plugin"]
    modules = {
        m.path: m.name for m in code.index.modules.values() if m.side == "plugin" and m.name.split(".")[0] in packages
    }
    facts = FactCache(store, "overrides", FACTS_VERSION).get_many(plugin, sorted(modules), scan_facts)
    return {modules[path]: value for path, value in facts.items()}


def find_overrides(code: Codebase, facts: dict[str, dict[str, Any]], base: ModuleIndex | None) -> Overrides:
    """Every registration, backend selection and patch of the plugin, and the modules that own them."""
    finder = _Finder(code, facts, base)
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
    found = []
    for record in indexed.record.imports if indexed else []:
        target = indexed.absolute(record.module)
        if record.branch != "not_taken" and (
            target == upstream or any(f"{target}.{name}" == upstream for name, _ in record.names)
        ):
            found.append(f"{indexed.path}:{record.line}")
    return found
