"""The real-weight trim job: its payload (built in the call from what real_checks checked), and the job
that copies the retained tensors as raw bytes, verifies them and proves the shipped script.

The job runs in a worker on the `RealTrimJob` the tool started it with. Everything is written in a
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
from ..foundation.errors import ErrorCode, ToolFailure
from ..foundation.jobs import JOB_MARKER_ENV, stop_requested
from ..foundation.policy import Policy, copy_resolved
from ..foundation.state import OutputRegistry, StateStore
from ..foundation.worker import Progress
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
from .assets import IMAGE_NAME, MANIFEST_NAME, tiny_png
from .cases import FILE_NAME
from .output import TrimTarget
from .plan import Plan, Source
from .real_checks import CheckedTrim
from .weight_map import Move

SCRIPT_NAME = "extract.py"
PLAN_LINE = "PLAN_JSON = None  # trim_model embeds the plan here (a JSON string) in the extract.py it writes\n"
PROGRESS_EVERY_S = 0.5
REPRODUCE_TIMEOUT_S = 24 * 3600


@dataclass(frozen=True)
class RealTrimJob:
    """The copy job's payload: everything the call checked and decided, stored as JSON and rebuilt by the
    worker. The documents (policy, manifest, validate_with, output) are the JSON they are written as."""

    source_dir: str
    source_paths: dict[str, str]
    """Source shard -> its resolved path (checked in the call)."""
    target: str
    shown: str
    overwrite: bool
    policy: dict[str, Any]
    """The call's policy (Policy.to_spec): the worker applies the overwrite rule again right before its swap."""
    config: str
    assets: dict[str, str]
    asset_sha256: dict[str, str]
    shards: dict[str, list[Move]]
    """Output shard -> its tensors in data order."""
    source_error_codes: list[str]
    """Error findings the source already has: the output may keep them, not add others."""
    extra_files: dict[str, str]
    image: bool
    manifest: dict[str, Any]
    """The manifest so far (without files, weights, verification): see output.manifest_document."""
    manifest_weights: dict[str, Any]
    validate_with: dict[str, Any]
    output: dict[str, Any]
    """trim_model's output fields, which the job's result completes."""

    @property
    def total_bytes(self) -> int:
        return sum(move.nbytes for moves in self.shards.values() for move in moves)


def real_trim_job(
    checked: CheckedTrim,
    source: Source,
    plan: Plan,
    target: TrimTarget,
    policy: Policy,
    manifest: dict[str, Any],
    validate_with: dict[str, Any],
    output: dict[str, Any],
) -> RealTrimJob:
    """The payload of the copy job for a checked trim; `manifest`, `validate_with` and `output` are the call's
    JSON documents."""
    weights = checked.weights
    return RealTrimJob(
        source_dir=str(source.directory),
        source_paths=checked.source_paths,
        target=str(target.path),
        shown=target.shown,
        overwrite=target.replace,
        policy=policy.to_spec(),
        config=checked.config_text,
        assets=checked.assets,
        asset_sha256={name: file_sha256(Path(path)) for name, path in checked.assets.items()},
        shards=checked.shards,
        source_error_codes=sorted(
            {f.code for f in (source.report.findings if source.report else []) if f.severity == "error"}
        ),
        extra_files={FILE_NAME: checked.smoke_text},
        image=plan.image,
        manifest=manifest,
        manifest_weights={
            "tensors": len(weights.moves),
            "bytes": weights.nbytes,
            "renamed": {m.source: m.target for m in weights.renamed},
            "dropped": len(weights.dropped),
            "rules": weights.rules,
            "source_shards": {shard: Path(path).stat().st_size for shard, path in checked.source_paths.items()},
        },
        validate_with=validate_with,
        output=output,
    )


class _Reporter:
    """Progress in bytes over the whole job, written at most every PROGRESS_EVERY_S (and at each phase
    start): each of the PHASES (copy, verify, the shipped script's own copy) moves the retained bytes
    once, so the job's total is PHASES times them and the count only grows from phase to phase."""

    PHASES = 3

    def __init__(self, progress: Progress, nbytes: int) -> None:
        self.progress = progress
        self.nbytes = nbytes
        self.total = nbytes * self.PHASES
        self.phase = ""
        self.base = -nbytes  # where the running phase started; the first start moves it to 0
        self.done = 0
        self.last = 0.0
        self.lock = threading.Lock()

    def start(self, phase: str) -> None:
        with self.lock:
            self.base = min(self.base + self.nbytes, self.total)
            self.phase, self.done, self.last = phase, 0, time.monotonic()
            self.progress.report(self.base, self.total, phase)

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.done = min(self.done + nbytes, self.nbytes)
            now = time.monotonic()
            if now - self.last >= PROGRESS_EVERY_S:
                self.last = now
                message = f"{self.phase}: {self.done} of {self.nbytes} bytes"
                self.progress.report(self.base + self.done, self.total, message)


def _failure(message: str) -> ToolFailure:
    return ToolFailure(ErrorCode.FAILED, message)


# -- writing ---------------------------------------------------------------------------------------


def _write_weights(staging: Path, job: RealTrimJob, reporter: _Reporter) -> None:
    reporter.start("copying tensor bytes")
    sources = open_sources(job.source_dir, sorted(job.source_paths), job.source_paths)
    try:
        for shard, moves in job.shards.items():
            write_shard(str(staging / shard), [m.row() for m in moves], sources, reporter.add)
    finally:
        close_sources(sources)
    sized = {shard: [(m.target, m.nbytes) for m in moves] for shard, moves in job.shards.items()}
    (staging / INDEX_NAME).write_bytes(index_bytes(sized))


def _copy_assets(staging: Path, job: RealTrimJob) -> None:
    (staging / "config.json").write_text(job.config, encoding="utf-8")
    for name, path in job.assets.items():
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
    path: Path, moves: list[Move], sources: dict[str, Any], reporter: _Reporter
) -> tuple[str, dict[str, Tensor]]:
    """Reopen one output shard: its header must list exactly the planned tensors, and every tensor's bytes
    must equal its source's; returns the whole file's sha256 (computed on the same read)."""
    try:
        header = parse_header(str(path))
    except HeaderError as exc:
        raise _failure(f"the written shard {path.name} does not parse back: {exc}.") from None
    planned = {move.target: move for move in moves}
    if set(header.entries) != set(planned):
        raise _failure(f"the written shard {path.name} lists other tensors than planned.")
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        digest.update(os.pread(fd, header.data_start, 0))
        for name, entry in sorted(header.entries.items(), key=lambda kv: kv[1].begin):
            move = planned[name]
            nbytes = move.nbytes
            if entry.dtype != move.dtype or entry.shape != move.shape or entry.end - entry.begin != nbytes:
                raise _failure(
                    f"{move.target} was written as {entry.dtype} {list(entry.shape)}, its source is {move.dtype} "
                    f"{list(move.shape)}."
                )
            source_fd, source_header = sources[move.shard]
            source_entry = source_header.entries.get(move.source)
            if source_entry is None:
                raise HeaderError(f"{move.source} is no longer in {move.shard}")
            if not _same_bytes(
                fd,
                header.data_start + entry.begin,
                source_fd,
                source_header.data_start + source_entry.begin,
                nbytes,
                digest,
            ):
                raise _failure(f"the bytes of {move.target} differ from {move.source} in {move.shard}.")
            reporter.add(nbytes)
    finally:
        os.close(fd)
    tensors = {n: Tensor(e.dtype, e.shape, path.name, e.end - e.begin, e.begin) for n, e in header.entries.items()}
    return digest.hexdigest(), tensors


def _verify(staging: Path, job: RealTrimJob, reporter: _Reporter) -> _Verified:
    shards = job.shards
    reporter.start("verifying every tensor against its source")
    sources = open_sources(job.source_dir, sorted(job.source_paths), job.source_paths)
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
    sha |= {name: job.asset_sha256[name] for name in job.assets}
    for name in job.assets:
        if file_sha256(staging / name) != job.asset_sha256[name]:
            raise _failure(f"the copied asset {name} differs from the source's.")
    tensors = sum(len(moves) for moves in shards.values())
    return _Verified(tensors, job.total_bytes, sha, {shard: tensors for shard, (_, tensors) in results.items()})


def _check_structure(job: RealTrimJob, verified: _Verified) -> list[str]:
    """The output read back with the reduced config: layer ids, MTP naming, kinds and ignore lists agree
    as well as they did in the source; returns the notes of what still disagrees (as in the source)."""
    config = json.loads(job.config)
    layout = analyse(config)
    tensors = {name: t for shard in verified.headers.values() for name, t in shard.items()}
    files = CheckpointFiles(INDEX_NAME, list(verified.headers), len(verified.headers), [], tensors)
    report = cross_check(layout, files)
    errors = [f for f in report.findings if f.severity == "error"]
    new = [f for f in errors if f.code not in job.source_error_codes]
    if new:
        raise _failure(
            "the trimmed checkpoint does not match its reduced config: "
            + "; ".join(f"{f.code}: {f.message}" for f in new[:5])
        )
    return [f.message for f in errors]


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


def _reproduce(staging: Path, target: Path, job: RealTrimJob, expected: list[str]) -> None:
    """Run the written extract.py alone (isolated, no site-packages) into a scratch directory and compare."""
    prefix = scratch_prefix(target, os.environ.get(JOB_MARKER_ENV, ""))
    scratch = Path(tempfile.mkdtemp(prefix=prefix, suffix=".reproduce", dir=target.parent))
    try:
        out = scratch / "out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        proc = subprocess.run(
            [sys.executable, "-I", "-S", str(staging / SCRIPT_NAME), job.source_dir, str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=REPRODUCE_TIMEOUT_S,
        )
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["no message"])[-1][:500]
            detail = detail.replace(job.source_dir, "SOURCE_DIR").replace(str(scratch), "OUTPUT_DIR")
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


def _build(staging: Path, target: Path, job: RealTrimJob, reporter: _Reporter) -> dict[str, Any]:
    """Everything of the output inside the staging directory; the job's result fields."""
    _copy_assets(staging, job)
    _write_weights(staging, job, reporter)
    verified = _verify(staging, job, reporter)
    remaining = _check_structure(job, verified)
    script_plan = {
        "shards": {shard: [m.row() for m in moves] for shard, moves in job.shards.items()},
        "config": job.config,
        "assets": sorted(job.assets),
        "sha256": verified.sha256,
    }
    (staging / SCRIPT_NAME).write_text(script_text(script_plan), encoding="utf-8")
    reporter.start(f"running the shipped {SCRIPT_NAME} once to prove it")
    _reproduce(staging, target, job, sorted(verified.sha256))
    extras = list(job.extra_files)
    for name, text in job.extra_files.items():
        (staging / name).write_text(text, encoding="utf-8")
    if job.image:
        (staging / IMAGE_NAME).write_bytes(tiny_png())
        extras.append(IMAGE_NAME)
    files = dict(verified.sha256)
    files |= {name: file_sha256(staging / name) for name in [SCRIPT_NAME, *extras]}
    manifest = _manifest(job, verified, files, remaining)
    (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return {
        "files": sorted([*files, MANIFEST_NAME]),
        "manifest_sha256": file_sha256(staging / MANIFEST_NAME),
        "verified": {"tensors": verified.tensors, "bytes": verified.nbytes},
        "script_reproduced": True,
        "load_validated": False,
    }


def run_job(job: RealTrimJob, progress: Progress) -> dict[str, Any]:
    """Job target: write, verify and prove a real-weight trim; the output appears whole or not at all."""
    signal.signal(signal.SIGTERM, stop_requested)
    target = Path(job.target)
    reporter = _Reporter(progress, job.total_bytes)
    try:
        tag = os.environ.get(JOB_MARKER_ENV, "")
        policy = _job_policy(job)
        with staged_directory(target, replace=job.overwrite, tag=tag, shown=job.shown, policy=policy) as staging:
            result = _build(staging, target, job, reporter)
    except HeaderError as exc:
        raise _failure(f"the source changed since it was checked ({exc}); nothing was written.") from None
    except OSError as exc:
        raise _failure(
            f"reading the source or writing the output failed ({exc.strerror or type(exc).__name__}); nothing was "
            "written."
        ) from None
    reporter.start("done")
    return {**job.output, **result}


def _job_policy(job: RealTrimJob) -> Policy:
    """The call's policy again, with the state directory's output records: the worker checks the overwrite
    rule right before its swap and records the new output, as an in-process tool does."""
    store = StateStore(Path(job.policy["state_dir"]))
    return Policy.from_spec(job.policy, OutputRegistry(store), tracked_below)


def _manifest(job: RealTrimJob, verified: _Verified, files: dict[str, str], remaining: list[str]) -> dict[str, Any]:
    return {
        "format": job.manifest["format"],  # first: the marker overwrite recognises (core/foundation/atomic.py)
        **job.manifest,
        "files": files,
        "weights": {
            **job.manifest_weights,
            "shards": {shard: files[shard] for shard in job.shards},
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
        "validate_with": job.validate_with,
    }
