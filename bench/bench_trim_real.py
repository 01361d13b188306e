"""Real-weight trim of a multi-GB synthetic checkpoint, beside a raw copy of the same bytes in the same run.

Run: `python -m bench.bench_trim_real [GIB]` (default 3). The checkpoint has 8 layers of one large
BF16 tensor each plus an embedding and a head; the trim keeps layers 0-3 (about 60% of the bytes).
The reference copies the retained bytes as plain files with `shutil.copyfile` (the kernel's copy
path). The trim job runs in a child process so its peak RSS (and its extract.py run's) is measured.
Prints throughput of the copy phase alone and of the whole job (hashing the source, the shipped
extract.py's copy and its sha256 check of every file) as ratios to the raw copy, and to a raw copy
fsynced as the trim's output is, and peak RSS against one shard. Targets: copy >= 0.8 of the raw
copy, whole job >= 0.4, peak memory well under one shard.
Nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.table import BenchRow, at_least, only, run_alone
from vllm_metax_mcp.core.foundation.jobs import JobHandle
from vllm_metax_mcp.core.trim.real import RealTrimJob
from vllm_metax_mcp.tools.spec import Runtime, ToolEnv
from vllm_metax_mcp.tools.trim_model import TrimModelInput, trim_model

LAYERS = 8
KEPT = [0, 1, 2, 3]
CHILD = r"""
import json, re, sys, time
from pydantic import TypeAdapter
from vllm_metax_mcp.core.trim.real import RealTrimJob, run_job

class Phases:
    # a phase starts with a report naming it; the reports within it end in ': N of M bytes'
    def __init__(self):
        self.starts = []
    def report(self, done, total=None, message=None):
        if message and not re.search(r": \d+ of \d+ bytes$", message):
            self.starts.append((message, time.perf_counter()))

job = TypeAdapter(RealTrimJob).validate_json(open(sys.argv[1]).read())
phases = Phases()
start = time.perf_counter()
run_job(job, phases)
end = time.perf_counter()
marks = phases.starts + [("end", end)]
durations = {marks[i][0]: marks[i + 1][1] - marks[i][1] for i in range(len(marks) - 1)}
print(json.dumps({"total": end - start, "phases": durations}))
"""


def write_checkpoint(directory: Path, gib: float) -> tuple[int, int]:
    """config.json, index and two shards; returns (retained bytes, largest shard bytes)."""
    directory.mkdir(parents=True)
    unit = int(gib * (1 << 30)) // (LAYERS + 2)
    cols = 4096
    rows = unit // (2 * cols)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": LAYERS,
        "hidden_size": cols,
        "vocab_size": rows,
        "num_attention_heads": 32,
        "intermediate_size": rows,
    }
    (directory / "config.json").write_text(json.dumps(config))
    names = [
        "model.embed_tokens.weight",
        *(f"model.layers.{i}.mlp.down_proj.weight" for i in range(LAYERS)),
        "lm_head.weight",
    ]
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    size = rows * cols * 2
    block = os.urandom(1 << 24)
    for shard, members in shards.items():
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        for number, name in enumerate(members):
            header[name] = {
                "dtype": "BF16",
                "shape": [rows, cols],
                "data_offsets": [number * size, (number + 1) * size],
            }
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(directory / shard, "wb") as handle:
            handle.write(len(raw).to_bytes(8, "little") + raw)
            for _ in members:
                left = size
                while left:
                    chunk = block[: min(left, len(block))]
                    handle.write(chunk)
                    left -= len(chunk)
    weight_map = {name: shard for shard, members in shards.items() for name in members}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    kept = sum(1 for n in names if not n.startswith("model.layers.") or int(n.split(".")[2]) in KEPT)
    return kept * size, max((directory / s).stat().st_size for s in shards)


def raw_copy(source: Path, target: Path, nbytes: int, durable: bool = False) -> float:
    """Copy whole shards until nbytes are copied (the same amount the trim writes); seconds. durable: each
    copy fsynced, as the trim's output is before it is renamed into place."""
    target.mkdir()
    start = time.perf_counter()
    copied = 0
    for shard in sorted(source.glob("*.safetensors")):
        if copied >= nbytes:
            break
        shutil.copyfile(shard, target / shard.name)
        if durable:
            fd = os.open(target / shard.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        copied += shard.stat().st_size
    elapsed = time.perf_counter() - start
    return elapsed * nbytes / copied


class _Captured:
    """A job table that keeps the payload instead of starting a worker: the bench runs the job itself."""

    def __init__(self) -> None:
        self.payload: RealTrimJob | None = None

    def start(self, tool: str, target: str, payload: RealTrimJob, scratch: Any = None) -> JobHandle:
        self.payload = payload
        return JobHandle("j-0000000000000000")


def trim_in_child(root: Path) -> tuple[dict, int]:
    """The tool's own call (every check, the payload) with the job run in a child process, as a worker would."""
    args = TrimModelInput(model="source", output="trimmed", output_mode="real", layers=KEPT)
    runtime = Runtime.create([str(root)], state_dir=str(root / ".state"))
    captured = _Captured()
    runtime.jobs = captured  # type: ignore[assignment]
    trim_model(args, ToolEnv(runtime=runtime, tool="trim_model"))
    assert captured.payload is not None
    job_path = root / "job.json"
    job_path.write_bytes(TypeAdapter(RealTrimJob).dump_json(captured.payload))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(job_path)], capture_output=True, text=True, check=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return json.loads(proc.stdout.strip().splitlines()[-1]), peak_kib * 1024


def rows(gib: float = 3.0) -> list[BenchRow]:
    with tempfile.TemporaryDirectory(prefix="bench-trim-", dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        retained, shard_bytes = write_checkpoint(root / "source", gib)
        os.sync()  # each measurement starts with nothing dirty: no copy pays for the writeback of the one before
        reference = raw_copy(root / "source", root / "raw", retained)
        shutil.rmtree(root / "raw")
        os.sync()
        result, peak = trim_in_child(root)
        os.sync()
        reference = min(reference, raw_copy(root / "source", root / "raw2", retained))
        os.sync()
        durable = raw_copy(root / "source", root / "raw3", retained, durable=True)
        phases = result["phases"]
        copy_s = phases["extract.py: copying tensor bytes"]
        gbps = lambda s: retained / s / 1e9  # noqa: E731
        print(
            f"checkpoint {gib:.1f} GiB, retained {retained / 2**30:.2f} GiB, "
            f"largest shard {shard_bytes / 2**30:.2f} GiB"
        )
        print(f"raw copy (shutil.copyfile)       {reference:7.2f} s  {gbps(reference):6.2f} GB/s")
        print(f"raw copy + fsync (durable)       {durable:7.2f} s  {gbps(durable):6.2f} GB/s")
        print(
            f"trim: copy phase                 {copy_s:7.2f} s  {gbps(copy_s):6.2f} GB/s  "
            f"ratio {reference / copy_s:.2f} (target >= 0.8), {durable / copy_s:.2f} to the durable copy"
        )
        total = result["total"]
        print(
            f"trim: whole job                  {total:7.2f} s  {gbps(total):6.2f} GB/s  ratio {reference / total:.2f} "
            f"(target >= 0.4), {durable / total:.2f} to the durable copy"
        )
        for phase, seconds in phases.items():
            print(f"   {phase:<45} {seconds:7.2f} s")
        print(f"peak RSS of the job and extract.py: {peak / 2**20:.0f} MiB = {peak / shard_bytes:.3f} of one shard")
    raw, fsynced = "raw copy", "raw copy + fsync"
    return [
        BenchRow("trim real: copy phase (throughput)", gbps(copy_s), gbps(reference), raw, at_least(0.8), "GB/s"),
        BenchRow("trim real: copy phase, to the durable copy", gbps(copy_s), gbps(durable), fsynced, unit="GB/s"),
        BenchRow("trim real: whole job (throughput)", gbps(total), gbps(reference), raw, at_least(0.4), "GB/s"),
        BenchRow("trim real: whole job, to the durable copy", gbps(total), gbps(durable), fsynced, unit="GB/s"),
        BenchRow("trim real: peak RSS", peak / 2**20, shard_bytes / 2**20, "one shard", only("well under 1x"), "MiB"),
    ]


def main() -> None:
    run_alone(lambda: rows(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0))


if __name__ == "__main__":
    main()
