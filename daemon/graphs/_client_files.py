"""The files a linked run authored for its client: each ``saved_to`` directive that a
``flow_write`` or ``flow_agents`` write of the run (or of a run under it) answered with, read back
from the logs, where the call's recorded answer keeps it. Nothing is held in memory, so a daemon
killed after the write and restarted still hands every directive back with the result.

A directive is ``{"path", "content", "encoding": "base64"}``, as a baseline write's is; the
client writes it by its own rules (only into its project's ``.salvor/flows`` and
``.salvor/agents``). Reads the runs' logs only; nothing here opens a path.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from salvor.protocol import Envelope, ToolCallCompleted, ToolCallRequested

from ..flows import MAP_OF_LABEL, PARENT_LABEL
from ._baseline_writes import RunLogs

# The authoring tools whose recorded answers may carry a directive.
AUTHORING = frozenset({"flow_write", "flow_agents"})


def client_file(path: str, data: bytes) -> dict:
    """The directive that has the client write ``data`` at ``path``."""
    return {"path": path, "content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def _directive_bytes(directive: Any) -> tuple[str, bytes] | None:
    if not isinstance(directive, dict) or directive.get("encoding") != "base64":
        return None
    path, content = directive.get("path"), directive.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return None
    try:
        return path, base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        return None


def saved_files(log: list[Envelope]) -> list[tuple[str, str, bytes]]:
    """Each file one run's log saved for its client, in the order written: (when it was
    recorded, its path, its bytes)."""
    authoring = {
        envelope.seq
        for envelope in log
        if isinstance(envelope.event, ToolCallRequested) and envelope.event.tool in AUTHORING
    }
    saved = []
    for envelope in log:
        event = envelope.event
        if not isinstance(event, ToolCallCompleted) or event.seq not in authoring:
            continue
        output = event.output
        if not isinstance(output, dict) or output.get("written") is not True:
            continue
        found = _directive_bytes(output.get("saved_to"))
        if found is not None:
            saved.append((envelope.recorded_at, *found))
    return saved


async def saved_client_files(reads: RunLogs, run_id: str) -> dict[str, bytes]:
    """Every file the run ``run_id`` and the runs under it (nested flows, map items,
    subagents' children) saved for the client, the last bytes written winning for a path."""
    found: list[tuple[str, int, str, bytes]] = []
    pending, seen = [run_id], set()
    while pending:
        current = pending.pop(0)
        if current in seen:
            continue
        seen.add(current)
        for order, (when, path, data) in enumerate(saved_files(await reads.log(current))):
            found.append((when, order, path, data))
        for label in (MAP_OF_LABEL, PARENT_LABEL):
            children, _ = await reads.list_runs(label=(label, current))
            pending += [child.run_id for child in children]
    # Each log is in its own order; across runs the store's clock orders them.
    found.sort(key=lambda entry: (entry[0], entry[1]))
    return {path: data for _, _, path, data in found}


def client_file_directives(files: dict[str, bytes]) -> list[dict]:
    """The result's ``client_files``: one directive per path, sorted by path."""
    return [client_file(path, data) for path, data in sorted(files.items())]
