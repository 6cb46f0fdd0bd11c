"""A graph whose nodes need files the call did not bring: what a daemon says to a client that
sends no members (an older one, or a graph registered by hash), before anything starts.

Such a graph cannot run here (the daemon never opens a path of the client's), so it is refused
whole, each node that needs a file named with what it needs, and the sentence says how to get a
client that sends them. A tool node giving a tool's declared file input anything counts: its file
is the client's. Pure: nothing here opens a path.
"""

from __future__ import annotations

from collections.abc import Iterable

from salvor.protocol import FileInputs, GraphNode, InvalidGraph, declared_arguments

from ._flow_check import FlowFiles, parse_flow_document


def _need(node: GraphNode, file_inputs: FileInputs) -> str | None:
    call = node.body if node.body is not None else node
    if call.agent_file is not None:
        return f"node {node.id!r} runs an agent file"
    if call.flow is not None:
        return f"node {node.id!r} runs the nested flow {call.flow!r}"
    if call.of is not None:
        return f"node {node.id!r} holds a snapshot against its baseline"
    if call.pinned:
        return f"node {node.id!r} is an agent pinned to its baseline"
    arguments = [name for name, _ in declared_arguments(call, file_inputs)]
    if arguments:
        return (
            f"node {node.id!r} hands the tool {call.tool} a file of the client's "
            f"(argument {', '.join(arguments)}), and this daemon runs a tool node with file "
            "arguments only for a client that sends them with the call"
        )
    return None


def files_not_sent(nodes: Iterable[GraphNode], file_inputs: FileInputs | None = None) -> str | None:
    """The refusal of a graph whose ``nodes`` need files no call brought, or None when none
    does (``file_inputs``: the tools' declared file inputs, tool name -> arguments)."""
    needs = [need for node in nodes if (need := _need(node, file_inputs or {})) is not None]
    if not needs:
        return None
    return (
        f"{'; '.join(needs)}: this daemon runs such nodes only for a client that sends the "
        "files with the call (a flow and its members); update the salvor client on the calling "
        "machine (`salvor graph run FILE --remote URL` sends them)"
    )


def flow_without_members(files: FlowFiles, file_inputs: FileInputs | None = None) -> str | None:
    """``files_not_sent`` for a flow sent with no ``members`` field at all (a client that does
    not know them); None when its document does not parse (the pre-check says why)."""
    data = files.document_bytes()
    try:
        graph = parse_flow_document(data or b"", files.bundle.path)
    except InvalidGraph:
        return None
    return files_not_sent(graph.nodes, file_inputs)
