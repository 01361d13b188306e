"""What a dummy trim writes beside the rewritten config: tokenizer, generation, chat-template and
processor assets (one copy of each format, no weights), the smoke cases that reach the covered
paths, and a small image when a vision tower needs one."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..foundation.atomic import TRIM_MANIFEST
from ..foundation.errors import ToolFailure
from ..foundation.policy import FileTooLarge, Policy
from ..target.extract import file_sha256
from .cases import ServeSettings, SmokeCase, SmokeCases

MANIFEST_NAME = TRIM_MANIFEST
"""Also the marker by which overwrite recognises an earlier trim output (core/foundation/atomic.py)."""
MAX_JSON_ASSET_BYTES = 64 * 1024 * 1024
IMAGE_NAME = "smoke_image.png"
FAST_TOKENIZER = "tokenizer.json"
OTHER_TOKENIZER_FORMATS = (
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tiktoken.model",
    "qwen.tiktoken",
    "tekken.json",
)
ASSETS = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt", ".index.json")
LONG_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
DEFAULT_CONTEXT = 4096
PROMPT_MARGIN = 32
STATEMENT = (
    "A trimmed model proves execution paths (the layers, kernels and loaders it exercises), not the original "
    "model's accuracy, routing distributions or performance."
)


@dataclass(frozen=True)
class AssetChoice:
    copy: list[str]
    skipped: list[tuple[str, str]]


def _json_document(source: Path, name: str, policy: Policy) -> Any:
    """A JSON asset of the source, read through the policy (a link out of the roots refuses); None when unparsable."""
    try:
        return json.loads(policy.read_bytes(source / name, max_bytes=MAX_JSON_ASSET_BYTES))
    except (ValueError, FileTooLarge, RecursionError):
        return None


def _remote_code(source: Path, names: set[str], policy: Policy) -> list[str]:
    """Python files the config's and tokenizer config's auto_map name (needed with trust_remote_code)."""
    found: list[str] = []
    for document in ("config.json", "tokenizer_config.json"):
        if document not in names:
            continue
        parsed = _json_document(source, document, policy)
        auto_map = parsed.get("auto_map") if isinstance(parsed, dict) else None
        if not isinstance(auto_map, dict):
            continue
        for value in auto_map.values():
            for ref in value if isinstance(value, list) else [value]:
                if isinstance(ref, str) and "--" not in ref and "." in ref:
                    module = ref.rsplit(".", 1)[0] + ".py"
                    if module in names and module not in found:
                        found.append(module)
    return found


def choose_assets(source: Path, policy: Policy) -> AssetChoice:
    """The files a dummy load needs, one tokenizer format: tokenizer.json (what vLLM's fast tokenizer
    loads) supersedes the slow formats when present. Every chosen file passes the read policy after
    resolution: one that links outside the readable places refuses the plan (outside_roots)."""
    names = {p.name for p in source.iterdir() if p.is_file()}
    copy = [n for n in ASSETS if n in names]
    skipped: list[tuple[str, str]] = []
    if FAST_TOKENIZER in names:
        copy.append(FAST_TOKENIZER)
        skipped += [(n, f"another format of {FAST_TOKENIZER}") for n in OTHER_TOKENIZER_FORMATS if n in names]
    else:
        copy += [n for n in OTHER_TOKENIZER_FORMATS if n in names]
    copy += _remote_code(source, names, policy)
    for name in copy:
        policy.readable(source / name)
    for name in sorted(names - set(copy) - {"config.json"} - {n for n, _ in skipped}):
        why = "weights (dummy mode loads none)" if name.endswith(WEIGHT_SUFFIXES) else "not read by a dummy load"
        skipped.append((name, why))
    return AssetChoice(copy, skipped)


def copy_assets(source: Path, names: list[str], destination: Path, policy: Policy) -> dict[str, str]:
    """Copy each asset (through the read policy, symlinks of a hub cache followed); name -> sha256."""
    hashes: dict[str, str] = {}
    for name in names:
        with policy.open_readable(source / name) as handle, open(destination / name, "xb") as out:
            shutil.copyfileobj(handle, out, 1 << 20)
        hashes[name] = file_sha256(destination / name)
    return hashes


def has_chat_template(source: Path, names: list[str], policy: Policy) -> bool:
    if "chat_template.jinja" in names or "chat_template.json" in names:
        return True
    if "tokenizer_config.json" not in names:
        return False
    parsed = _json_document(source, "tokenizer_config.json", policy)
    return isinstance(parsed, dict) and bool(parsed.get("chat_template"))


def tiny_png(size: int = 64) -> bytes:
    """A plain RGB PNG (no imaging library): the input an image case sends to a vision tower."""
    row = b"\x00" + bytes([200, 80, 40]) * size
    raw = row * size

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


# -- smoke cases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseNeeds:
    """What the kept paths need from requests."""

    text_covers: list[str]
    long_tokens: int | None
    long_covers: list[str]
    mtp: bool
    chat: bool
    image: str | None
    """The submodel an image input reaches, if any."""


def default_context(needs: CaseNeeds, max_positions: int | None) -> int:
    """Room for the longest case (words may take two tokens each), within the model's positions."""
    wanted = DEFAULT_CONTEXT
    if needs.long_tokens:
        wanted = max(wanted, 1 << (2 * (needs.long_tokens + PROMPT_MARGIN) + 64).bit_length())
    return min(wanted, max_positions) if max_positions else wanted


def long_words(needs: CaseNeeds, context: int) -> int | None:
    """Words of the long prompt: past the threshold, yet within the context at two tokens a word."""
    if not needs.long_tokens:
        return None
    return min(needs.long_tokens + PROMPT_MARGIN, (context - 64) // 2)


def build_cases(needs: CaseNeeds, context: int) -> SmokeCases:
    """One request per way of reaching a path; the serve settings the paths need."""
    cases = [
        SmokeCase(
            name="text",
            kind="completion",
            prompt="The capital of France is",
            covers="backbone: " + ", ".join(needs.text_covers),
        ),
    ]
    words = long_words(needs, context)
    if words and needs.long_tokens and words > needs.long_tokens:
        prompt = " ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(words))
        cases.append(
            SmokeCase(name="long-context", kind="completion", prompt=prompt, covers=", ".join(needs.long_covers))
        )
    if needs.chat:
        cases.append(
            SmokeCase(
                name="chat", kind="chat", messages=[{"role": "user", "content": "Say hello."}], covers="chat template"
            )
        )
    if needs.mtp:
        cases.append(
            SmokeCase(
                name="mtp-draft",
                kind="completion",
                prompt="Count: one two three",
                covers="MTP layer (serve.speculative_config)",
            )
        )
    if needs.image:
        cases.append(
            SmokeCase(name="image", kind="image", image=IMAGE_NAME, prompt="Describe the image.", covers=needs.image)
        )
    serve = ServeSettings(
        load_format="dummy",
        max_model_len=context,
        speculative_config={"method": "mtp", "num_speculative_tokens": 1} if needs.mtp else None,
    )
    return SmokeCases(serve=serve, cases=cases)


def related_examples(models_dir: Path, raw: dict[str, Any], policy: Policy, limit: int = 20) -> list[str]:
    """Trimmed-model examples (directories with a config.json) of the same architecture or model type;
    an example whose config links outside the readable places is skipped, never read."""
    if not models_dir.is_dir():
        return []
    wanted = set(raw.get("architectures") or [])
    found: list[str] = []
    for entry in sorted(models_dir.iterdir()):
        config = entry / "config.json"
        if not config.is_file():
            continue
        try:
            other = json.loads(policy.read_bytes(config, max_bytes=1 << 20))
        except (ValueError, FileTooLarge, RecursionError, ToolFailure):
            continue
        if isinstance(other, dict) and (
            set(other.get("architectures") or []) & wanted or other.get("model_type") == raw.get("model_type")
        ):
            found.append(entry.name)
        if len(found) >= limit:
            break
    return found
