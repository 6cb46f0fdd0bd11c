"""What a flow run that updates its baselines hands back: each baseline path its snapshots and
pinned agent nodes (and its nested flows') captured, with the bytes the file gets, the last
capture of a path winning. The command line writes them itself after a local run; over a link
they travel in the stream's result as directives (``{"path", "content", "encoding": "base64"}``)
the client writes by its own rules. Reads the runs' logs only; nothing here opens a path.
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

from ..flows import MAP_OF_LABEL
from ._pinned import calls_document, node_calls
from ._pinned_baseline import calls_baseline_path
from ._snapshot import CAPTURED


class RunLogs(Protocol):
    """The reads ``captured_baselines`` needs (the runtime's ``RunReads``)."""

    async def view(self, run_id: str) -> RunView: ...

    async def log(self, run_id: str, from_seq: int = 0) -> list[Envelope]: ...

    async def list_runs(self, **filters: Any) -> tuple[list[Any], str | None]: ...


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
    with the bytes of the last value captured for it (a run that did not complete: none).

    ``load_bundle``: a flow run's manifest by its hash, where a pinned agent node's baseline
    path is found (without it, pinned nodes capture nothing).
    """
    writes: dict[str, bytes] = {}
    pending = [run_id]
    while pending:
        current = pending.pop(0)
        view = await reads.view(current)
        if view.graph_hash is None or view.state is not RunState.COMPLETED:
            continue
        graph = await load_graph(view.graph_hash)
        snapshots = {node.id for node in graph.nodes if node.kind is NodeKind.SNAPSHOT}
        nested = {node.id for node in graph.nodes if node.kind is NodeKind.FLOW}
        log = await reads.log(current)
        for envelope in log:
            event = envelope.event
            if not isinstance(event, NodeExited) or event.node not in snapshots:
                continue
            if isinstance(event.output, dict) and event.output.get("baseline") == CAPTURED:
                writes[event.output["path"]] = baseline_bytes(event.output["value"])
        writes.update(await _pinned_writes(graph, log, load_bundle))
        if nested:
            children, _ = await reads.list_runs(label=(MAP_OF_LABEL, current))
            pending += [child.run_id for child in children if child.graph_hash is not None]
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
