"""The path chokepoint: every path a tool reads or writes is resolved and checked here.

Containment is decided on resolved paths, component by component, so `/allowed-evil` is not
inside `/allowed` and a symlink cannot lead out of a root.

Three rules live here and nowhere else:

- every file the server reads is checked after resolution (`readable`, `read_bytes`,
  `readable_entries` for a directory another process will read), so a symlink — the file itself,
  a parent directory, a hub-cache snapshot link — never leads outside the readable places: the read
  roots, the output roots (so what a trim wrote can be inspected and smoke-tested by the same server;
  reading never makes anything writable, which only `writable` decides) and the readable-only places;
- an output is a new directory strictly inside an output root (never the root itself, never above
  one), so its staging siblings lie inside the root too; it may replace an existing path only when
  that path is an earlier output of this server that the state directory recorded writing (a marker
  alone is not enough), and is not, does not contain and does not lie above a git repository, a read
  root, a protected path or the state directory, and holds no file tracked by an enclosing
  repository (`writable(..., overwrite=True)` and `replaceable`, with `atomic.check_replaceable`);
- a path in a message is the caller's own spelling or root-relative (`display`), never a resolved
  absolute path the caller did not give.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, BinaryIO

from .atomic import REPLACE_RULE, OutputRecords, check_replaceable
from .errors import ErrorCode, ToolFailure

HF_CACHE_LABEL = "<hf-cache>"

TrackedFiles = Callable[["Policy", Path, Path], list[str]]
"""(policy, work tree top, target) -> the files that work tree tracks at or below target; raises
ToolFailure or ValueError when it cannot tell (sources/git.py `tracked_below`)."""


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


class FileTooLarge(ValueError):
    """`Policy.read_bytes` met a file larger than the caller's limit (nothing was read)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


_WRITES_REFUSED: ContextVar[str | None] = ContextVar("writes_refused", default=None)
"""The tool whose call is running, where that tool's effect class is not *writes*."""


@contextmanager
def writes_refused(tool: str) -> Iterator[None]:
    """Run a call of a reads/validates tool: `Policy.writable` refuses everything inside it."""
    token = _WRITES_REFUSED.set(tool)
    try:
        yield
    finally:
        _WRITES_REFUSED.reset(token)


@dataclass
class Policy:
    """Read roots, output roots, protected paths and the mode of one server."""

    roots: list[Path]
    output_roots: list[Path]
    mode: Mode = Mode.EDIT
    readable_extra: list[Path] = field(default_factory=list)
    protected: list[Path] = field(default_factory=list)
    labels: dict[Path, str] = field(default_factory=dict)
    """How a readable-only place is named in messages (`<hf-cache>`, `<site-packages>`)."""
    state_dir: Path | None = None
    """The server's own state directory: never an output, never replaced."""
    outputs: OutputRecords | None = None
    """The outputs the state directory recorded writing: without them, overwrite replaces nothing."""
    tracked_files: TrackedFiles | None = None
    """Asks a git work tree what it tracks: without it, overwrite replaces nothing inside a work tree."""

    @classmethod
    def create(
        cls,
        roots: list[str] | None = None,
        output_roots: list[str] | None = None,
        mode: Mode | str = Mode.EDIT,
    ) -> Policy:
        resolved = [real(r) for r in (roots or [os.getcwd()])]
        for root in resolved:
            if not root.is_dir():
                raise ToolFailure(
                    ErrorCode.BAD_INPUT, f"Root {root} is not a directory; pass an existing directory to --root."
                )
        outputs = [real(r) for r in output_roots] if output_roots else list(resolved)
        policy = cls(roots=resolved, output_roots=outputs, mode=Mode(mode))
        policy.allow_read(hf_cache_dir(), label=HF_CACHE_LABEL)
        return policy

    # -- registration of readable-only and protected places -------------------------------

    def allow_read(self, path: str | os.PathLike[str], label: str | None = None) -> None:
        """A readable place that is never writable (site-packages, the HF cache)."""
        resolved = real(path)
        if resolved not in self.readable_extra:
            self.readable_extra.append(resolved)
        self.labels.setdefault(resolved, label or f"<{resolved.name or 'readable place'}>")
        self.protect(resolved)

    def protect_state(
        self, path: str | os.PathLike[str], outputs: OutputRecords | None = None, tracked: TrackedFiles | None = None
    ) -> None:
        """The server's state directory: no output goes into it, contains it or replaces it. `outputs`: the
        record of the outputs it wrote (`state.OutputRegistry`), by which overwrite recognises one; `tracked`:
        how a work tree is asked what it tracks (`git.tracked_below`), so overwrite never replaces tracked files."""
        self.state_dir = real(path)
        self.protect(self.state_dir)
        self.outputs = outputs
        if tracked is not None:  # keeps a lister set earlier (without one, overwrite in a work tree is refused)
            self.tracked_files = tracked

    def to_spec(self) -> dict[str, Any]:
        """What a job worker needs to apply the overwrite rule again (`from_spec`), as plain JSON."""
        return {
            "roots": [str(p) for p in self.roots],
            "output_roots": [str(p) for p in self.output_roots],
            "mode": self.mode.value,
            "protected": [str(p) for p in self.protected],
            "state_dir": str(self.state_dir) if self.state_dir else None,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any], outputs: OutputRecords | None, tracked: TrackedFiles | None) -> Policy:
        policy = cls(
            roots=[Path(p) for p in spec["roots"]],
            output_roots=[Path(p) for p in spec["output_roots"]],
            mode=Mode(spec["mode"]),
            protected=[Path(p) for p in spec["protected"]],
        )
        if spec.get("state_dir"):
            policy.protect_state(spec["state_dir"], outputs, tracked)
        return policy

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

    def display(self, path: str | os.PathLike[str]) -> str:
        """A path for a message: the caller's own spelling when relative, else relative to the root (or
        readable place) holding it — never a resolved absolute path the caller did not give. Only an
        absolute path outside every known place is shown as it is, since only a caller can have spelled it."""
        text = os.fspath(path)
        if not os.path.isabs(text):
            return text
        lexical = Path(os.path.normpath(text))
        candidates = [lexical]
        try:
            candidates.append(real(lexical.parent) / lexical.name if lexical.name else real(lexical))
            candidates.append(real(lexical))
        except (OSError, ValueError):
            pass
        for candidate in candidates:
            shown = self._place_relative(candidate)
            if shown is not None:
                return shown
        return text

    def _place_relative(self, path: Path) -> str | None:
        for index, root in enumerate(self.roots):
            if is_within(path, root):
                relative = path.relative_to(root).as_posix()
                if index == 0:
                    return relative
                return root.name if relative == "." else f"{root.name}/{relative}"
        for root in self.output_roots:
            if is_within(path, root):
                relative = path.relative_to(root).as_posix()
                return root.name if relative == "." else f"{root.name}/{relative}"
        for place in self.readable_extra:
            if is_within(path, place):
                relative = path.relative_to(place).as_posix()
                label = self.labels.get(place, "<readable place>")
                return label if relative == "." else f"{label}/{relative}"
        if self.state_dir is not None and is_within(path, self.state_dir):
            relative = path.relative_to(self.state_dir).as_posix()
            return "<state>" if relative == "." else f"<state>/{relative}"
        return None

    def readable(self, path: str | os.PathLike[str]) -> Path:
        """Resolve a path a tool will read; refuse anything outside the read roots (after every symlink)."""
        resolved = real(self._absolute(path))
        if self.is_readable(resolved):
            return resolved
        raise ToolFailure(
            ErrorCode.OUTSIDE_ROOTS,
            f"{self.display(path)} is outside the server's roots and output roots (after following symlinks); start "
            "the server with --root covering it.",
        )

    def is_readable(self, resolved: Path) -> bool:
        """Whether an already resolved path lies in a read root, an output root or a readable place. An output
        root makes its outputs readable, not the state directory an operator placed inside it."""
        if any(is_within(resolved, r) for r in [*self.roots, *self.readable_extra]):
            return True
        in_state = self.state_dir is not None and is_within(resolved, self.state_dir)
        return not in_state and any(is_within(resolved, r) for r in self.output_roots)

    def open_readable(self, path: str | os.PathLike[str]) -> BinaryIO:
        """A file the server reads, opened after the root check on its resolved path (see open_resolved)."""
        resolved = self.readable(path)
        try:
            return open_resolved(resolved)
        except FileNotFoundError:
            raise ToolFailure(ErrorCode.NOT_FOUND, f"{self.display(path)} does not exist.") from None
        except OSError as exc:
            swapped = exc.errno == errno.ELOOP
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS if swapped else ErrorCode.BAD_INPUT,
                f"{self.display(path)} "
                + ("became a symlink after it was checked" if swapped else f"cannot be read ({exc.strerror or exc})")
                + "; nothing was read.",
            ) from None

    def read_bytes(self, path: str | os.PathLike[str], *, max_bytes: int | None = None) -> bytes:
        """The bytes of a file the server reads, after the root check on its resolved path; never more
        than `max_bytes` (FileTooLarge, raised before any byte is read when the size says so)."""
        with self.open_readable(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise FileTooLarge(size)
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise FileTooLarge(len(data))
        return data

    def readable_entries(self, directory: str | os.PathLike[str]) -> Path:
        """Resolve a directory that another process (the target interpreter, vLLM) will read as a whole,
        and refuse when any entry in it is a symlink leading outside the readable places: that process
        follows links the server cannot check file by file."""
        resolved = self.readable(directory)
        if not resolved.is_dir():
            return resolved
        shown = self.display(directory)
        with os.scandir(resolved) as entries:
            for entry in entries:
                if entry.is_symlink() and not self.is_readable(real(entry.path)):
                    raise ToolFailure(
                        ErrorCode.OUTSIDE_ROOTS,
                        f"{shown}/{entry.name} is a symlink leading outside the server's roots; start the server "
                        "with --root covering its target, or replace the link with the file.",
                    )
        return resolved

    def writable(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Resolve an output path (it may not exist yet); refuse outside output roots or into protected trees.

        An output is a directory strictly inside an output root (`output_place`). With `overwrite`, an
        existing path is accepted only when it may be replaced (`replaceable`). Inside a call of a tool
        that does not write (`writes_refused`), nothing is writable: output roots are readable to every
        tool, so this is what keeps a read tool from writing into one."""
        refusing = _WRITES_REFUSED.get()
        if refusing is not None:
            raise ToolFailure(
                ErrorCode.FAILED,
                f"{refusing} does not write files, yet asked for an output path; this is a server bug.",
            )
        shown = self.display(path)
        target = _resolve_nonexistent(self._absolute(path), shown)
        if not any(is_within(target, r) for r in self.output_roots):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"{shown} is outside the output roots; choose a path under --output-root.",
            )
        if ".git" in target.parts or any(is_within(target, p) or is_within(p, target) for p in self.protected):
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{shown} is or contains a protected path (upstream source, site-packages, the HF cache, "
                "a source checkpoint, the server's state directory or a git directory); choose a fresh output "
                "directory.",
            )
        if overwrite and (target.exists() or target.is_symlink()):
            self.replaceable(target, shown)
        else:
            self.output_place(target, shown)
        return target

    def output_place(self, target: Path, shown: str) -> None:
        """An output lies strictly inside an output root: never the root itself, never above one (its staging
        and retired siblings are then inside the root as well)."""
        for root in self.output_roots:
            if is_within(root, target):
                what = "is an output root" if root == target else "contains an output root"
                raise ToolFailure(
                    ErrorCode.PROTECTED_PATH,
                    f"{shown} {what} of this server; an output is a directory strictly inside an output root, never "
                    "the root itself nor a directory above one (its staging copy is written beside it), and overwrite "
                    "replaces only an earlier output of this server inside one. Choose a directory inside it, e.g. "
                    f"{shown.rstrip('/')}/<name>.",
                )

    def replaceable(self, target: Path, shown: str) -> None:
        """The one overwrite rule, applied in the call and again right before the swap (`staged_directory`):
        `target` is no read root, state directory or output root and holds none; it is an earlier output of
        this server that the state directory recorded writing, holding no git repository
        (`atomic.check_replaceable`); and no file below it is tracked by an enclosing repository."""
        for root in self.roots:
            if is_within(root, target):
                what = "is a read root" if root == target else "contains a read root"
                raise ToolFailure(ErrorCode.PROTECTED_PATH, f"{shown} {what} of this server; {REPLACE_RULE}.")
        if self.state_dir is not None and (is_within(self.state_dir, target) or is_within(target, self.state_dir)):
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH, f"{shown} is, holds or lies in the server's state directory; {REPLACE_RULE}."
            )
        self.output_place(target, shown)
        if self.outputs is None:
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{shown} exists and this server has no state directory recording its outputs, so it cannot tell an "
                f"earlier output; {REPLACE_RULE}, or delete {shown} yourself.",
            )
        check_replaceable(target, shown, self.outputs)
        self._refuse_tracked(target, shown)

    def record_output(self, target: Path, shown: str) -> None:
        """Record an output once its swap succeeded, so a later overwrite recognises it."""
        if self.outputs is None:
            return
        try:
            self.outputs.record(target)
        except OSError as exc:
            raise ToolFailure(
                ErrorCode.FAILED,
                f"{shown} was written, but recording it in the state directory failed ({exc.strerror or exc}); "
                "overwrite will not recognise it as this server's output (delete it yourself to write it again).",
            ) from None

    def _refuse_tracked(self, target: Path, shown: str) -> None:
        """Refuse when any git work tree holding `target` tracks a file below it (`git ls-files`, through
        the hardened runner). Every enclosing work tree is asked, not only the nearest: a repository
        created inside another hides nothing the outer one tracks. A work tree outside the read roots
        cannot be checked: refused."""
        for top in (place for place in target.parents if os.path.lexists(place / ".git")):
            self._refuse_tracked_by(top, target, shown)

    def _refuse_tracked_by(self, top: Path, target: Path, shown: str) -> None:
        advice = f"Choose a new output directory, or delete {shown} yourself if it is yours."
        if not self.is_readable(top):
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{shown} lies inside a git work tree outside the server's read roots, so whether that repository "
                f"tracks files below it cannot be checked; overwrite never replaces tracked files. {advice}",
            )
        where = self.display(top)
        where = "the read root" if where == "." else where
        try:
            if self.tracked_files is None:
                raise ToolFailure(ErrorCode.FAILED, "this server has no way to ask it")
            names = self.tracked_files(self, top, target)
        except (ToolFailure, ValueError) as exc:
            detail = exc.message if isinstance(exc, ToolFailure) else "it does not hold the output"
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{shown} lies inside the git work tree at {where}, whose tracked files could not be listed "
                f"({detail}); overwrite never replaces tracked files. {advice}",
            ) from None
        if names:
            raise ToolFailure(
                ErrorCode.PROTECTED_PATH,
                f"{shown} holds {len(names)} file(s) tracked by the git repository at {where} (e.g. {names[0]}): "
                f"replacing it would lose their uncommitted edits and every untracked file beside them; overwrite "
                f"never replaces tracked files. {advice}",
            )

    def require_mode_allows(self, effect: Effect, tool: str) -> None:
        if self.mode is Mode.REVIEW and effect is Effect.WRITES:
            raise ToolFailure(
                ErrorCode.REVIEW_MODE,
                f"{tool} writes files and the server runs in review mode; restart it with --mode edit to use it.",
            )

    def relative(self, path: Path, root: Path) -> str:
        """A repository-relative POSIX path for results (never an absolute internal path)."""
        return path.relative_to(root).as_posix()


def open_resolved(resolved: str | os.PathLike[str]) -> BinaryIO:
    """Open a checked, resolved path for reading without following a final symlink (one swapped in after
    the check raises ELOOP); only a regular file opens (O_NONBLOCK: a FIFO planted there cannot hang the
    open). For job workers that got resolved paths too."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(resolved, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def copy_resolved(resolved: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
    """Copy a checked, resolved file's bytes (never a link) to a new file."""
    with open_resolved(resolved) as source, open(destination, "xb") as out:
        shutil.copyfileobj(source, out, 1 << 20)


def _resolve_nonexistent(path: Path, shown: str) -> Path:
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
            raise ToolFailure(ErrorCode.BAD_INPUT, f"{shown} contains '.' or '..' components; pass a plain path.")
        resolved = resolved / part
    return resolved


def hf_cache_dir() -> Path:
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expanduser(home)) / "hub"
