"""The graph document's model: nodes, edges, a validated graph, and its validation errors.

Rules:
* A ``Graph`` exists only for a document that passed every check
  (``graph_from_value`` and the parsers build it); its ``document`` is the
  parsed value exactly as submitted and its ``hash`` is over that value, so
  defaults filled in here (a node's ``input``, a gate's schema, a map's
  concurrency) never change what is stored or hashed.
* Everything a walk needs is precomputed once: the node index, each node's
  inbound and outbound edges, the entry and terminal nodes, and one
  deterministic topological order (Kahn's, ties broken by document order).
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field
from typing import Any

from ._error_codes import ErrorCode
from ._errors import ProtocolError

GRAPH_SCHEMA_VERSION = 1


class NodeKind(enum.StrEnum):
    """What a node does when the walk reaches it."""

    AGENT = "agent"
    TOOL = "tool"
    GATE = "gate"
    BRANCH = "branch"
    MAP = "map"
    FOLD = "fold"
    DELAY = "delay"
    FLOW = "flow"
    SNAPSHOT = "snapshot"


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphNode:
    """One node; only its kind's fields are set, the others are None.

    ``input`` is the node's template with the default applied (agent and tool
    nodes, and a map's body; a gate always has the default, what it holds up
    for approval): ``$input`` with no predecessor, ``$nodes.<p>`` with one, an
    object of them with several; ``$item`` in a map body. A map's
    ``body`` is a node of kind agent or tool carrying the map's id. An agent node names its
    agent by ``agent`` (a hash) or ``agent_file`` (a file beside the flow file); a flow node
    names another flow of the project by ``flow`` (its ``update_baselines`` says whether that
    run updates its baselines; None: as the run that starts it does); a snapshot compares the
    value ``of`` references with its baseline (its ``name`` names the baseline file).
    """

    id: str
    kind: NodeKind
    name: str | None = None
    input: Any = None
    agent: str | None = None
    agent_file: str | None = None
    # An agent node whose calls a flow run answers from its recorded baseline (``pinned``).
    pinned: bool = False
    flow: str | None = None
    update_baselines: bool | None = None
    of: str | None = None
    tool: str | None = None
    prompt: str | None = None
    approval_schema: dict | None = None
    on: str | None = None
    cases: tuple[str, ...] = ()
    default: str | None = None
    over: str | None = None
    body: GraphNode | None = None
    concurrency: int | None = None
    reducer: str | None = None
    field: str | None = None
    seconds: int | float | None = None
    until: str | None = None


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """An edge ``source -> target``; ``case`` is set only on an edge out of a branch."""

    source: str
    target: str
    case: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphError:
    """One validation error: a code, a sentence, where it is, and a fix when one is obvious.

    ``edge`` is ``(from, to)``; ``extra`` holds the code's own fields
    (``missing``, ``nodes``, ``case``, ``reference``, ``index``). ``line`` is
    the line (1-based) of the node or edge the error is about, for a document
    read from YAML.
    """

    code: str
    message: str
    node: str | None = None
    edge: tuple[str, str] | None = None
    suggestion: str | None = None
    extra: dict = field(default_factory=dict)
    line: int | None = None

    def to_json(self) -> dict:
        """``{code, message, node?, edge?: {from, to}, suggestion, line?, ...extra}``."""
        body: dict = {"code": self.code, "message": self.message}
        if self.node is not None:
            body["node"] = self.node
        if self.edge is not None:
            body["edge"] = {"from": self.edge[0], "to": self.edge[1]}
        body["suggestion"] = self.suggestion
        if self.line is not None:
            body["line"] = self.line
        body.update(self.extra)
        return body


class InvalidGraph(ProtocolError):
    """A graph document that failed validation; ``errors`` lists every error found.

    Nothing was stored or started: the document is refused as a whole.
    """

    code = ErrorCode.INVALID_GRAPH

    def __init__(self, errors: list[GraphError]) -> None:
        super().__init__(
            f"the graph document has {len(errors)} validation error(s)",
            details={"errors": [error.to_json() for error in errors]},
        )
        self.errors = errors


@dataclass(frozen=True)
class Graph:
    """A validated graph document and the indexes a walk reads.

    Build one with ``graph_from_value`` or a parser; constructing it directly
    assumes ``nodes`` and ``edges`` already passed validation.
    """

    document: dict
    hash: str
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    order: tuple[str, ...] = field(init=False)
    entry_nodes: tuple[str, ...] = field(init=False)
    terminal_nodes: tuple[str, ...] = field(init=False)
    _by_id: dict[str, GraphNode] = field(init=False, repr=False, compare=False)
    _inbound: dict[str, tuple[GraphEdge, ...]] = field(init=False, repr=False, compare=False)
    _outbound: dict[str, tuple[GraphEdge, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        inbound: dict[str, list[GraphEdge]] = {node.id: [] for node in self.nodes}
        outbound: dict[str, list[GraphEdge]] = {node.id: [] for node in self.nodes}
        for edge in self.edges:
            outbound[edge.source].append(edge)
            inbound[edge.target].append(edge)
        ids = [node.id for node in self.nodes]
        object.__setattr__(self, "_by_id", {node.id: node for node in self.nodes})
        object.__setattr__(self, "_inbound", {key: tuple(val) for key, val in inbound.items()})
        object.__setattr__(self, "_outbound", {key: tuple(val) for key, val in outbound.items()})
        object.__setattr__(self, "entry_nodes", tuple(i for i in ids if not inbound[i]))
        object.__setattr__(self, "terminal_nodes", tuple(i for i in ids if not outbound[i]))
        object.__setattr__(self, "order", topological_order(ids, self.edges))

    def node(self, node_id: str) -> GraphNode:
        """The node ``node_id``.

        Raises:
            KeyError: the graph has no such node.
        """
        return self._by_id[node_id]

    def predecessors(self, node_id: str) -> tuple[GraphEdge, ...]:
        """The edges into ``node_id``, in document order."""
        return self._inbound[node_id]

    def successors(self, node_id: str) -> tuple[GraphEdge, ...]:
        """The edges out of ``node_id``, in document order."""
        return self._outbound[node_id]

    def summary(self) -> dict:
        """``{"node_count", "edge_count", "entry_nodes", "terminal_nodes"}``."""
        return {
            "node_count": len(self.nodes),
            "edge_count": len(self.edges),
            "entry_nodes": list(self.entry_nodes),
            "terminal_nodes": list(self.terminal_nodes),
        }


def topological_order(ids: list[str], edges: Any) -> tuple[str, ...]:
    """Kahn's order of ``ids`` over ``edges`` (ties by position in ``ids``).

    Nodes on or behind a cycle are left out, so a shorter answer than ``ids``
    means the edges are not a DAG. Edges naming an id not in ``ids`` are ignored.
    """
    position = {node_id: index for index, node_id in enumerate(ids)}
    targets: list[list[int]] = [[] for _ in ids]
    waiting = [0] * len(ids)
    for edge in edges:
        source, target = position.get(edge.source), position.get(edge.target)
        if source is None or target is None:
            continue
        targets[source].append(target)
        waiting[target] += 1
    ready = [index for index, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        index = heapq.heappop(ready)
        order.append(ids[index])
        for target in targets[index]:
            waiting[target] -= 1
            if waiting[target] == 0:
                heapq.heappush(ready, target)
    return tuple(order)
