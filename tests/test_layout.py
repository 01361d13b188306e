"""The layout rules of the project (issue 19), checked on the package's own source.

Each rule reads the real modules (their imports and sizes, by `ast`), so a change that breaks one
names the module and the line that did.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vllm_metax_mcp"
CORE = PACKAGE / "core"

ALLOWED = {
    "foundation": set(),
    "sources": {"foundation", "target"},
    "code": {"foundation", "sources"},
    "compare": {"foundation", "sources", "code"},
    "trace": {"foundation", "sources", "code", "target"},
    "audit": {"foundation", "sources", "code", "compare"},
    "port": {"foundation", "sources", "code", "compare", "audit"},
    "checkpoint": {"foundation", "sources", "target"},
    "trim": {"foundation", "sources", "checkpoint", "target"},
    "smoke": {"foundation", "sources", "trim", "target"},
    "target": set(),
}
"""Which core packages each may import (the dependency order of core/__init__.py)."""

TOOL_SHARED = {"spec", "dispatch", "arguments", "output"}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_ENTRY_BODY_LINES = 40


@dataclass(frozen=True)
class Import:
    module: str
    """The importing module, dotted."""
    target: str
    """The imported module, dotted and absolute."""
    line: int


def _dotted(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[Import]:
    module = _dotted(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.append(Import(module, target, node.lineno))
            found += [Import(module, f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _core_package(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["vllm_metax_mcp", "core"] else None


def test_core_packages_import_only_the_packages_below_them() -> None:
    assert {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(ALLOWED)
    wrong = []
    for path in CORE.rglob("*.py"):
        for item in _imports(path):
            mine, theirs = _core_package(item.module), _core_package(item.target)
            if mine and theirs and theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{item.module}:{item.line} imports {item.target}")
    assert not wrong, wrong


def test_core_never_imports_the_mcp_sdk_or_a_tool() -> None:
    wrong = [
        f"{item.module}:{item.line} imports {item.target}"
        for path in CORE.rglob("*.py")
        for item in _imports(path)
        if item.target.split(".")[0] == "mcp"
        or item.target.startswith(("vllm_metax_mcp.tools", "vllm_metax_mcp.server"))
    ]
    assert not wrong, wrong


def test_a_tool_never_imports_another_tool() -> None:
    wrong = []
    for path in (PACKAGE / "tools").glob("*.py"):
        if path.stem in TOOL_SHARED or path.stem == "__init__":
            continue
        for item in _imports(path):
            parts = item.target.split(".")
            if parts[:2] == ["vllm_metax_mcp", "tools"] and len(parts) > 2 and parts[2] not in TOOL_SHARED:
                wrong.append(f"{item.module}:{item.line} imports {item.target}")
    assert not wrong, wrong


def _top_level_imports(path: Path) -> list[Import]:
    """Imports that run when the module loads: its body, and the `if`/`try` blocks at its top level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    statements, found = list(tree.body), []
    while statements:
        node = statements.pop()
        if isinstance(node, ast.Import):
            found += [Import(path.stem, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append(Import(path.stem, node.module or "", node.lineno))
        elif isinstance(node, (ast.If, ast.Try)):
            statements += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            statements += [s for handler in getattr(node, "handlers", []) for s in handler.body]
    return found


def test_target_scripts_load_with_the_standard_library_only() -> None:
    """They run inside the target interpreter, where this package is not installed: what they import on
    loading is the standard library; torch, vllm and plugins are imported inside the functions that
    probe them."""
    wrong = []
    for path in (CORE / "target").glob("*.py"):
        wrong += [
            f"{path.name}:{item.line} imports {item.target}"
            for item in _top_level_imports(path)
            if item.target.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
        ]
        wrong += [
            f"{path.name}:{item.line} imports {item.target}"
            for item in _imports(path)
            if "vllm_metax_mcp" in item.target
        ]
    assert not wrong, wrong


def test_every_core_package_names_its_modules() -> None:
    missing = []
    for init in CORE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        named = set(re.findall(r"\b\w+\b", doc))
        missing += [
            f"{init.parent.name}/{m.stem}" for m in init.parent.glob("*.py") if m.stem not in named | {"__init__"}
        ]
    assert not missing, f"not named in their package docstring: {missing}"


def test_no_module_is_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in _sources()}
    assert not {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES}


def test_a_long_function_says_why_in_its_docstring() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and not ast.get_docstring(node):
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long


def test_a_tools_entry_function_stays_short() -> None:
    """A tool's entry (its SPEC.run, whose docstring is the tool description) delegates to core: about
    40 lines of body at most, the docstring not counted."""
    from vllm_metax_mcp.tools import ALL_TOOLS

    long = []
    for spec in ALL_TOOLS:
        node = ast.parse(textwrap.dedent(inspect.getsource(spec.run))).body[0]
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        body = node.body[1:] if ast.get_docstring(node) else node.body
        lines = (body[-1].end_lineno or 0) - body[0].lineno + 1
        if lines > MAX_ENTRY_BODY_LINES:
            long.append(f"{spec.name}: {lines} lines")
    assert not long, long
