"""The outline (`core/code/outline.py`, no `ast`) against `ast` itself.

The whole-tree pass of the module index reads outlines instead of parsing every file, so the
outline has to say what `ast` says: every top-level class and function (name, kind, line of the
`def`/`class` keyword, the last dotted part of each base before any subscript) and every import
statement anywhere in the file (module as written, names, line). The slow tests check that on every
file of real vLLM releases and of the real vendor plugins; the fast ones on the shapes that make a
line-based pass go wrong (docstrings holding code, statements split over lines or joined by `;`).
"""

from __future__ import annotations

import ast
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_real_plugins import shared_plugins

from vllm_metax_mcp.core.code.module_index import ModuleIndex, RecordCache
from vllm_metax_mcp.core.code.outline import outline
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject


def by_ast(source: bytes) -> tuple[list[Any], list[Any]]:
    tree = ast.parse(source)
    definitions = [
        (
            node.name,
            "class" if isinstance(node, ast.ClassDef) else "function",
            node.lineno,
            tuple(ast.unparse(b).split("[")[0].rpartition(".")[2] for b in node.bases)
            if isinstance(node, ast.ClassDef)
            else (),
        )
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    imports: list[Any] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports += [(alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append(("." * node.level + (node.module or ""), tuple(a.name for a in node.names), node.lineno))
    return definitions, sorted(imports)


def by_outline(source: bytes) -> tuple[list[Any], list[Any]]:
    found = outline(source)
    assert found.exact
    definitions = [(d.name, d.kind, d.line, d.base_tails) for d in found.definitions]
    return definitions, sorted((i.module, i.names, i.line) for i in found.imports)


TRICKY = textwrap.dedent(
    '''
    """Module docstring.

    class NotAClass(Base):
    def not_a_function():
    import not_an_import
    from not_a import module
    """
    from __future__ import annotations
    import os, sys as system; import json
    from . import sibling
    from ..pkg.mod import (a as b,  # a comment (with a bracket
        c)
    from x \\
        import y
    TEXT = \'\'\'
    def inside_single_quoted_block(): """not closing anything"""
    \'\'\'

    @decorator(
        "with (brackets"
    )
    class Model(nn.Module, Generic[T], metaclass=Meta):  # trailing comment
        import inside_class

        def method(self):
            from .lazy import thing
            return thing


    class Split(
        base.Left,  # comment with a , comma
        typing.Mapping[str, int],
    ):
        pass


    async def fetch():
        import asyncio


    def  spaced  ():
        pass
    if condition:
        import guarded
    '''
).encode()


def test_the_outline_says_what_ast_says_on_the_shapes_that_mislead_a_line_scan() -> None:
    assert by_outline(TRICKY) == by_ast(TRICKY)
    definitions, imports = by_outline(TRICKY)
    assert [d[0] for d in definitions] == ["Model", "Split", "fetch", "spaced"]
    assert definitions[0][3] == ("Module", "Generic") and definitions[1][3] == ("Left", "Mapping")
    assert ("..pkg.mod", ("a", "c"), 12) in imports and ("x", ("y",), 14) in imports


def test_a_file_the_outline_cannot_vouch_for_is_read_from_its_record(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": b"",
        "pkg/open.py": b'x = """never closed\nclass Inside:\n    pass\n',
        "pkg/latin.py": "class Caf\u00e9Base:\n    pass\n# \xe9\n".encode("latin-1"),
        "pkg/plain.py": b"class Plain(Base):\n    pass\n",
    }
    for path, data in files.items():
        (tmp_path / "tree" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / path).write_bytes(data)
    assert not outline(files["pkg/open.py"]).exact and not outline(files["pkg/latin.py"]).exact
    index = ModuleIndex()
    cache = RecordCache(StateStore(tmp_path / "state"))
    index.add_tree("upstream", DirectorySubject(tmp_path / "tree"), cache, ["pkg/"])
    outlines = index.outlines("upstream")
    assert cache.misses == 2, "only the two files the outline cannot vouch for are parsed"
    assert [d.name for d in outlines["pkg.open"].definitions] == [] and outlines["pkg.open"].exact
    assert [(d.name, d.base_tails) for d in outlines["pkg.plain"].definitions] == [("Plain", ("Base",))]


def _release_sources(tree: Path) -> list[tuple[str, bytes]]:
    return [(p.relative_to(tree).as_posix(), p.read_bytes()) for p in sorted(tree.glob("vllm/**/*.py"))]


def _plugin_sources() -> list[tuple[str, bytes]]:
    root = shared_plugins()
    if root is None:
        pytest.skip("the real plugin snapshots (shared/fixtures/plugins/) are not beside this checkout")
    found = []
    for archive in sorted(root.glob("*.tar.gz")):
        with tarfile.open(archive) as opened:
            for member in opened.getmembers():
                handle = opened.extractfile(member) if member.isfile() and member.name.endswith(".py") else None
                if handle is not None:
                    found.append((f"{archive.name}:{member.name}", handle.read()))
    return found


def _differences(sources: list[tuple[str, bytes]]) -> list[str]:
    differing = []
    for name, source in sources:
        try:
            expected = by_ast(source)
        except SyntaxError:
            continue
        found = outline(source)
        if found.exact and by_outline(source) != expected:
            differing.append(name)
    return differing


@pytest.mark.slow
@pytest.mark.parametrize("release", ["upstream_092", "upstream_026", "upstream_033"])
def test_every_file_of_a_real_release_outlines_as_ast_reads_it(release: str, request: pytest.FixtureRequest) -> None:
    sources = _release_sources(request.getfixturevalue(release))
    assert len(sources) > 500
    assert _differences(sources) == []
    assert sum(not outline(source).exact for _, source in sources) <= 2, "inexact files are parsed instead"


def test_every_file_of_the_real_vendor_plugins_outlines_as_ast_reads_it() -> None:
    sources = _plugin_sources()
    assert len(sources) > 300
    assert _differences(sources) == []
