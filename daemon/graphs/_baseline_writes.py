"""What a flow run that updates baselines hands back: each baseline path its snapshots and pinned
agent nodes (and its nested flows': a nested run may update while the call compares) captured,
with the bytes the file gets, the last capture of a path in the order the call ran winning. The
command line writes them itself after a local run; over a link they travel in the stream's
result as directives (``{"path", "content", "encoding": "base64"}``) the client writes by its own
rules. Reads the runs' logs only; nothing here opens a path.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from salvor.protocol import (
    Envelope,
    FlowBundle,
    Graph,
    GraphRunStarted,
    NodeExited,
    NodeKind,
    RunState,
    RunView,
    canonical_json,
)

from ._call_captures import call_captures
from ._pinned import calls_document, node_calls
from ._pinned_baseline import calls_baseline_path


class RunLogs(Protocol):
    """The reads ``captured_baselines`` needs (the runtime's ``RunReads``)."""

    async def find_view(self, run_id: str) -> RunView | None: ...

    async def log(self, run_id: str, from_seq: int = 0) -> list[Envelope]: ...


class _ReadsAsCallLogs:
    def __init__(self, reads: RunLogs, load_graph: Callable[[str], Awaitable[Graph]]) -> None:
        self._reads, self._load_graph = reads, load_graph

    async def view(self, run_id: str) -> RunView | None:
        return await self._reads.find_view(run_id)

    async def log(self, run_id: str) -> list[Envelope]:
        return await self._reads.log(run_id)

    async def graph(self, graph_hash: str) -> Graph | None:
        return await self._load_graph(graph_hash)


class BadDirective(ValueError):
    """A ``baseline_writes`` entry is not the shape; the message names which."""


def baseline_bytes(value: Any) -> bytes:
    """A captured value as its baseline file holds it: canonical JSON and a newline."""
    return canonical_json(value) + b"\n"


async def captured_baselines(
    reads: RunLogs,
    load_graph: Callable[[str], Awaitable[Graph]],
    run_id: str,
    load_bundle: Callable[[str], Awaitable[FlowBundle]] | None = None,
) -> dict[str, bytes]:
    """Each baseline path the completed run ``run_id`` (and its nested flows' runs) captured,
    with the bytes of the last value captured for it in the order the call ran (a run that did
    not complete: none).

    ``load_bundle``: a flow run's manifest by its hash, where a pinned agent node's baseline
    path is found (without it, pinned nodes capture nothing).
    """
    view = await reads.find_view(run_id)
    if view is None or view.graph_hash is None or view.state is not RunState.COMPLETED:
        return {}
    runs: list[tuple[Graph, list[Envelope]]] = []
    captured = await call_captures(_ReadsAsCallLogs(reads, load_graph), run_id, runs)
    writes = {path: baseline_bytes(value) for path, value in captured.items()}
    for graph, log in runs:
        writes.update(await _pinned_writes(graph, log, load_bundle))
    return writes


async def _pinned_writes(
    graph: Graph,
    log: list[Envelope],
    load_bundle: Callable[[str], Awaitable[FlowBundle]] | None,
) -> dict[str, bytes]:
    """The baselines of the pinned agent nodes a completed flow run's ``log`` walked."""
    pinned = [node.id for node in graph.nodes if node.kind is NodeKind.AGENT and node.pinned]
    head = log[0].event if log else None
    if not pinned or load_bundle is None or not isinstance(head, GraphRunStarted) or not head.flow:
        return {}
    bundle = await load_bundle(head.flow)
    if not bundle.update_baselines:  # a comparing run's pinned nodes answered from their baseline
        return {}
    exited = {env.event.node for env in log if isinstance(env.event, NodeExited)}
    return {
        calls_baseline_path(bundle, node): baseline_bytes(
            calls_document(node, node_calls(log, node))
        )
        for node in pinned
        if node in exited
    }


def baseline_directives(writes: dict[str, bytes]) -> list[dict]:
    """The result's ``baseline_writes``: one directive per path, sorted by path."""
    return [
        {"path": path, "content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}
        for path, data in sorted(writes.items())
    ]


def directive_writes(directives: Any, field: str = "baseline_writes") -> dict[str, bytes]:
    """The paths and bytes of a result's ``baseline_writes`` (``baseline_directives`` read back),
    or of its list ``field`` of the same directives (``client_files``).

    Raises:
        BadDirective: a directive is not the shape (a sentence naming which).
    """
    if not isinstance(directives, list):
        raise BadDirective(f"{field} is not a list")
    writes: dict[str, bytes] = {}
    for index, directive in enumerate(directives):
        where = f"{field}[{index}]"
        if not isinstance(directive, dict) or directive.get("encoding") != "base64":
            raise BadDirective(f"{where} is not a base64 directive")
        path, content = directive.get("path"), directive.get("content")
        if not isinstance(path, str) or not isinstance(content, str):
            raise BadDirective(f"{where} lacks its path or its content")
        try:
            writes[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise BadDirective(f"{where}: its content is not base64") from None
    return writes
