"""Scripts that run inside the *target* interpreter (any Python >= 3.8, stdlib only); nothing here imports the server.

- `probe`: versions and import origins (the environment record);
- `op_probe`: which `torch.ops` the installed binaries provide (trace_dependency);
- `nvml_probe`: accelerator occupancy through pymxsml / pynvml, no device context (run_smoke_test);
- `construct`: the HF config `vllm serve` builds (inspect_config);
- `serve_wrapper`: the vLLM server process itself (run_smoke_test);
- `ray_probe`: a Ray cluster's free resources and the end of a run's Ray job (run_smoke_test);
- `extract`: the real-weight copy (trim_model), also imported by the server for its header parser.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def script_path(name: str) -> Path:
    """The file of target script `name` (run by path: it removes its own directory from sys.path)."""
    return HERE / f"{name}.py"


def script_source(name: str) -> str:
    """The source of target script `name`, for running with `python -c`."""
    return script_path(name).read_text(encoding="utf-8")
