"""A ``flow`` node: the flow of the project it names, run as a child graph run of the walk.

The child's id derives from the graph run and the node (``flow_child_id``), so a re-walk after a
crash finds the child a killed drive started instead of starting a second one. Its head is
durable before it is driven, its files are the parent's (its document the nested flow's member),
and its output, once it completes, is the node's.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import trio
from salvor.protocol import (
    EMPTY_VIEW,
    Graph,
    GraphNode,
    GraphRunStarted,
    NodeKind,
    RunState,
    content_hash,
)
from salvor.store import SeqConflict

from ..agents import AgentDefinition, parse_definition
from ..flows import MAP_OF_LABEL, inherited_labels
from ..recording import DriveInterrupted, RunContext
from ._flow_check import check_flow, nested_member, registry_parser
from ._walk_parts import WalkParts

# The namespace of nested flow runs' ids (uuid5 over "<graph run>/<node>").
FLOW_CHILDREN = uuid.UUID("0b6c1f0e-4a7d-5e3b-9f21-8d5c2e7a4b60")
# A child in one of these states fails its flow node (and the graph run).
_CHILD_FAILED = (RunState.FAILED, RunState.ABANDONED)


def flow_child_id(run_id: str, node: str) -> str:
    """The run id of the nested flow run ``flow`` node ``node`` of graph run ``run_id`` starts:
    the same every walk, so a re-walk finds the child a killed drive started."""
    return str(uuid.uuid5(FLOW_CHILDREN, f"{run_id}/{node}"))


async def run_nested_flow(
    walk: WalkParts, ctx: RunContext, node: GraphNode, flow_input: Any, drive: Callable
) -> Any:
    """Run the flow ``node`` names as a child graph run (its id derived, its head durable
    before it is driven, so a re-walk drives the one child); its output is the child's.

    Raises:
        Parked: the child failed (this run fails naming the node and the child).
        DriveInterrupted: the child rests short of an output (a gate, a delay) or its
            drive stopped; a later drive of this run drives it on.
    """
    member = None if walk.files is None else nested_member(walk.files, node)
    if member is None:  # the pre-check refuses such a flow before it starts
        await walk.fail(ctx, node, f"the flow {node.flow!r} was not sent with this run")
    files = walk.files.nested(member, node)
    checked = await trio.to_thread.run_sync(
        check_flow,
        files,
        registry_parser(walk.registry.names(), walk.registry.skills),
        walk.registry.file_inputs(),
    )
    if checked.graph is None:
        await walk.fail(ctx, node, f"the flow {node.flow!r}: {checked.errors[0].message}")
    graph, store = checked.graph, walk.access.store
    manifest = files.bundle.manifest_bytes()
    digest = content_hash(manifest)
    # The NodeEntered (and what else is held) is durable before the child exists.
    await ctx.flush()
    await walk.access.read(store.flow_files.put, {digest: manifest})
    await walk.access.read(
        lambda: store.definitions.put_graph(
            graph.hash, document=graph.document, summary=graph.summary()
        )
    )
    child = flow_child_id(ctx.run_id, node.id)
    head = GraphRunStarted(
        graph_hash=graph.hash,
        input=flow_input,
        labels={MAP_OF_LABEL: walk.run_id, **inherited_labels(walk.tree_labels(ctx))},
        flow=digest,
    )
    with contextlib.suppress(SeqConflict):  # a killed walk started it already
        await walk.access.append(child, [head], EMPTY_VIEW)
    agents = await _child_agents(walk, ctx, node, graph, checked.agents)
    rested = await drive(walk.kit, child, graph, agents, files=files)
    if rested.state is RunState.COMPLETED:
        return rested.detail.get("output")
    if rested.state in _CHILD_FAILED:
        error = rested.detail.get("error") or rested.detail.get("reason") or ""
        await walk.fail(
            ctx,
            node,
            f"the flow {node.flow!r} (child run {child}) {rested.state.value}: {error}",
        )
    raise DriveInterrupted(
        f"flow node {node.id!r}: its child run {child} is {rested.state.value}; once it "
        f"completes, `salvor resume {ctx.run_id}` walks on"
    )


async def _child_agents(
    walk: WalkParts,
    ctx: RunContext,
    node: GraphNode,
    graph: Graph,
    known: Mapping[str, AgentDefinition],
) -> dict[str, AgentDefinition]:
    """Every agent a nested flow's nodes name: its agent files', and those it names by hash
    from the store (stored when the flow run started, which checked them)."""
    agents = {**walk.agents, **known}
    for other in graph.nodes:
        call = other.body if other.kind is NodeKind.MAP else other
        if call is None or call.kind is not NodeKind.AGENT or call.agent in agents:
            continue
        stored = await walk.access.read(walk.access.store.get_agent, call.agent)
        if stored is None:
            await walk.fail(ctx, node, f"the flow {node.flow!r} names an unknown agent")
        agents[call.agent] = parse_definition(
            stored.definition, stored.format, known_tools=walk.registry.names(), stored=True
        )
    return agents
