"""The module index's scanner and record cache, on small trees written here (no downloads).

The scanner is checked against plain `ast` definitions of what it records (names loaded,
`torch.ops` uses in `ast.walk` order, signatures as `ast.unparse` writes them), so its fast
paths stay exact on whatever Python runs the tests.
"""

from __future__ import annotations

import ast
import hashlib
import os
import textwrap
import time
from pathlib import Path
from typing import Any

from vllm_metax_mcp.core.code.blob_store import MAX_BUNDLES
from vllm_metax_mcp.core.code.dispatch import walk_nodes
from vllm_metax_mcp.core.code.module_index import (
    ModuleIndex,
    ModuleRecord,
    RecordCache,
    scan_source,
)
from vllm_metax_mcp.core.foundation.state import StateStore
from vllm_metax_mcp.core.sources.subjects import DirectorySubject

SAMPLE = textwrap.dedent(
    '''
    """Module docstring with import os inside it."""
    from __future__ import annotations
    import os, sys as system
    from . import sibling
    from ..pkg.mod import (a as b, c)
    from typing import TYPE_CHECKING

    if TYPE_CHECKING:
        from torch import Tensor
    if current_platform.is_rocm():
        from .amd import kernel
    elif envs.VLLM_FLAG:
        from .flag import kernel
    else:
        from .generic import kernel
    try:
        import triton
    except (ImportError, ModuleNotFoundError):
        triton = None
    try:
        value = compute()
    except ValueError:
        import fallback
    with open("x") as handle:
        import inside_with
    match command:
        case "go":
            import inside_match

    __all__ = ["Model", "helper"]
    text = "import not_an_import"  # import in a comment

    @torch.compile(dynamic=True)
    def helper(x: torch.Tensor, /, y: int | None = None, *args: str, flag: bool = True, \
**kw: dict[str, list[int]]) -> tuple[int, ...]:
        """Docstring."""
        import lazy_one
        total = torch.ops._C.rms_norm(x) + torch.ops.vllm.custom(y)
        return [v for v in gen()] if (n := len(args)) else {k: w for k, w in kw.items()}

    async def odd(a=(1,), b=-1, c=1.5, d=1e999, e=lambda q: q, f=b"\\x00", g=..., \
*, h=[x for x in range(3)]) -> "Forward":
        global counter
        await thing(*a, **{"k": b}, items=[v async for v in agen()])
        print(f"{a!r:>{b}} {torch.ops.other.op}")

    class Model(nn.Module, Generic[T], metaclass=Meta):
        """Class docstring."""

        size: int = 4
        NAMES = ("a",)

        @triton.jit
        def forward(self, x, *, scale: float = 1.0):
            # a comment line
            return layer(x)[::2, ...] * scale

        @property
        def forward(self):
            return torch.ops._C.rms_norm

        def guarded(self):
            if platform.is_cuda():
                from .cuda import fast
            try:
                import optional
            except Exception:
                pass

    if current_platform.is_cuda_alike():
        def only_on_cuda():
            pass
        ALIAS = only_on_cuda

    x.attr = 1
    items[key] = value
    counter += 1
    annotated: dict[str, int] = {}
    '''
)

SIGNATURES = textwrap.dedent(
    """
    def a(x: tuple[int,] = (), y: t[()] = -1, *, z: 'q"x' = b'\\x00', w=u'u', v: p | (q | r) = 1.5, u=-n, \
s=[1, [2]], **k: dict[str, list[int | None]]) -> int | None: ...
    def b(p, q=1, /, r=2, *s: int, t, u=3, **v): ...
    def c(*, a): ...
    def d(a, /): ...
    def e(x: Callable[[int, str], None] = ..., y: float = 1e999, z=True, n=None, m=0x10, f=float('nan')) -> 'A': ...
    def f(a: x.y.z[a.b, c] = (1, 2), b: x[1:2] = {1: 2}, c=(), d=(1,), e=lambda: 0, g=a if b else c, \
h=not_a.call()) -> x[...]: ...
    def g(a: 'it''s' = "\\n", b=2 ** 8, c=-(1), d=+1, e=~1, f=1 | 2, g=(*a, 1)) -> None: ...
    """
)


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _expected_uses(node: ast.AST) -> tuple[list[str], list[str]]:
    """The index's definition of names used and torch ops, written with `ast.walk`."""
    names: set[str] = set()
    ops: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            chain = child.value
            if (
                isinstance(chain, ast.Attribute)
                and isinstance(chain.value, ast.Attribute)
                and chain.value.attr == "ops"
                and isinstance(chain.value.value, ast.Name)
                and chain.value.value.id == "torch"
                and f"{chain.attr}.{child.attr}" not in ops
            ):
                ops.append(f"{chain.attr}.{child.attr}")
    return sorted(names), ops


def _snapshot(record: ModuleRecord) -> dict[str, Any]:
    return {
        "imports": record.imports,
        "definitions": record.definitions,
        "names_used": record.names_used,
        "torch_ops": record.torch_ops,
        "jit_kernels": record.jit_kernels,
        "exports": record.exports,
        "error": record.error,
        "guarded_names": record.guarded_names,
    }


def _write_tree(top: Path, files: dict[str, str]) -> DirectorySubject:
    for path, text in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_text(text)
    return DirectorySubject(top)


def test_imports_carry_guard_and_branch() -> None:
    record = scan_source(SAMPLE.encode())
    found = {(i.module, i.guard, i.branch) for i in record.imports}
    assert ("os", None, "taken") in found and ("sys", None, "taken") in found
    assert ("torch", "TYPE_CHECKING", "not_taken") in found
    assert (".amd", "current_platform.is_rocm()", "not_taken") in found
    assert (".flag", "not (current_platform.is_rocm()) and envs.VLLM_FLAG", "conditional") in found
    assert (".generic", "not (current_platform.is_rocm()) and not (envs.VLLM_FLAG)", "conditional") in found
    assert ("triton", "try (import may fail)", "conditional") in found
    assert ("fallback", None, "taken") in found  # `except ValueError` is no import guard
    assert ("inside_with", None, "taken") in found
    assert ("lazy_one", None, "lazy") in found
    assert (".cuda", "platform.is_cuda()", "lazy") in found and ("optional", "try (import may fail)", "lazy") in found
    assert not any(i.module in ("not_an_import", "inside_match") for i in record.imports)
    relative = next(i for i in record.imports if i.module == "..pkg.mod")
    assert relative.names == [["a", "b"], ["c", "c"]] and relative.line == 6
    system = next(i for i in record.imports if i.module == "sys")
    assert system.alias == "system" and system.names == []


def test_platform_answers_change_the_branch() -> None:
    record = scan_source(SAMPLE.encode(), {"is_rocm": True})
    assert next(i.branch for i in record.imports if i.module == ".amd") == "taken"
    assert next(i.branch for i in record.imports if i.module == ".flag") == "not_taken"


def test_definitions_match_their_ast() -> None:
    tree = ast.parse(SAMPLE)
    record = scan_source(SAMPLE.encode())
    names = [d.name for d in record.definitions]
    assert names[:5] == ["__all__", "text", "helper", "odd", "Model"] and names[-2:] == ["counter", "annotated"]
    by_node = {d.name: d for d in record.definitions}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names, _ = _expected_uses(node)
            assert by_node[node.name].names_used == names
            assert (by_node[node.name].line, by_node[node.name].end_line) == (node.lineno, node.end_lineno)
    model = record.definition("Model")
    assert model is not None and model.kind == "class"
    assert model.bases == ["nn.Module", "Generic[T]"]
    assert list(model.members) == ["forward", "guarded"]
    assert model.member_signatures["forward"] == "(self)"  # the later definition of a name wins
    assert record.jit_kernels == ["helper @torch.compile", "forward @triton.jit"]
    assert record.exports == ["Model", "helper"]
    assert record.guarded_names == ["ALIAS", "only_on_cuda", "triton", "value"]


def test_module_uses_and_torch_ops_follow_ast_walk() -> None:
    tree = ast.parse(SAMPLE)
    record = scan_source(SAMPLE.encode())
    names: set[str] = set()
    ops: list[str] = []
    for statement in tree.body:
        found, statement_ops = _expected_uses(statement)
        names.update(found)
        ops += [op for op in statement_ops if op not in ops]
    assert record.names_used == sorted(names)
    assert record.torch_ops == ops == ["_C.rms_norm", "vllm.custom", "other.op"]


def test_signatures_are_written_as_ast_unparse_writes_them() -> None:
    record = scan_source(SIGNATURES.encode())
    for node, definition in zip(_functions(ast.parse(SIGNATURES)), record.definitions, strict=True):
        expected = f"({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else "")
        assert definition.signature == expected, node.name
    sample = scan_source(SAMPLE.encode())
    for node in _functions(ast.parse(SAMPLE)):
        definition = sample.definition(node.name)
        assert definition is not None
        assert definition.signature == f"({ast.unparse(node.args)})" + (
            f" -> {ast.unparse(node.returns)}" if node.returns else ""
        )


def test_body_hash_ignores_docstrings_comments_and_blank_lines() -> None:
    before = "def f(x):\n    '''Doc.'''\n    return x + 1\n\nclass C:\n    a = 1\n    def m(self):\n        return 1\n"
    after = (
        "def f(x):\n    # a note\n\n    return x + 1   \n\nclass C:\n    a = 1\n    def m(self):\n        return 2\n"
    )
    old, new = scan_source(before.encode()), scan_source(after.encode())
    assert old.definitions[0].body_hash == new.definitions[0].body_hash
    assert old.definitions[1].own_hash == new.definitions[1].own_hash  # only a method changed
    assert old.definitions[1].members["m"] != new.definitions[1].members["m"]
    assert old.definitions[1].body_hash != new.definitions[1].body_hash
    digest = hashlib.sha1(b"def f(x):\n    return x + 1\n").hexdigest()[:16]
    assert old.definitions[0].body_hash == digest


def test_malformed_source_is_a_record_error() -> None:
    record = scan_source(b"def broken(:\n")
    assert record.error and "line 1" in record.error
    assert record.imports == [] and record.definitions == [] and record.exports is None


def _plain_tree(top: Path, count: int) -> dict[str, str]:
    files = {"pkg/__init__.py": "from .mod0 import Thing as Thing\n"}
    for number in range(count):
        files[f"pkg/mod{number}.py"] = (
            f"import os\nfrom . import mod{(number + 1) % count}\n\n"
            f"class Thing{number}(Base):\n    def run(self, n: int = {number}) -> int:\n        return n\n"
        )
    files["pkg/mod0.py"] += "class Thing:\n    pass\n"
    files["pkg/bad.py"] = "def broken(:\n"
    return files


def test_cache_serves_a_tree_again_without_parsing(tmp_path: Path) -> None:
    subject = _write_tree(tmp_path / "tree", _plain_tree(tmp_path, 80))
    store = StateStore(tmp_path / "state")
    paths = subject.list("pkg/")
    cold = RecordCache(store)
    first = cold.get_many(subject, paths, workers=2)
    assert cold.misses == len(paths) and cold.hits == 0
    serial = RecordCache(StateStore(tmp_path / "serial")).get_many(subject, paths, workers=1)
    warm = RecordCache(store)
    again = warm.get_many(subject, paths)
    assert warm.misses == 0 and warm.hits == len(paths)
    for path in paths:
        assert _snapshot(again[path]) == _snapshot(first[path]) == _snapshot(serial[path])
        assert _snapshot(again[path]) == _snapshot(scan_source(subject.read(path)))
    assert again["pkg/bad.py"].error


def test_a_changed_tree_parses_only_what_changed(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    subject = _write_tree(top, _plain_tree(tmp_path, 80))
    store = StateStore(tmp_path / "state")
    RecordCache(store).get_many(subject, subject.list("pkg/"))
    (top / "pkg/mod3.py").write_text("import json\n")
    changed = DirectorySubject(top)
    cache = RecordCache(store)
    records = cache.get_many(changed, changed.list("pkg/"))
    assert cache.misses == 1 and [i.module for i in records["pkg/mod3.py"].imports] == ["json"]
    single = RecordCache(store)
    assert [i.module for i in single.get_many(changed, ["pkg/mod3.py"])["pkg/mod3.py"].imports] == ["json"]
    assert single.misses == 0


def test_damaged_cache_files_are_misses(tmp_path: Path) -> None:
    subject = _write_tree(tmp_path / "tree", _plain_tree(tmp_path, 70))
    store = StateStore(tmp_path / "state")
    paths = subject.list("pkg/")
    expected = {p: _snapshot(r) for p, r in RecordCache(store).get_many(subject, paths).items()}
    root = RecordCache(store).blobs.root
    for shard in sorted((root / "blobs").iterdir())[:20]:
        data = shard.read_bytes()
        shard.write_bytes(data[: len(data) // 2] + b"\xff")  # cut mid-line, as a crash would
    cache = RecordCache(store)
    records = cache.get_many(subject, paths)
    assert 0 < cache.misses < len(paths)
    assert {p: _snapshot(r) for p, r in records.items()} == expected
    healed = RecordCache(store)
    healed.get_many(subject, paths)
    assert healed.misses == 0


def test_index_resolves_relative_imports_and_re_exports(tmp_path: Path) -> None:
    subject = _write_tree(tmp_path / "tree", _plain_tree(tmp_path, 3))
    index = ModuleIndex()
    index.add_tree("upstream", subject, RecordCache(StateStore(tmp_path / "state")), ["pkg/"])
    assert set(index.modules) == {"pkg", "pkg.mod0", "pkg.mod1", "pkg.mod2", "pkg.bad"}
    package = index.get("pkg")
    assert package is not None and package.is_package
    assert package.absolute(package.record.imports[0].module) == "pkg.mod0"
    assert index.resolve_symbol("pkg", "Thing") == ("pkg.mod0", "Thing")
    assert index.resolve_symbol("pkg", "mod1") == ("pkg.mod1", None)


def _outline_rows(cache: RecordCache, subject: DirectorySubject) -> dict[str, Any]:
    shas = {path: subject.sha(path) for path in subject.list("pkg/")}
    return {p: (o.definitions, o.imports, o.exact) for p, o in cache.outlines(subject, shas).items()}


def test_only_the_most_recently_used_outline_bundles_are_kept(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    subject = _write_tree(top, _plain_tree(tmp_path, 70))
    store = StateStore(tmp_path / "state")
    first = RecordCache(store)
    expected, original_bytes = _outline_rows(first, subject), (top / "pkg/mod3.py").read_bytes()
    bundles = first.outline_blobs.root / "trees"
    [original] = list(bundles.iterdir())
    for version in range(MAX_BUNDLES + 2):
        (top / "pkg/mod3.py").write_text(f"import json  # version {version}\n")
        _outline_rows(RecordCache(store), DirectorySubject(top))
        if version == 3:
            os.utime(original, (time.time() + 60, time.time() + 60))  # the original tree is read again meanwhile
    kept = list(bundles.iterdir())
    assert len(kept) == MAX_BUNDLES and original in kept
    (top / "pkg/mod3.py").write_text("import json  # version 0\n")
    pruned = _outline_rows(RecordCache(store), DirectorySubject(top))
    assert pruned["pkg/mod3.py"][1][0].module == "json", "a pruned bundle's outlines still come from the shards"
    (top / "pkg/mod3.py").write_bytes(original_bytes)
    assert _outline_rows(RecordCache(store), DirectorySubject(top)) == expected


def test_an_index_parses_only_the_modules_a_call_reads(tmp_path: Path) -> None:
    subject = _write_tree(tmp_path / "tree", _plain_tree(tmp_path, 80))
    cache = RecordCache(StateStore(tmp_path / "state"))
    index = ModuleIndex()
    index.add_tree("upstream", subject, cache, ["pkg/"])
    assert cache.misses == 0 and len(index.modules) == 82
    module = index.get("pkg.mod7")
    assert module is not None and [d.name for d in module.record.definitions] == ["Thing7"]
    assert cache.misses == 1
    outlines = index.outlines("upstream")
    assert cache.misses == 1 and set(outlines) == set(index.modules)
    assert [(d.name, d.kind, d.base_tails) for d in outlines["pkg.mod7"].definitions] == [
        ("Thing7", "class", ("Base",))
    ]
    index.load(index.modules.values())
    assert cache.misses == 82, "the other 81 are parsed in one batch; the one already read is not parsed again"
    plugin = ModuleIndex()
    plugin_cache = RecordCache(StateStore(tmp_path / "plugin-state"))
    plugin.add_tree("plugin", subject, plugin_cache, ["pkg/"])
    assert plugin_cache.misses == 82, "a plugin's records are read when added (its parse errors are reported)"


def test_walk_nodes_visits_what_ast_walk_visits_in_its_order() -> None:
    tree = ast.parse(SAMPLE)
    assert [id(n) for n in walk_nodes(tree)] == [id(n) for n in ast.walk(tree)]
