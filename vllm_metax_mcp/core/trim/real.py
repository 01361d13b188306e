"""The real-weight trim job: its payload (built in the call from what real_checks checked), and the job
that has the shipped script write the trimmed checkpoint, in one pass that is its own proof.

The job runs in a worker on the `RealTrimJob` the tool started it with. It hashes the retained
source bytes (every entry checked against the plan), embeds those sha256 in `extract.py`, and runs
that script, isolated, into a staging directory beside the target: the script copies the tensors
as raw bytes (in the kernel where it can) and checks every file it wrote against the embedded
hashes, so the deliverable, its reproducibility and its verification are one execution and the
output is written once. The job then reparses every header and cross-checks the structure with
the reduced config; only then is the staging renamed into place. A failure or a cancellation
(SIGTERM raises Stopped; the script is killed) removes the staging directory.
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
from ..foundation.atomic import staged_directory
from ..foundation.errors import ErrorCode, ToolFailure
from ..foundation.jobs import JOB_MARKER_ENV, stop_requested
from ..foundation.policy import Policy
from ..foundation.state import OutputRegistry, StateStore
from ..foundation.worker import Progress
from ..sources.git import tracked_below
from ..target import script_source
from ..target.extract import (
    CHUNK_BYTES,
    INDEX_NAME,
    PROGRESS_PREFIX,
    HeaderError,
    close_sources,
    file_sha256,
    header_bytes,
    index_bytes,
    open_sources,
    parse_header,
)
from .assets import IMAGE_NAME, MANIFEST_NAME, tiny_png
from .cases import FILE_NAME
from .output import TrimTarget
from .plan import Plan, Source
from .real_checks import SCRIPT_NAME, CheckedTrim
from .weight_map import Move

PLAN_LINE = "PLAN_JSON = None  # trim_model embeds the plan here (a JSON string) in the extract.py it writes\n"
PROGRESS_EVERY_S = 0.5
SCRIPT_OUTPUT = ".extract-out"
SCRIPT_SOURCE = ".extract-source"
"""The script's SOURCE_DIR inside the staging directory: links to the checked source files."""
SCRIPT_SILENCE_S = 600
"""The script's OUTPUT_DIR inside the staging directory (its files are moved up once it succeeded)."""


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
    start): hashing the source moves the retained bytes once, the script's run twice (its copy and its
    sha256 check, which overlap), so the job's total is PASSES times them and the count only grows."""

    PASSES = 3

    def __init__(self, progress: Progress, nbytes: int) -> None:
        self.progress = progress
        self.nbytes = nbytes
        self.total = nbytes * self.PASSES
        self.phase = ""
        self.base = 0  # where the running phase started
        self.span = 0  # the bytes the running phase moves
        self.done = 0
        self.last = 0.0
        self.lock = threading.Lock()

    def start(self, phase: str, passes: int = 1) -> None:
        """A new phase that moves the retained bytes `passes` times."""
        with self.lock:
            self.base = min(self.base + self.span, self.total)
            self.span = passes * self.nbytes
            self.phase, self.done, self.last = phase, 0, time.monotonic()
            self.progress.report(self.base, self.total, phase)

    def relabel(self, phase: str) -> None:
        """The running phase goes on under a new name (what is left of it), its count kept."""
        with self.lock:
            self.phase, self.last = phase, time.monotonic()
            self.progress.report(self.base + self.done, self.total, phase)

    def add(self, nbytes: int) -> None:
        with self.lock:
            self.done = min(self.done + nbytes, self.span)
            now = time.monotonic()
            if now - self.last >= PROGRESS_EVERY_S:
                self.last = now
                message = f"{self.phase}: {self.done} of {self.nbytes} bytes"
                self.progress.report(self.base + self.done, self.total, message)


def _failure(message: str) -> ToolFailure:
    return ToolFailure(ErrorCode.FAILED, message)


# -- the expectation, from the source alone -------------------------------------------------------


@dataclass
class _Verified:
    tensors: int
    nbytes: int
    sha256: dict[str, str]
    headers: dict[str, dict[str, Tensor]]


def _moves_sha256(moves: list[Move], sources: dict[str, Any], on_bytes: Any) -> str:
    """One output shard's expected sha256, by code of its own (not the script's copy plan): the header
    built from the plan's moves, then each move's source bytes, looked up by name and read tensor by
    tensor, so a fault in the script's grouping or offsets cannot hide in both sides."""
    digest = hashlib.sha256(header_bytes([(m.target, m.dtype, m.shape, m.nbytes) for m in moves]))
    for move in moves:
        fd, header = sources[move.shard]
        entry = header.entries.get(move.source)
        if entry is None or (entry.dtype, tuple(entry.shape), entry.end - entry.begin) != (
            move.dtype,
            tuple(move.shape),
            move.nbytes,
        ):
            raise HeaderError(f"{move.source} (in {move.shard}) is no longer what the plan recorded")
        done = 0
        while done < move.nbytes:
            chunk = os.pread(fd, min(CHUNK_BYTES, move.nbytes - done), header.data_start + entry.begin + done)
            if not chunk:
                raise HeaderError(f"{move.shard} ended inside {move.source}")
            digest.update(chunk)
            done += len(chunk)
            on_bytes(len(chunk))
    return digest.hexdigest()


def _expected_sha256(job: RealTrimJob, reporter: _Reporter) -> dict[str, str]:
    """The sha256 of every file the script is to write, computed before anything is written: shards from
    the plan and the source bytes (read once, every entry checked against the plan), the index and config
    from their bytes, the assets from the call."""
    reporter.start("hashing the retained source bytes")
    sources = open_sources(job.source_dir, sorted(job.source_paths), job.source_paths)
    pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(job.shards)))
    try:
        futures = {s: pool.submit(_moves_sha256, moves, sources, reporter.add) for s, moves in job.shards.items()}
        sha = {shard: future.result() for shard, future in futures.items()}
    except BaseException:
        # a failure or cancellation drops the queued shards; the sources stay open for a shard still being
        # hashed (closing them could hand its descriptors to other files) until the worker exits
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    close_sources(sources)
    sized = {shard: [(m.target, m.nbytes) for m in moves] for shard, moves in job.shards.items()}
    sha[INDEX_NAME] = hashlib.sha256(index_bytes(sized)).hexdigest()
    sha["config.json"] = hashlib.sha256(job.config.encode("utf-8")).hexdigest()
    return sha | job.asset_sha256


# -- the shipped script writes the output ------------------------------------------------------------


def script_text(plan: dict[str, Any]) -> str:
    """extract.py: the standalone module with the plan embedded."""
    template = script_source("extract")
    if template.count(PLAN_LINE) != 1:
        raise _failure("the extraction script template has changed shape; reinstall vllm-metax-mcp.")
    embedded = f"PLAN_JSON = {json.dumps(json.dumps(plan, separators=(',', ':')))}\n"
    return template.replace(PLAN_LINE, embedded)


class _Watched:
    """The script's progress lines, forwarded to the reporter; a script silent for SCRIPT_SILENCE_S (a
    stalled mount, a file that blocks) is killed rather than left to hang the job."""

    def __init__(self, proc: subprocess.Popen[bytes], reporter: _Reporter) -> None:
        self.proc = proc
        self.reporter = reporter
        self.last = time.monotonic()
        self.silenced = False
        self.done = threading.Event()

    def watchdog(self) -> None:
        while not self.done.wait(1.0):
            if time.monotonic() - self.last > SCRIPT_SILENCE_S:
                self.silenced = True
                self.proc.kill()
                return

    def follow(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.last = time.monotonic()
            parts = raw.decode("ascii", errors="replace").split()
            if len(parts) != 3 or parts[0] != PROGRESS_PREFIX or not parts[2].isdigit():
                continue
            if parts[1] == "written":
                self.reporter.relabel(f"{SCRIPT_NAME}: checking the sha256 of every file it wrote")
            self.reporter.add(int(parts[2]))


def _private_source(staging: Path, job: RealTrimJob) -> Path:
    """SOURCE_DIR for the script: links from each name it opens to the file the call checked (resolved),
    so a link swapped into the source since is never followed."""
    private = staging / SCRIPT_SOURCE
    private.mkdir(mode=0o700)
    for name, checked in {**job.source_paths, **job.assets}.items():
        (private / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(checked, private / name)
    return private


def _execute(argv: list[str], reporter: _Reporter) -> tuple[int, str, bool]:
    """Run the script, following its progress; (exit status, its last error line, killed for silence)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with tempfile.TemporaryFile("w+b") as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, env=env)
        watched = _Watched(proc, reporter)
        guard = threading.Thread(target=watched.watchdog, daemon=True)
        guard.start()
        try:
            watched.follow()
            returncode = proc.wait()
        except BaseException:  # cancelled (Stopped) or failed: the script must not outlive the job's staging
            proc.kill()
            proc.wait()
            raise
        finally:
            watched.done.set()
        errors.seek(max(0, os.fstat(errors.fileno()).st_size - 4096))
        lines = errors.read().decode(errors="replace").strip().splitlines()
    return returncode, (lines or ["no message"])[-1][:500], watched.silenced


def _run_script(staging: Path, job: RealTrimJob, reporter: _Reporter, expected: list[str]) -> None:
    """Run the written extract.py alone (isolated, no site-packages) into the staging directory: its output
    is the checkpoint, checked by the script against the hashes taken from the source."""
    reporter.start(f"{SCRIPT_NAME}: copying tensor bytes", passes=2)
    source, out = _private_source(staging, job), staging / SCRIPT_OUTPUT
    argv = [sys.executable, "-I", "-S", str(staging / SCRIPT_NAME), "--progress", str(source), str(out)]
    returncode, last, silenced = _execute(argv, reporter)
    shutil.rmtree(source)
    if silenced:
        raise _failure(f"the shipped {SCRIPT_NAME} made no progress for {SCRIPT_SILENCE_S} s and was stopped.")
    if returncode != 0:
        detail = last.replace(str(source), "SOURCE_DIR").replace(str(out), "OUTPUT_DIR")
        raise _failure(f"the shipped {SCRIPT_NAME} failed ({detail}); nothing was written.")
    written = sorted(p.name for p in out.iterdir())
    if written != sorted(expected):
        raise _failure(f"the shipped {SCRIPT_NAME} wrote {written}, not {sorted(expected)}.")
    clashes = [name for name in written if os.path.lexists(staging / name)]
    if clashes:
        raise _failure(f"the source's {', '.join(clashes)} would replace a file the trim writes; nothing was written.")
    for name in written:
        os.rename(out / name, staging / name)
    out.rmdir()


def _read_back(staging: Path, job: RealTrimJob, sha: dict[str, str]) -> _Verified:
    """Each written shard's header parsed again: exactly the planned tensors, each with its source's dtype,
    shape and size (the bytes themselves were checked by sha256)."""
    headers: dict[str, dict[str, Tensor]] = {}
    for shard, moves in job.shards.items():
        try:
            header = parse_header(str(staging / shard))
        except HeaderError as exc:
            raise _failure(f"the written shard {shard} does not parse back: {exc}.") from None
        planned = {move.target: move for move in moves}
        if set(header.entries) != set(planned):
            raise _failure(f"the written shard {shard} lists other tensors than planned.")
        offset = 0
        for move in moves:  # in plan order, each tensor where the plan puts it
            if header.entries[move.target].begin != offset:
                raise _failure(f"{move.target} is not at its planned offset in the written shard {shard}.")
            offset += move.nbytes
        for name, entry in header.entries.items():
            move = planned[name]
            if entry.dtype != move.dtype or entry.shape != move.shape or entry.end - entry.begin != move.nbytes:
                raise _failure(
                    f"{move.target} was written as {entry.dtype} {list(entry.shape)}, its source is {move.dtype} "
                    f"{list(move.shape)}."
                )
        entries = header.entries.items()
        headers[shard] = {n: Tensor(e.dtype, e.shape, shard, e.end - e.begin, e.begin) for n, e in entries}
    tensors = sum(len(moves) for moves in job.shards.values())
    return _Verified(tensors, job.total_bytes, sha, headers)


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


# -- the job ---------------------------------------------------------------------------------------


def _build(staging: Path, job: RealTrimJob, reporter: _Reporter) -> dict[str, Any]:
    """Everything of the output inside the staging directory; the job's result fields."""
    sha = _expected_sha256(job, reporter)
    script_plan = {
        "shards": {shard: [m.row() for m in moves] for shard, moves in job.shards.items()},
        "config": job.config,
        "assets": sorted(job.assets),
        "sha256": sha,
    }
    (staging / SCRIPT_NAME).write_text(script_text(script_plan), encoding="utf-8")
    _run_script(staging, job, reporter, sorted(sha))
    verified = _read_back(staging, job, sha)
    remaining = _check_structure(job, verified)
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
            result = _build(staging, job, reporter)
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
            "method": "the job computed each file's sha256 beforehand from the plan and the source bytes, with "
            "code of its own; the shipped script, which wrote the files, checked every one against it; the job "
            "reparsed every header (each tensor at its planned offset, with its source's dtype, shape and size) "
            "and cross-checked layer ids, MTP naming, kinds and ignore lists with the reduced config.json",
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
