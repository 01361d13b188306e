"""Accelerator occupancy, read the way the platform reads it, and the choice of free devices.

First the NVML-compatible library of the *target* interpreter (`pymxsml`, which vLLM-MetaX's platform
uses; then `pynvml`, nvidia-ml-py), queried by a target script that creates no device context
(core/target/nvml_probe.py). When neither initialises, the vendors' tools: MetaX `mx-smi` (its default
table; `--show-memory` as a fallback), NVIDIA `nvidia-smi` CSV queries; why the library path failed is
kept. None answers: the machine is CPU-only. Each process on a device is checked against /proc for
whether this server started it (a smoke server of a run in its state directory). A device counts as
free when nothing runs on it and its free memory covers the requested share (`gpu_memory_utilization`,
vLLM's default 0.9). Nothing here ever signals a process: a busy device means `blocked`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

from ..foundation.isolated import ProbeDied, run_isolated
from ..foundation.state import StateStore
from ..target import script_source
from .processes import SMOKE_MARKER_ENV, process_group, start_ticks

QUERY_TIMEOUT_S = 30
VLLM_DEFAULT_UTILIZATION = 0.9
NVML_MARKER = "@@NVML@@"

OccupancyKind = Literal["metax", "nvidia", "cpu"]
"""Whose devices answered; cpu: no library or tool did."""
OccupancySource = Literal["pymxsml", "pynvml", "mx-smi", "nvidia-smi", "none"]
"""What answered: a management library in the target interpreter, a vendor tool, or nothing."""
LibraryModule = Literal["pymxsml", "pynvml"]
LibraryOutcome = Literal["answered", "missing", "import_failed", "init_failed", "query_failed", "no_devices"]
"""missing: not installed in the target interpreter; init_failed: nvmlInit raised (no driver library)."""
KIND_OF_LIBRARY: dict[LibraryModule, OccupancyKind] = {"pymxsml": "metax", "pynvml": "nvidia"}


@dataclass
class DeviceProcess:
    pid: int
    used_mib: int | None = None
    started_by_this_server: bool = False
    """A smoke server (or one of its processes) that a run of this state directory launched."""
    run_id: str | None = None
    """That run, when this server started it."""


@dataclass
class Device:
    index: int
    name: str = ""
    total_mib: int | None = None
    used_mib: int | None = None
    processes: list[DeviceProcess] | None = None
    """None: the source does not list them (then only the memory decides)."""
    error: str | None = None
    """What the source could not read of this device."""
    reported_free_mib: int | None = None
    """Free memory as the library reports it (NVML keeps some memory reserved, outside used and free)."""

    @property
    def free_mib(self) -> int | None:
        if self.reported_free_mib is not None:
            return self.reported_free_mib
        if self.total_mib is None or self.used_mib is None:
            return None
        return self.total_mib - self.used_mib

    def as_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"index": self.index, "name": self.name or None}
        record |= {"total_mib": self.total_mib, "used_mib": self.used_mib, "free_mib": self.free_mib}
        record["processes"] = [_compact(asdict(p)) for p in self.processes or []] or None
        record["error"] = self.error
        return _compact(record)


@dataclass(frozen=True)
class LibraryAttempt:
    """One NVML-class module the probe tried in the target interpreter."""

    module: LibraryModule
    outcome: LibraryOutcome
    version: str | None = None
    error: str | None = None


@dataclass
class Occupancy:
    kind: OccupancyKind
    source: OccupancySource = "none"
    tool: str | None = None
    """The vendor tool that answered (its path)."""
    devices: list[Device] = field(default_factory=list)
    error: str | None = None
    """The source answered, but not readably: the devices cannot be checked."""
    library: list[LibraryAttempt] = field(default_factory=list)
    """What the NVML probe found, module by module."""
    library_error: str | None = None
    """The NVML probe itself gave no report (it crashed or hung)."""

    @property
    def version(self) -> str | None:
        """The answering library's version."""
        return next((a.version for a in self.library if a.outcome == "answered"), None)

    def as_dict(self) -> dict[str, Any]:
        """Compact: no key for what is unknown; the library attempts only when the library path did not
        answer (they say why a tool, or nothing, answered instead)."""
        record: dict[str, Any] = {"kind": self.kind, "source": self.source, "version": self.version}
        tool = Path(self.tool).name if self.tool else None  # its name: results carry no paths of this machine
        record |= {"tool": tool, "error": self.error, "library_error": self.library_error}
        if self.source not in KIND_OF_LIBRARY:
            record["library"] = [_compact(asdict(a)) for a in self.library] or None
        record["devices"] = [d.as_dict() for d in self.devices] or None
        return _compact(record)


def _compact(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if value is not None}


@dataclass(frozen=True)
class LaunchedServer:
    """A smoke server a run of this state directory launched (`smoke/<run_id>/server.json`)."""

    run_id: str
    pgid: int
    finished: bool
    """The run wrote its evidence: its teardown is over, so its group id may belong to anyone now."""
    leader_start_ticks: int | None
    """The leader's start time: a live process with the group's id and another start time is not ours."""


# -- the vendor tools -----------------------------------------------------------------------------


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited with {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}"
        )
    return proc.stdout


def _int(text: str) -> int | None:
    try:
        return int(float(text.strip()))
    except ValueError:
        return None


def parse_nvidia(gpus_csv: str, apps_csv: str) -> list[Device]:
    """`nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv,noheader,nounits`
    plus `--query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits`."""
    per_uuid: dict[str, list[DeviceProcess]] = {}
    for line in apps_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        pid = _int(parts[1]) if len(parts) >= 2 and parts[0] else None
        if pid is not None:
            used = _int(parts[2]) if len(parts) >= 3 else None
            per_uuid.setdefault(parts[0], []).append(DeviceProcess(pid, used))
    devices = []
    for line in gpus_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or _int(parts[0]) is None:
            continue
        devices.append(
            Device(
                index=_int(parts[0]) or 0,
                name=parts[2],
                total_mib=_int(parts[3]),
                used_mib=_int(parts[4]),
                processes=per_uuid.get(parts[1], []),
            )
        )
    return devices


_MX_DEVICE_ROW = re.compile(r"^\|\s*(\d+)\s+(\S.*?)\s*\|")
_MX_MEMORY = re.compile(r"(\d+)\s*/\s*(\d+)\s*MiB")
_MX_PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+\S")
_MX_BLOCK = re.compile(r"GPU#(\d+)\s*(\S*)")
_MX_VRAM = re.compile(r"^\s*vram\s+(total|used)\s*:\s*(\d+)\s*(KB|MB|MiB|KiB)", re.IGNORECASE)


def parse_mx_smi(table: str) -> list[Device]:
    """The default `mx-smi` table: a device row `| 0  MXC500 | ...` followed by a row holding
    `used/total MiB`; a `Process` section whose rows start with `| gpu pid`."""
    devices: dict[int, Device] = {}
    current: Device | None = None
    in_processes = False
    for line in table.splitlines():
        if "process" in line.lower() and "|" in line and not _MX_DEVICE_ROW.match(line):
            in_processes = True
            for device in devices.values():
                device.processes = []
            continue
        if in_processes:
            row = _MX_PROCESS_ROW.match(line)
            listed = devices[int(row.group(1))].processes if row and int(row.group(1)) in devices else None
            if row and listed is not None:
                listed.append(DeviceProcess(int(row.group(2))))
            continue
        row = _MX_DEVICE_ROW.match(line)
        if row:
            current = devices.setdefault(
                int(row.group(1)), Device(index=int(row.group(1)), name=row.group(2).split()[0])
            )
        memory = _MX_MEMORY.search(line)
        if memory and current is not None and current.total_mib is None:
            current.used_mib, current.total_mib = int(memory.group(1)), int(memory.group(2))
    return [devices[i] for i in sorted(devices)]


def parse_mx_memory(text: str) -> list[Device]:
    """`mx-smi --show-memory`: blocks `GPU#0 ...` with `vram total : N KB` / `vram used : N KB`."""
    devices: list[Device] = []
    for line in text.splitlines():
        block = _MX_BLOCK.search(line)
        if block:
            devices.append(Device(index=int(block.group(1)), name=block.group(2)))
            continue
        vram = _MX_VRAM.match(line)
        if vram and devices:
            value = int(vram.group(2))
            mib = value // 1024 if vram.group(3).upper() in ("KB", "KIB") else value
            if vram.group(1).lower() == "total" and devices[-1].total_mib is None:
                devices[-1].total_mib = mib
            elif vram.group(1).lower() == "used" and devices[-1].used_mib is None:
                devices[-1].used_mib = mib
    return devices


def tool_occupancy() -> Occupancy:
    """What mx-smi or nvidia-smi (found on PATH) say; source none when neither is installed."""
    mx = shutil.which("mx-smi")
    if mx:
        try:
            devices = parse_mx_smi(_run([mx]))
            if not devices or any(d.total_mib is None for d in devices):
                devices = parse_mx_memory(_run([mx, "--show-memory"])) or devices
            error = None if devices else "mx-smi answered, but its output could not be read"
            return Occupancy("metax", "mx-smi", mx, devices, error)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            return Occupancy("metax", "mx-smi", mx, [], f"mx-smi failed: {exc}")
    nvidia = shutil.which("nvidia-smi")
    if nvidia:
        try:
            gpus = _run(
                [nvidia, "--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
            )
            apps = _run([nvidia, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"])
            devices = parse_nvidia(gpus, apps)
            return Occupancy("nvidia", "nvidia-smi", nvidia, devices, None if devices else "nvidia-smi listed no GPU")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            return Occupancy("nvidia", "nvidia-smi", nvidia, [], f"nvidia-smi failed: {exc}")
    return Occupancy("cpu")


# -- the management library in the target interpreter --------------------------------------------


def _optional_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _device_of(entry: dict[str, Any]) -> Device:
    listed = entry.get("processes")
    processes = None
    if isinstance(listed, list):
        processes = [
            DeviceProcess(p["pid"], _optional_int(p.get("used_mib")))
            for p in listed
            if isinstance(p, dict) and _optional_int(p.get("pid")) is not None
        ]
    return Device(
        index=int(entry["index"]),
        name=str(entry.get("name") or ""),
        total_mib=_optional_int(entry.get("total_mib")),
        used_mib=_optional_int(entry.get("used_mib")),
        processes=processes,
        error=str(entry["error"]) if entry.get("error") else None,
        reported_free_mib=_optional_int(entry.get("free_mib")),
    )


def _attempt_of(entry: dict[str, Any]) -> LibraryAttempt:
    module, outcome = entry["module"], entry["outcome"]
    if module not in get_args(LibraryModule) or outcome not in get_args(LibraryOutcome):
        raise ValueError(f"unknown attempt {module}: {outcome}")
    version, error = entry.get("version"), entry.get("error")
    return LibraryAttempt(module, outcome, str(version) if version else None, str(error) if error else None)


def library_occupancy(python: Path, pythonpath: list[Path] | None = None) -> Occupancy:
    """What the NVML probe reads in the target interpreter (the modules it sees, `pythonpath` first);
    source none when no library answered, with each module's outcome or why the probe gave no report."""
    try:
        report = run_isolated(
            python,
            script_source("nvml_probe"),
            NVML_MARKER,
            what="NVML probe",
            pythonpath=pythonpath,
            timeout_s=QUERY_TIMEOUT_S,
        )
    except ProbeDied as exc:
        return Occupancy("cpu", library_error=exc.death.sentence())
    except OSError as exc:
        return Occupancy("cpu", library_error=f"the NVML probe could not start: {exc.strerror or exc}")
    try:
        attempts = [_attempt_of(a) for a in report["attempts"]]
        devices = [_device_of(d) for d in report["devices"]]
    except (KeyError, TypeError, ValueError) as exc:
        return Occupancy("cpu", library_error=f"the NVML probe's report could not be read ({exc})")
    answered = next((a.module for a in attempts if a.outcome == "answered"), None)
    if answered is None or not devices:
        return Occupancy("cpu", library=attempts)
    return Occupancy(KIND_OF_LIBRARY[answered], answered, devices=devices, library=attempts)


# -- whose processes ------------------------------------------------------------------------------


def launched_servers(store: StateStore) -> list[LaunchedServer]:
    """The smoke servers the runs of this state directory launched, as their server records say."""
    found = []
    for run_id in store.list("smoke"):
        try:
            record = store.read(f"smoke/{run_id}/server.json")
        except ValueError:  # not JSON: not a record this server wrote
            continue
        if isinstance(record, dict) and _optional_int(record.get("pgid")) is not None:
            finished = store.path(f"smoke/{run_id}/evidence.json").is_file()
            ticks = _optional_int(record.get("leader_start_ticks"))
            found.append(LaunchedServer(run_id, record["pgid"], finished, ticks))
    return found


def _smoke_marker(pid: int) -> str | None:
    """The run id of the smoke marker in /proc/PID/environ (unreadable for another user's process)."""
    prefix = f"{SMOKE_MARKER_ENV}=".encode()
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e[len(prefix) :].decode(errors="replace") for e in environ if e.startswith(prefix)), None)


def started_by(pid: int, servers: Sequence[LaunchedServer]) -> str | None:
    """The run whose smoke server `pid` is part of, for runs not finished: the process is in the run's group
    and the group's leader is still the recorded process (same start time: a reused group id fails), or it
    carries the run's marker (set only by this server's launch; a finished run's id may be known to anyone).
    None: this server did not start it, or it is not visible here."""
    group = process_group(pid)
    if group is None:
        return None
    running = [s for s in servers if not s.finished]
    for server in running:
        leader_is_ours = server.leader_start_ticks is not None and start_ticks(group) == server.leader_start_ticks
        if server.pgid == group and leader_is_ours:
            return server.run_id
    marker = _smoke_marker(pid)
    return next((s.run_id for s in running if s.run_id == marker), None)


def detect(python: str | Path, store: StateStore | None = None, pythonpath: list[Path] | None = None) -> Occupancy:
    """What accelerators this machine has and how busy they are, read without a device context: the
    target interpreter's management library, else the vendor tools (keeping why the library did not
    answer). Each process is marked as started by this server or not, against `store`'s runs."""
    occupancy = library_occupancy(Path(python), pythonpath)
    if occupancy.source == "none":
        fallback = tool_occupancy()
        fallback.library, fallback.library_error = occupancy.library, occupancy.library_error
        occupancy = fallback
    processes = [p for d in occupancy.devices for p in d.processes or []]
    servers = launched_servers(store) if store is not None and processes else []
    for process in processes:
        process.run_id = started_by(process.pid, servers)
        process.started_by_this_server = process.run_id is not None
    return occupancy


# -- the choice -----------------------------------------------------------------------------------


def busy_reason(device: Device, utilization: float) -> str | None:
    """Why a device cannot take a server that wants `utilization` of its memory (None: it can)."""
    processes = device.processes or []
    foreign = [p.pid for p in processes if not p.started_by_this_server]
    if foreign:
        return (
            f"device {device.index} runs {len(foreign)} process(es) this server did not start "
            f"(pid {', '.join(map(str, foreign))}); they are left alone"
        )
    runs = sorted({p.run_id for p in processes if p.run_id})
    if runs:
        return f"device {device.index} runs the smoke server of run {', '.join(runs)}, started by this server"
    free = device.free_mib
    if free is None:
        return f"device {device.index}: free memory unknown" + (f" ({device.error})" if device.error else "")
    if device.total_mib and free < utilization * device.total_mib:
        return (
            f"device {device.index} has {free} MiB free of {device.total_mib} MiB, less than the "
            f"{utilization:.2f} share the server would claim"
        )
    return None


class DeviceChoice(NamedTuple):
    """The devices a server may use, or why it may not start (then `selected` is empty)."""

    selected: list[int]
    reasons: list[str]


def choose(occupancy: Occupancy, needed: int, requested: list[int] | None, utilization: float | None) -> DeviceChoice:
    """The devices to use, or the reasons the run is blocked. CPU-only machines use no device ids."""
    share = utilization if utilization is not None else VLLM_DEFAULT_UTILIZATION
    if occupancy.kind == "cpu":
        if requested:
            return DeviceChoice(
                [],
                [
                    f"devices {requested} were requested, but no accelerator management library (pymxsml, "
                    "pynvml) or tool (mx-smi, nvidia-smi) answered on this machine: there are no such devices"
                ],
            )
        return DeviceChoice([], [])
    if occupancy.error:
        return DeviceChoice(
            [], [f"occupancy could not be read ({occupancy.error}); pass devices only once it can be checked"]
        )
    by_index = {d.index: d for d in occupancy.devices}
    if requested:
        reasons = [f"device {i} does not exist (found {sorted(by_index)})" for i in requested if i not in by_index]
        reasons += [r for i in requested if i in by_index and (r := busy_reason(by_index[i], share))]
        return DeviceChoice(list(requested), []) if not reasons else DeviceChoice([], reasons)
    free = [d.index for d in occupancy.devices if busy_reason(d, share) is None]
    if len(free) >= needed:
        return DeviceChoice(free[:needed], [])
    reasons = [r for d in occupancy.devices if (r := busy_reason(d, share))]
    return DeviceChoice([], [f"{needed} device(s) needed, {len(free)} free", *reasons])
