"""The flow tools agents call (``ask_user``, ``subagent``, ``finish``, ``flow_results``,
``flow_agents``, ``flow_write``, ``attach_tool``): one implementation as ``Tool``s bound to a
run's flow session, offered to built-in agents, graph agent nodes and (through the ``salvor`` MCP
server) process agents; and the labels that mark a run tree.

Rule: imports only the packages below it; what needs the daemon above (child runs, the catalog,
the store's settings) is asked of the session's ``FlowHost``.
"""

from __future__ import annotations

from ._caller_labels import (
    caller_labels,
)
from ._session import (
    AUTONOMOUS_LABEL,
    DAEMON_LABELS,
    FLOW_LABEL,
    LINKED_LABEL,
    MAP_OF_LABEL,
    PARENT_LABEL,
    SUBAGENTS,
    TOOLS_LABEL,
    FlowHost,
    FlowSession,
    child_run_id,
    client_project,
    inherited_labels,
    is_autonomous,
    session_of,
    tree_tools,
    with_tools,
)
from ._tools import (
    AUTONOMOUS_REFUSAL,
    flow_tool,
    flow_tools,
    offered,
)

__all__ = [
    "AUTONOMOUS_LABEL",
    "AUTONOMOUS_REFUSAL",
    "DAEMON_LABELS",
    "FLOW_LABEL",
    "LINKED_LABEL",
    "MAP_OF_LABEL",
    "PARENT_LABEL",
    "SUBAGENTS",
    "TOOLS_LABEL",
    "FlowHost",
    "FlowSession",
    "caller_labels",
    "child_run_id",
    "client_project",
    "flow_tool",
    "flow_tools",
    "inherited_labels",
    "is_autonomous",
    "offered",
    "session_of",
    "tree_tools",
    "with_tools",
]
