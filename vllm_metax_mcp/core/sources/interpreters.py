"""Which interpreters the server may run: one decision, made here for every caller.

The operator names them at start-up (`serve --python PATH`, repeatable; `call --python` likewise).
Without `--python` the server's default is its own interpreter and the `python3` found on the
absolute entries of `PATH` (in review mode, not one inside a read root). Then:

- review mode: only those run, whoever names one — `environment establish`, a recorded
  environment, anything. A `python` override on another tool is refused outright, as before.
- edit mode: those, and an interpreter a tool argument (or a record made in edit mode) names
  inside a read root (a venv beside the plugin, say).

Every accepted interpreter carries its reason, and the environment record keeps it.

An interpreter is identified by the directory it is invoked from (resolved) together with the
file that runs (resolved): a venv's `bin/python` is usually a symlink to the base interpreter, yet
runs with the venv's site-packages (and `.pth` files), so the resolved file alone would let any
venv pass for the base interpreter; `bin/python` and `bin/python3` of one venv are the same
interpreter. What runs is the allowed spelling (the operator's), never the caller's.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..foundation.errors import ErrorCode, ToolFailure, not_found
from ..foundation.policy import Mode, Policy, is_within, real

Reason = Literal["operator", "server_interpreter", "path_default", "inside_roots"]
"""Why an interpreter was accepted: named with --python; the server's own interpreter (no --python);
`python3` on PATH (no --python); named by a call inside a read root (edit mode only)."""

Source = Literal["override", "establish", "record"]
"""Who asks: a `python` override on an analysis or validation tool; `environment establish`; a record."""

REASONS: dict[str, str] = {
    "operator": "named by the operator with --python",
    "server_interpreter": "the server's own interpreter (the default when no --python is given)",
    "path_default": "python3 on PATH when the server started (the default when no --python is given)",
    "inside_roots": "named by a call and inside a read root (edit mode)",
}


def identity(path: str | os.PathLike[str]) -> Path:
    """The invocation path with its directory resolved and its last component kept as it is."""
    absolute = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    return real(absolute.parent) / absolute.name


def same_interpreter(a: Path, b: Path) -> bool:
    """Invoked from the same (resolved) directory, running the same (resolved) file."""
    return a.parent == b.parent and real(a) == real(b)


@dataclass(frozen=True)
class AllowedInterpreter:
    path: Path
    reason: Literal["operator", "server_interpreter", "path_default"]


@dataclass(frozen=True)
class AcceptedInterpreter:
    """An interpreter the policy lets run, and why."""

    path: Path
    reason: Reason

    def as_record(self) -> dict[str, Any]:
        return {"path": str(self.path), "reason": self.reason, "why": REASONS[self.reason]}


def _on_absolute_path(name: str) -> str | None:
    """`which`, over the absolute PATH entries only: a relative entry would resolve against the
    working directory, which is often the very repository under review."""
    entries = [entry for entry in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(entry)]
    return shutil.which(name, path=os.pathsep.join(entries)) if entries else None


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@dataclass(frozen=True)
class Interpreters:
    """The operator's allowed interpreters; `accept` is the one place an interpreter is decided."""

    allowed: tuple[AllowedInterpreter, ...] = ()
    named: bool = False
    """Whether the operator named them (--python) or they are the server's default."""

    @classmethod
    def create(cls, named: list[str] | None, policy: Policy) -> Interpreters:
        """From `--python` (each must be an executable file), else the server's default."""
        allowed: list[AllowedInterpreter] = []
        if named:
            for spelling in named:
                located = spelling if os.sep in spelling else (_on_absolute_path(spelling) or spelling)
                path = identity(located)
                if not _executable(path):
                    raise ToolFailure(
                        ErrorCode.BAD_INPUT,
                        f"--python {spelling} is not an executable file; name the interpreter's path.",
                    )
                allowed.append(AllowedInterpreter(path, "operator"))
        else:
            if sys.executable:  # empty when embedded
                allowed.append(AllowedInterpreter(identity(sys.executable), "server_interpreter"))
            found = _on_absolute_path("python3")
            if found:
                path = identity(found)
                inside = any(is_within(path, root) for root in policy.roots)
                if not (inside and policy.mode is Mode.REVIEW):
                    allowed.append(AllowedInterpreter(path, "path_default"))
        unique: dict[Path, AllowedInterpreter] = {}
        for item in allowed:
            unique.setdefault(item.path, item)
        return cls(tuple(unique.values()), bool(named))

    def default(self) -> str:
        """The interpreter `environment establish` probes when the call names none."""
        if not self.allowed:
            raise not_found("No interpreter: start the server with --python PATH, or pass python.")
        if not self.named:
            for item in self.allowed:
                if item.reason == "path_default":
                    return str(item.path)
        return str(self.allowed[0].path)

    def listing(self) -> str:
        """What is allowed, in words (no paths: the caller did not give them)."""
        if self.named:
            return f"{len(self.allowed)} interpreter(s) named with --python"
        return "the defaults: the server's own interpreter and python3 on PATH"

    def accept(self, policy: Policy, python: str, source: Source) -> AcceptedInterpreter:
        """Decide whether `python` may run for this caller; raise with the precise reason if not."""
        if "\0" in python:
            raise ToolFailure(ErrorCode.BAD_INPUT, "python contains a NUL byte.")
        if source == "override" and policy.mode is not Mode.EDIT:
            raise ToolFailure(
                ErrorCode.REVIEW_MODE,
                "python overrides are accepted in edit mode only; in review mode the environment record's "
                "interpreter runs.",
            )
        shown = policy.display(python)
        if os.sep not in python and not os.path.isabs(python):
            located = _on_absolute_path(python)
            if not located:
                raise not_found(f"{python} is not on PATH; pass the interpreter's path.")
            candidate = identity(located)
        else:
            raw = Path(os.path.expanduser(python))
            candidate = identity(raw if raw.is_absolute() else policy.base() / raw)
        who = "The environment record names" if source == "record" else "The call names"
        for item in self.allowed:
            if same_interpreter(item.path, candidate):
                return self._usable(AcceptedInterpreter(item.path, item.reason), shown)
        if policy.mode is Mode.EDIT and any(is_within(candidate, root) for root in policy.roots):
            return self._usable(AcceptedInterpreter(candidate, "inside_roots"), shown)
        allowed = self.listing()
        if policy.mode is Mode.REVIEW:
            raise ToolFailure(
                ErrorCode.REVIEW_MODE,
                f"{who} the interpreter {shown}, which the operator did not allow: in review mode only the "
                f"interpreters named with `serve --python` run (now: {allowed}). Restart the server with --python "
                "naming it, or establish the environment with an allowed one.",
            )
        raise ToolFailure(
            ErrorCode.OUTSIDE_ROOTS,
            f"{who} the interpreter {shown}, which is neither allowed by the operator (now: {allowed}) nor inside the "
            "server's roots; restart the server with --python naming it.",
        )

    @staticmethod
    def _usable(accepted: AcceptedInterpreter, shown: str) -> AcceptedInterpreter:
        if not _executable(accepted.path):
            raise not_found(f"{shown} is not an executable interpreter.")
        return accepted
