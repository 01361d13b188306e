"""Upgrade-window completeness (the status action): the forked files whose base, their closest
upstream release, is older than the release the plugin declares it targets, and the upstream
commits between the two that the fork did not bring in.

The declared base is read from the plugin's own files as evidence: a Docker build argument naming
vLLM's tag or version (`ARG VLLM_TAG=v0.27.1`), a pin in a requirements file (`vllm==0.9.2`), or
a pin in setup.py / pyproject.toml / setup.cfg. Each file's closest release is diff_model's (the
newest release with the fewest differing lines, as the audit's ranges take it). The missing commits
are the commits of the file's range (its counterpart's, renames followed) that lie below the
declared release: entries of its ledger range, each awaiting a disposition.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..foundation.errors import ToolFailure
from ..sources.subjects import Subject
from .commits import Listing, range_commits
from .scope import Scope
from .session import AuditSession

DOCKER_ARG = re.compile(r"^\s*(?:ARG|ENV)\s+VLLM_(?:TAG|VERSION|REF|BRANCH)\s*[= ]\s*[\"']?v?(\d[\w.+-]*)")
"""vLLM's own release variable (a plugin's `VLLM_<PLUGIN>_VERSION` is its own version, not this)."""
REQUIREMENT = re.compile(r"vllm(?:\[[\w,\s-]*\])?\s*(?:==|~=|===)\s*v?(\d[\w.+-]*)\s*(?:;.*)?", re.I)
"""A whole requirement string pinning vllm (extras and a marker allowed): `vllm[audio]==0.9.1`."""
QUOTED = re.compile(r"""["']([^"'\n]*)["']""")
PIN_FILES = ("setup.py", "pyproject.toml", "setup.cfg")
COMMITS_SHOWN = 20


@dataclass(frozen=True)
class DeclaredBase:
    version: str
    where: str
    """file:line of the declaration."""
    text: str


def _declaration_files(plugin: Subject) -> list[str]:
    """Dockerfiles anywhere, requirements files at the top or in a `requirements/` folder, and the
    packaging metadata at the top."""
    found = []
    for path in plugin.list():
        pure = PurePosixPath(path)
        top = len(pure.parts) == 1 or (len(pure.parts) == 2 and pure.parts[0] == "requirements")
        requirements = top and pure.suffix == ".txt" and (pure.name.startswith("requirements") or len(pure.parts) == 2)
        if (
            pure.name.lower().startswith("dockerfile")
            or requirements
            or (len(pure.parts) == 1 and pure.name in PIN_FILES)
        ):
            found.append(path)
    return sorted(found)


def _pins(path: str, text: str) -> list[tuple[int, str, str]]:
    """(line, version, text) of each vllm pin: a requirements line, or a whole quoted requirement
    string of packaging metadata; comments never count."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0].strip()
        if not code:
            continue
        if path.endswith(".txt"):
            candidates = [code]
        else:
            candidates = QUOTED.findall(code)
        for candidate in candidates:
            match = REQUIREMENT.fullmatch(candidate.strip())
            if match:
                found.append((number, match.group(1), line.strip()))
    return found


def declared_bases(plugin: Subject) -> list[DeclaredBase]:
    """Every declaration of the upstream release the plugin targets, in file order."""
    declared = []
    for path in _declaration_files(plugin):
        text = plugin.read(path).decode(errors="replace")
        if PurePosixPath(path).name.lower().startswith("dockerfile"):
            for number, line in enumerate(text.splitlines(), 1):
                if match := DOCKER_ARG.match(line):
                    declared.append(DeclaredBase(match.group(1), f"{path}:{number}", line.strip()))
            continue
        declared += [DeclaredBase(version, f"{path}:{n}", line) for n, version, line in _pins(path, text)]
    return declared


@dataclass(frozen=True)
class Behind:
    """A file whose closest release is older than the declared one: the commits of its range up to
    the declared release (those the upgrade window did not bring in)."""

    shas: list[str]
    """The first COMMITS_SHOWN, oldest first."""
    total: int


@dataclass
class Window:
    declared: list[DeclaredBase]
    release: str | None = None
    """The release (as `releases` or the upstream repository names it) the declarations name."""
    behind: dict[str, Behind] = field(default_factory=dict)
    unknowns: list[str] = field(default_factory=list)


def _release_label(session: AuditSession, version: str, releases: tuple[str, ...]) -> str | None:
    """The release label naming `version`: one of `releases`, else a tag of the upstream repository."""
    for label in releases:
        if label.lstrip("vV") == version:
            return label
    for label in (f"v{version}", version):
        try:
            session.upstream.repo.resolve_commit(label)
        except ToolFailure:
            continue
        return label
    return None


def _declared_release(session: AuditSession, window: Window, releases: tuple[str, ...]) -> str | None:
    """The commit of the release the plugin declares, when it lies between the files' bases and the target."""
    versions = list(dict.fromkeys(d.version for d in window.declared))
    if not versions:
        return None
    if len(versions) > 1:
        shown = ", ".join(f"{d.version} at {d.where}" for d in window.declared)
        window.unknowns.append(f"The declared upstream releases disagree ({shown}): compared with {versions[0]}.")
    label = _release_label(session, versions[0], releases)
    if label is None:
        window.unknowns.append(f"No release or tag of the upstream repository names the declared {versions[0]}.")
        return None
    commit = session.upstream.repo.resolve_commit(label)
    if session.upstream.repo.text("merge-base", commit, session.target).strip() != commit:
        window.unknowns.append(f"The declared release {label} is not an ancestor of the target: nothing lags it.")
        return None
    window.release = label
    return commit


def upgrade_window(session: AuditSession, scope: Scope, listing: Listing, releases: tuple[str, ...]) -> Window:
    """Per file whose base is older than the declared release, the commits of its range below it."""
    window = Window(declared_bases(session.plugin))
    declared = _declared_release(session, window, releases)
    if declared is None:
        return window
    order = {c.sha: i for i, c in enumerate(listing.ordered())}
    below: dict[str, frozenset[str]] = {}
    for track in scope.tracks:
        base = scope.bases[track.local].commit
        if base == declared or session.upstream.repo.text("merge-base", base, declared).strip() != base:
            continue
        if base not in below:
            below[base] = range_commits(session.upstream.repo, base, declared)
        shas = sorted((s for s in listing.hits.get(track.local, {}) if s in below[base]), key=order.__getitem__)
        window.behind[track.local] = Behind(shas[:COMMITS_SHOWN], len(shas))
    return window
