"""What part of the workspace an agent's file tools may read, and what part they may write.

A definition's ``access`` gives two lists of globs over paths relative to the workspace
(``access = {read = ["**"], write = ["notes/**"]}``): ``*`` and ``?`` stay within one path
segment, a segment of ``**`` spans any number of them, ``[...]`` is a class. Left out, ``read``
is everything in the workspace and ``write`` is nothing: an agent writes only where its
definition says. A glob cannot name a place outside the workspace (no leading ``/``, no ``..``).

Paths are checked after they are resolved (``_confine``), so a glob is matched against where a
path really leads, never against how the call spelt it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_GLOBS = 64
MAX_GLOB_CHARS = 256
# A glob ``_globs`` takes, as a schema pattern (no lookaround, so any engine reads it alike):
# segments split by `/`, none empty, `.` or `..`, no NUL, no leading `/`.
_SEGMENT = r"(?:[^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+)"
GLOB_PATTERN = rf"^{_SEGMENT}(?:/{_SEGMENT})*$"
_KINDS = ("read", "write")


def _segment(segment: str) -> str:
    """A regular expression for one glob segment (never matching a ``/``)."""
    out: list[str] = []
    index = 0
    while index < len(segment):
        char = segment[index]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (close := segment.find("]", index + 2)) != -1:
            body = segment[index + 1 : close]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            out.append("[" + ("^/" if negate else "") + body.replace("\\", "\\\\") + "]")
            index = close
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def _compile(glob: str) -> re.Pattern[str]:
    parts = glob.split("/")
    pieces: list[str] = []
    for position, part in enumerate(parts):
        last = position == len(parts) - 1
        if part == "**":
            pieces.append(".*" if last else "(?:[^/]+/)*")
        else:
            pieces.append(_segment(part) + ("" if last else "/"))
    return re.compile("".join(pieces))


@dataclass(frozen=True, slots=True)
class Glob:
    text: str
    whole: re.Pattern[str]
    segments: tuple[re.Pattern[str] | None, ...]  # None for a `**` segment

    @classmethod
    def of(cls, text: str) -> Glob:
        segments = tuple(
            None if part == "**" else re.compile(_segment(part)) for part in text.split("/")
        )
        return cls(text, _compile(text), segments)

    def matches(self, rel: str) -> bool:
        return self.whole.fullmatch(rel) is not None

    def may_hold(self, folder: str) -> bool:
        """Whether some path below the folder ``folder`` ("" for the workspace) could match."""
        parts = folder.split("/") if folder else []
        for position, part in enumerate(parts):
            if position >= len(self.segments):
                return False
            pattern = self.segments[position]
            if pattern is None:
                return True
            if pattern.fullmatch(part) is None:
                return False
        return len(self.segments) > len(parts)


def _globs(kind: str, value: Any) -> tuple[Glob, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f'`access.{kind}` must be an array of globs (like "notes/**")')
    if len(value) > MAX_GLOBS:
        raise ValueError(f"`access.{kind}` may hold at most {MAX_GLOBS} globs")
    for glob in value:
        parts = glob.split("/")
        if (
            not glob
            or len(glob) > MAX_GLOB_CHARS
            or "\0" in glob
            or glob.startswith("/")
            or any(part in ("", ".", "..") for part in parts)
        ):
            raise ValueError(
                f"`access.{kind}` holds {glob!r}, which is not a glob inside the workspace "
                "(relative, no empty, `.` or `..` segment, at most "
                f"{MAX_GLOB_CHARS} characters)"
            )
    return tuple(Glob.of(glob) for glob in value)


@dataclass(frozen=True, slots=True)
class FileAccess:
    """The globs an agent's file tools read and write under."""

    read: tuple[Glob, ...] = (Glob.of("**"),)
    write: tuple[Glob, ...] = ()

    @classmethod
    def parse(cls, raw: Any) -> FileAccess:
        """A definition's ``access`` table (``read`` and ``write``, each optional).

        Raises:
            ValueError: one sentence naming what is wrong.
        """
        if not isinstance(raw, dict):
            raise ValueError("`access` must be a table with `read` and `write` globs")  # noqa: TRY004
        unknown = sorted(set(raw) - set(_KINDS))
        if unknown:
            raise ValueError(f"unknown field `{unknown[0]}` in `access`; allowed: read, write")
        default = cls()
        return cls(
            read=_globs("read", raw["read"]) if "read" in raw else default.read,
            write=_globs("write", raw["write"]) if "write" in raw else default.write,
        )

    def may_read(self, rel: str) -> bool:
        return any(glob.matches(rel) for glob in self.read)

    def may_write(self, rel: str) -> bool:
        return any(glob.matches(rel) for glob in self.write)

    def may_look_in(self, folder: str) -> bool:
        """Whether the folder ``folder`` ("" for the workspace) is readable or holds a path that
        may be: ``ls``, ``find`` and ``grep`` may look in it, and show only what is readable."""
        return (folder != "" and self.may_read(folder)) or any(
            glob.may_hold(folder) for glob in self.read
        )

    def describe(self) -> dict[str, list[str]]:
        return {"read": [g.text for g in self.read], "write": [g.text for g in self.write]}
