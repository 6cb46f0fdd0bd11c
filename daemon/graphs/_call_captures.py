"""The baselines one call's snapshots have captured so far, read from the runs' logs.

A call is a flow run and the nested flow runs under it (each a child graph run labelled with its
parent, its id derived from the parent and the flow node). Its runs go one at a time: a nested
run runs while its flow node is entered. So the order the call ran in is each run's log in seq
order with a child's log read where its flow node enters, and the last capture of a path in that
order is the baseline a later snapshot of the call compares with (and what the client is handed
to write). Derived from the logs alone, so a walk resumed after a crash reads the same.
"""

from __future__ import annotations

from typing import Any, Protocol

from salvor.protocol import (
    MAX_FLOW_DEPTH,
    Envelope,
    Graph,
    GraphNode,
    NodeEntered,
    NodeExited,
    NodeKind,
    RunView,
    graph_from_value,
)

from ..flows import MAP_OF_LABEL
from ..recording import RunContext, StoreAccess
from ._nested import flow_child_id
from ._snapshot import CAPTURED, snapshot_outcome
from ._walk_parts import WalkParts

# A nested run's own flow nodes count too; a chain longer than this is a damaged store.
_MAX_RUNS_UP = MAX_FLOW_DEPTH + 1


class CallLogs(Protocol):
    """The reads the captures of a call need."""

    async def view(self, run_id: str) -> RunView | None: ...

    async def log(self, run_id: str) -> list[Envelope]: ...

    async def graph(self, graph_hash: str) -> Graph | None: ...


class StoredCallLogs:
    """``CallLogs`` over a drive's store access (what a walk reads them through)."""

    def __init__(self, access: StoreAccess) -> None:
        self._access = access

    async def view(self, run_id: str) -> RunView | None:
        return await self._access.read(self._access.store.read_view, run_id)

    async def log(self, run_id: str) -> list[Envelope]:
        return await self._access.read(self._access.store.read_log, run_id)

    async def graph(self, graph_hash: str) -> Graph | None:
        definitions = self._access.store.definitions
        stored = await self._access.read(definitions.get_graph, graph_hash)
        # Stored only once it validated: it validates again.
        return None if stored is None else graph_from_value(stored.document)


def captured_value(output: Any) -> tuple[str, Any] | None:
    """The path and value a snapshot node's output captured, or None (it compared)."""
    if isinstance(output, dict) and output.get("baseline") == CAPTURED:
        path = output.get("path")
        if isinstance(path, str):
            return path, output.get("value")
    return None


async def call_root(logs: CallLogs, run_id: str, labels: dict | None) -> str:
    """The flow run whose call ``run_id`` (labelled ``labels``) is part of: up the parents a
    nested flow run's label names, as far as they are graph runs."""
    root = run_id
    for _ in range(_MAX_RUNS_UP):
        parent = (labels or {}).get(MAP_OF_LABEL)
        if parent is None:
            return root
        view = await logs.view(parent)
        if view is None or view.graph_hash is None:
            return root
        root, labels = parent, view.labels
    return root


async def call_captures(
    logs: CallLogs, root: str, runs: list[tuple[Graph, list[Envelope]]] | None = None
) -> dict[str, Any]:
    """Each baseline path the call of ``root`` captured so far, with its last value, in the
    order the call ran (a path captured again moves to the end). ``runs``, when given, gets each
    run of the call read on the way, with its graph and log."""
    found: dict[str, Any] = {}
    await _captures(logs, root, found, 0, runs if runs is not None else [])
    return found


async def _captures(
    logs: CallLogs,
    run_id: str,
    found: dict[str, Any],
    depth: int,
    runs: list[tuple[Graph, list[Envelope]]],
) -> None:
    view = await logs.view(run_id)
    if view is None or view.graph_hash is None or depth > _MAX_RUNS_UP:
        return
    graph = await logs.graph(view.graph_hash)
    if graph is None:
        return
    log = await logs.log(run_id)
    runs.append((graph, log))
    snapshots = {node.id for node in graph.nodes if node.kind is NodeKind.SNAPSHOT}
    nested = {node.id for node in graph.nodes if node.kind is NodeKind.FLOW}
    for envelope in log:
        event = envelope.event
        if isinstance(event, NodeEntered) and event.node in nested:
            await _captures(logs, flow_child_id(run_id, event.node), found, depth + 1, runs)
        elif isinstance(event, NodeExited) and event.node in snapshots:
            captured = captured_value(event.output)
            if captured is not None:
                found.pop(captured[0], None)
                found[captured[0]] = captured[1]


async def snapshot_now(
    walk: WalkParts, ctx: RunContext, node: GraphNode, value: Any
) -> tuple[Any, str | None]:
    """A live snapshot node's outcome (``snapshot_outcome``) against what its call captured so
    far; what the walk holds is committed first, so the call's logs hold every earlier step."""
    captured: dict[str, Any] = {}
    if walk.files is not None:
        await ctx.flush()
        logs = StoredCallLogs(walk.access)
        captured = await call_captures(logs, await call_root(logs, ctx.run_id, walk.labels))
    return snapshot_outcome(walk.files, node, value, captured)
