"""Which open writes of a graph run the walk can probe, as an agent run's loop probes its own.

A graph run's write is made by one of its nodes: an agent node (the built-in
loop, inline, with its agent's probes) or a tool node (the registry's tool,
with the registry's probe). Either way the walk hands the write its read, so
a graph run parked on such a write is driven, not left to a person: on
restart (``RunReads.probed_writes``) and whenever it is driven.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from salvor.protocol import Envelope, Graph, NodeKind, RunView

from ..agents import (
    AgentDefinition,
    attached_declares_probe,
    attachments_before,
    declares_probe,
    parked_write,
)
from ..mcp import McpServerSpec
from ..tools import ToolRegistry


def graph_declares_probe(
    graph: Graph, agents: Iterable[AgentDefinition], registry: ToolRegistry, tool_name: str
) -> bool:
    """Whether ``graph``'s write ``tool_name`` declares a probe this daemon can run: an agent
    node's agent declares it, or a tool node calls the write and the registry holds its probe."""
    if any(declares_probe(agent, registry, tool_name) for agent in agents):
        return True
    for node in graph.nodes:
        call = node.body if node.kind is NodeKind.MAP else node
        if call is not None and call.kind is NodeKind.TOOL and call.tool == tool_name:
            tool = registry.get(tool_name)
            return tool is not None and registry.probe_of(tool) is not None
    return False


def graph_probes_open_write(
    graph: Graph,
    agents: Iterable[AgentDefinition],
    registry: ToolRegistry,
    view: RunView,
    log: Sequence[Envelope] = (),
    attachable_mcp: Mapping[str, McpServerSpec] | None = None,
) -> bool:
    """Whether the graph run ``view`` is parked on an open write its walk probes first
    (``probes_open_write``'s rule for a graph run, an agent node's attached tools included)."""
    pending = parked_write(view)
    if pending is None:
        return False
    if graph_declares_probe(graph, agents, registry, pending.tool):
        return True
    attached = attachments_before(view.labels, log, pending.seq)
    return any(
        attached_declares_probe(agent, registry, attachable_mcp or {}, attached, pending.tool)
        for agent in agents
    )
