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

from ..sources.subjects import Subject
from .commits import Listing, range_commits
from .scope import Scope
from .session import AuditSession

DOCKER_ARG = re.compile(r"^\s*(?:ARG|ENV)\s+(\w*VLLM\w*(?:TAG|VERSION|REF))\s*[= ]\s*[\"']?v?(\d[\w.+-]*)", re.I)
PIN = re.compile(r"""(?:^|["'\s,\[])vllm\s*(?:==|~=|===)\s*v?(\d[\w.+-]*)""", re.I)
PIN_FILES = ("setup.py", "pyproject.toml", "setup.cfg")
COMMITS_SHOWN = 20


@dataclass(frozen=True)
class DeclaredBase:
    version: str
    where: str
    """file:line of the declaration."""
    text: str


def _declaration_files(plugin: Subject) -> list[str]:
    """Top-level build files: Dockerfiles, requirements files, packaging metadata."""
    found = []
    for path in plugin.list():
        name = PurePosixPath(path).name
        if "/" in path.rstrip("/") and not name.lower().startswith("dockerfile"):
            continue
        if (
            name.lower().startswith("dockerfile")
            or (name.startswith("requirements") and name.endswith(".txt"))
            or name in PIN_FILES
        ):
            found.append(path)
    return sorted(found)


def declared_bases(plugin: Subject) -> list[DeclaredBase]:
    """Every declaration of the upstream release the plugin targets, in file order."""
    declared = []
    for path in _declaration_files(plugin):
        docker = PurePosixPath(path).name.lower().startswith("dockerfile")
        text = plugin.read(path).decode(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            match = DOCKER_ARG.match(line) if docker else PIN.search(line)
            if match:
                declared.append(DeclaredBase(match.group(match.lastindex or 1), f"{path}:{number}", line.strip()))
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
        if session.upstream.repo.run("rev-parse", "--verify", "-q", f"{label}^{{commit}}", check=False):
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
