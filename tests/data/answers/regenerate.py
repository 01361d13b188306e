"""Regenerate the answers tests/test_answers_unchanged.py compares with, from the code a run imports.

The stored answers are issue 26's reference: commit aa1a369, the code before the module index became
lazy, made them with (from the checkout root; <worktree> any directory outside the checkout):

    git worktree add --detach <worktree> aa1a369
    PYTHONPATH=<worktree>:<worktree>/tests python tests/data/answers/regenerate.py
    git worktree remove --force <worktree>

PYTHONPATH puts the old tools, test workbench and test helpers first (an editable install of the
checkout would answer otherwise; the run prints where vllm_metax_mcp came from). The scenarios and
the normalization are this checkout's tests/test_answers_unchanged.py. Without PYTHONPATH the
checkout's own code answers: do that only for an intentional change of answers, and say which in
the commit. Scenario names as arguments regenerate only those. meta.json records the commit (and
whether its tree had changes) of the code that answered.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]
COMMAND = "PYTHONPATH=<worktree>:<worktree>/tests python tests/data/answers/regenerate.py (see its docstring)"


def test_module() -> ModuleType:
    """This checkout's test module, whatever tests/ comes first on the path (its helpers come from there)."""
    for shared in (CHECKOUT / "shared", CHECKOUT.parent / "shared"):
        if (shared / "fixtures" / "plugins").is_dir():
            os.environ.setdefault("VLLM_METAX_MCP_SHARED", str(shared))
    sys.path.append(str(CHECKOUT / "tests"))
    path = CHECKOUT / "tests" / "test_answers_unchanged.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def revision(code: Path) -> tuple[str, bool]:
    """The commit the answering code is at, and whether its tools or tests differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(code), *args], capture_output=True, text=True, check=True).stdout

    return git("rev-parse", "HEAD").strip(), bool(git("status", "--porcelain", "--", "vllm_metax_mcp", "tests"))


def main(names: list[str]) -> None:
    import vllm_metax_mcp

    answers = test_module()
    code = Path(vllm_metax_mcp.__file__).resolve().parents[1]
    commit, dirty = revision(code)
    print(f"answering code: {code} at {commit}{' (with changes)' if dirty else ''}")
    meta_path = HERE / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"scenarios": {}}
    for name in names or list(answers.SCENARIOS):
        with tempfile.TemporaryDirectory(prefix="answers-") as scratch:
            base = Path(scratch) / "s"
            base.mkdir()
            written = answers.store(name, answers.SCENARIOS[name](answers.Context(base)))
        meta["scenarios"][name] = {"file": written.name, "commit": commit, "dirty": dirty}
        meta["command"] = COMMAND
        meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")  # after each: a failure keeps the rest
        print(f"{name}: {written.name} ({written.stat().st_size} bytes)")


if __name__ == "__main__":  # the tools' worker processes re-import the main module
    main(sys.argv[1:])
