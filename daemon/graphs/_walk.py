"""The graph walker: a graph run driven from its log, replay first, through a RunContext.

A graph run's log narrates its walk (``NodeEntered``, ``NodeExited``,
``NodeSkipped``, ``MapItemCompleted``) between the calls its nodes make, and
those calls are recorded exactly as an agent run records them (an agent node
is the built-in loop, inline in this log). Every drive walks ``Graph.order``
from the top: a step the log holds is taken from the replay cursor (a
completed call is never made again), and past the end of the log the walk
goes live and records. The walk is a pure function of the log, so re-walking
it replays it.

Narration is held back and committed with the next append (a call's intent,
a park, the next node's narration): a node costs no append of its own, and a
drive killed before that append loses only what the next drive derives again
from the same recorded facts.

A map node's items are child runs (``_map_items``): a re-walk takes the recorded items and
drives only the children not yet recorded; a failed item ends the map before any later item
starts. A store fault under an item is raised by the walk as itself, not
as a group of its children's errors: the drive of the tree's root stops on it, and the healer
drives the root again, whose walk drives the child on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from salvor.protocol import (
    MISSING,
    TOOL_ERROR_KEY,
    EventKind,
    Graph,
    GraphNode,
    MapItemCompleted,
    NodeEntered,
    NodeExited,
    NodeKind,
    NodeSkipped,
    ReplayDivergence,
    RunCompleted,
    RunFailed,
    RunState,
    RunView,
    SleepStarted,
    Suspended,
    TemplateError,
    fold_values,
    format_instant,
    parse_instant,
    pick_case,
    resolve_template,
)

from ..agents import (
    AgentDefinition,
    AgentLoop,
    DriveKit,
    fail_unreachable,
    flow_session,
    gateway_for,
    reach_refusal,
    withdrawal_refusal,
    withdrawn_servers,
)
from ..flows import with_tools
from ..mcp import open_connections
from ..models import ModelGateway
from ..processes import MARK_VAR, RUN_VAR, store_fingerprint
from ..recording import DriveInterrupted, Parked, RunContext, StoreAccess, slept
from ..tools import graph_call_key
from ._call_captures import captured_value, snapshot_now
from ._flow_check import FlowFiles
from ._map_items import CHILD_FAILED, MapItems, recorded_items
from ._nested import run_nested_flow
from ._pinned import pinned_calls
from ._probes import graph_probes_open_write
from ._tool_files import ToolFileProblem, handing_files, staged_files

_Narration = NodeEntered | NodeExited | NodeSkipped | MapItemCompleted


# Forks of forks deeper than this are keyed from the deepest origin reached (ids are fresh, so no
# chain loops; the bound only keeps a damaged store from walking forever).
MAX_LINEAGE = 1000


async def lineage_root(access: StoreAccess, run_id: str, forked_from: dict | None) -> str:
    """The run a graph run's forks descend from: ``run_id`` itself unless it is a fork, else the
    root its origin descends from (each origin's ``forked_from``, one ``runs`` row each)."""
    root = run_id
    for _ in range(MAX_LINEAGE):
        if forked_from is None:
            return root
        root = forked_from["run_id"]
        view = await access.read(access.store.read_view, root)
        forked_from = view.forked_from if view is not None else None
    return root


class GraphWalk:
    """One drive's walk of one graph run: the recorded outputs so far and the agents' gateways."""

    def __init__(
        self,
        kit: DriveKit,
        graph: Graph,
        agents: Mapping[str, AgentDefinition],
        files: FlowFiles | None = None,
    ) -> None:
        self.kit = kit
        # A flow run's files (its nested flows are found there), None for a graph by hash.
        self.files = files
        self.access = kit.access
        self.graph = graph
        self.agents = agents
        self.registry = kit.registry
        self.labels: dict[str, str] | None = None
        self.run_input: Any = None
        self._run_id = ""
        # The run this one's forks descend from (itself unless it is a fork): its calls' keys.
        self.lineage = ""
        # Node id -> its recorded output, and what the nodes after it read of it (the same, but
        # for a snapshot that captured its baseline: the value it held, as when it compares);
        # a branch's case; the nodes passed by.
        self.outputs: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.cases: dict[str, str] = {}
        self.skipped: set[str] = set()
        self._gateways: dict[str, ModelGateway] = {}

    async def aclose(self) -> None:
        for gateway in self._gateways.values():
            await gateway.aclose()

    def tree_labels(self, ctx: RunContext) -> dict[str, str] | None:
        """The labels a child this walk starts here inherits from: the head's, with the tools
        attached to the tree so far (the log's up to this point, so a replay starts the same)."""
        ctx.live  # noqa: B018 (the cursor passes the attachments standing before this point)
        return with_tools(self.labels, ctx.cursor.attached)

    # -- the walk -------------------------------------------------------------

    async def run(self, ctx: RunContext) -> None:
        """Walk from the head to the run's next resting point. Raises Parked at every one."""
        head = ctx.cursor.take(EventKind.GRAPH_RUN_STARTED)
        if head is None:
            raise DriveInterrupted(f"run {ctx.run_id} has no GraphRunStarted head")
        self.run_input = head.event.input
        self.labels = head.event.labels
        self._run_id = ctx.run_id
        self.lineage = await lineage_root(self.access, ctx.run_id, head.event.forked_from)
        for node_id in self.graph.order:
            reason = self._dead_because(node_id)
            if reason is not None:
                await self._narrate(ctx, NodeSkipped(node=node_id, reason=reason))
                self.skipped.add(node_id)
                continue
            await self._walk_node(ctx, self.graph.node(node_id))
        terminals = self.graph.terminal_nodes
        output = {node: self.values[node] for node in terminals if node in self.values}
        await ctx.control(RunCompleted(output=output))
        await ctx.park(RunState.COMPLETED)

    def _dead_because(self, node_id: str) -> str | None:
        """Why ``node_id`` is dead (every inbound edge is), or None when it is live."""
        inbound = self.graph.predecessors(node_id)
        if not inbound:
            return None
        why = []
        for edge in inbound:
            if edge.source in self.skipped:
                why.append(f"`{edge.source}` was skipped")
            elif edge.case is not None and self.cases.get(edge.source) != edge.case:
                why.append(
                    f"branch `{edge.source}` took case `{self.cases.get(edge.source)}`, "
                    f"not `{edge.case}`"
                )
            else:
                return None
        return "no live inbound edge: " + "; ".join(why)

    async def _narrate(self, ctx: RunContext, event: _Narration) -> None:
        """Hold ``event`` for the next append when live; in replay, take the recorded one.

        Raises:
            ReplayDivergence: the log narrates another step here (the graph is not the one
                the log walked, or the log was not written by this walk).
        """
        if ctx.live:
            ctx.hold(event)
            return
        at = ctx.cursor.position
        try:
            found = ctx.cursor.take(event.KIND)
        except ReplayDivergence:
            found = None
        if found is None or found.event.node != event.node:
            raise ReplayDivergence(
                f"run {ctx.run_id}: at position {at} the walk of graph {self.graph.hash} is at "
                f"{event.KIND.value} of node {event.node!r}, which the log does not record there"
            )
        if isinstance(found.event, NodeExited):
            # The recorded output is the node's (an agent's answer is the log's, not a new one).
            self._output(event.node, found.event.output)

    @property
    def run_id(self) -> str:
        """The graph run this walk drives (set once its head is read)."""
        return self._run_id

    async def fail(self, ctx: RunContext, node: GraphNode, message: str) -> None:
        """Fail the run naming ``node`` (``_fail``), for the node kinds walked elsewhere."""
        await self._fail(ctx, node, message)

    async def _fail(self, ctx: RunContext, node: GraphNode, message: str) -> None:
        """Fail the run naming ``node``; raises Parked (or takes the recorded RunFailed)."""
        await ctx.control(RunFailed(error=f"node {node.id!r}: {message}"))
        await ctx.park(RunState.FAILED)

    async def _resolve(
        self,
        ctx: RunContext,
        node: GraphNode,
        template: Any,
        *,
        item: Any = MISSING,
        index: int | None = None,
    ) -> Any:
        try:
            return resolve_template(
                template, run_input=self.run_input, outputs=self.values, item=item, index=index
            )
        except TemplateError as exc:
            await self._fail(ctx, node, exc.message)

    async def _exit(self, ctx: RunContext, node: GraphNode, output: Any, **case: str) -> None:
        self._output(node.id, output)
        await self._narrate(ctx, NodeExited(node=node.id, output=output, **case))

    def _output(self, node_id: str, output: Any) -> None:
        self.outputs[node_id] = output
        captured = None
        if self.graph.node(node_id).kind is NodeKind.SNAPSHOT:
            captured = captured_value(output)
        self.values[node_id] = output if captured is None else captured[1]

    async def _walk_node(self, ctx: RunContext, node: GraphNode) -> None:
        kind = node.kind
        if kind is NodeKind.AGENT:
            task = await self._resolve(ctx, node, node.input)
            await self._narrate(ctx, NodeEntered(node=node.id, input=task))
            calls = await pinned_calls(self, ctx, node) if node.pinned else None
            output = await self._converse(calls or ctx, node, self.agents[node.agent], task)
            if calls is not None:
                await calls.ended()
            await self._exit(ctx, node, output)
        elif kind is NodeKind.TOOL:
            tool_input = await self._resolve(ctx, node, node.input)
            await self._narrate(ctx, NodeEntered(node=node.id, input=tool_input))
            await self._exit(ctx, node, await self._tool_call(ctx, node, node, tool_input, 0))
        elif kind is NodeKind.GATE:
            held_up = await self._resolve(ctx, node, node.input)
            await self._narrate(ctx, NodeEntered(node=node.id, input=held_up))
            await ctx.control(Suspended(reason=node.prompt, input_schema=node.approval_schema))
            await self._exit(ctx, node, await ctx.await_resume(RunState.SUSPENDED))
        elif kind is NodeKind.BRANCH:
            value = await self._resolve(ctx, node, node.on)
            try:
                case = pick_case(node, value)
            except TemplateError as exc:
                await self._fail(ctx, node, exc.message)
            await self._narrate(ctx, NodeEntered(node=node.id, input=value))
            self.cases[node.id] = case
            await self._exit(ctx, node, value, branch_case=case)
        elif kind is NodeKind.FOLD:
            items = await self._resolve(ctx, node, node.over)
            try:
                output = fold_values(node.reducer, items, node.field)
            except TemplateError as exc:
                await self._fail(ctx, node, exc.message)
            await self._narrate(ctx, NodeEntered(node=node.id, input=items))
            await self._exit(ctx, node, output)
        elif kind is NodeKind.DELAY:
            await self._delay(ctx, node)
        elif kind is NodeKind.SNAPSHOT:
            value = await self._resolve(ctx, node, node.of)
            await self._narrate(ctx, NodeEntered(node=node.id, input=value))
            # Replayed, the recorded outcome is the node's (later captures are in the log now).
            output, problem = (
                await snapshot_now(self, ctx, node, value) if ctx.live else (None, None)
            )
            if problem is not None:
                await self._fail(ctx, node, problem)
            await self._exit(ctx, node, output)
        elif kind is NodeKind.FLOW:
            flow_input = await self._resolve(ctx, node, node.input)
            await self._narrate(ctx, NodeEntered(node=node.id, input=flow_input))
            output = (
                await run_nested_flow(self, ctx, node, flow_input, drive_graph)
                if ctx.live
                else None
            )
            await self._exit(ctx, node, output)
        else:
            await self._map(ctx, node)

    # -- the node kinds that act --------------------------------------------

    def _gateway(self, agent: AgentDefinition) -> ModelGateway:
        gateway = self._gateways.get(agent.agent_def_hash)
        if gateway is None:
            gateway = self._gateways[agent.agent_def_hash] = gateway_for(
                agent, self.kit.credentials, self.kit.model_clients
            )
        return gateway

    def branches_on(self, node: GraphNode) -> list[str] | None:
        """The cases of the branch node that routes on ``node``'s finish branch, if one does."""
        reference = f"$nodes.{node.id}.branch"
        for other in self.graph.nodes:
            if other.kind is NodeKind.BRANCH and other.on == reference:
                return list(other.cases)
        return None

    async def _converse(
        self, ctx: RunContext, node: GraphNode, agent: AgentDefinition, task: Any
    ) -> Any:
        """The agent's loop, inline in this log, about ``task``; its final output.

        Its idempotent calls without key fields are keyed by (lineage, graph hash, node id, the
        call's index within the node), not by their seq, so a fork re-walking the node presents
        the keys its origin recorded and the provider collapses the repeats.
        """
        mark = {MARK_VAR: store_fingerprint(self.access.store.url), RUN_VAR: ctx.run_id}

        def call_key(index: int, tool: str) -> str:
            return graph_call_key(self.lineage, self.graph.hash, node.id, index, tool)

        session = flow_session(
            agent,
            ctx.run_id,
            self.labels,
            self.kit.flows,
            graph_node=True,
            branches=self.branches_on(node),
        )
        # MCP servers are started only when the conversation first needs one live.
        async with open_connections(agent.mcp_servers, mark=mark) as mcp:
            gateway, attachable = self._gateway(agent), self.kit.attachable_mcp
            loop = AgentLoop(agent, self.registry, gateway, mcp, session, mark, attachable)
            return await loop.converse(ctx, task, call_key=call_key)

    async def _tool_call(
        self, ctx: RunContext, node: GraphNode, call: GraphNode, tool_input: Any, index: int
    ) -> Any:
        """One call of ``call``'s tool (a tool node, or a map's tool body) at ``index``.

        A call whose recorded output is a tool error fails the run: a graph has no model
        to tell, so the error is the node's end.
        """
        tool = self.registry.get(call.tool)
        probe = self.registry.probe_of(tool) if tool.probe else None
        key = graph_call_key(self.lineage, self.graph.hash, node.id, index, tool.name)
        try:
            staged = staged_files(
                call, tool_input, self.registry.file_inputs(), self.files, self.outputs
            )
        except ToolFileProblem as exc:
            await self._fail(ctx, node, str(exc))
        # Recorded with the client's paths; only the handler sees the daemon's copies.
        output = await ctx.tool_call(handing_files(tool, staged), tool_input, probe=probe, key=key)
        if isinstance(output, dict) and TOOL_ERROR_KEY in output:
            error = output[TOOL_ERROR_KEY]
            await self._fail(ctx, node, f"the {tool.name} call failed: {error.get('message')}")
        return output

    async def _delay(self, ctx: RunContext, node: GraphNode) -> None:
        if node.seconds is not None:
            await self._narrate(ctx, NodeEntered(node=node.id, input={"seconds": node.seconds}))
            wake_at: datetime = await ctx.now() + timedelta(seconds=node.seconds)
        else:
            until = await self._resolve(ctx, node, node.until)
            try:
                wake_at = parse_instant(until)
            except ValueError:
                await self._fail(ctx, node, f"`until` is {until!r}, not an RFC 3339 instant")
            await self._narrate(ctx, NodeEntered(node=node.id, input={"until": until}))
        when = format_instant(wake_at)
        await ctx.control(SleepStarted(wake_at=when))
        await ctx.sleep_until_woken()
        await self._exit(ctx, node, slept(when))

    async def _map(self, ctx: RunContext, node: GraphNode) -> None:
        items = await self._resolve(ctx, node, node.over)
        if not isinstance(items, list):
            await self._fail(ctx, node, f"`over` ({node.over}) is not a list")
        await self._narrate(ctx, NodeEntered(node=node.id, input=items))
        body = node.body
        outputs: dict[int, Any] = {}
        if body.kind is NodeKind.TOOL:
            # Inline, one after another: each call is a step of this log.
            for index, item in enumerate(items):
                call_input = await self._resolve(ctx, node, body.input, item=item, index=index)
                output = await self._tool_call(ctx, node, body, call_input, index)
                outputs[index] = output
                await self._narrate(
                    ctx,
                    MapItemCompleted(node=node.id, index=index, run_id=ctx.run_id, output=output),
                )
        else:
            await self._map_children(ctx, node, items, outputs)
        await self._exit(ctx, node, [outputs[index] for index in range(len(items))])

    async def _map_children(
        self, ctx: RunContext, node: GraphNode, items: list, outputs: dict[int, Any]
    ) -> None:
        """Fill ``outputs`` from the recorded items, then from children driven now
        (``MapItems``).

        Raises:
            Parked: a child failed (the run fails naming node, index and child); no item after
                it was started, and the items in flight were driven to their rest first.
            DriveInterrupted: a child rests short of an output (parked on a gate, a budget,
                a write to reconcile, a timer) or its drive stopped; every other item is
                driven and recorded first, and a later drive of this run drives the rest.
            StoreUnavailable: the store failed under a child, or under this walk recording an
                item (``store_fault``), raised as itself once the items in flight reached their
                rest; each child is left at its last durable event, and a later drive of this
                run drives them on.
        """
        outputs.update(recorded_items(ctx))
        remaining = [index for index in range(len(items)) if index not in outputs]
        if not remaining:
            return
        # The NodeEntered (and what else is held) is durable before any child exists.
        await ctx.flush()
        agent = self.agents[node.body.agent]
        inputs = await self._item_inputs(ctx, node, items, remaining)
        children = MapItems(self.kit, self._run_id, self.tree_labels(ctx), node, agent)
        end = await children.drive(ctx, inputs, outputs)
        if end.fault is not None:
            raise end.fault
        if end.failed is not None or end.stopped is not None:
            await self._map_stopped(ctx, node, *(end.failed or end.stopped))

    async def _item_inputs(
        self, ctx: RunContext, node: GraphNode, items: list, indexes: list[int]
    ) -> dict[int, Any]:
        """Each item's child input, resolved from the body's ``input`` before any child starts."""
        return {
            index: await self._resolve(ctx, node, node.body.input, item=items[index], index=index)
            for index in indexes
        }

    async def _map_stopped(
        self, ctx: RunContext, node: GraphNode, index: int, child: str, rested: RunView | str
    ) -> None:
        """Where a map ends short of its outputs: a failed child fails the run, any other stop
        interrupts the drive (``_map_children``)."""
        if isinstance(rested, RunView) and rested.state in CHILD_FAILED:
            error = rested.detail.get("error") or rested.detail.get("reason") or ""
            await self._fail(
                ctx, node, f"map item {index} (child run {child}) {rested.state.value}: {error}"
            )
        what = rested.state.value if isinstance(rested, RunView) else f"stopped: {rested}"
        raise DriveInterrupted(
            f"map node {node.id!r}: item {index} (child run {child}) is {what}; once it "
            f"completes, `salvor resume {ctx.run_id}` walks on"
        )


async def drive_graph(
    kit: DriveKit,
    run_id: str,
    graph: Graph,
    agents: Mapping[str, AgentDefinition],
    *,
    on_record: Callable | None = None,
    files: FlowFiles | None = None,
) -> RunView:
    """Drive a graph run to its next resting point and return its view there.

    ``agents``: every agent the graph's nodes name, by hash (built-in agents). ``files``: a
    flow run's files (its graph bound to them), where its nested flows are found. ``kit``: what
    every drive is handed; its map items' drives are handed the same (``agents.drive``).
    Whatever log it finds is walked: a fork's child, whose log holds a copied
    prefix, continues from the end of that prefix.

    Raises:
        DriveInterrupted: the drive stopped with the run recoverable (a model
            call that may succeed later, a map item that has not completed).
        ReplayDivergence: the log does not narrate this graph's walk; nothing was recorded.

    Concurrency:
        The walk holds the run (``kit.access.driving``) as ``agents.drive`` holds an agent run.
    """
    access = kit.access
    async with access.driving.hold(run_id):  # one drive at a time (``agents.drive`` says why)
        log = await access.read(access.store.read_log, run_id)
        ctx = RunContext(access, run_id, log, on_record=on_record, clock=kit.clock)
        # Every agent the walk may reach, held to the operator's declarations as they are now.
        refusal = next(
            (r for agent in agents.values() if (r := reach_refusal(agent, kit.credentials))),
            None,
        ) or withdrawal_refusal(withdrawn_servers(ctx.view.labels, log, kit.attachable_mcp))
        if refusal is not None:
            return await fail_unreachable(ctx, refusal)
        if ctx.view.idle and not graph_probes_open_write(
            graph, agents.values(), kit.registry, ctx.view, log, kit.attachable_mcp
        ):
            return ctx.view
        return await _walk(ctx, GraphWalk(kit, graph, agents, files))


async def _walk(ctx: RunContext, walk: GraphWalk) -> RunView:
    try:
        await walk.run(ctx)
    except Parked:
        pass
    finally:
        await walk.aclose()
    return ctx.view
