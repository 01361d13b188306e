"""Pairing mechanisms the real plugins do not show (issue 20): an `__init__` paired by what it
re-exports, a name-only twin, a registration by class object, a contested subclass.

The upstream is a small synthetic family laid out as vLLM's `vllm/models/<family>/` packages are
(a dispatch `__init__` choosing `nvidia/` or `amd/` by `current_platform.is_rocm()`, a shared
`common/`); the expected pairs follow from the files written here, as the comments say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from workbench import git

from vllm_metax_mcp.tools import diff_model as tool
from vllm_metax_mcp.tools.dispatch import invoke
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv

FAM = "vllm/models/fam"
UPSTREAM = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": "current_platform = None\n",
    "vllm/models/__init__.py": "",
    f"{FAM}/__init__.py": (
        "from vllm.platforms import current_platform\n"
        "if current_platform.is_rocm():\n"
        "    from .amd.model import FamForCausalLM\n"
        "else:\n"
        "    from .nvidia.model import FamForCausalLM\n"
    ),
    f"{FAM}/nvidia/__init__.py": "",
    f"{FAM}/nvidia/model.py": (
        "from vllm.models.fam.common.ops import fam_kernel\n\n\n"
        "class FamBlock:\n    def forward(self, x):\n        return fam_kernel(x)\n\n\n"
        "class FamForCausalLM(FamBlock):\n    def load(self):\n        return 1\n"
    ),
    f"{FAM}/nvidia/ops/__init__.py": "from .fast import fast_kernel\n",
    f"{FAM}/nvidia/ops/fast.py": "def fast_kernel(x):\n    return x * 2\n",
    f"{FAM}/amd/__init__.py": "",
    f"{FAM}/amd/model.py": "class FamForCausalLM:\n    pass\n",
    f"{FAM}/common/__init__.py": "",
    f"{FAM}/common/ops/__init__.py": "from .kern import fam_helper, fam_kernel\n",
    f"{FAM}/common/ops/kern.py": (
        "def fam_kernel(x):\n    y = x + 1\n    z = y * 3\n    return z - 7\n\n\n"
        "def fam_helper(x):\n    return [v for v in x if v]\n"
    ),
    f"{FAM}/common/ops/util.py": "def pad_to(x, n):\n    return x + [0] * (n - len(x))\n",
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": "",
    "vllm/model_executor/models/registry.py": (
        '_MODELS = {\n    "FamForCausalLM": ("vllm.models.fam", "FamForCausalLM"),\n}\n'
    ),
}
PLUGIN = {
    "vllm_x/__init__.py": "",
    "vllm_x/models/__init__.py": (
        "from vllm import ModelRegistry\n\nfrom vllm_x.models.fam.model import XFamForCausalLM\n\n\n"
        "def register():\n    ModelRegistry.register_model(model_arch='FamForCausalLM', model_cls=XFamForCausalLM)\n"
    ),
    "vllm_x/models/fam/__init__.py": "",
    "vllm_x/models/fam/model.py": (
        "from vllm_x.models.fam.ops import fam_kernel\n\n\n"
        "class XFamBlock:\n    def forward(self, x):\n        return fam_kernel(x) + 0\n\n\n"
        "class XFamForCausalLM(XFamBlock):\n    def load(self):\n        return 1\n"
    ),
    "vllm_x/models/fam/ops/__init__.py": "from .kern import fam_helper, fam_kernel\n",
    "vllm_x/models/fam/ops/kern.py": (
        "def fam_kernel(x):\n    y = x + 1\n    z = y * 3\n    return z - 8\n\n\n"
        "def fam_helper(x):\n    return [v for v in x if v]\n"
    ),
    # Same base name as common/ops/util.py, none of its names: the kernel file's code instead.
    "vllm_x/models/fam/util.py": (
        "def fam_kernel_v2(x):\n    y = x + 1\n    z = y * 3\n    return z - 7\n\n\n"
        "def fam_helper_v2(x):\n    return [v for v in x if v]\n"
    ),
}


def _write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


OLD_RELEASE = {
    **UPSTREAM,
    "vllm/model_executor/models/fam_old.py": (
        "class FamBlock:\n    pass\n\n\nclass FamForCausalLM(FamBlock):\n    pass\n"
    ),
    "vllm/model_executor/models/registry.py": (
        '_MODELS = {\n    "FamForCausalLM": ("fam_old", "FamForCausalLM"),\n}\n'
    ),
}
"""An older release whose registry maps the architecture to a flat model file instead of the family."""


TWIN = "vllm_x/models/fam/util.py"


def _pairs(tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "root"
    repo, upstream, old = root / "plugin", root / "upstream", root / "old"
    _write(upstream, UPSTREAM)
    _write(old, OLD_RELEASE)
    # fam/util.py starts as fam/pad.py; a later plugin commit renames it: the twin's origin
    _write(repo, {TWIN.replace("util.py", "pad.py") if path == TWIN else path: text for path, text in PLUGIN.items()})
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "plugin")
    git(repo, "mv", TWIN.replace("util.py", "pad.py"), TWIN)
    git(repo, "commit", "-qm", "pad helpers become util")
    runtime = Runtime.create([str(root)], mode="review", state_dir=str(tmp_path / "state"))
    env = ToolEnv(runtime=runtime, tool="diff_model")
    arguments = {
        "upstream": str(upstream),
        "plugin_repo": str(repo),
        "paths": ["vllm_x/models/"],
        "releases": [str(old), str(upstream)],
        "limit": 50,
    }
    result = anyio.run(lambda: invoke(tool.SPEC, arguments, env))
    return {p.local: p for p in result.pairs}


def test_pairing_mechanisms_beyond_the_real_plugins(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path)

    # vllm_x/models/__init__.py registers FamForCausalLM (by keyword) with the class object XFamForCausalLM,
    # imported from vllm_x.models.fam.model; upstream's registry maps the arch to vllm.models.fam, whose dispatch
    # imports it from .nvidia.model on the out-of-tree branch and from .amd.model under is_rocm().
    model = pairs["vllm_x/models/fam/model.py"]
    assert (model.upstream, model.rule) == (f"{FAM}/nvidia/model.py", "registry")
    # At the older release the registry maps the same architecture to model_executor/models/fam_old.py.
    others = {a.upstream: a.reason for a in model.alternatives}
    assert set(others) == {f"{FAM}/amd/model.py", "vllm/model_executor/models/fam_old.py"}
    assert others["vllm/model_executor/models/fam_old.py"].startswith("the counterpart at release ")

    # ops/__init__.py re-exports fam_kernel and fam_helper from .kern, paired with common/ops/kern.py (the only
    # kern.py, its one member: too few to decide the package); common/ops/__init__.py re-exports the same names.
    # The flattened path alone would say the platform branch's nvidia/ops/__init__.py, kept as the alternative.
    init = pairs["vllm_x/models/fam/ops/__init__.py"]
    assert (init.upstream, init.rule) == (f"{FAM}/common/ops/__init__.py", "package")
    assert f"{FAM}/nvidia/ops/__init__.py" in {a.upstream for a in init.alternatives}

    # fam/util.py has the same base name as common/ops/util.py but none of its names (pad_to): a name-only
    # twin. Its content is common/ops/kern.py's, shown as the better content match, never chosen.
    twin = pairs["vllm_x/models/fam/util.py"]
    assert twin.upstream == f"{FAM}/common/ops/util.py" and "name_only" in twin.flags
    # its origin: the plugin commit that renamed fam/pad.py to it (_pairs), as commit evidence
    notes = [e.text for e in twin.evidence if e.kind == "note" and "name-only twin" in e.text]
    assert notes and "('pad helpers become util')" in notes[0] and "from vllm_x/models/fam/pad.py" in notes[0]
    assert any(e.kind == "commit" for e in twin.evidence)
    assert f"{FAM}/common/ops/kern.py" in {c.upstream for c in twin.candidates}
