"""Graph runs: the walker that drives a graph document's nodes, replay first, through the same
run context an agent run is driven through (agent nodes are the built-in loop, inline).

Rule: imports only the packages below it; knows nothing of HTTP routes or of how a run is started.
"""

from __future__ import annotations

from ._baseline_writes import (
    BadDirective,
    RunLogs,
    baseline_bytes,
    baseline_directives,
    captured_baselines,
    directive_writes,
)
from ._client_files import (
    client_file,
    client_file_directives,
    saved_client_files,
    saved_files,
)
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
from ._unsent import files_not_sent, flow_without_members
from ._walk import (
    GraphWalk,
    drive_graph,
)

__all__ = [
    "CAPTURED",
    "MAP_ITEMS",
    "AgentParser",
    "BadDirective",
    "CheckedFlow",
    "FlowFiles",
    "GraphWalk",
    "RunLogs",
    "baseline_bytes",
    "baseline_directives",
    "bind_agents",
    "captured_baselines",
    "check_flow",
    "client_file",
    "client_file_directives",
    "directive_writes",
    "drive_graph",
    "files_not_sent",
    "flow_child_id",
    "flow_without_members",
    "graph_declares_probe",
    "graph_probes_open_write",
    "map_child_id",
    "parse_flow_document",
    "registry_parser",
    "saved_client_files",
    "saved_files",
]
