"""Upstream commits per plugin file: every commit in the file's range that touches its upstream
counterpart (or the modules the counterpart imports), renames and moves followed, with what else
each commit touched and which upstream symbols it changed.

Git is asked once per distinct base, not once per file: a path-limited `log --full-diff --raw`
over every tracked path sharing that base lists the commits touching them and every file each
commit touched, with both blob ids. Only where a path's history in range starts with an addition,
in a commit that also deleted a file, does one `log --follow -n1` ask whether that addition was a
rename; the older name is then listed the same way up to the rename. Changed symbols compare the
module index's per-definition hashes of the two blobs (records cached by blob id), so listing the
same range again parses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal, cast

from ..code.module_index import ModuleRecord, RecordCache, module_name
from ..sources.git import Repository
from ..sources.subjects import Entry, Subject, SubjectKind, read_blobs

LOG_FORMAT = "--format=%x1e%H%x1f%an <%ae>%x1f%aI%x1f%ct%x1f%s"
NULL_BLOB = "0" * 40
MAX_RENAMES = 16
"""Older names followed per path; a longer chain is reported, not walked."""
NON_PRODUCTION_DIRS = frozenset(
    {
        "tests",
        "test",
        "docs",
        "doc",
        "benchmarks",
        "benchmark",
        "examples",
        ".github",
        ".buildkite",
        ".circleci",
        ".gitlab",
        "ci",
        ".ci",
    }
)
CODE_SUFFIXES = frozenset({".py", ".pyi", ".cu", ".cuh", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".hip"})
WHOLE_MODULE = "*"
IMPORT_PREFIX = "import:"
ChangeStatus = Literal["A", "M", "D", "T"]
"""How a commit touched a file; renames appear as D plus A (listing runs with --no-renames)."""
SymbolChangeKind = Literal["added", "removed", "changed", "moved", "unparsed"]


def is_production(path: str) -> bool:
    """Code that ships: not under a tests/docs/benchmarks/examples/CI directory, not a test file,
    and of a code kind (Python, CUDA/C++ sources); markdown, configs and data are not."""
    pure = PurePosixPath(path)
    if any(part in NON_PRODUCTION_DIRS for part in pure.parts[:-1]):
        return False
    name = pure.name
    if name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"):
        return False
    return pure.suffix in CODE_SUFFIXES


# -- the log ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    path: str
    status: ChangeStatus
    old_blob: str | None
    new_blob: str | None


@dataclass
class Commit:
    sha: str
    author: str
    date: str
    timestamp: int
    subject: str
    changes: dict[str, Change] = field(default_factory=dict)
    """Every file the commit touched, by path."""


@dataclass(frozen=True)
class Hit:
    """A tracked upstream file as one commit touched it."""

    path: str
    """The file's path at this commit."""
    target_path: str
    """Its path at the target."""
    previous: str | None = None
    """The path it had before, when this commit moved it."""


@dataclass(frozen=True)
class Track:
    """What to list for one plugin file: upstream paths at the target, from its base."""

    local: str
    paths: tuple[str, ...]
    """The counterpart first, then the other upstream files the local file carries (`merged`), then
    (include_dependencies) the upstream modules they import."""
    base: str
    """Base commit: the range is base..target."""
    base_path: str | None = None
    """The counterpart's path at the base (from pairing there), when known."""
    merged: int = 0
    """How many of `paths` after the counterpart are files the local file also carries."""


@dataclass
class Listing:
    commits: dict[str, Commit] = field(default_factory=dict)
    hits: dict[str, dict[str, list[Hit]]] = field(default_factory=dict)
    """Local file -> commit sha -> the tracked files that commit touched."""
    followed: dict[str, list[str]] = field(default_factory=dict)
    """Local file -> older upstream names its counterpart had in range (newest first)."""
    unknowns: list[str] = field(default_factory=list)

    def ordered(self) -> list[Commit]:
        """Commits oldest first (committer time, then sha), the order to review them in."""
        return sorted(self.commits.values(), key=lambda c: (c.timestamp, c.sha))

    def files_of(self, sha: str) -> list[str]:
        return sorted(local for local, by_commit in self.hits.items() if sha in by_commit)

    def hits_of(self, sha: str) -> list[Hit]:
        """The tracked files a commit touched, each once."""
        found = {hit.path: hit for by_commit in self.hits.values() for hit in by_commit.get(sha, [])}
        return [found[path] for path in sorted(found)]


def _blob(sha: str) -> str | None:
    return None if sha == NULL_BLOB else sha


@dataclass(frozen=True)
class RawChange:
    """One `--raw` line of a log: the status letters (with a rename's score), both blobs, the path,
    and for a rename or copy the path before."""

    status: str
    old_blob: str | None
    new_blob: str | None
    path: str
    previous: str | None = None


@dataclass(frozen=True)
class LogRecord:
    sha: str
    author: str
    date: str
    timestamp: int
    subject: str
    changes: list[RawChange]


def log_records(raw: bytes) -> list[LogRecord]:
    """The commits of a `log -z --raw --no-abbrev` run with LOG_FORMAT, as git printed them (a
    rename or copy, listed with -M or -C, carries two paths)."""
    records = []
    for record in raw.split(b"\x1e")[1:]:
        header, _, body = record.partition(b"\0")
        sha, author, date, stamp, subject = header.decode(errors="replace").split("\x1f", 4)
        tokens = [t.decode(errors="replace") for t in body.lstrip(b"\n").split(b"\0")]
        changes, index = [], 0
        while index + 1 < len(tokens):
            if not tokens[index].startswith(":"):
                index += 1
                continue
            _mode_a, _mode_b, old, new, status = tokens[index][1:].split(" ")
            two = status[:1] in ("R", "C") and index + 2 < len(tokens)
            previous, path = (tokens[index + 1], tokens[index + 2]) if two else (None, tokens[index + 1])
            changes.append(RawChange(status, _blob(old), _blob(new), path, previous))
            index += 3 if two else 2
        records.append(LogRecord(sha, author, date, int(stamp), subject.strip(), changes))
    return records


def parse_log(raw: bytes) -> list[Commit]:
    """Commits of a `log -z --raw --no-abbrev --no-renames` run, newest first as git printed them."""
    commits = []
    for record in log_records(raw):
        commit = Commit(record.sha, record.author, record.date, record.timestamp, record.subject)
        for change in record.changes:
            status = cast(ChangeStatus, change.status[0])
            commit.changes[change.path] = Change(change.path, status, change.old_blob, change.new_blob)
        commits.append(commit)
    return commits


def log_range(repo: Repository, base: str, upper: str, paths: list[str]) -> list[Commit]:
    """Non-merge commits in base..upper touching `paths`, each with every file it touched."""
    specs = [f":(literal){p}" for p in paths]
    raw = repo.run(
        "log",
        "--no-merges",
        "--no-renames",
        "--full-diff",
        "--raw",
        "--no-abbrev",
        "-z",
        LOG_FORMAT,
        f"{base}..{upper}",
        "--",
        *specs,
    )
    return parse_log(raw)


def renamed_from(repo: Repository, commit: str, path: str) -> str | None:
    """The path `commit` moved to `path` from, if git's rename detection (as `--follow` runs it,
    against this one destination) pairs the addition with a deletion."""
    raw = repo.run(
        "log", "--follow", "-M", "--name-status", "-z", "--format=%x1e%H", "-n1", commit, "--", f":(literal){path}"
    )
    for record in raw.split(b"\x1e")[1:]:
        tokens = record.partition(b"\0")[2].lstrip(b"\n").split(b"\0")
        if len(tokens) >= 3 and tokens[0][:1] == b"R" and tokens[2].decode() == path:
            return tokens[1].decode()
    return None


@dataclass(frozen=True)
class _Segment:
    path: str
    target_path: str
    base: str
    upper: str
    follow: bool = True


def list_commits(repo: Repository, tracks: list[Track], target: str) -> Listing:
    """Every commit in each track's range touching its paths, renames followed back to the base."""
    listing = Listing()
    touched: dict[tuple[str, str], dict[str, Hit]] = {}
    """(target path, base) -> sha -> hit."""
    older: dict[tuple[str, str], list[str]] = {}
    pending = sorted({_Segment(p, p, t.base, target) for t in tracks for p in t.paths}, key=lambda s: (s.base, s.path))
    rounds = 0
    while pending and rounds <= MAX_RENAMES:
        pending, rounds = _walk(repo, pending, listing, touched, older), rounds + 1
    listing.unknowns += [
        f"{s.target_path}: more than {MAX_RENAMES} renames; history before {s.upper} is not listed." for s in pending
    ]
    extra = _unfollowed_bases(tracks, older, listing, target)
    if extra:
        _walk(repo, extra, listing, touched, older)
    for track in tracks:
        mine = listing.hits.setdefault(track.local, {})
        for path in track.paths:
            for sha, hit in touched.get((path, track.base), {}).items():
                mine.setdefault(sha, []).append(hit)
        names = [name for path in track.paths[:1] for name in older.get((path, track.base), [])]
        if names:
            listing.followed[track.local] = names
    return listing


def _walk(
    repo: Repository,
    segments: list[_Segment],
    listing: Listing,
    touched: dict[tuple[str, str], dict[str, Hit]],
    older: dict[tuple[str, str], list[str]],
) -> list[_Segment]:
    """List one round of segments (grouped by range) and return the older names to follow next."""
    groups: dict[tuple[str, str], list[_Segment]] = {}
    for segment in segments:
        groups.setdefault((segment.base, segment.upper), []).append(segment)
    following: list[_Segment] = []
    for (base, upper), members in groups.items():
        commits = log_range(repo, base, upper, sorted({s.path for s in members}))
        for commit in commits:
            listing.commits.setdefault(commit.sha, commit)
        for segment in members:
            mine = [c for c in commits if segment.path in c.changes]
            hits = touched.setdefault((segment.target_path, segment.base), {})
            for commit in mine:
                known = hits.get(commit.sha)
                if known is None:
                    hits[commit.sha] = Hit(segment.path, segment.target_path)
                elif not segment.follow and _moved(commit, known, segment.path):
                    hits[commit.sha] = Hit(known.path, known.target_path, segment.path)  # a move only pairing saw
            first = mine[-1] if mine else None
            if not (segment.follow and first and first.changes[segment.path].status == "A" and _deletes(first)):
                continue
            source = renamed_from(repo, first.sha, segment.path)
            if source is None:
                continue
            hits[first.sha] = Hit(segment.path, segment.target_path, source)
            older.setdefault((segment.target_path, segment.base), []).append(source)
            following.append(_Segment(source, segment.target_path, base, f"{first.sha}^"))
    return following


def _deletes(commit: Commit) -> bool:
    """Whether the commit deleted a file: a rename's source is one (`-M`, as `--follow` runs it, pairs
    an addition only with a deletion), so an addition in a commit deleting nothing needs no git call."""
    return any(change.status == "D" for change in commit.changes.values())


def _moved(commit: Commit, added: Hit, deleted: str) -> bool:
    return added.previous is None and commit.changes[added.path].status == "A" and commit.changes[deleted].status == "D"


def _unfollowed_bases(
    tracks: list[Track], older: dict[tuple[str, str], list[str]], listing: Listing, target: str
) -> list[_Segment]:
    """Counterparts whose path at the base git's rename detection never reached: list that path
    too (no further following), so a move git cannot see still brings its commits."""
    extra = []
    for track in tracks:
        if not track.base_path or not track.paths:
            continue
        counterpart = track.paths[0]
        reached = {counterpart, *older.get((counterpart, track.base), [])}
        if track.base_path in reached:
            continue
        older.setdefault((counterpart, track.base), []).append(track.base_path)
        extra.append(_Segment(track.base_path, counterpart, track.base, target, follow=False))
        listing.unknowns.append(
            f"{track.local}: git found no rename from {track.base_path} (the counterpart at the base) "
            f"to {counterpart}; commits touching it in range are listed too, from the pairing at the base."
        )
    return extra


@dataclass(frozen=True)
class OtherFiles:
    """What a commit touched besides its tracked files."""

    production: list[str]
    """Production modules (`is_production`)."""
    other: list[str]
    """Tests, docs, benchmarks, CI and non-code files."""


def other_files(commit: Commit, hits: list[Hit]) -> OtherFiles:
    mapped = {hit.path for hit in hits} | {hit.previous for hit in hits if hit.previous}
    rest = sorted(set(commit.changes) - mapped)
    return OtherFiles([p for p in rest if is_production(p)], [p for p in rest if not is_production(p)])


def commit_patch(repo: Repository, commit: str, hits: list[Hit] | None) -> list[str]:
    """The commit's patch, of its tracked files (`hits`, old names too) or whole (None)."""
    specs = []
    if hits is not None:
        specs = [
            "--",
            *(f":(literal){p}" for p in sorted({h.path for h in hits} | {h.previous for h in hits if h.previous})),
        ]
    return (
        repo.run("show", "--format=", "--patch", "--no-color", "-M", commit, *specs)
        .decode(errors="replace")
        .splitlines()
    )


def range_commits(repo: Repository, base: str, target: str) -> frozenset[str]:
    """Every commit in base..target: what a `commit` evidence item or an entry must lie in."""
    return frozenset(repo.text("rev-list", f"{base}..{target}").split())


# -- changed symbols --------------------------------------------------------------------------


class BlobSet(Subject):
    """Blobs by id, so the record cache can index file versions found in a log (keys are blob ids)."""

    kind = SubjectKind.REVISION

    def __init__(self, repo: Repository, shas: Iterable[str]) -> None:
        super().__init__()
        self.repo = repo
        self.shas = sorted(set(shas))

    def _entries(self) -> dict[str, Entry]:
        return {sha: Entry(sha, sha) for sha in self.shas}

    def _read_many(self, entries: list[Entry]) -> dict[str, bytes]:
        blobs = read_blobs(self.repo, [e.sha for e in entries])
        return {e.path: blobs[e.sha] for e in entries}


def definition_hashes(record: ModuleRecord) -> dict[str, str]:
    """`Name` and `Class.method` -> body hash (a class by its own lines, methods apart), and
    `import:<alias>` -> what the alias is bound to, so an import change is a change too."""
    hashes: dict[str, str] = {}
    for definition in record.definitions:
        if definition.kind == "class":
            hashes.setdefault(definition.name, definition.own_hash)
            for method, digest in definition.members.items():
                hashes.setdefault(f"{definition.name}.{method}", digest)
        else:
            hashes.setdefault(definition.name, definition.body_hash)
    for item in record.imports:
        if item.branch not in ("taken", "conditional"):
            continue  # lazy imports belong to their function's body
        for original, alias in item.names or [[item.module, item.alias or item.module.split(".")[0]]]:
            if alias != "*":
                hashes.setdefault(f"{IMPORT_PREFIX}{alias}", f"{item.module}:{original}")
    return hashes


@dataclass(frozen=True)
class SymbolChange:
    path: str
    """The upstream file at the commit."""
    symbol: str
    """`module:Qualified.name`, `module:import:<alias>`, or `module:*` for the whole module."""
    change: SymbolChangeKind

    @property
    def qualified(self) -> str:
        return self.symbol.partition(":")[2]


@dataclass(frozen=True)
class Touched:
    """A commit and the tracked files it touched (`Listing.hits_of`)."""

    commit: Commit
    hits: list[Hit]


@dataclass(frozen=True)
class Versions:
    """A tracked file's blob before and after a commit (None: it did not exist)."""

    old: str | None
    new: str | None


def _versions(commit: Commit, hit: Hit) -> Versions:
    change = commit.changes[hit.path]
    old = commit.changes[hit.previous].old_blob if hit.previous and hit.previous in commit.changes else change.old_blob
    return Versions(old, change.new_blob)


def symbol_changes(repo: Repository, cache: RecordCache, touched: list[Touched]) -> dict[str, list[SymbolChange]]:
    """Commit sha -> the upstream symbols it changed in its tracked files (records parsed in one batch)."""
    versions = [_versions(item.commit, hit) for item in touched for hit in item.hits if hit.path.endswith(".py")]
    wanted = {blob for version in versions for blob in (version.old, version.new) if blob}
    blobs = BlobSet(repo, wanted)
    records = cache.get_many(blobs, blobs.shas) if wanted else {}
    found: dict[str, list[SymbolChange]] = {}
    for item in touched:
        changes: list[SymbolChange] = []
        for hit in item.hits:
            changes += _file_changes(hit, _versions(item.commit, hit), records)
        found[item.commit.sha] = changes
    return found


def _file_changes(hit: Hit, versions: Versions, records: dict[str, ModuleRecord]) -> list[SymbolChange]:
    old, new = versions.old, versions.new
    module = module_name(hit.path) or hit.path
    whole = f"{module}:{WHOLE_MODULE}"
    if old is None or new is None:
        return [SymbolChange(hit.path, whole, "added" if old is None else "removed")]
    if not hit.path.endswith(".py") or records[old].error or records[new].error:
        return [SymbolChange(hit.path, whole, "moved" if old == new else "unparsed")]
    before, after = definition_hashes(records[old]), definition_hashes(records[new])
    changes = [
        SymbolChange(
            hit.path,
            f"{module}:{name}",
            "added" if name not in before else "removed" if name not in after else "changed",
        )
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name)
    ]
    if not changes and hit.previous:
        return [SymbolChange(hit.path, whole, "moved")]
    if not changes and old != new:
        return [SymbolChange(hit.path, whole, "changed")]  # module-level code outside any definition
    return changes
