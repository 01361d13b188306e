"""Whether a plugin patch runs: reached from the plugin's entry points through imports and calls.

The entry points are the plugin functions its packaging metadata registers in vLLM's plugin
groups (`setup.py` `entry_points=`, `pyproject.toml` `[project.entry-points."<group>"]`,
`setup.cfg` `[options.entry_points]`). From them the walk runs what a Python process runs:
importing a module runs its parent packages and its module-level code (the imports in branches
an out-of-tree platform may take, the calls, the class paths it names); calling a function runs
its lazy imports, its calls and the class paths it names; a plugin class named by a class-path
string (`"pkg.platform.Platform"` returned to vLLM, a `worker_cls`) or called is instantiated by
whoever receives it, so its `__init__` and every method overriding an upstream base's run — the
platform's start-up hooks (`pre_register_and_update`, `check_and_update_config`), a worker's
`init_device`; so do the plugin functions a patch installs (upstream calls them) and the classes
it registers. Upstream code is a boundary: the walk does not enter it. Each edge taken under an
`if` adds its test to the condition of what it reaches (`conditions`): a unit's condition is the
alternatives of all its ways, so a patch reached through every branch of an `if`/`else` has none;
literal arguments decide the guards of the function they are passed to.
"""

from __future__ import annotations

import ast
import configparser
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..sources.subjects import Subject
from .codebase import Codebase, Ref
from .conditions import Term, conditions, render, simplify
from .literals import own_nodes
from .overrides import Overrides, class_chain
from .patch_forms import UNKNOWN, dotted_ref

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

PLUGIN_GROUPS = ("vllm.platform_plugins", "vllm.general_plugins")
"""The entry-point groups vLLM loads plugins from (`vllm.plugins`)."""
TOML_SECTION = re.compile(r"""^\[(?:project\.entry-points|tool\.poetry\.plugins)\.["']?([\w.-]+)["']?\]\s*$""")
TOML_ENTRY = re.compile(r"""^\s*["']?([\w.-]+)["']?\s*=\s*["']([^"']+)["']""")
NAME = re.compile(r"[A-Za-z_]\w*")
CHAIN_SHOWN = 8
MAX_VISITS = 24
"""Times one state's edges are revisited as its condition grows (conditions only ever widen)."""


@dataclass(frozen=True)
class Step:
    """An edge into `unit`: the file and line that runs it, under `guard` (None: unconditionally)."""

    unit: str
    file: str
    line: int
    guard: str | None = None
    binding: tuple[tuple[str, Any], ...] = ()
    """Literal values of the unit's parameters that its guards test (from the call's arguments)."""


def entry_points(subject: Subject) -> list[Step]:
    """The `module:function` of every plugin the packaging metadata registers in vLLM's groups."""
    entries = subject.entries()
    found: list[Step] = []
    if "setup.py" in entries:
        found += _setup_py(subject.read("setup.py"))
    if "pyproject.toml" in entries:
        found += _pyproject(subject.read("pyproject.toml"))
    if "setup.cfg" in entries:
        found += _setup_cfg(subject.read("setup.cfg"))
    return found


def _value(text: str) -> str:
    return text.partition("=")[2].strip() if "=" in text else text.strip()


def _setup_py(source: bytes) -> list[Step]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and key.value in PLUGIN_GROUPS):
                continue
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    found.append(Step(_value(item.value), "setup.py", item.lineno))
    return found


def _pyproject(source: bytes) -> list[Step]:
    found, group = [], None
    for number, line in enumerate(source.decode("utf-8", errors="replace").splitlines(), 1):
        if line.startswith("["):
            header = TOML_SECTION.match(line)
            group = header.group(1) if header else None
        elif group in PLUGIN_GROUPS and (entry := TOML_ENTRY.match(line)):
            found.append(Step(entry.group(2).strip(), "pyproject.toml", number))
    return found


def _setup_cfg(source: bytes) -> list[Step]:
    parser = configparser.ConfigParser()
    try:
        parser.read_string(source.decode("utf-8", errors="replace"))
    except configparser.Error:
        return []
    if not parser.has_section("options.entry_points"):
        return []
    section = parser["options.entry_points"]
    return [
        Step(_value(line), "setup.cfg", 1)
        for group in PLUGIN_GROUPS
        for line in section.get(group, "").splitlines()
        if line.strip()
    ]


Binding = tuple[tuple[str, Any], ...]
State = tuple[str, Binding]


class _Reach:
    """Every unit ("module", "module:function", "module:Class", "module:Class.method") the entry
    points reach, with the condition under which it runs and a least conditional way there. A
    function unit is walked once per set of literal values its guards test
    (`adapt_patch(is_global_patch=True)` and `adapt_patch()` take different branches); a guard
    those values decide adds no condition, or cuts the edge."""

    def __init__(self, code: Codebase, found: Overrides) -> None:
        self.code, self.facts = code, found.facts
        self.cond: dict[State, set[Term]] = {}
        self.parent: dict[State, tuple[Step, State | None]] = {}
        """state -> the edge into it and the state it came from, on its least conditional way."""
        self._edges: dict[str, list[Step]] = {}
        self._lazy: dict[str, dict[str, list[Step]]] = {}
        self._tested: dict[str, set[str]] = {}
        self.installs: dict[str, list[Step]] = {}
        """unit -> plugin functions and classes it hands upstream (patch replacements, registrations)."""
        for patch in found.patches:
            installed = self._symbol(patch.replacement)
            if installed:
                holder = f"{patch.module}:{patch.scope}" if patch.scope else patch.module
                self.installs.setdefault(holder, []).append(Step(installed, patch.file, patch.line))
        for override in found.overrides:
            module, _, name = override.name.partition(":")
            if override.kind in ("custom_op", "quant_config") and name:
                self.installs.setdefault(module, []).append(Step(override.name, override.file, override.line))

    def _symbol(self, symbol: str | None) -> str | None:
        module, colon, path = (symbol or "").partition(":")
        return self._unit_of(Ref(module, tuple(path.split(".")))) if colon and path else None

    def entry(self, start: Step) -> list[Step]:
        """An entry point `module:function`: its module is imported, then the function called
        with no arguments (its defaults decide its guards)."""
        module, _, attr = start.unit.partition(":")
        steps = [Step(module.strip(), start.file, start.line)]
        target = self._unit_of(Ref(module.strip(), tuple(attr.strip().split(".")))) if attr.strip() else None
        if target:
            steps.append(Step(target, start.file, start.line, binding=self._binding(target, [], {})))
        return steps

    def run(self, starts: list[Step]) -> None:
        """Widen each state's condition along the edges until nothing changes."""
        queue: deque[State] = deque()
        for start in starts:
            state = (start.unit, start.binding)
            self.cond[state], self.parent[state] = {frozenset()}, (start, None)
            queue.append(state)
        visits: dict[State, int] = {}
        while queue:
            state = queue.popleft()
            visits[state] = visits.get(state, 0) + 1
            if visits[state] > MAX_VISITS:
                continue
            if state[0] not in self._edges:
                self._edges[state[0]] = self.edges(state[0])
            for edge in self._edges[state[0]]:
                added = conditions(edge.guard, dict(state[1]))
                if added is not None:
                    self._widen(state, edge, frozenset(added), queue)

    def _widen(self, state: State, edge: Step, added: Term, queue: deque[State]) -> None:
        child = (edge.unit, edge.binding)
        before = self.cond.get(child, set())
        now = simplify(before | {t | added for t in self.cond[state]})
        if now == before:
            return
        if not before or min(map(len, now)) < min(map(len, before)):
            self.parent[child] = (replace(edge, guard=render(added) if added else None), state)
        self.cond[child] = now
        queue.append(child)

    def way(self, states: list[State]) -> list[Step]:
        """The least conditional way to one of a unit's states, from its entry point."""
        current: State | None = min(states, key=lambda s: min(map(len, self.cond[s])))
        steps: list[Step] = []
        while current is not None and len(steps) < len(self.parent):
            step, current = self.parent[current]
            steps.append(step)
        return steps[::-1]

    # -- edges -------------------------------------------------------------------------------

    def edges(self, unit: str) -> list[Step]:
        module, _, qual = unit.partition(":")
        indexed = self.code.get(module)
        if indexed is None or indexed.side != "plugin":
            return []
        extra = self.installs.get(unit, [])
        if not qual:
            return self._module(module, indexed.path) + extra
        definition = indexed.record.definition(qual.split(".")[0])
        steps = [Step(module, indexed.path, definition.line if definition else 1)]
        if definition is not None and definition.kind == "class" and "." not in qual:
            return steps + self._instance(module, qual, indexed.path, definition.line)
        steps += self._lazy_imports(module).get(qual, [])
        return steps + self._runs(module, qual, indexed.path) + extra

    def _module(self, module: str, path: str) -> list[Step]:
        parts = module.split(".")
        steps = [Step(".".join(parts[:i]), path, 1) for i in range(1, len(parts))]
        indexed = self.code.module(module)
        for record in indexed.record.imports:
            if record.branch not in ("taken", "conditional"):
                continue
            target = indexed.absolute(record.module)
            guard = record.guard if record.branch == "conditional" else None
            steps.append(Step(target, path, record.line, guard))
            for name, _ in record.names:
                if self.code.get(f"{target}.{name}") is not None:
                    steps.append(Step(f"{target}.{name}", path, record.line, guard))
        return steps + self._runs(module, "", path)

    def _lazy_imports(self, module: str) -> dict[str, list[Step]]:
        """The imports inside each function or method of a module, by the unit holding them."""
        if module not in self._lazy:
            indexed = self.code.module(module)
            units = self.facts[module].units if module in self.facts else {}
            spans = sorted((u.start, -u.end, name) for name, u in units.items() if name)
            found: dict[str, list[Step]] = {}
            for record in indexed.record.imports:
                if record.branch != "lazy":
                    continue
                holder = [name for start, end, name in spans if start <= record.line <= -end]
                if not holder:
                    continue
                target = indexed.absolute(record.module)
                targets = [target] + [f"{target}.{n}" for n, _ in record.names if self.code.get(f"{target}.{n}")]
                found.setdefault(holder[-1], []).extend(
                    Step(t, indexed.path, record.line, record.guard) for t in targets
                )
            self._lazy[module] = found
        return self._lazy[module]

    def _runs(self, module: str, qual: str, path: str) -> list[Step]:
        unit = self.facts[module].units.get(qual) if module in self.facts else None
        if unit is None:
            return []
        steps = []
        for call in unit.calls:
            target = self._call(module, qual, call.name)
            if target:
                steps.append(Step(target, path, call.line, call.guard, self._binding(target, call.args, call.kwargs)))
        for text, line, guard in unit.paths:
            ref = dotted_ref(self.code, None, text)
            target = self._unit_of(ref) if ref is not None else None
            if target:
                steps.append(Step(target, path, line, guard))
        return steps

    def _instance(self, module: str, cls: str, path: str, line: int) -> list[Step]:
        """An instance's `__init__` (the first in its chain) and the methods overriding upstream's."""
        chain = class_chain(self.code, module, cls)
        upstream = {m for owner, d in chain if self._side(owner) == "upstream" for m in d.members}
        steps, named = [], set()
        for owner, definition in chain:
            if self._side(owner) != "plugin":
                continue
            for member in definition.members:
                if member not in named and (member in upstream or member == "__init__"):
                    named.add(member)
                    steps.append(Step(f"{owner}:{definition.name}.{member}", path, line))
        return steps

    def _binding(self, unit: str, args: list[Any], kwargs: Mapping[str, Any]) -> Binding:
        """The literal values a call gives the parameters the callee's guards test (defaults
        where the call passes nothing)."""
        module, _, qual = unit.partition(":")
        found = self.facts[module].units.get(qual) if module in self.facts and qual else None
        if found is None or not self._tests(unit):
            return ()
        params = (
            found.params[1:]
            if "." in qual and found.params[:1] and found.params[0][0] in ("self", "cls")
            else found.params
        )
        values = {}
        for position, (name, default) in enumerate(params):
            value = args[position] if position < len(args) else kwargs.get(name, default)
            if name in self._tests(unit) and value != UNKNOWN:
                values[name] = value
        return tuple(sorted(values.items()))

    def _tests(self, unit: str) -> set[str]:
        """Names the guards inside a function test."""
        if unit not in self._tested:
            module, _, qual = unit.partition(":")
            found = self.facts[module].units.get(qual) if module in self.facts else None
            guards = [s.guard for s in self._lazy_imports(module).get(qual, [])]
            guards += [c.guard for c in found.calls] + [g for _, _, g in found.paths] if found else []
            self._tested[unit] = {n for g in guards if g for n in NAME.findall(g)}
        return self._tested[unit]

    def _side(self, module: str) -> str | None:
        indexed = self.code.get(module)
        return indexed.side if indexed else None

    def _call(self, module: str, qual: str, name: str) -> str | None:
        head, _, rest = name.partition(".")
        if head in ("self", "cls") and "." in qual:
            return self._method(module, qual.rpartition(".")[0], rest) if rest and "." not in rest else None
        ref = self.code.bind(module, name)
        return self._unit_of(ref) if ref is not None else None

    def _method(self, module: str, cls: str, method: str) -> str | None:
        for owner, definition in class_chain(self.code, module, cls):
            if self._side(owner) == "plugin" and method in definition.members:
                return f"{owner}:{definition.name}.{method}"
        return None

    def _unit_of(self, ref: Ref) -> str | None:
        indexed = self.code.get(ref.module)
        if indexed is None or indexed.side != "plugin":
            return None
        if not ref.path:
            return ref.module
        definition = indexed.record.definition(ref.path[0])
        if definition is None:
            found = self.code.resolve(ref.module, ref.path[0])
            if found.module != ref.module and found.name:
                return self._unit_of(Ref(found.module, (found.name, *ref.path[1:])))
            return None
        if len(ref.path) == 1 and definition.kind in ("class", "function"):
            return f"{ref.module}:{ref.path[0]}"
        if len(ref.path) == 2 and definition.kind == "class":
            return self._method(ref.module, ref.path[0], ref.path[1])
        return None


def mark_active(code: Codebase, found: Overrides) -> list[str]:
    """Set each patch's `active`, the way it is reached and the conditions on it; the unknowns.

    A patch nothing reaches is inactive, unless a module load on the way names its module at run
    time (`import_module(f"pkg.{name}")` over a directory listing): then whether it runs is unknown."""
    if not found.patches:
        return []
    starts = entry_points(code.subjects["plugin"])
    if not starts:
        return [
            "No vLLM plugin entry points in setup.py, pyproject.toml or setup.cfg: "
            "whether each patch is active is unknown."
        ]
    reach = _Reach(code, found)
    reach.run([step for start in starts for step in reach.entry(start)])
    by_unit: dict[str, list[State]] = {}
    for state in reach.cond:
        by_unit.setdefault(state[0], []).append(state)
    opaque = undecided_loads(code, set(by_unit))
    for patch in found.patches:
        unit = f"{patch.module}:{patch.scope}" if patch.scope else patch.module
        own = conditions(patch.guard, {})
        reached = {t for state in by_unit.get(unit, []) for t in reach.cond[state]}
        terms = simplify({t | frozenset(own) for t in reached}) if own is not None else set()
        patch.active = bool(terms) if reached or not opaque else None
        if reached:
            way = reach.way(by_unit[unit])
            shown = way if len(way) <= CHAIN_SHOWN else [*way[:2], *way[-(CHAIN_SHOWN - 2) :]]
            patch.activation = [f"{s.file}:{s.line} {s.unit}" + (f" (if {s.guard})" if s.guard else "") for s in shown]
        if terms:
            patch.active_if = [] if frozenset() in terms else sorted(map(render, terms))
        elif reached:
            way_to = render(min(reached, key=len)) or "always"
            patch.active_if = [f"never: its own guard ({patch.guard}) contradicts the way there ({way_to})"]
    if not opaque or all(p.active is not None for p in found.patches):
        return []
    return [
        f"{len(opaque)} module load(s) reached from the entry points name their module at run time "
        f"({', '.join(opaque[:CHAIN_SHOWN])}): the patches nothing else reaches may still run (active unknown)."
    ]


def undecided_loads(code: Codebase, units: set[str]) -> list[str]:
    """file:line of each `import_module` / `__import__` call in the given plugin units that loads a
    plugin module by a name computed at run time: the name starts with a literal naming a plugin
    package (`f"plug.patches.{name}"`) and the file's literals do not decide the rest (decided loads
    are import records, and walked). A bare variable is a patch helper's upstream target, not this."""
    packages = {m.name.split(".")[0] for m in code.index.modules.values() if m.side == "plugin"}
    found = []
    for module in sorted({u.partition(":")[0] for u in units}):
        indexed, tree = code.get(module), code.tree(module)
        if indexed is None or indexed.side != "plugin" or tree is None:
            continue
        decided = {record.line for record in indexed.record.dynamic_imports}
        quals = {u.partition(":")[2] for u in units if u.partition(":")[0] == module}
        for qual in sorted(quals):
            for node in _unit_nodes(tree, qual):
                if isinstance(node, ast.Call) and node.lineno not in decided and _loads_plugin(node, packages):
                    found.append(f"{indexed.path}:{node.lineno}")
    return sorted(set(found))


def _loads_plugin(call: ast.Call, packages: set[str]) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name not in ("import_module", "__import__") or not call.args:
        return False
    prefix = _literal_prefix(call.args[0])
    return prefix is not None and (prefix.startswith(".") or prefix.split(".")[0] in packages)


def _literal_prefix(expression: ast.expr) -> str | None:
    """The constant start of a computed string: an f-string's, a `+` chain's, a `%` or `.format` template's."""
    if isinstance(expression, ast.JoinedStr) and expression.values:
        first = expression.values[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    if isinstance(expression, ast.BinOp) and isinstance(expression.op, (ast.Add, ast.Mod)):
        left = expression.left
        if isinstance(left, ast.Constant) and isinstance(left.value, str):
            return left.value
        return _literal_prefix(left) if isinstance(expression.op, ast.Add) else None
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute):
        template = expression.func.value
        if expression.func.attr == "format" and isinstance(template, ast.Constant) and isinstance(template.value, str):
            return template.value
    return None


def _unit_nodes(tree: ast.Module, qual: str) -> list[ast.AST]:
    """The nodes a unit runs: the module's top level (outside functions) or one function's body."""
    scope: ast.AST | None = tree
    for part in qual.split(".") if qual else []:
        body = getattr(scope, "body", [])
        scope = next((n for n in body if isinstance(n, DEFINITIONS) and n.name == part), None)
    if scope is None or isinstance(scope, ast.ClassDef):
        return []
    return list(own_nodes(scope))
