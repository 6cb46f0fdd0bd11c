"""The client's side of baselines: what a run that updates them captured, written into the
project by the client's rules.

A baseline is written only when its path ends in ``.json``, has no ``..`` and lies directly in
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
import sys
from typing import Any

from salvor.protocol import NodeExited, NodeKind, RunState, canonical_json

from ..flows import MAP_OF_LABEL
from ..graphs import CAPTURED, FlowFiles
from ..runs import Runtime
from ._flow_collect import LOG_VAR


async def captured_baselines(runtime: Runtime, run_id: str) -> dict[str, Any]:
    """Each baseline path the completed run ``run_id`` (and its nested flows' runs) captured,
    with the last value captured for it."""
    writes: dict[str, Any] = {}
    pending = [run_id]
    while pending:
        current = pending.pop(0)
        view = await runtime.reads.view(current)
        if view.graph_hash is None or view.state is not RunState.COMPLETED:
            continue
        graph = await runtime.definitions.load_graph(view.graph_hash)
        snapshots = {node.id for node in graph.nodes if node.kind is NodeKind.SNAPSHOT}
        nested = {node.id for node in graph.nodes if node.kind is NodeKind.FLOW}
        for envelope in await runtime.reads.log(current):
            event = envelope.event
            if not isinstance(event, NodeExited) or event.node not in snapshots:
                continue
            if isinstance(event.output, dict) and event.output.get("baseline") == CAPTURED:
                writes[event.output["path"]] = event.output["value"]
        if nested:
            children, _ = await runtime.reads.list_runs(label=(MAP_OF_LABEL, current))
            pending += [child.run_id for child in children if child.graph_hash is not None]
    return writes


def _refusal(path: str, allowed: set[str]) -> str | None:
    directory = posixpath.dirname(path)
    if not path.endswith(".json") or ".." in path.split("/"):
        return "only a .json file is written, by a path without .."
    if directory not in allowed:
        return "it is not directly in a baseline directory of this run"
    if os.path.islink(directory) or os.path.realpath(directory) != directory:
        return f"{directory} is a link; a baseline is written only into the directory itself"
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return "it is a link; a baseline replaces only a regular file"
        if not stat.S_ISREG(info.st_mode):
            return "it is there and is not a regular file"
    return None


def write_baselines(files: FlowFiles, writes: dict[str, Any]) -> list[str]:
    """Write each captured baseline by the client's rules; the sentences of those refused."""
    allowed = {
        posixpath.dirname(member.key)
        for member in files.bundle.members.values()
        if member.role == "baseline" and member.state == "listed"
    }
    refused = []
    log = os.environ.get(LOG_VAR) == "1"
    for path, value in sorted(writes.items()):
        with contextlib.suppress(OSError):
            os.makedirs(posixpath.dirname(path), exist_ok=True)
        reason = _refusal(path, allowed)
        if reason is None:
            temporary = f"{path}.{os.getpid()}.tmp"
            try:
                with open(temporary, "wb") as handle:
                    handle.write(canonical_json(value) + b"\n")
                os.replace(temporary, path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                reason = exc.strerror or str(exc)
        if reason is not None:
            refused.append(f"baseline not written: {path}: {reason}")
        elif log:
            print(f"[flow-files] baseline {path}: written", file=sys.stderr, flush=True)
    return refused
