"""`signature_drift` defects: plugin code that no longer fits an upstream signature at the target.

Three places: calls from plugin code to upstream functions and constructors, plugin methods that
override an upstream method whose parameters changed, and launches of JIT kernels that bind no
argument to a parameter the target kernel requires. With a base, what did not fit at base either
is left out: that is not drift.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..code.codebase import Codebase, Ref
from ..code.dispatch import dotted
from ..code.module_index import Definition, ModuleIndex
from ..code.overrides import class_chain
from .defects import Defect
from .kernels import KernelLaunch


@dataclass(frozen=True)
class Params:
    positional: list[str]
    required: list[str]
    keyword_only: list[str]
    var_positional: bool
    var_keyword: bool

    @classmethod
    def parse(cls, signature: str, drop_first: bool) -> Params | None:
        try:
            args = ast.parse(f"def _f{signature}:\n    pass").body[0].args  # type: ignore[attr-defined]
        except (SyntaxError, IndexError, AttributeError):
            return None
        positional = [a.arg for a in (*args.posonlyargs, *args.args)]
        required = positional[: len(positional) - len(args.defaults)]
        required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
        if drop_first and positional:
            required = [r for r in required if r != positional[0]]
            positional = positional[1:]
        return cls(
            positional, required, [a.arg for a in args.kwonlyargs], args.vararg is not None, args.kwarg is not None
        )

    def problems(self, call: ast.Call) -> list[str] | None:
        """Why `call` does not bind; None when it unpacks arguments (undecidable)."""
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        found = []
        if len(call.args) > len(self.positional) and not self.var_positional:
            found.append(f"{len(call.args)} positional arguments, {len(self.positional)} accepted")
        bound = set(self.positional[: len(call.args)])
        for keyword in call.keywords:
            if keyword.arg in self.positional or keyword.arg in self.keyword_only:
                bound.add(keyword.arg)
            elif not self.var_keyword:
                found.append(f"unexpected keyword {keyword.arg}")
        missing = [r for r in self.required if r not in bound]
        if missing:
            found.append(f"missing required {', '.join(missing)}")
        return found


@dataclass(frozen=True)
class _Callable:
    """The signature a call binds to: a function's, or a constructor's (`self` dropped)."""

    signature: str
    drop_self: bool
    definition: Definition

    @property
    def params(self) -> Params | None:
        return Params.parse(self.signature, self.drop_self)


def _callable(index: ModuleIndex, code: Codebase, ref: Ref) -> _Callable | None:
    """An upstream function or class constructor in `index` (JIT kernels are launches, not calls)."""
    indexed = index.get(ref.module)
    definition = indexed.record.definition(ref.path[0]) if indexed and len(ref.path) == 1 else None
    if indexed is None or definition is None:
        return None
    if any(k.split(" @")[0] == ref.path[0] for k in indexed.record.jit_kernels):
        return None
    if definition.kind == "function":
        return _Callable(definition.signature, False, definition)
    if definition.kind == "class" and index is code.index:
        for _, klass in class_chain(code, ref.module, ref.path[0]):
            if "__init__" in klass.member_signatures:
                return _Callable(klass.member_signatures["__init__"], True, definition)
    if definition.kind == "class" and "__init__" in definition.member_signatures:
        return _Callable(definition.member_signatures["__init__"], True, definition)
    return None


def _fits(index: ModuleIndex | None, code: Codebase, ref: Ref, call: ast.Call) -> bool | None:
    found = _callable(index, code, ref) if index is not None else None
    params = found.params if found else None
    problems = params.problems(call) if params else None
    return None if problems is None else not problems


def call_drift(code: Codebase, base: ModuleIndex | None, module: str) -> list[Defect]:
    """Calls from `module` to upstream functions and classes that do not bind to the target's signature.

    With a base, a call that did not bind at base either is left out: that is not drift.
    """
    tree = code.tree(module)
    caller = code.get(module)
    if tree is None or caller is None:
        return []
    defects = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or isinstance(node.func, ast.Subscript):
            continue
        name = dotted(node.func)
        ref = code.bind(module, name) if name else None
        indexed = code.get(ref.module) if ref else None
        if ref is None or indexed is None or indexed.side != "upstream":
            continue
        found = _callable(code.index, code, ref)
        params = found.params if found else None
        problems = params.problems(node) if params else None
        if found is None or not problems or (base is not None and _fits(base, code, ref, node) is False):
            continue
        defects.append(
            Defect(
                "signature_drift",
                caller.path,
                node.lineno,
                f"call to {ref.symbol}{found.signature} does not bind at the target: {'; '.join(problems)}",
                [code.evidence(module, node.lineno), code.evidence(ref.module, found.definition.line)],
                ref.symbol,
            )
        )
    return defects


def _incompatible(signature: str, upstream: str) -> list[str]:
    """How a method's parameters fail its upstream counterpart's (empty: compatible or unreadable)."""
    mine, theirs = Params.parse(signature, True), Params.parse(upstream, True)
    if mine is None or theirs is None:
        return []
    lacking = [] if mine.var_keyword else [p for p in theirs.required if p not in mine.positional + mine.keyword_only]
    extra = [] if theirs.var_keyword else [p for p in mine.required if p not in theirs.positional + theirs.keyword_only]
    return ([f"the target requires {', '.join(lacking)}"] if lacking else []) + (
        [f"it requires {', '.join(extra)} the target does not pass"] if extra else []
    )


def override_drift(code: Codebase, base: ModuleIndex | None, module: str) -> list[Defect]:
    """Methods of plugin subclasses whose upstream counterpart's parameters changed incompatibly."""
    indexed = code.get(module)
    if indexed is None:
        return []
    defects = []
    for definition in indexed.record.definitions:
        if definition.kind != "class":
            continue
        chain = class_chain(code, module, definition.name)[1:]
        for method, signature in definition.member_signatures.items():
            if method.startswith("__"):
                continue
            owner = next(((m, d) for m, d in chain if method in d.member_signatures), None)
            owner_module = code.get(owner[0]) if owner else None
            if owner is None or owner_module is None or owner_module.side != "upstream":
                continue
            upstream = owner[1].member_signatures[method]
            parts = _incompatible(signature, upstream)
            before = _base_member(base, owner[0], owner[1].name, method)
            if not parts or (before is not None and before == upstream):
                continue
            overridden = f"{owner[0]}:{owner[1].name}.{method}{upstream}"
            defects.append(
                Defect(
                    "signature_drift",
                    indexed.path,
                    definition.line,
                    f"{definition.name}.{method}{signature} overrides {overridden}: {'; '.join(parts)}",
                    [code.evidence(module, definition.line), code.evidence(owner[0], owner[1].line)],
                    f"{module}:{definition.name}.{method}",
                )
            )
    return defects


def _base_member(base: ModuleIndex | None, module: str, cls: str, method: str) -> str | None:
    indexed = base.get(module) if base else None
    definition = indexed.record.definition(cls) if indexed else None
    return definition.member_signatures.get(method) if definition else None


def kernel_drift(code: Codebase, launches: list[KernelLaunch], plugin_modules: set[str]) -> list[Defect]:
    """Launches from plugin code that no longer match the target kernel: a required parameter they
    bind nothing to, or a keyword for a parameter the kernel lost since base."""
    defects = []
    for launch in launches:
        gained = f"; the kernel gained {', '.join(launch.gained)} since base" if launch.gained else ""
        problems = {
            site: f"binds no argument to required parameter(s) {', '.join(missing)} of the target kernel{gained}"
            for site, missing in launch.missing.items()
        }
        for site, stale in launch.stale.items():
            lost = f"passes {', '.join(stale)}, which the target kernel no longer takes (lost since base)"
            problems[site] = f"{problems[site]}, and {lost}" if site in problems else lost
        for site, problem in sorted(problems.items()):
            path, _, line = site.rpartition(":")
            module = next((m for m in plugin_modules if (i := code.get(m)) is not None and i.path == path), None)
            if module is None:
                continue
            via = f" (through {launch.via[site]})" if site in launch.via else ""
            defects.append(
                Defect(
                    "signature_drift",
                    path,
                    int(line),
                    f"launch of JIT kernel {launch.kernel.symbol}{via} {problem}",
                    [code.evidence(module, int(line)), code.evidence(launch.kernel.module, launch.line)],
                    launch.kernel.symbol,
                )
            )
    return defects
