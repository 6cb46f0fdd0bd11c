"""Graph runs: the walker that drives a graph document's nodes, replay first, through the same
run context an agent run is driven through (agent nodes are the built-in loop, inline).

Rule: imports only the packages below it; knows nothing of HTTP routes or of how a run is started.
"""

from __future__ import annotations

from ._flow_check import (
    AgentParser,
    CheckedFlow,
    FlowFiles,
    bind_agents,
    check_flow,
    parse_flow_document,
    registry_parser,
)
from ._map_items import (
    MAP_ITEMS,
    map_child_id,
)
from ._nested import flow_child_id
from ._probes import graph_declares_probe, graph_probes_open_write
from ._snapshot import CAPTURED
from ._walk import (
    GraphWalk,
    drive_graph,
)

__all__ = [
    "CAPTURED",
    "MAP_ITEMS",
    "AgentParser",
    "CheckedFlow",
    "FlowFiles",
    "GraphWalk",
    "bind_agents",
    "check_flow",
    "drive_graph",
    "flow_child_id",
    "graph_declares_probe",
    "graph_probes_open_write",
    "map_child_id",
    "parse_flow_document",
    "registry_parser",
]
