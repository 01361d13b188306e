"""What a merged module reads and binds: which tentative units it still needs, which names it lacks."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from .units import Unit, split_units


class Prune(cst.CSTTransformer):
    def __init__(self, drop: set[int]) -> None:
        super().__init__()
        self.drop = drop

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode | cst.RemovalSentinel:  # type: ignore[override]
        return cst.RemoveFromParent() if id(original) in self.drop else updated


class Uses(cst.CSTVisitor):
    """Names the code refers to (attribute tails included), not counting imports and definition names."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: set[str] = set()
        self.skip: set[int] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.skip.add(id(node.name))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.skip.add(id(node.name))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.skip.add(id(node.keyword))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self.skip:
            self.refs.add(node.value)


def missing_names(module: cst.Module, defines: Callable[[Unit], list[str]]) -> Callable[[list[str]], bool]:
    """Whether the module refers to one of the names without defining it at its top level."""
    uses = Uses()
    module.visit(uses)
    defined = {n for u in split_units(module.body) for n in defines(u)}
    return lambda names: any(n in uses.refs and n not in defined for n in names)
