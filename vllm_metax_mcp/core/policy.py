"""The path chokepoint: every path a tool reads or writes is resolved and checked here.

Containment is decided on resolved paths, component by component, so `/allowed-evil` is not
inside `/allowed` and a symlink cannot lead out of a root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from .errors import ErrorCode, ToolFailure


class Mode(str, Enum):
    EDIT = "edit"
    REVIEW = "review"


class Effect(str, Enum):
    """What a tool may do to the world; declared once per tool, drives annotations and review mode."""

    READS = "reads"
    VALIDATES = "validates"
    WRITES = "writes"


def real(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def is_within(path: Path, root: Path) -> bool:
    """Component-wise containment of two resolved paths."""
    return path == root or root in path.parents


@dataclass
class Policy:
    """Read roots, output roots, protected paths and the mode of one server."""

    roots: list[Path]
    output_roots: list[Path]
    mode: Mode = Mode.EDIT
    readable_extra: list[Path] = field(default_factory=list)
    protected: list[Path] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        roots: list[str] | None = None,
        output_roots: list[str] | None = None,
        mode: Mode | str = Mode.EDIT,
    ) -> "Policy":
        resolved = [real(r) for r in (roots or [os.getcwd()])]
        for root in resolved:
            if not root.is_dir():
                raise ToolFailure(ErrorCode.BAD_INPUT, f"Root {root} is not a directory; pass an existing directory to --root.")
        outputs = [real(r) for r in output_roots] if output_roots else list(resolved)
        policy = cls(roots=resolved, output_roots=outputs, mode=Mode(mode))
        policy.allow_read(hf_cache_dir())
        return policy

    # -- registration of readable-only and protected places -------------------------------

    def allow_read(self, path: str | os.PathLike[str]) -> None:
        """A readable place that is never writable (site-packages, the HF cache)."""
        resolved = real(path)
        if resolved not in self.readable_extra:
            self.readable_extra.append(resolved)
        self.protect(resolved)

    def protect(self, path: str | os.PathLike[str]) -> None:
        """Never write into this tree (upstream source, site-packages, a source checkpoint)."""
        resolved = real(path)
        if resolved not in self.protected:
            self.protected.append(resolved)

    # -- checks ------------------------------------------------------------------------------

    def base(self) -> Path:
        return self.roots[0]

    def _absolute(self, path: str | os.PathLike[str]) -> Path:
        raw = Path(os.path.expanduser(os.fspath(path)))
        return raw if raw.is_absolute() else self.base() / raw

    def readable(self, path: str | os.PathLike[str]) -> Path:
        """Resolve a path a tool will read; refuse anything outside the read roots."""
        resolved = real(self._absolute(path))
        if any(is_within(resolved, r) for r in [*self.roots, *self.readable_extra]):
            return resolved
        raise ToolFailure(
            ErrorCode.OUTSIDE_ROOTS,
            f"{path} is outside the server's roots; start the server with --root covering it.",
        )

    def writable(self, path: str | os.PathLike[str]) -> Path:
        """Resolve an output path (it may not exist yet); refuse outside output roots or into protected trees."""
        target = _resolve_nonexistent(self._absolute(path))
        if not any(is_within(target, r) for r in self.output_roots):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"{path} is outside the output roots; choose a path under --output-root.",
            )
        if ".git" in target.parts or any(is_within(target, p) or is_within(p, target) for p in self.protected):
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{path} is or contains a protected path (upstream source, site-packages, the HF cache, "
                "a source checkpoint or a git directory); choose a fresh output directory.",
            )
        return target

    def require_mode_allows(self, effect: Effect, tool: str) -> None:
        if self.mode is Mode.REVIEW and effect is Effect.WRITES:
            raise ToolFailure(
                ErrorCode.REVIEW_MODE,
                f"{tool} writes files and the server runs in review mode; restart it with --mode edit to use it.",
            )

    def relative(self, path: Path, root: Path) -> str:
        """A repository-relative POSIX path for results (never an absolute internal path)."""
        return path.relative_to(root).as_posix()


def _resolve_nonexistent(path: Path) -> Path:
    """realpath of the deepest existing ancestor, with the missing tail appended."""
    missing: list[str] = []
    current = path
    while not current.exists() and not current.is_symlink():
        missing.append(current.name)
        if current.parent == current:
            break
        current = current.parent
    resolved = real(current)
    for part in reversed(missing):
        if part in ("", ".", ".."):
            raise ToolFailure(ErrorCode.BAD_INPUT, f"{path} contains '.' or '..' components; pass a plain path.")
        resolved = resolved / part
    return resolved


def hf_cache_dir() -> Path:
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expanduser(home)) / "hub"
