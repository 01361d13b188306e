"""The repository guard: what no `-c` override can undo is refused before git runs.

Nothing a repository configures may make git start a program or reach a remote. Before a
repository's first call, and again whenever its configuration or object store changes, the guard
reads the effective configuration (`git config --list --includes`, which runs nothing) and
compares it with `PROGRAM_KEYS`, the explicit list of keys known to run programs or fetch (a
partial clone or promisor remote would fetch every missing object, running the remote's
transport), and it checks every file git would read objects or configuration from — the object
directory, `objects/info/alternates` (followed as git follows it, nested and quoted entries
included), symlinks inside the object store, included config files, the git dirs' own entries —
lies inside the read roots. A missing object is then `not_found`, never a fetch.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol

from ..foundation.errors import ErrorCode, ToolFailure
from ..foundation.policy import is_within, real
from .git_runner import GIT_TIMEOUT_S, hardened_env, scrub_paths


class GuardedRepository(Protocol):
    """What the guard reads of a repository (core/sources/git.py's `Repository`)."""

    @property
    def top(self) -> Path: ...
    @property
    def git_dir(self) -> Path: ...
    @property
    def common_dir(self) -> Path: ...
    @property
    def allowed(self) -> tuple[Path, ...]: ...


# -- the guard: what no override can undo is refused -------------------------------------------

Handling = Literal["refused", "overridden", "unreachable"]
"""What the runner does about a configuration key (the three constants below)."""

REFUSED: Final = "refused"
"""git would start a program or fetch and no `-c` override can stop it: the repository is refused."""
OVERRIDDEN: Final = "overridden"
"""Neutralised by a `NEUTRALISING_CONFIG` override (or hardened_env) on every call."""
UNREACHABLE: Final = "unreachable"
"""Used only by commands or options the runner never starts (fetch, push, commit, checkout, the
work-tree comparing commands, `--ext-diff`/`--textconv`); fetching itself needs a promisor
remote (refused) and a transport (none allowed)."""


@dataclass(frozen=True)
class ConfigKey:
    pattern: str
    """fnmatch pattern on the key as `git config --list` prints it, lower-cased."""
    handling: Handling
    why: str
    only_when_true: bool = False


PROGRAM_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "extensions.partialclone",
        REFUSED,
        "makes it a partial clone: git fetches every object it lacks from "
        "that remote, starting the remote's transport (an ext:: command, an upload-pack program, ssh)",
    ),
    ConfigKey(
        "remote.*.promisor",
        REFUSED,
        "makes that remote a promisor: git fetches every object it lacks from it, "
        "starting the remote's transport (an ext:: command, an upload-pack program, ssh)",
        only_when_true=True,
    ),
    ConfigKey("core.fsmonitor", OVERRIDDEN, "runs a file-system monitor"),
    ConfigKey("core.hookspath", OVERRIDDEN, "runs hooks"),
    ConfigKey("core.untrackedcache", OVERRIDDEN, "writes the untracked cache into the index"),
    ConfigKey("core.pager", OVERRIDDEN, "runs a pager"),
    ConfigKey("diff.external", OVERRIDDEN, "runs an external diff program"),
    ConfigKey("core.sshcommand", OVERRIDDEN, "runs an ssh command"),
    ConfigKey("credential.helper", OVERRIDDEN, "runs a credential helper"),
    ConfigKey("protocol.allow", OVERRIDDEN, "allows transports (GIT_ALLOW_PROTOCOL= allows none)"),
    ConfigKey(
        "protocol.*.allow", OVERRIDDEN, "allows a transport; ext:: runs any command (GIT_ALLOW_PROTOCOL= allows none)"
    ),
    ConfigKey("diff.submodule", OVERRIDDEN, "reads submodule repositories, which may lie outside the roots"),
    ConfigKey("submodule.recurse", OVERRIDDEN, "recurses into submodule repositories"),
    ConfigKey("gc.auto", OVERRIDDEN, "starts git gc"),
    ConfigKey("maintenance.auto", OVERRIDDEN, "starts git maintenance"),
    ConfigKey("log.showsignature", OVERRIDDEN, "runs the signature program on log/show"),
    ConfigKey("gpg.program", OVERRIDDEN, "runs gpg"),
    ConfigKey("gpg.*.program", OVERRIDDEN, "runs a signature program"),
    ConfigKey("core.askpass", UNREACHABLE, "runs a password prompt (GIT_ASKPASS=false wins too)"),
    ConfigKey(
        "pager.*", UNREACHABLE, "runs a pager only on a terminal; output is always captured (GIT_PAGER=cat wins too)"
    ),
    ConfigKey("diff.*.command", UNREACHABLE, "external diff driver: --no-ext-diff on every diff-producing call"),
    ConfigKey("diff.*.textconv", UNREACHABLE, "text conversion: --no-textconv on every diff-producing call"),
    ConfigKey("filter.*", UNREACHABLE, "clean/smudge/process filters run only against the work tree"),
    ConfigKey("core.alternaterefscommand", UNREACHABLE, "runs only while fetching or receiving"),
    ConfigKey("core.gitproxy", UNREACHABLE, "runs only while fetching over git://"),
    ConfigKey("remote.*.url", UNREACHABLE, "reached only by fetch or push"),
    ConfigKey("remote.*.uploadpack", UNREACHABLE, "runs only while fetching"),
    ConfigKey("remote.*.receivepack", UNREACHABLE, "runs only while pushing"),
    ConfigKey("remote.*.vcs", UNREACHABLE, "a remote helper, run only while fetching or pushing"),
    ConfigKey("url.*.insteadof", UNREACHABLE, "rewrites fetch URLs"),
    ConfigKey("uploadpack.*", UNREACHABLE, "upload-pack settings, used only when serving a fetch"),
    ConfigKey("http.*", UNREACHABLE, "network settings, used only while fetching or pushing"),
    ConfigKey("core.editor", UNREACHABLE, "runs an editor only for commands that edit"),
    ConfigKey("sequence.editor", UNREACHABLE, "runs an editor only while rebasing"),
)
FILE_KEYS = frozenset({"core.excludesfile", "core.attributesfile", "diff.orderfile", "mailmap.file"})
"""Keys naming a file git reads on the calls the runner makes (listing, diffs, logs): like an
include, the file must lie inside the roots (a FIFO outside them would hang every call, and its
content is read outside the policy). The user-level defaults are off: see `hardened_env`."""
INTERPOLATED_PATH_PREFIXES = ("%(", ":(")
"""git expands `%(prefix)/` (its install prefix) and newer `:(optional)` in path-valued keys."""
GIT_DIR_SKIPPED = frozenset({"objects"})
"""Checked by the object-store walk (alternates followed as git follows them)."""
MAX_ALTERNATE_DEPTH = 5
"""git follows nested alternates this deep and no deeper."""
_FALSE = frozenset({"false", "no", "off", "0", ""})


_Stamp = tuple[int, int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_ctime_ns, info.st_size, info.st_ino)


_GUARDED: dict[tuple[str, ...], dict[Path, _Stamp]] = {}
_GUARDED_LOCK = threading.Lock()


def guard_repository(repo: GuardedRepository) -> None:
    """Refuse the repository if anything it configures could make git run a program, fetch, or read
    outside the roots. Checked once per repository and again whenever a file it was decided from changes."""
    key = (str(repo.top), str(repo.git_dir), str(repo.common_dir), *(str(r) for r in repo.allowed))
    with _GUARDED_LOCK:
        known = _GUARDED.get(key)
    if known is not None and all(_stamp(path) == stamp for path, stamp in known.items()):
        return
    guard = _Guard(repo)
    guard.check_config()
    guard.check_git_dirs()
    guard.check_objects()
    with _GUARDED_LOCK:
        _GUARDED[key] = guard.watched


def _blocks_readers(path: Path) -> bool:
    """A FIFO or device: opening or reading it may wait forever."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


class _Guard:
    def __init__(self, repo: GuardedRepository) -> None:
        self.repo = repo
        self.allowed = repo.allowed
        self.watched: dict[Path, _Stamp] = {}
        self.visited: set[Path] = set()

    def watch(self, path: Path) -> None:
        """Stamp a file before reading it: a change made after the stamp is seen on the next call."""
        if path not in self.watched:
            self.watched[path] = _stamp(path)

    def inside(self, path: Path) -> bool:
        return any(is_within(path, root) for root in self.allowed)

    def shown(self, path: Path) -> str:
        """Root-relative spelling for messages (never a resolved absolute path)."""
        for root in self.allowed:
            if is_within(path, root):
                return path.relative_to(root).as_posix() or "."
        return path.name

    # -- configuration ---------------------------------------------------------------------------

    def check_config(self) -> None:
        repo = self.repo
        for path in (
            repo.common_dir / "config",
            repo.common_dir / "config.worktree",
            repo.git_dir / "config.worktree",
            repo.git_dir / "HEAD",
        ):
            self.watch(path)
        proc = subprocess.run(
            ["git", "-C", str(repo.top), "config", "--list", "-z", "--includes", "--show-origin"],
            check=False,
            capture_output=True,
            env=hardened_env(),
            timeout=GIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            lines = proc.stderr.decode(errors="replace").strip().splitlines()
            detail = scrub_paths(lines[-1], self.allowed) if lines else f"exit status {proc.returncode}"
            raise ToolFailure(
                ErrorCode.FAILED, f"git could not read the configuration of {self.shown(repo.top)}: {detail}"
            )
        fields = proc.stdout.split(b"\0")
        for origin, item in zip(fields[0::2], fields[1::2], strict=False):
            source = self._origin(os.fsdecode(origin))
            name, newline, value = os.fsdecode(item).partition("\n")
            self._entry(name, value if newline else None)
            lowered = name.lower()
            if lowered in FILE_KEYS and value:
                self._named_file(name, value)
            if (
                value
                and source is not None
                and (lowered == "include.path" or (lowered.startswith("includeif.") and lowered.endswith(".path")))
            ):
                included = Path(os.path.expanduser(value))
                self.watch(included if included.is_absolute() else source.parent / included)  # created later: seen

    def _origin(self, origin: str) -> Path | None:
        kind, _, location = origin.partition(":")
        if kind != "file" or not location:
            return None
        path = Path(location) if os.path.isabs(location) else self.repo.top / location
        self.watch(path)
        if not self.inside(real(path)):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"The configuration of {self.shown(self.repo.top)} includes a file outside the server's roots "
                "(include.path or includeIf); git would read it on every call. Remove the include, or start the "
                "server with a --root covering it.",
            )
        return path

    def _named_file(self, name: str, value: str) -> None:
        """A file a key names (relative to the work tree, as git resolves it from `-C top`) must lie inside
        the roots."""
        if value.startswith(INTERPOLATED_PATH_PREFIXES):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"The repository {self.shown(self.repo.top)} sets `{name}` to a path git interpolates "
                f"({value[:2]}...); where it leads cannot be checked against the server's roots. Spell the path "
                "out, or unset the key.",
                key=name,
            )
        named = Path(os.path.expanduser(value))
        path = named if named.is_absolute() else self.repo.top / named
        self.watch(path)
        if not self.inside(real(path)):
            raise ToolFailure(
                ErrorCode.OUTSIDE_ROOTS,
                f"The repository {self.shown(self.repo.top)} sets `{name}` to a file outside the server's roots; git "
                "would read it on every call. Unset the key, or start the server with a --root covering the file.",
                key=name,
            )

    def _entry(self, name: str, value: str | None) -> None:
        lowered = name.lower()
        for rule in PROGRAM_KEYS:
            if rule.handling != REFUSED or not fnmatch.fnmatchcase(lowered, rule.pattern):
                continue
            if rule.only_when_true and value is not None and value.strip().lower() in _FALSE:
                continue
            shown = f"{name}={value}" if value is not None else name
            raise ToolFailure(
                ErrorCode.BAD_INPUT,
                f"The repository {self.shown(self.repo.top)} sets `{shown}`, which {rule.why}. The server never "
                "fetches or runs a repository's programs, so it refuses the repository: use a full clone (one made "
                f"without --filter), or, once every object is present, remove the key (`git config --unset {name}`).",
                key=name,
            )

    # -- object store ----------------------------------------------------------------------------

    def check_git_dirs(self) -> None:
        """Every entry of the git dirs (objects aside) is a regular file or a directory inside the roots:
        git reads info/exclude, info/attributes, info/grafts, shallow, packed-refs and refs on the calls
        the runner makes, and a link out of the roots (or a FIFO, which would hang every call) is refused."""
        for top in dict.fromkeys((self.repo.git_dir, self.repo.common_dir)):
            self._git_dir_entries(top, top)

    def _git_dir_entries(self, top: Path, directory: Path) -> None:
        self.watch(directory)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            path = Path(entry.path)
            if directory == top and entry.name in GIT_DIR_SKIPPED:
                continue
            if entry.is_symlink():
                target = real(path)
                if not self.inside(target):
                    raise ToolFailure(
                        ErrorCode.OUTSIDE_ROOTS,
                        f"{self.shown(path)} in the git directory of {self.shown(self.repo.top)} is a link outside the "
                        "server's roots; git would read it on every call. Replace the link with the file, or start "
                        "the server with a --root covering it.",
                    )
                self.watch(path)
                if _blocks_readers(target):
                    raise self._not_a_file(path)
                continue
            if entry.is_dir(follow_symlinks=False):
                self._git_dir_entries(top, path)
            elif _blocks_readers(path):
                raise self._not_a_file(path)

    def _not_a_file(self, path: Path) -> ToolFailure:
        return ToolFailure(
            ErrorCode.BAD_INPUT,
            f"{self.shown(path)} in the git directory of {self.shown(self.repo.top)} is a FIFO or a device, which "
            "would make git wait forever; remove it.",
        )

    def check_objects(self) -> None:
        objects = self.repo.common_dir / "objects"
        if not self.inside(real(objects)):
            raise self._outside("its objects directory is a symlink to another place")
        self._object_dir(objects, 0)

    def _outside(self, what: str) -> ToolFailure:
        return ToolFailure(
            ErrorCode.OUTSIDE_ROOTS,
            f"The object store of {self.shown(self.repo.top)} reads from outside the server's roots ({what}); git "
            "would show another repository's objects. Start the server with a --root covering it, or make the "
            "repository standalone (`git repack -a -d`, then remove objects/info/alternates).",
        )

    def _object_dir(self, path: Path, depth: int) -> None:
        """An object directory as git names it (normalised, symlinks unresolved) and its alternates."""
        resolved = real(path)
        if resolved in self.visited:
            return
        self.visited.add(resolved)
        for watched in (resolved, resolved / "info", resolved / "pack"):
            self.watch(watched)
        self._links(resolved, 0)
        alternates = resolved / "info" / "alternates"
        self.watch(alternates)
        if not os.path.lexists(alternates):
            return
        if not self.inside(real(alternates)):
            raise self._outside(f"{self.shown(alternates)} is a symlink to another place")
        if depth > MAX_ALTERNATE_DEPTH:
            return
        try:
            data = alternates.read_bytes()
        except OSError:
            return
        for line, entry in parse_alternates(data):
            joined = entry if os.path.isabs(entry) else os.path.join(resolved, entry)
            normalised = os.path.normpath(joined)
            target = real(normalised)
            self.watch(target)
            if not self.inside(target):
                raise self._outside(f"{self.shown(alternates)} line {line} names an object directory elsewhere")
            if target.is_dir():
                self._object_dir(Path(normalised), depth + 1)

    def _links(self, directory: Path, depth: int) -> None:
        """Symlinks inside an object directory must lead inside the roots too."""
        if depth > 3:
            return
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            if entry.is_symlink():
                target = real(entry.path)
                if not self.inside(target):
                    raise self._outside(f"a symlink at {self.shown(Path(entry.path))}")
                if target.is_dir() and target not in self.visited:
                    self.visited.add(target)
                    self._links(target, depth + 1)
            elif entry.is_dir(follow_symlinks=False):
                self._links(Path(entry.path), depth + 1)


def parse_alternates(data: bytes) -> list[tuple[int, str]]:
    """The entries of an `objects/info/alternates` file as git reads them: one per line, `#` comments,
    C-quoted entries (which may span lines); the file ends at a NUL. Returns (line number, path)."""
    data = data.split(b"\0", 1)[0]
    entries: list[tuple[int, str]] = []
    position = 0
    while position < len(data):
        line = data.count(b"\n", 0, position) + 1
        quoted = _unquote_c(data, position) if data[position : position + 1] == b'"' else None
        if data[position : position + 1] == b"#":
            entry, end = b"", _line_end(data, position)
        elif quoted is not None:
            entry, end = quoted
        else:
            end = _line_end(data, position)
            entry = data[position:end]
        position = end + 1 if end < len(data) else end
        if entry:
            entries.append((line, os.fsdecode(entry)))
    return entries


def _line_end(data: bytes, start: int) -> int:
    end = data.find(b"\n", start)
    return len(data) if end < 0 else end


_C_ESCAPES = {
    ord("a"): 7,
    ord("b"): 8,
    ord("f"): 12,
    ord("n"): 10,
    ord("r"): 13,
    ord("t"): 9,
    ord("v"): 11,
    ord("\\"): 92,
    ord('"'): 34,
}


def _unquote_c(data: bytes, start: int) -> tuple[bytes, int] | None:
    """git's unquote_c_style: the unquoted bytes and the index just after the closing quote."""
    out = bytearray()
    position = start + 1
    while position < len(data):
        byte = data[position]
        position += 1
        if byte == ord('"'):
            return bytes(out), position
        if byte != ord("\\"):
            out.append(byte)
            continue
        if position >= len(data):
            return None
        escape = data[position]
        position += 1
        if escape in _C_ESCAPES:
            out.append(_C_ESCAPES[escape])
        elif ord("0") <= escape <= ord("3"):
            digits = data[position : position + 2]
            if len(digits) != 2 or not all(ord("0") <= d <= ord("7") for d in digits):
                return None
            out.append(((escape - 48) << 6) | ((digits[0] - 48) << 3) | (digits[1] - 48))
            position += 2
        else:
            return None
    return None
