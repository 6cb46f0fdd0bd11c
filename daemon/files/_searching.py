"""``find`` and ``grep``: files by name, lines by pattern, within what the agent may read.

Both walk down from a folder without following symbolic links, skip what the agent may not read
(and folders that hold nothing it may), and stop at a bound: ``FIND_RESULTS`` paths,
``GREP_MATCHES`` lines, ``WALK_ENTRIES`` entries visited. An answer that stopped at a bound
says so. ``grep`` skips files past ``GREP_FILE_BYTES`` and files that look binary (a NUL byte);
its patterns are RE2's (linear time: no pattern can stall a search).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from typing import Any

import re2

from ._access import Glob
from ._confine import Confinement, Target, refused
from ._reading import _whole

FIND_RESULTS = 500
GREP_MATCHES = 100
GREP_LINE_CHARS = 300
GREP_FILE_BYTES = 4 * 1024 * 1024
WALK_ENTRIES = 20000
# One RE2 program may use at most this much memory (as a schema's patterns).
_RE2_MAX_MEM = 1024 * 1024


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _RE2_MAX_MEM
    options.log_errors = False  # a refused pattern is told to the agent, not printed
    return options


_RE2_OPTIONS = _re2_options()


class _Walk:
    """The readable regular files below a folder, in a stable order, counting what it visits."""

    def __init__(self, confined: Confinement, top: Target) -> None:
        self.confined = confined
        self.top = top
        self.visited = 0
        self.cut = False

    def files(self) -> Iterator[tuple[Target, str]]:
        """Each readable file (its target, in ``top``'s zone) and its path relative to ``top``."""
        zone = self.confined.zone_of(self.top)
        for folder, dirs, names in os.walk(self.top.real, followlinks=False):
            dirs.sort()
            rel_folder = os.path.relpath(folder, zone.root)
            rel_folder = "" if rel_folder == "." else rel_folder
            dirs[:] = [
                d for d in dirs if zone.may_look_in(f"{rel_folder}/{d}" if rel_folder else d)
            ]
            for name in sorted(names):
                self.visited += 1
                if self.visited > WALK_ENTRIES:
                    self.cut = True
                    return
                rel = f"{rel_folder}/{name}" if rel_folder else name
                real = os.path.join(folder, name)
                try:
                    mode = os.lstat(real).st_mode
                except OSError:
                    continue
                if stat.S_ISREG(mode) and zone.may_read(rel):
                    yield Target(real, rel, self.top.zone), os.path.relpath(real, self.top.real)


def _start(confined: Confinement, path: object) -> Target:
    return confined.folder(path or ".")


def _bounded(lines: list[str], walk: _Walk | None, limit: int, what: str) -> str:
    if not lines:
        text = f"(no {what})"
    else:
        text = "\n".join(lines[:limit])
    if len(lines) > limit:
        text += f"\n[stopped at {limit} {what}; narrow the search]"
    if walk is not None and walk.cut:
        text += f"\n[stopped after visiting {WALK_ENTRIES} files; narrow the search]"
    return text


def find_files(confined: Confinement, tool_input: dict) -> str:
    """Paths (relative to the workspace) of readable files below ``path`` matching the glob
    ``pattern``: against the file's name when the pattern has no ``/``, else against its path
    below ``path``."""
    pattern = tool_input.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise refused("`pattern` must be a glob (like `*.md` or `docs/**/*.md`)")
    glob = Glob.of(pattern)
    limit = min(_whole(tool_input.get("limit"), "limit", FIND_RESULTS), FIND_RESULTS)
    walk = _Walk(confined, _start(confined, tool_input.get("path")))
    found: list[str] = []
    for target, below in walk.files():
        if glob.matches(below if "/" in pattern else os.path.basename(below)):
            found.append(target.shown)
            if len(found) > limit:
                break
    return _bounded(sorted(found[:limit]) + found[limit:], walk, limit, "matching files")


def _matcher(tool_input: dict) -> Any:
    """The line matcher, compiled by RE2: linear in the line, whatever the pattern, so no
    pattern an agent writes can hold a worker thread."""
    pattern = tool_input.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise refused("`pattern` must be a regular expression (or text, with `literal`)")
    text = re2.escape(pattern) if tool_input.get("literal") is True else pattern
    flags = "(?i)" if tool_input.get("ignore_case") is True else ""
    try:
        return re2.compile(flags + text, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise refused(f"`pattern` is not a regular expression RE2 takes: {reason}") from None


def _lines(confined: Confinement, target: Target) -> list[str] | None:
    found = confined.read_bytes(target, GREP_FILE_BYTES + 1)
    if found is None or found[1] > GREP_FILE_BYTES or b"\0" in found[0][:8192]:
        return None
    return found[0].decode("utf-8", errors="replace").splitlines()


def grep_files(confined: Confinement, tool_input: dict) -> str:
    """Lines matching ``pattern`` in the readable files at or below ``path``, as
    ``path:line: text``; ``glob`` narrows the files by name."""
    matcher = _matcher(tool_input)
    limit = min(_whole(tool_input.get("limit"), "limit", GREP_MATCHES), GREP_MATCHES)
    names = tool_input.get("glob")
    if names is not None and (not isinstance(names, str) or not names):
        raise refused("`glob` must be a glob of file names (like `*.py`)")
    narrowed = Glob.of(names) if names else None
    path = tool_input.get("path") or "."
    start = confined.locate(path)
    walk: _Walk | None = None
    if os.path.isfile(start.real):
        files: Iterable[tuple[Target, str]] = [(confined.readable(path), "")]
    else:
        walk = _Walk(confined, _start(confined, path))
        files = walk.files()
    found: list[str] = []
    for target, _ in files:
        if narrowed is not None and not narrowed.matches(os.path.basename(target.rel)):
            continue
        for number, line in enumerate(_lines(confined, target) or (), 1):
            if matcher.search(line):
                found.append(f"{target.shown}:{number}: {line[:GREP_LINE_CHARS]}")
                if len(found) > limit:
                    return _bounded(_by_path(found, limit), walk, limit, "matching lines")
    return _bounded(_by_path(found, limit), walk, limit, "matching lines")


def _by_path(found: list[str], limit: int) -> list[str]:
    """The first ``limit`` lines in path order (each file's lines in their order)."""
    return sorted(found[:limit], key=lambda line: line.split(":", 1)[0]) + found[limit:]
