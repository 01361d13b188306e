"""Real upstream vLLM source trees and git histories built from PyPI release wheels.

PyPI's ``vllm`` wheels carry the whole upstream Python source, so a release's tree is
one ``pip download`` plus extracting the ``*.py`` members; no network clone of the
upstream repository is needed, and the trees are byte-identical to what users run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ._cache import cache_root, file_lock, require_free_disk
from ._git import deterministic_commit, git

COMPLETE_MARKER = ".complete"
RELEASE_AUTHOR = "vLLM Release <release@vllm.invalid>"
CONTRIBUTOR = "vLLM Contributor <contributor@vllm.invalid>"
#: A wheel is about 0.3 GB and its extracted ``*.py`` about 50 MB; keep headroom.
_DOWNLOAD_GIB = 2.0


def _wheel_for(version: str, wheels: Path) -> Path | None:
    """An already downloaded ``vllm-<version>-*.whl`` in ``wheels``, if any."""
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    return found[0] if found else None


def _download_wheel(version: str, wheels: Path) -> Path:
    """Download the release wheel (no deps) into ``wheels`` and return its path.

    pip writes into a private temporary folder first, so an interrupted download never
    leaves a truncated ``.whl`` where ``_wheel_for`` would pick it up.
    """
    require_free_disk(wheels, _DOWNLOAD_GIB)
    tmp = wheels / f".download-{version}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"vllm=={version}",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                str(tmp),
            ],
            capture_output=True,
            text=True,
        )
        got = sorted(tmp.glob(f"vllm-{version}-*.whl"))
        if proc.returncode != 0 or not got:
            raise RuntimeError(
                f"pip download vllm=={version} failed (rc={proc.returncode}):\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        final = wheels / got[0].name
        os.replace(got[0], final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract_python(wheel: Path, dest: Path) -> int:
    """Extract only the ``vllm/**.py`` members of ``wheel`` under ``dest``."""
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            pure = PurePosixPath(name)
            if (
                info.is_dir()
                or not name.endswith(".py")
                or pure.parts[:1] != ("vllm",)
                or ".." in pure.parts
                or pure.is_absolute()
            ):
                continue
            target = dest.joinpath(*pure.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    return count


def upstream_source(version: str) -> Path:
    """Return a directory containing the real upstream ``vllm/`` Python source of ``version``.

    The tree is ``<cache>/upstream/vllm-<version>/``, built once from the PyPI wheel
    (reused from ``<cache>/wheels`` when already there). Extraction goes into a temporary
    sibling that gets a ``.complete`` marker and is renamed into place, so readers only
    ever see a finished tree; a leftover tree without the marker is rebuilt.
    """
    root = cache_root()
    wheels = root / "wheels"
    upstream = root / "upstream"
    final = upstream / f"vllm-{version}"
    if (final / COMPLETE_MARKER).is_file():
        return final
    with file_lock(upstream / f".vllm-{version}.lock"):
        if (final / COMPLETE_MARKER).is_file():
            return final
        wheels.mkdir(parents=True, exist_ok=True)
        wheel = _wheel_for(version, wheels) or _download_wheel(version, wheels)
        require_free_disk(upstream, 0.5)
        tmp = upstream / f".vllm-{version}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        tmp.mkdir(parents=True)
        started = time.perf_counter()
        count = _extract_python(wheel, tmp)
        if count == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"{wheel.name} holds no vllm/*.py files")
        (tmp / COMPLETE_MARKER).write_text(f"{wheel.name}\n{count} files\n{time.perf_counter() - started:.2f} s\n")
        os.replace(tmp, final)
    return final


@dataclass
class UpstreamHistory:
    """A git repository whose commits are upstream releases (tags ``v<version>``).

    Tests add fine-grained commits on top with :meth:`add_commit` to model upstream
    changes between two releases.
    """

    path: Path
    tags: list[str] = field(default_factory=list)

    def rev_parse(self, ref: str) -> str:
        """Full sha of ``ref`` (a tag such as ``v0.26.0``, a branch, ``HEAD``...)."""
        return git(self.path, "rev-parse", f"{ref}^{{commit}}").strip()

    def add_commit(
        self,
        changes: Mapping[str, str | None],
        message: str,
        author: str = CONTRIBUTOR,
    ) -> str:
        """Write (text) or delete (``None``) repo-relative files, commit exactly those.

        Returns the new commit's sha. Dates are deterministic (see ``_git``).
        """
        if not changes:
            raise ValueError("add_commit needs at least one change")
        paths: list[str] = []
        for rel, text in changes.items():
            pure = PurePosixPath(rel)
            if pure.is_absolute() or ".." in pure.parts or not pure.parts:
                raise ValueError(f"not a repository-relative path: {rel!r}")
            target = self.path.joinpath(*pure.parts)
            if text is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
            paths.append(pure.as_posix())
        git(self.path, "add", "-A", "-f", "--", *paths)
        return deterministic_commit(self.path, message, author)


def _existing_prefixes(root: Path, include: Sequence[str] | None) -> list[str]:
    """Pathspecs for ``git add``: the ``include`` prefixes present in ``root``."""
    if include is None:
        return ["vllm"] if (root / "vllm").exists() else []
    return [p.rstrip("/") for p in include if (root / p.rstrip("/")).exists()]


def build_upstream_history(
    dest: Path,
    versions: Sequence[str],
    include: Sequence[str] | None = None,
    *,
    sources: Mapping[str, Path] | None = None,
) -> UpstreamHistory:
    """Create a git repository at ``dest`` with one commit per release, in order.

    Each commit's tree is the release's extracted source (only paths under the
    ``include`` prefixes when given, e.g. ``["vllm/models/"]``, to keep tests fast) and
    is tagged ``v<version>``. ``sources`` maps a version to a ready tree (a directory
    containing ``vllm/``) instead of :func:`upstream_source`, for synthetic histories.

    Files are staged straight from the cached tree (``--work-tree``) with one
    ``git add -A`` per release, so nothing is copied except the final checkout.
    """
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists and is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    git(dest, "init", "-q", "-b", "main")
    git_dir = str(dest / ".git")
    # Bytecode next to a cached tree (if anything ever imported it) is not source.
    # (An ``:(exclude)`` pathspec silently matches nothing with ``--work-tree`` on git 2.39.)
    (dest / ".git" / "info").mkdir(exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text("__pycache__/\n*.pyc\n")
    history = UpstreamHistory(path=dest)
    for version in versions:
        root = Path(sources[version]) if sources and version in sources else upstream_source(version)
        tree = ("--git-dir", git_dir, "--work-tree", str(root))
        git(root, *tree, "read-tree", "--empty")
        prefixes = _existing_prefixes(root, include)
        if prefixes:
            git(root, *tree, "add", "-A", "--", *prefixes)
        deterministic_commit(
            dest,
            f"Release v{version}",
            RELEASE_AUTHOR,
            git_args=tree,
            allow_empty=True,
        )
        git(dest, "tag", f"v{version}")
        history.tags.append(f"v{version}")
    if history.tags:
        git(dest, "reset", "-q", "--hard", "HEAD")
    return history
