"""The pieces both authoring paths share, the daemon's (``FlowCatalog``) and a linked run's that
saves on the client (``_client_saves``): a flow name's rule, an answer's shape, and a graph
document's parse and the registered agents its nodes name (read on a worker thread)."""

from __future__ import annotations

import re
from typing import Any

from salvor.protocol import (
    Diagnostic,
    Graph,
    GraphNode,
    InvalidGraph,
    Severity,
    graph_nodes,
    parse_graph_json,
    parse_graph_yaml,
)
from salvor.store import EventStore

from ..agents import AgentDefinition, DefinitionError, parse_definition

FLOW_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def answer(written: bool, diagnostics: list[Diagnostic]) -> dict:
    return {"written": written, "diagnostics": [d.to_json() for d in diagnostics]}


def has_errors(diagnostics: list[Diagnostic]) -> bool:
    return any(d.severity is Severity.ERROR for d in diagnostics)


def parsed_graph(content: str) -> tuple[Graph | None, tuple[GraphNode, ...]]:
    """A graph document's graph (None when it does not validate) and its nodes, those its shape
    reads when it does not: the diagnostics check every agent node either way
    (``graph_diagnostics`` with ``graph_agents``)."""
    parse = parse_graph_json if content.lstrip().startswith("{") else parse_graph_yaml
    try:
        graph = parse(content)
    except InvalidGraph:
        return None, graph_nodes(content)
    return graph, graph.nodes


def graph_agents(
    store: EventStore, nodes: tuple[GraphNode, ...], known_tools: Any
) -> tuple[dict[str, AgentDefinition], dict[str, str | None]]:
    """The registered agents ``nodes`` name, by hash (the ones that still build), and, when a
    node names one that is not among them, every registered agent's name by hash (where its
    suggestion is looked for)."""
    found: dict[str, AgentDefinition] = {}
    for node in nodes:
        target = node.body if node.body is not None else node
        if target.agent is None or target.agent in found:
            continue
        stored = store.definitions.get_agent(target.agent)
        if stored is None:
            continue
        try:
            found[target.agent] = parse_definition(
                stored.definition, stored.format, known_tools=known_tools, stored=True
            )
        except DefinitionError:
            continue  # no longer builds here: refused as not registered
    named = {(node.body or node).agent for node in nodes} - {None}
    if named <= found.keys():
        return found, {}  # nothing to suggest a registered agent for
    registered = {stored.agent_def_hash: stored.name for stored in store.definitions.list_agents()}
    return found, registered
