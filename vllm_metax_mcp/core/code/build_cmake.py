"""The Python extension modules a repository's CMake build defines, read from its CMakeLists.txt files as text.

`build_files` merges them with setup.py's declarations. Only the project's own build counts: the
top-level CMakeLists.txt (and those setup.py points a CMake extension at) and what they reach through
`add_subdirectory`, never vendored code or tests; only Python module targets, never plain libraries.
"""

from __future__ import annotations

import posixpath
import re
from bisect import bisect_right
from dataclasses import dataclass, field

from ..sources.subjects import Subject
from .build_switches import read_file

CMAKE = "CMakeLists.txt"
TARGET = re.compile(
    r"^[ \t]*(\w*_extension_target|pybind11_add_module|nanobind_add_module|python3?_add_library|add_library)\s*\(",
    re.I | re.M,
)
"""CMake commands that make a Python extension module (`add_library` only as a MODULE)."""
SUBDIRECTORY = re.compile(r"^[ \t]*add_subdirectory\s*\(([^)]*)\)", re.I | re.M)
SET = re.compile(r"^[ \t]*(?:set\s*\(\s*|list\s*\(\s*(APPEND)\s+)(\w+)([^)]*)\)", re.I | re.M)
"""`set(VAR ...)` and `list(APPEND VAR ...)`: what `${VAR}` in a target's arguments stands for."""
KEYWORD = re.compile(r"[A-Z][A-Z0-9_]+")
WORD = re.compile(r'"[^"]*"|[^\s"]+')
CURRENT_DIR = re.compile(r"\$\{CMAKE_CURRENT_(?:SOURCE|LIST)_DIR\}/?")
ROOT_DIR = re.compile(r"\$\{(?:CMAKE|PROJECT)_SOURCE_DIR\}/?")
OUTSIDE = frozenset({"third_party", "thirdparty", "3rdparty", "external", "extern", "tests", "test"})
"""Directories whose CMake files build vendored code or tests, never the project's extensions."""


@dataclass(frozen=True)
class CMakeTarget:
    """A Python module target of the project's CMake build."""

    target: str
    module: str
    """The target, prefixed by its `DESTINATION` package (`vllm._C`) when it names one."""
    packaged: bool
    """It names a `DESTINATION`: `module` is final, not just the target's name."""
    where: str
    how: str
    sources: list[str] = field(default_factory=list)
    """Repository paths of its literal sources (relative ones resolved against the file's directory)."""


@dataclass(frozen=True)
class _Pending:
    """A directory `add_subdirectory` reaches, with the variables its parent had set."""

    directory: str
    variables: dict[str, list[str]]


def _words(text: str, variables: dict[str, list[str]]) -> list[str]:
    """The arguments of one command, `${VAR}` replaced by what `set`/`list(APPEND)` gave it."""
    words = []
    for word in (w.strip('"') for w in WORD.findall(text)):
        whole = re.fullmatch(r"\$\{(\w+)\}", word)
        words += variables.get(whole.group(1), [word]) if whole else [word]
    return words


def _located(word: str, directory: str) -> str | None:
    """The repository path a CMake path names from `directory` (the file's own); None where a variable
    stays unknown or the path leaves the repository."""
    current, rooted = CURRENT_DIR.match(word), ROOT_DIR.match(word)
    if current:
        word = word[current.end() :]
    elif rooted:
        word, directory = word[rooted.end() :], ""
    path = posixpath.normpath(posixpath.join(directory, word))
    if "${" in path or "$<" in path or path.startswith(("/", "..")):
        return None
    return "" if path == "." else path


def _sources(rest: list[str], directory: str) -> list[str]:
    """Literal files after `SOURCES` (or after the target name and its options), up to the next keyword."""
    listed = rest[rest.index("SOURCES") + 1 :] if "SOURCES" in rest else rest
    while listed and KEYWORD.fullmatch(listed[0]):
        listed = listed[1:]
    end = next((i for i, word in enumerate(listed) if KEYWORD.fullmatch(word)), len(listed))
    return [path for word in listed[:end] if (path := _located(word, directory))]


def _variables(text: str, inherited: dict[str, list[str]]) -> dict[str, list[str]]:
    variables = dict(inherited)
    for found in SET.finditer(text):
        values = _words(found.group(3), variables)
        variables[found.group(2)] = (variables.get(found.group(2), []) if found.group(1) else []) + values
    return variables


def _targets(path: str, text: str, variables: dict[str, list[str]]) -> list[CMakeTarget]:
    """Python module targets of one CMake file (`DESTINATION pkg` makes the module `pkg.<target>`)."""
    directory = posixpath.dirname(path)
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    found = []
    for match in TARGET.finditer(text):
        words = _words(text[match.end() : text.find(")", match.end())], variables)
        command = match.group(1)
        if not words or "${" in words[0] or (command.lower() == "add_library" and words[1:2] != ["MODULE"]):
            continue
        target, rest = words[0], words[1:]
        destination = rest[rest.index("DESTINATION") + 1] if "DESTINATION" in rest[:-1] else None
        module = f"{destination.replace('/', '.')}.{target}" if destination else target
        where = f"{path}:{bisect_right(starts, match.start())}"
        found.append(CMakeTarget(target, module, destination is not None, where, command, _sources(rest, directory)))
    return found


def _subdirectories(text: str, directory: str) -> list[str]:
    """The source directories `add_subdirectory(dir [binary_dir])` adds."""
    found = []
    for match in SUBDIRECTORY.finditer(text):
        words = _words(match.group(1), {})
        path = _located(words[0], directory) if words else None
        found += [path] if path else []
    return found


def cmake_targets(subject: Subject, roots: list[str], gaps: list[str]) -> list[CMakeTarget]:
    """The Python module targets of the CMake files reached from the top-level CMakeLists.txt (and the
    directories in `roots`) through `add_subdirectory`, outside vendored and test directories."""
    present = set(subject.list())
    pending = [_Pending(root, {}) for root in dict.fromkeys(["", *roots])]
    seen: set[str] = set()
    found: list[CMakeTarget] = []
    while pending:
        directory, inherited = pending[0].directory, pending.pop(0).variables
        path = posixpath.join(directory, CMAKE) if directory else CMAKE
        outside = any(part in OUTSIDE for part in directory.split("/"))
        source = read_file(subject, path, gaps) if path in present and path not in seen and not outside else None
        seen.add(path)
        if source is None:
            continue
        text = re.sub(r"#[^\n]*", "", source.decode("utf-8", errors="replace"))
        variables = _variables(text, inherited)
        found += _targets(path, text, variables)
        pending += [_Pending(sub, variables) for sub in _subdirectories(text, directory)]
    return found
