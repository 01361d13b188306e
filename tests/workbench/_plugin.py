"""A small but real vLLM-MetaX-like plugin repository built from upstream files.

The MCP tools compare plugin model files with their upstream origin, so the fixture
repo copies *real* upstream files and applies a visible MACA-style edit (imports
redirected to the plugin's own overrides plus a ``# MetaX:`` marked change), the same
shape of divergence the real plugin has.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

from ._git import deterministic_commit, git

PLUGIN_AUTHOR = "MetaX Developer <dev@metax.invalid>"
METAX_MARK = "# MetaX:"
#: The block the default edit inserts after the module's imports.
METAX_BLOCK = (
    "# MetaX: MACA GPUs keep the BF16 path for this model; the FP8 kernels used\n"
    "# MetaX: upstream are not available on MetaX hardware.\n"
    "MACA_KEEP_BF16: bool = True\n"
)

Edit = Callable[[str, str], str]
"""``edit(local_path, upstream_text) -> plugin_text``."""


def module_name(path: str) -> str:
    """Dotted module of a repo-relative ``.py`` path (``pkg/__init__.py`` -> ``pkg``)."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _insertion_line(source: str) -> int:
    """0-based line index after the last top-level import (or docstring/comments)."""
    lines = source.splitlines(keepends=True)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    if tree is not None:
        imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        if imports:
            return max(n.end_lineno or n.lineno for n in imports)
        body = tree.body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            return body[0].end_lineno or body[0].lineno
    index = 0
    while index < len(lines) and lines[index].lstrip().startswith("#"):
        index += 1
    return index


def maca_edit(overrides: Mapping[str, str]) -> Edit:
    """Build the default MACA edit for a plugin that overrides ``overrides`` modules.

    ``overrides`` maps upstream module names to plugin module names. The edit rewrites
    ``from <upstream> import`` / ``import <upstream>`` lines for those modules to the
    ``vllm_metax.`` module and inserts :data:`METAX_BLOCK` after the imports, so the
    plugin copy always differs from upstream in a way a reviewer would see.
    """
    ordered = sorted(overrides.items(), key=lambda kv: -len(kv[0]))
    patterns = [
        (re.compile(rf"^(\s*(?:from|import)\s+){re.escape(up)}(?=\s|$|,)", re.M), local) for up, local in ordered
    ]

    def edit(local_path: str, text: str) -> str:
        for pattern, local in patterns:
            text = pattern.sub(lambda m, local=local: m.group(1) + local, text)
        lines = text.splitlines(keepends=True)
        at = _insertion_line(text)
        if at and not lines[at - 1].endswith("\n"):
            lines[at - 1] += "\n"
        return "".join(lines[:at] + ["\n", METAX_BLOCK] + lines[at:])

    return edit


def default_maca_edit(files: Mapping[str, str]) -> Edit:
    """The edit :func:`build_plugin_repo` applies when none is given for ``files``."""
    return maca_edit({module_name(up): module_name(local) for local, up in files.items()})


_PLUGIN_INIT = '''\
"""vLLM-MetaX: the MACA (MetaX GPU) platform plugin for vLLM (workbench copy)."""

import os


def register() -> str | None:
    """``vllm.platform_plugins`` entry point: the platform class when MACA is present."""
    if os.path.exists("/dev/mxcd") or os.environ.get("VLLM_METAX_FORCE_PLATFORM") == "1":
        return "vllm_metax.platform.MacaPlatform"
    return None


def register_model() -> None:
    """``vllm.general_plugins`` entry point: register the plugin's model classes."""
    from vllm_metax.models import register_model as _register

    _register()
'''

_PLATFORM = '''\
"""MACA platform stub; the workbench plugin is never run on MetaX hardware."""


class MacaPlatform:
    device_name = "maca"
    device_type = "cuda"
    dispatch_key = "CUDA"
'''

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm-metax"
version = "0.0.0+workbench"
description = "vLLM platform plugin for MetaX GPUs (MACA), test workbench copy"
requires-python = ">=3.10"

[project.entry-points."vllm.platform_plugins"]
metax = "vllm_metax:register"

[project.entry-points."vllm.general_plugins"]
metax_models = "vllm_metax:register_model"

[tool.setuptools.packages.find]
include = ["vllm_metax*"]
"""

_AGENTS = """\
# AGENTS.md (vLLM-MetaX)

- Model files under `vllm_metax/models/` are copies of upstream vLLM files adapted to
  MACA. Keep them as close to upstream as possible.
- Mark every MetaX-specific change with a `# MetaX:` comment.
- Import plugin overrides from `vllm_metax.`; everything else from upstream `vllm.`.
- Register each model architecture in `vllm_metax/models/__init__.py` with
  `ModelRegistry.register_model("Arch", "vllm_metax.models.<module>:<Class>")`.
"""


def _models_init(registrations: Mapping[str, str]) -> str:
    lines = [
        '"""Model classes the MetaX plugin overrides, registered with vLLM."""',
        "",
        "",
        "def register_model() -> None:",
        "    from vllm import ModelRegistry",
        "",
    ]
    for arch, target in registrations.items():
        lines.append(f"    ModelRegistry.register_model({json.dumps(arch)}, {json.dumps(target)})")
    return "\n".join(lines).rstrip() + "\n"


def build_plugin_repo(
    dest: Path,
    upstream_root: Path,
    files: Mapping[str, str],
    edits: Edit | None = None,
    registrations: Mapping[str, str] | None = None,
) -> Path:
    """Create a vLLM-MetaX-like git repository at ``dest`` and return its path.

    ``files`` maps plugin paths (``vllm_metax/models/deepseek_v4/model.py``) to upstream
    paths under ``upstream_root`` (``vllm/models/deepseek_v4/nvidia/model.py``); each is
    copied and passed through ``edits(local_path, text)`` (default:
    :func:`default_maca_edit`). ``registrations`` maps architecture names to
    ``"vllm_metax.models.x:Class"`` targets for ``vllm_metax/models/__init__.py``.
    The repo gets the plugin entry points, an ``AGENTS.md`` and one initial commit.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty")
    edit = edits or default_maca_edit(files)
    out: dict[str, str] = {
        "vllm_metax/__init__.py": _PLUGIN_INIT,
        "vllm_metax/platform.py": _PLATFORM,
        "vllm_metax/models/__init__.py": _models_init(registrations or {}),
        "pyproject.toml": _PYPROJECT,
        "AGENTS.md": _AGENTS,
    }
    for local, upstream in files.items():
        text = Path(upstream_root).joinpath(*PurePosixPath(upstream).parts).read_text(encoding="utf-8")
        out[local] = edit(local, text)
    for local in list(out):
        parent = PurePosixPath(local).parent
        while parent.parts and parent.parts[0] == "vllm_metax":
            out.setdefault((parent / "__init__.py").as_posix(), "")
            parent = parent.parent
    for rel, text in out.items():
        target = dest.joinpath(*PurePosixPath(rel).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A", "-f")
    deterministic_commit(dest, "Initial vLLM-MetaX plugin", PLUGIN_AUTHOR)
    return dest
