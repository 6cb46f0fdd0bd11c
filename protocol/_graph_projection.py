"""The per-node projection of a graph run's log: what ``GET /v1/runs/{id}/graph`` answers.

Rules of this module:

* It is a pure function of the log, like the fold, and total like it: any
  log (legal or not, a graph run's or not) projects without raising. The
  guard, not the projection, decides what may be recorded.
* Absence is honest. A node the walk has not reached is not listed (which
  says something else than ``skipped``); ``reason``, ``branch_case`` and
  ``map`` appear only when the log recorded them; ``current_node`` only
  while a node is entered and not exited; ``forked_from`` only on a fork.
* Nodes are listed in walk order: the order the log first names them in
  (``NodeEntered`` or ``NodeSkipped``), which is the walk's ``Graph.order``
  restricted to the nodes it reached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._envelope import Envelope
from ._events import GraphRunStarted, MapItemCompleted, NodeEntered, NodeExited, NodeSkipped
from ._graph import Graph, NodeKind


class NodeState:
    """The ``state`` of a node in the projection."""

    ENTERED = "entered"
    EXITED = "exited"
    SKIPPED = "skipped"


def project_graph(
    graph_hash: str, envelopes: Iterable[Envelope], *, graph: Graph | None = None
) -> dict:
    """The projection of a graph run's log.

    Args:
        graph_hash: the run's graph (``RunView.graph_hash``).
        envelopes: the run's log, from seq 0.
        graph: the run's graph document when it is at hand. It says which nodes are
            ``map`` nodes, so one entered with no item finished yet already shows its
            progress; without it a node shows ``map`` once the log records an item of it.

    Returns:
        ``{graph_hash, current_node?, nodes: [{node, state, reason?, branch_case?, map?}],
        forked_from?}``; ``map`` is ``{"items": N, "completed": K}``: N the length of the
        list the node was entered with (absent if that was no list), K the distinct items
        recorded finished.
    """
    map_nodes = {n.id for n in graph.nodes if n.kind is NodeKind.MAP} if graph else set()
    nodes: dict[str, dict[str, Any]] = {}
    # A map node's finished item indexes; a set, so an index recorded twice counts once.
    completed: dict[str, set[int]] = {}
    forked_from = None
    current = None
    for envelope in envelopes:
        event = envelope.event
        if isinstance(event, GraphRunStarted):
            forked_from = event.forked_from
        elif isinstance(event, NodeEntered):
            entry = nodes.setdefault(event.node, {"node": event.node})
            entry["state"] = NodeState.ENTERED
            if event.node in map_nodes:
                completed.setdefault(event.node, set())
            if isinstance(event.input, list):
                entry["_items"] = len(event.input)
            current = event.node
        elif isinstance(event, NodeExited):
            entry = nodes.setdefault(event.node, {"node": event.node})
            entry["state"] = NodeState.EXITED
            if event.branch_case is not None:
                entry["branch_case"] = event.branch_case
            if current == event.node:
                current = None
        elif isinstance(event, NodeSkipped):
            entry = nodes.setdefault(event.node, {"node": event.node})
            entry["state"] = NodeState.SKIPPED
            entry["reason"] = event.reason
        elif isinstance(event, MapItemCompleted):
            completed.setdefault(event.node, set()).add(event.index)
    projected = []
    for node_id, entry in nodes.items():
        items = entry.pop("_items", None)
        if node_id in completed:
            progress = {"completed": len(completed[node_id])}
            if items is not None:
                progress = {"items": items, **progress}
            entry["map"] = progress
        # A node an illegal log only exited or gave items to is still shown as reached.
        entry.setdefault("state", NodeState.EXITED)
        projected.append(_ordered(entry))
    body: dict[str, Any] = {"graph_hash": graph_hash}
    if current is not None:
        body["current_node"] = current
    body["nodes"] = projected
    if forked_from is not None:
        body["forked_from"] = forked_from
    return body


_KEY_ORDER = ("node", "state", "reason", "branch_case", "map")


def _ordered(entry: dict) -> dict:
    return {key: entry[key] for key in _KEY_ORDER if key in entry}
