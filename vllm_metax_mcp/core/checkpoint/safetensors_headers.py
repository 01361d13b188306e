"""Header-only reading of safetensors checkpoints: the index's weight map and each shard's header.

A safetensors file starts with an 8-byte little-endian header length and a JSON header; tensor
data follows. Only those two parts are ever read, and every header length and data offset is
checked against the file's size, so a damaged or hostile file yields a finding, not a crash or a
multi-gigabyte read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..foundation.errors import ToolFailure
from ..foundation.policy import FileTooLarge, Policy
from ..foundation.safe_load import load_json_bounded
from ..target.extract import HeaderError, parse_header
from .findings import Finding

SHARD_SUFFIX = ".safetensors"
INDEX_SUFFIX = ".safetensors.index.json"
PREFERRED_INDEX = "model.safetensors.index.json"
MAX_INDEX_BYTES = 256 * 1024 * 1024
RANK_PATTERN = re.compile(r"(?:^|[-_.])(?:mp_rank|tp_rank|rank|tp)[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Tensor:
    dtype: str | None
    shape: tuple[int, ...] | None
    shard: str
    nbytes: int | None = None
    offset: int | None = None
    """Where the bytes start in the shard's data buffer (after the header)."""


@dataclass
class CheckpointFiles:
    """What the index and the shard headers say; dtype and shape are None where only the index was read."""

    index_name: str | None
    shard_names: list[str]
    shards_read: int
    missing_shards: list[str]
    tensors: dict[str, Tensor]
    problems: list[Finding] = field(default_factory=list)
    other_indexes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        """Rank numbers in shard names: a pre-partitioned (per-rank) checkpoint."""
        found = {int(m.group(1)) for name in self.shard_names if (m := RANK_PATTERN.search(PurePosixPath(name).name))}
        return sorted(found)


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors a shard declares, from its header alone; raises HeaderError when it is inconsistent
    (length past the end, offsets outside the data, overlaps, holes, duplicate names)."""
    header = parse_header(path)
    return {name: Tensor(e.dtype, e.shape, path.name, e.end - e.begin, e.begin) for name, e in header.entries.items()}


def _load_index(path: Path, policy: Policy) -> dict[str, str]:
    """The index's weight map, read through the policy (a link out of the roots refuses with outside_roots)."""
    try:
        document = load_json_bounded(policy.read_bytes(path, max_bytes=MAX_INDEX_BYTES), path.name)
    except FileTooLarge:
        raise HeaderError("index file is larger than any real index") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeaderError(f"not valid JSON ({exc})") from None
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise HeaderError("has no weight_map object of tensor name -> shard file")
    return weight_map


def _safe_shard_name(name: str) -> bool:
    pure = PurePosixPath(name)
    return not pure.is_absolute() and ".." not in pure.parts and "\\" not in name and "\0" not in name


def scan_checkpoint(directory: Path, policy: Policy) -> CheckpointFiles | None:
    """Index plus shard headers of a model directory; None when it holds no safetensors at all."""
    indexes = sorted(p.name for p in directory.iterdir() if p.name.endswith(INDEX_SUFFIX) and p.is_file())
    shards_on_disk = sorted(p.name for p in directory.iterdir() if p.name.endswith(SHARD_SUFFIX) and p.is_file())
    if not indexes and not shards_on_disk:
        return None
    problems: list[Finding] = []
    weight_map: dict[str, str] | None = None
    index_name = None
    if indexes:
        index_name = PREFERRED_INDEX if PREFERRED_INDEX in indexes else indexes[0]
        try:
            weight_map = _load_index(directory / index_name, policy)
        except HeaderError as exc:
            problems.append(
                Finding("error", "bad_index", f"{index_name} {exc}; the cross-check uses the shard headers alone.")
            )
    if weight_map is not None:
        names = list(dict.fromkeys(weight_map.values()))
    else:
        names = shards_on_disk
    files = CheckpointFiles(index_name, names, 0, [], {}, problems, [i for i in indexes if i != index_name])
    headers = _read_shards(directory, names, policy, files)
    _merge(files, weight_map, headers, shards_on_disk)
    return files


def _read_shards(
    directory: Path, names: list[str], policy: Policy, files: CheckpointFiles
) -> dict[str, dict[str, Tensor]]:
    headers: dict[str, dict[str, Tensor]] = {}
    for name in names:
        if not _safe_shard_name(name):
            files.problems.append(
                Finding(
                    "error",
                    "bad_shard_name",
                    f"the index names shard {name!r}, which is not a plain relative file name.",
                )
            )
            continue
        path = directory / name
        if not path.is_file():
            files.missing_shards.append(name)
            continue
        try:
            headers[name] = read_header(policy.readable(path))
        except ToolFailure as failure:
            files.problems.append(
                Finding(
                    "error",
                    "shard_unreadable",
                    f"shard {name} cannot be read within the server's roots ({failure.code.value}).",
                )
            )
        except HeaderError as exc:
            files.problems.append(Finding("error", "bad_header", f"shard {name} {exc}; its tensors are not counted."))
        except OSError as exc:
            files.problems.append(
                Finding("error", "shard_unreadable", f"shard {name} cannot be read ({exc.strerror}).")
            )
    files.shards_read = len(headers)
    return headers


def _merge(
    files: CheckpointFiles, weight_map: dict[str, str] | None, headers: dict[str, dict[str, Tensor]], on_disk: list[str]
) -> None:
    """Tensors from headers, plus index-only names; disagreements between the two are problems. A name
    in two shard headers is an error: which bytes a loader takes is then undecided (with an index,
    the index's shard is the one kept)."""
    owners: dict[str, list[str]] = {}
    for shard, tensors in headers.items():
        for tensor in tensors:
            owners.setdefault(tensor, []).append(shard)
        files.tensors.update(tensors)
    twice = sorted(t for t, shards in owners.items() if len(shards) > 1)
    if twice:
        example = ", ".join(f"{t} ({' and '.join(owners[t][:2])})" for t in twice[:3])
        files.problems.append(
            Finding(
                "error",
                "tensor_in_two_shards",
                f"{len(twice)} tensors are in more than one shard header (e.g. {example}).",
            )
        )
    if weight_map is not None:
        _merge_index(files, weight_map, headers, on_disk)


def _merge_index(
    files: CheckpointFiles, weight_map: dict[str, str], headers: dict[str, dict[str, Tensor]], on_disk: list[str]
) -> None:
    """The index's shard wins for a tensor; index-only names are kept without dtype and shape."""
    for tensor, shard in weight_map.items():
        if tensor in headers.get(shard, {}):
            files.tensors[tensor] = headers[shard][tensor]
    not_in_header: list[str] = []
    for tensor, shard in weight_map.items():
        if shard in headers:
            if tensor not in headers[shard]:
                not_in_header.append(tensor)
            continue
        files.tensors.setdefault(tensor, Tensor(None, None, shard))
    not_in_index = sorted(t for shard, tensors in headers.items() for t in tensors if weight_map.get(t) != shard)
    files.problems.extend(_index_findings(files, not_in_header, not_in_index, on_disk))


def _index_findings(
    files: CheckpointFiles, not_in_header: list[str], not_in_index: list[str], on_disk: list[str]
) -> list[Finding]:
    found: list[Finding] = []
    if files.missing_shards and len(files.missing_shards) < len(files.shard_names):
        found.append(
            Finding(
                "error",
                "shards_missing",
                f"{len(files.missing_shards)} of {len(files.shard_names)} shards named by the index are absent "
                f"(e.g. {', '.join(files.missing_shards[:3])}): the checkpoint is incomplete.",
            )
        )
    if not_in_header:
        found.append(
            Finding(
                "error",
                "index_tensor_not_in_shard",
                f"{len(not_in_header)} tensors the index places in a shard are not in its header "
                f"(e.g. {', '.join(not_in_header[:3])}).",
            )
        )
    if not_in_index:
        found.append(
            Finding(
                "warning",
                "shard_tensor_not_in_index",
                f"{len(not_in_index)} tensors in shard headers are not mapped there by the index "
                f"(e.g. {', '.join(not_in_index[:3])}); loaders that follow the index never see them.",
            )
        )
    unlisted = sorted(set(on_disk) - set(files.shard_names))
    if unlisted:
        found.append(
            Finding(
                "info",
                "shard_not_in_index",
                f"{len(unlisted)} .safetensors files are not named by the index (e.g. {', '.join(unlisted[:3])}).",
            )
        )
    return found
