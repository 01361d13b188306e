"""The real-weight trim: checks that refuse in the call, then the job that copies the retained tensors
as raw bytes, verifies them and proves the shipped script.

The job runs in a worker on the plan the tool checked (`spec`, plain JSON). Everything is written in a
staging directory beside the target and renamed into place only after every tensor was compared
byte for byte with its source, the output's structure was checked against the reduced config,
and the shipped `extract.py` recreated the same files on its own. A failure or a cancellation
(SIGTERM raises Stopped) removes the staging and reproduction directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoint.cross_check import cross_check
from ..checkpoint.layout import analyse
from ..checkpoint.safetensors_headers import CheckpointFiles, Tensor
from ..foundation.atomic import scratch_prefix, staged_directory
from ..foundation.errors import ErrorCode, ToolFailure, bad_input
from ..foundation.jobs import JOB_MARKER_ENV, stop_requested
from ..foundation.policy import Policy, copy_resolved
from ..foundation.state import OutputRegistry, StateStore
from ..sources.git import tracked_below
from ..target import script_source
from ..target.extract import (
    CHUNK_BYTES,
    INDEX_NAME,
    HeaderError,
    close_sources,
    file_sha256,
    index_bytes,
    open_sources,
    parse_header,
    write_shard,
)
from .assets import IMAGE_NAME, tiny_png
from .plan import Plan, Source, keep_submodel_whole
from .weight_map import submodel_prefix

SCRIPT_NAME = "extract.py"
OTHER_WEIGHT_FORMATS = (".bin", ".pt", ".pth", ".gguf", ".ckpt", ".msgpack", ".h5")
PLAN_LINE = "PLAN_JSON = None  # trim_model embeds the plan here (a JSON string) in the extract.py it writes\n"
PROGRESS_EVERY_S = 0.5
REPRODUCE_TIMEOUT_S = 24 * 3600

Item = tuple[str, str, str, str, list[int], int]
"""(target name, source shard, source name, dtype, shape, nbytes): one tensor of an output shard."""


class _Reporter:
    """Progress in bytes per phase, written at most every PROGRESS_EVERY_S (and at each phase start)."""

    def __init__(self, progress: Any, total: int) -> None:
        self.progress = progress
        self.total = total
        self.phase = ""
        self.done = 0
        self.last = 0.0
        self.lock = threading.Lock()

    def start(self, phase: str) -> None:
        with self.lock:
            self.phase, self.done, self.last = phase, 0, time.monotonic()
            self.progress.report(0, self.total, phase)

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.done += nbytes
            now = time.monotonic()
            if now - self.last >= PROGRESS_EVERY_S:
                self.last = now
                self.progress.report(self.done, self.total, f"{self.phase}: {self.done} of {self.total} bytes")


def _failure(message: str) -> ToolFailure:
    return ToolFailure(ErrorCode.FAILED, message)


# -- checks in the call, before the job: nothing is written when one refuses ----------------------


def readable_source(source: Source) -> CheckpointFiles:
    """The source checkpoint is complete and every header parses; refuses with every problem found."""
    files = source.files
    if files is None:
        others = sorted(p.name for p in source.directory.iterdir() if p.suffix in OTHER_WEIGHT_FORMATS)
        found = f" (found {', '.join(others[:3])})" if others else ""
        raise bad_input(
            f"the source holds no safetensors checkpoint{found}: real-weight trims copy safetensors tensors byte for "
            "byte. Convert the checkpoint to safetensors first, or use output_mode=dummy."
        )
    if files.ranks:
        raise bad_input(
            f"the source is pre-partitioned per rank (shard names carry ranks {files.ranks[:8]}): its files are rank "
            "partitions, not storage shards. Trimming it needs re-sharding for the new TP (merging the rank slices), "
            "which this tool does not do; trim a non-partitioned checkpoint."
        )
    problems = [message for severity, _, message in files.problems if severity == "error"]
    if files.missing_shards:
        problems.insert(0, f"shard(s) named by the index are missing: {', '.join(files.missing_shards[:5])}.")
    if problems:
        raise bad_input(
            "the source checkpoint is not readable as a whole, so nothing is written: "
            + " ".join(problems[:5])
            + " Repair or re-download the source, then trim again."
        )
    return files


def submodel_maps(plan: Plan, source: Source, files: CheckpointFiles, prefix: str) -> dict[str, dict[int, int]]:
    """For each submodel trimmed by its own depth, the tensor prefix that holds its layers; a submodel whose
    layers no unique prefix holds is kept whole (its config restored), since its tensors cannot be told apart."""
    maps: dict[str, dict[int, int]] = {}
    for sub in list(plan.submodels):
        if sub.kept == list(range(sub.layers)):
            continue
        found = submodel_prefix(files, prefix, sub.layers)
        if found is None:
            keep_submodel_whole(
                plan,
                source.raw,
                sub.name,
                f"no single tensor prefix holds exactly its {sub.layers} layers, so its tensors cannot be renamed",
            )
            continue
        maps[found] = {old: new for new, old in enumerate(sub.kept)}
    return maps


def refuse_narrowing(plan: Plan) -> None:
    narrowed = [c.field for c in plan.changes if c.reason.startswith("narrowed")]
    if narrowed:
        raise bad_input(
            f"allow_narrowing changed {', '.join(narrowed)}: the retained tensors would no longer match the config. A "
            "real-weight trim copies tensors unchanged; trim by depth only (drop allow_narrowing), or use output_mode=dummy."
        )


def check_disk(target: Path, need: int, quota: int | None) -> None:
    existing = target
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    limit = min(free, quota) if quota is not None else free
    if need > limit:
        where = f"max_disk_bytes {quota}" if limit != free else f"{free} bytes free at the output"
        raise bad_input(
            f"the trim needs {need} bytes (the checkpoint and, while extract.py is proven, its reproduction) but "
            f"{where} allows {limit}; nothing was written. Free space, choose another output root, or keep fewer "
            "layers (plan_trim budgets.disk_bytes_real gives the checkpoint alone).",
        )


# -- writing ---------------------------------------------------------------------------------------


def _write_weights(staging: Path, spec: dict[str, Any], reporter: _Reporter) -> None:
    shards: dict[str, list[Item]] = spec["shards"]
    reporter.start("copying tensor bytes")
    sources = open_sources(spec["source_dir"], sorted(spec["source_paths"]), spec["source_paths"])
    try:
        for shard, items in shards.items():
            write_shard(str(staging / shard), items, sources, reporter.add)
    finally:
        close_sources(sources)
    sized = {shard: [(item[0], item[5]) for item in items] for shard, items in shards.items()}
    (staging / INDEX_NAME).write_bytes(index_bytes(sized))


def _copy_assets(staging: Path, spec: dict[str, Any]) -> None:
    (staging / "config.json").write_text(spec["config"], encoding="utf-8")
    for name, path in spec["assets"].items():
        copy_resolved(path, staging / name)  # checked and resolved in the call; a link swapped in since is refused


# -- verifying -------------------------------------------------------------------------------------


@dataclass
class _Verified:
    tensors: int
    nbytes: int
    sha256: dict[str, str]
    headers: dict[str, dict[str, Tensor]]


def _same_bytes(out_fd: int, out_offset: int, source_fd: int, source_offset: int, length: int, digest: Any) -> bool:
    done = 0
    while done < length:
        size = min(CHUNK_BYTES, length - done)
        written = os.pread(out_fd, size, out_offset + done)
        original = os.pread(source_fd, size, source_offset + done)
        if len(written) != size or written != original:
            return False
        digest.update(written)
        done += size
    return True


def _verify_shard(
    path: Path, items: list[Item], sources: dict[str, Any], reporter: _Reporter
) -> tuple[str, dict[str, Tensor]]:
    """Reopen one output shard: its header must list exactly the planned tensors, and every tensor's bytes
    must equal its source's; returns the whole file's sha256 (computed on the same read)."""
    try:
        header = parse_header(str(path))
    except HeaderError as exc:
        raise _failure(f"the written shard {path.name} does not parse back: {exc}.") from None
    planned = {item[0]: item for item in items}
    if set(header.entries) != set(planned):
        raise _failure(f"the written shard {path.name} lists other tensors than planned.")
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        digest.update(os.pread(fd, header.data_start, 0))
        for name, entry in sorted(header.entries.items(), key=lambda kv: kv[1].begin):
            target, shard, source_name, dtype, shape, nbytes = planned[name]
            if entry.dtype != dtype or list(entry.shape) != list(shape) or entry.end - entry.begin != nbytes:
                raise _failure(
                    f"{target} was written as {entry.dtype} {list(entry.shape)}, its source is {dtype} {shape}."
                )
            source_fd, source_header = sources[shard]
            source_entry = source_header.entries.get(source_name)
            if source_entry is None:
                raise HeaderError(f"{source_name} is no longer in {shard}")
            if not _same_bytes(
                fd,
                header.data_start + entry.begin,
                source_fd,
                source_header.data_start + source_entry.begin,
                nbytes,
                digest,
            ):
                raise _failure(f"the bytes of {target} differ from {source_name} in {shard}.")
            reporter.add(nbytes)
    finally:
        os.close(fd)
    tensors = {n: Tensor(e.dtype, e.shape, path.name, e.end - e.begin, e.begin) for n, e in header.entries.items()}
    return digest.hexdigest(), tensors


def _verify(staging: Path, spec: dict[str, Any], reporter: _Reporter) -> _Verified:
    shards: dict[str, list[Item]] = spec["shards"]
    reporter.start("verifying every tensor against its source")
    sources = open_sources(spec["source_dir"], sorted(spec["source_paths"]), spec["source_paths"])
    pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(shards)))
    try:
        futures = {s: pool.submit(_verify_shard, staging / s, shards[s], sources, reporter) for s in shards}
        results = {shard: future.result() for shard, future in futures.items()}
    except BaseException:
        # a failure or cancellation drops the queued shards; the sources stay open for a shard still being
        # compared (closing them could hand its descriptors to other files) until the worker exits
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    close_sources(sources)
    sha = {shard: digest for shard, (digest, _) in results.items()}
    sha[INDEX_NAME] = file_sha256(staging / INDEX_NAME)
    sha["config.json"] = file_sha256(staging / "config.json")
    sha |= {name: spec["asset_sha256"][name] for name in spec["assets"]}
    for name in spec["assets"]:
        if file_sha256(staging / name) != spec["asset_sha256"][name]:
            raise _failure(f"the copied asset {name} differs from the source's.")
    tensors = sum(len(items) for items in shards.values())
    nbytes = sum(item[5] for items in shards.values() for item in items)
    return _Verified(tensors, nbytes, sha, {shard: tensors for shard, (_, tensors) in results.items()})


def _check_structure(spec: dict[str, Any], verified: _Verified) -> list[str]:
    """The output read back with the reduced config: layer ids, MTP naming, kinds and ignore lists agree
    as well as they did in the source; returns the notes of what still disagrees (as in the source)."""
    config = json.loads(spec["config"])
    layout = analyse(config)
    tensors = {name: t for shard in verified.headers.values() for name, t in shard.items()}
    files = CheckpointFiles(INDEX_NAME, list(verified.headers), len(verified.headers), [], tensors)
    report = cross_check(layout, files)
    allowed = set(spec["source_error_codes"])
    new = [
        (code, message) for severity, code, message in report.findings if severity == "error" and code not in allowed
    ]
    if new:
        raise _failure(
            "the trimmed checkpoint does not match its reduced config: "
            + "; ".join(f"{code}: {message}" for code, message in new[:5])
        )
    return [message for severity, _, message in report.findings if severity == "error"]


# -- the shipped script ----------------------------------------------------------------------------


def script_text(plan: dict[str, Any]) -> str:
    """extract.py: the standalone module with the plan embedded."""
    template = script_source("extract")
    if template.count(PLAN_LINE) != 1:
        raise _failure("the extraction script template has changed shape; reinstall vllm-metax-mcp.")
    embedded = f"PLAN_JSON = {json.dumps(json.dumps(plan, separators=(',', ':')))}\n"
    return template.replace(PLAN_LINE, embedded)


def _same_file(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as left, open(b, "rb") as right:
        while True:
            chunk = left.read(CHUNK_BYTES)
            if chunk != right.read(CHUNK_BYTES):
                return False
            if not chunk:
                return True


def _reproduce(staging: Path, target: Path, spec: dict[str, Any], expected: list[str]) -> None:
    """Run the written extract.py alone (isolated, no site-packages) into a scratch directory and compare."""
    prefix = scratch_prefix(target, os.environ.get(JOB_MARKER_ENV, ""))
    scratch = Path(tempfile.mkdtemp(prefix=prefix, suffix=".reproduce", dir=target.parent))
    try:
        out = scratch / "out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        proc = subprocess.run(
            [sys.executable, "-I", "-S", str(staging / SCRIPT_NAME), spec["source_dir"], str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=REPRODUCE_TIMEOUT_S,
        )
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["no message"])[-1][:500]
            detail = detail.replace(spec["source_dir"], "SOURCE_DIR").replace(str(scratch), "OUTPUT_DIR")
            raise _failure(f"the shipped {SCRIPT_NAME} failed on its own ({detail}); nothing was written.")
        written = sorted(p.name for p in out.iterdir())
        if written != sorted(expected):
            raise _failure(f"the shipped {SCRIPT_NAME} wrote {written}, not {sorted(expected)}.")
        different = [name for name in expected if not _same_file(out / name, staging / name)]
        if different:
            raise _failure(f"the shipped {SCRIPT_NAME} recreated {', '.join(different)} with other bytes.")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- the job ---------------------------------------------------------------------------------------


def _build(staging: Path, target: Path, spec: dict[str, Any], reporter: _Reporter) -> dict[str, Any]:
    """Everything of the output inside the staging directory; the job's result fields."""
    _copy_assets(staging, spec)
    _write_weights(staging, spec, reporter)
    verified = _verify(staging, spec, reporter)
    remaining = _check_structure(spec, verified)
    script_plan = {
        "shards": spec["shards"],
        "config": spec["config"],
        "assets": sorted(spec["assets"]),
        "sha256": verified.sha256,
    }
    (staging / SCRIPT_NAME).write_text(script_text(script_plan), encoding="utf-8")
    reporter.start(f"running the shipped {SCRIPT_NAME} once to prove it")
    _reproduce(staging, target, spec, sorted(verified.sha256))
    extras = list(spec["extra_files"])
    for name, text in spec["extra_files"].items():
        (staging / name).write_text(text, encoding="utf-8")
    if spec["image"]:
        (staging / IMAGE_NAME).write_bytes(tiny_png())
        extras.append(IMAGE_NAME)
    files = dict(verified.sha256)
    files |= {name: file_sha256(staging / name) for name in [SCRIPT_NAME, *extras]}
    manifest = _manifest(spec, verified, files, remaining)
    (staging / spec["manifest_name"]).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return {
        "files": sorted([*files, spec["manifest_name"]]),
        "manifest_sha256": file_sha256(staging / spec["manifest_name"]),
        "verified": {"tensors": verified.tensors, "bytes": verified.nbytes},
        "script_reproduced": True,
        "load_validated": False,
    }


def run_job(spec: dict[str, Any], progress: Any) -> dict[str, Any]:
    """Job target: write, verify and prove a real-weight trim; the output appears whole or not at all."""
    signal.signal(signal.SIGTERM, stop_requested)
    target = Path(spec["target"])
    reporter = _Reporter(progress, sum(item[5] for items in spec["shards"].values() for item in items))
    try:
        tag = os.environ.get(JOB_MARKER_ENV, "")
        policy = _job_policy(spec)
        with staged_directory(
            target, replace=spec["overwrite"], tag=tag, shown=spec.get("shown"), policy=policy
        ) as staging:
            result = _build(staging, target, spec, reporter)
    except HeaderError as exc:
        raise _failure(f"the source changed since it was checked ({exc}); nothing was written.") from None
    except OSError as exc:
        raise _failure(
            f"reading the source or writing the output failed ({exc.strerror or type(exc).__name__}); nothing was written."
        ) from None
    reporter.start("done")
    return {**spec["output"], **result}


def _job_policy(spec: dict[str, Any]) -> Policy:
    """The call's policy again, with the state directory's output records: the worker checks the overwrite
    rule right before its swap and records the new output, as an in-process tool does."""
    rules = spec["policy"]
    store = StateStore(Path(rules["state_dir"]))
    return Policy.from_spec(rules, OutputRegistry(store), tracked_below)


def _manifest(spec: dict[str, Any], verified: _Verified, files: dict[str, str], remaining: list[str]) -> dict[str, Any]:
    return {
        "format": spec["manifest"]["format"],  # first: the marker overwrite recognises (core/foundation/atomic.py)
        **spec["manifest"],
        "files": files,
        "weights": {
            **spec["manifest_weights"],
            "shards": {shard: files[shard] for shard in spec["shards"]},
            "index": INDEX_NAME,
        },
        "verified": {
            "tensors": verified.tensors,
            "bytes": verified.nbytes,
            "method": "every output tensor reopened and compared byte for byte with its source range; dtype and "
            "shape equal to the source's; layer ids, MTP naming, kinds and ignore lists cross-checked against "
            "the reduced config.json",
            "source_disagreements_kept": remaining,
        },
        "script": {
            "name": SCRIPT_NAME,
            "sha256": files[SCRIPT_NAME],
            "usage": f"python {SCRIPT_NAME} SOURCE_DIR OUTPUT_DIR",
            "writes": sorted(verified.sha256),
            "reproduced": True,
        },
        "load_validated": False,
        "validate_with": spec["validate_with"],
    }
