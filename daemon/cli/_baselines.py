"""The client's side of baselines: what a run that updates them captured (``graphs``'
``captured_baselines`` for a local run, the stream's ``baseline_writes`` for a remote one),
written into the project by the client's rules.

A baseline is written only when its path ends in ``.json`` (or ``.png``, holding a PNG image),
has no ``..`` and lies directly in
the baseline directory of a run of this call (the flow's, or a nested flow's); it replaces the
file in one rename. A link at the path or in place of the directory, or a path that is there and
is not a regular file, is refused, and so is everything else: each refusal is a sentence naming
the path, and the command then exits 1.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat

from ..graphs import FlowFiles
from ._flow_collect import LOG_VAR, flow_files_line

_PNG = b"\x89PNG\r\n\x1a\n"


def _refusal(path: str, data: bytes, allowed: set[str]) -> str | None:
    directory = posixpath.dirname(path)
    if not path.endswith((".json", ".png")) or ".." in path.split("/"):
        return "only a .json or .png file is written, by a path without .."
    if path.endswith(".png") and not data.startswith(_PNG):
        return "a .png baseline must hold a PNG image"
    if directory not in allowed:
        return "it is not directly in a baseline directory of this run"
    if os.path.islink(directory) or os.path.realpath(directory) != directory:
        return f"{directory} is a link; a baseline is written only into the directory itself"
    return not_replaceable(path, "a baseline")


def not_replaceable(path: str, what: str) -> str | None:
    """Why the file at ``path`` may not be replaced by ``what`` ("a baseline"), or None: a link
    there, or anything but a regular file, is left as it is."""
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return f"it is a link; {what} replaces only a regular file"
        if not stat.S_ISREG(info.st_mode):
            return "it is there and is not a regular file"
    return None


def replace_file(path: str, data: bytes) -> str | None:
    """Write ``data`` to ``path`` in one rename (a new temporary file beside it first); None, or
    the system's reason it failed (then nothing at ``path`` changed)."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "xb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return exc.strerror or str(exc)
    return None


def write_baselines(
    files: FlowFiles, writes: dict[str, bytes], *, as_json: bool = False
) -> list[str]:
    """Write each captured baseline (its path, its bytes) by the client's rules; the sentences
    of those refused. A refused baseline leaves its path as it was. ``as_json``: the
    ``SALVOR_FLOW_FILES_LOG=1`` line of each one written is a JSON warning object."""
    allowed = set(files.updating)
    refused = []
    log = os.environ.get(LOG_VAR) == "1"
    for path, data in sorted(writes.items()):
        with contextlib.suppress(OSError):
            os.makedirs(posixpath.dirname(path), exist_ok=True)
        reason = _refusal(path, data, allowed)
        if reason is None:
            reason = replace_file(path, data)
        if reason is not None:
            refused.append(f"baseline not written: {path}: {reason}")
        elif log:
            flow_files_line(f"[flow-files] baseline {path}: written", as_json)
    return refused
