"""Accelerator occupancy, read with the vendors' management tools (which create no device context).

MetaX: `mx-smi` (its default table; `--show-memory` as a fallback); NVIDIA: `nvidia-smi` CSV
queries. Neither present: the machine is CPU-only. A device counts as free when no compute
process runs on it and its free memory covers the requested share (`gpu_memory_utilization`,
vLLM's default 0.9). Nothing here ever stops a process: a busy device means `blocked`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

QUERY_TIMEOUT_S = 30
VLLM_DEFAULT_UTILIZATION = 0.9

OccupancyKind = Literal["metax", "nvidia", "cpu"]
"""Whose management tool answered; cpu: neither is installed."""


@dataclass
class Device:
    index: int
    name: str = ""
    total_mib: int | None = None
    used_mib: int | None = None
    processes: int | None = None  # compute processes on the device; None when the tool does not say

    @property
    def free_mib(self) -> int | None:
        if self.total_mib is None or self.used_mib is None:
            return None
        return self.total_mib - self.used_mib


@dataclass
class Occupancy:
    kind: OccupancyKind
    tool: str | None = None
    devices: list[Device] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tool": self.tool,
            "error": self.error,
            "devices": [asdict(d) | {"free_mib": d.free_mib} for d in self.devices],
        }


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
    plus `--query-compute-apps=gpu_uuid,pid --format=csv,noheader,nounits`."""
    per_uuid: dict[str, int] = {}
    for line in apps_csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            per_uuid[parts[0]] = per_uuid.get(parts[0], 0) + 1
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
                processes=per_uuid.get(parts[1], 0),
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
            continue
        if in_processes:
            row = _MX_PROCESS_ROW.match(line)
            if row and int(row.group(1)) in devices:
                device = devices[int(row.group(1))]
                device.processes = (device.processes or 0) + 1
            continue
        row = _MX_DEVICE_ROW.match(line)
        if row:
            current = devices.setdefault(
                int(row.group(1)), Device(index=int(row.group(1)), name=row.group(2).split()[0])
            )
        memory = _MX_MEMORY.search(line)
        if memory and current is not None and current.total_mib is None:
            current.used_mib, current.total_mib = int(memory.group(1)), int(memory.group(2))
    for device in devices.values():
        if in_processes and device.processes is None:
            device.processes = 0
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


def detect() -> Occupancy:
    """What accelerators this machine has and how busy they are (no device context is created)."""
    mx = shutil.which("mx-smi")
    if mx:
        try:
            devices = parse_mx_smi(_run([mx]))
            if not devices or any(d.total_mib is None for d in devices):
                devices = parse_mx_memory(_run([mx, "--show-memory"])) or devices
            error = None if devices else "mx-smi answered, but its output could not be read"
            return Occupancy("metax", mx, devices, error)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            return Occupancy("metax", mx, [], f"mx-smi failed: {exc}")
    nvidia = shutil.which("nvidia-smi")
    if nvidia:
        try:
            gpus = _run(
                [nvidia, "--query-gpu=index,uuid,name,memory.total,memory.used", "--format=csv,noheader,nounits"]
            )
            apps = _run([nvidia, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"])
            devices = parse_nvidia(gpus, apps)
            return Occupancy("nvidia", nvidia, devices, None if devices else "nvidia-smi listed no GPU")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            return Occupancy("nvidia", nvidia, [], f"nvidia-smi failed: {exc}")
    return Occupancy("cpu")


def busy_reason(device: Device, utilization: float) -> str | None:
    """Why a device cannot take a server that wants `utilization` of its memory (None: it can)."""
    if device.processes:
        return f"device {device.index} runs {device.processes} compute process(es) this tool did not start"
    free = device.free_mib
    if free is None:
        return f"device {device.index}: free memory unknown"
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
                    f"devices {requested} were requested, but this machine has no accelerator management tool "
                    "(mx-smi, nvidia-smi): there are no such devices"
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
