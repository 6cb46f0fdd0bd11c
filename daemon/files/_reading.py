"""``read`` and ``ls``: a file's text, a folder's entries, bounded.

A read answers at most ``READ_BYTES`` bytes (and ``READ_LINES`` lines) from the line it starts
at, and says so when there is more and where to go on; a listing at most ``LIST_ENTRIES``
entries. Only what the agent may read is shown: a folder's entry that is neither readable nor
holds anything readable is left out of a listing.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ._confine import Confinement, refused

READ_BYTES = 64 * 1024
READ_LINES = 2000
# The most a read loads to find its starting line (a file past it is read from its start only).
READ_SCAN_BYTES = 8 * 1024 * 1024
LIST_ENTRIES = 500


def _whole(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if type(value) is not int or value < 1:
        raise refused(f"`{name}` must be a whole number, 1 or more")
    return value


def read_text(confined: Confinement, tool_input: dict) -> str:
    """The text of the file ``path`` from line ``offset`` (1-based), ``limit`` lines at most."""
    target = confined.readable(tool_input.get("path"))
    offset = _whole(tool_input.get("offset"), "offset", 1)
    limit = min(_whole(tool_input.get("limit"), "limit", READ_LINES), READ_LINES)
    found = confined.read_bytes(target, READ_SCAN_BYTES)
    if found is None:
        raise refused(f"there is no file {target.shown!r}")
    data, size = found
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    if offset > max(len(lines), 1):
        raise refused(f"{target.shown!r} has {len(lines)} lines; `offset` {offset} is past them")
    chosen: list[str] = []
    used = 0
    for line in lines[offset - 1 : offset - 1 + limit]:
        encoded = len(line.encode("utf-8"))
        if used + encoded > READ_BYTES:
            break
        chosen.append(line)
        used += encoded
    text = "".join(chosen)
    last = offset - 1 + len(chosen)
    if not chosen and offset <= len(lines):
        # One line longer than the whole bound: its first part, said as such.
        text = lines[offset - 1].encode("utf-8")[:READ_BYTES].decode("utf-8", errors="ignore")
        return text + f"\n[line {offset} is longer than {READ_BYTES} bytes; this is its start]"
    known = f"{len(lines)}" if size <= READ_SCAN_BYTES else f"more than {len(lines)}"
    if last < len(lines) or size > READ_SCAN_BYTES:
        return text + (
            f"\n[lines {offset}-{last} of {known} ({size} bytes) shown; "
            f"read on with offset={last + 1}]"
        )
    return text


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "@"
    if stat.S_ISDIR(mode):
        return "/"
    return ""


def list_folder(confined: Confinement, tool_input: dict) -> str:
    """The entries of the folder ``path`` (the workspace when absent), sorted, one a line:
    a folder ends in ``/``, a symbolic link in ``@``."""
    target = confined.folder(tool_input.get("path") or ".")
    limit = min(_whole(tool_input.get("limit"), "limit", LIST_ENTRIES), LIST_ENTRIES)
    zone = confined.zone_of(target)
    shown: list[str] = []
    names = sorted(os.listdir(target.real))
    for name in names:
        rel = f"{target.rel}/{name}" if target.rel else name
        try:
            mode = os.lstat(os.path.join(target.real, name)).st_mode
        except OSError:
            continue
        folder = stat.S_ISDIR(mode)
        if zone.may_read(rel) or (folder and zone.may_look_in(rel)):
            shown.append(name + _kind(mode))
    if not shown:
        return "(no entries this agent may read)"
    more = len(shown) - limit
    listing = "\n".join(shown[:limit])
    return listing + (f"\n[{more} more entries not shown]" if more > 0 else "")
