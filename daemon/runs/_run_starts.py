"""Starting runs: an agent run's head, a graph run's, a re-run's of a completed process agent run.

A start checks everything it can first (labels, the definition, the graph's agents and tools, a
service agent's port) and then records the run's head in one append: once it returns the run
exists durably, and a refusal leaves the store as it was. A start drives nothing; whoever
started the run drives it (the driving set, the command line).
"""

from __future__ import annotations

import uuid
from typing import Any

from salvor.protocol import (
    EMPTY_VIEW,
    Actor,
    ErrorCode,
    Graph,
    GraphRunStarted,
    InvalidGraph,
    RunStarted,
    RunState,
    RunView,
)
from salvor.store import SeqConflict

from ..agents import AgentDefinition, AgentKind
from ..graphs import FlowFiles, files_not_sent
from ..processes import PortClaims
from ..recording import StoreAccess, checked_labels, chosen_run_id, parse_run_id
from ..web import OperationRefused, bad_request, port_held
from ._definitions import Definitions
from ._run_reads import RunReads


async def open_log(access: StoreAccess, run_id: str, events: list) -> RunView:
    """Record a new run's first events from seq 0, in one append: once this returns the run
    exists durably (an agent run's or a graph run's head, a fork's copied prefix).

    Raises:
        OperationRefused: run_exists when ``run_id`` already has history (seq 0 is taken, so
            the append itself fails); nothing was written.
    """
    try:
        _, view = await access.append(run_id, events, EMPTY_VIEW)
    except SeqConflict:
        raise OperationRefused(
            ErrorCode.RUN_EXISTS, f"run {run_id} already has history; choose another id"
        ) from None
    return view


class RunStarts:
    """New runs' heads over one store; a service agent's port is claimed in ``ports``."""

    def __init__(
        self,
        access: StoreAccess,
        definitions: Definitions,
        reads: RunReads,
        *,
        ports: PortClaims,
    ) -> None:
        self.access = access
        self.definitions = definitions
        self.reads = reads
        # Which run holds each service agent's loopback port (a start claims, a drive releases).
        self.ports = ports

    async def open_log(self, run_id: str, events: list) -> RunView:
        """Record a new run's first events (``open_log``)."""
        return await open_log(self.access, run_id, events)

    async def start_run(
        self,
        agent: AgentDefinition,
        run_input: Any,
        *,
        labels: dict[str, str] | None = None,
        run_id: str | None = None,
        register: bool = True,
        replay_of: str | None = None,
    ) -> str:
        """Record a new run's head; once this returns the run exists durably.

        ``register=False`` when the definition was just read from this store.
        ``replay_of`` makes the run a re-run of that completed run: its input
        is the origin's (``run_input`` is ignored), and every model call it
        makes must reproduce the origin's call at the same position.

        Raises:
            OperationRefused: bad_request for labels over the bounds or a
                re-run of a built-in agent, run_exists when ``run_id``
                already has history, unknown_run / wrong_state when the
                origin is missing or not completed, port_held when the
                service agent's proxy port is held by another live run of
                this daemon.
        """
        checked_labels(labels)
        run_id = chosen_run_id(run_id) if run_id is not None else str(uuid.uuid4())
        if replay_of is not None:
            run_input = (await self.rerun_origin(parse_run_id(replay_of), agent)).input
            replay_of = parse_run_id(replay_of)
        port = agent.service.proxy_port if agent.service is not None else None
        if port is not None and (holder := self.ports.claim(port, run_id)) is not None:
            raise port_held(port, holder)
        # From here the claim belongs to this run; its drive lets it go.
        try:
            if register:
                await self.definitions.register_agent(agent)
            head = RunStarted(
                agent_def_hash=agent.agent_def_hash,
                input=run_input,
                labels=labels,
                replay_of=replay_of,
            )
            await open_log(self.access, run_id, [head])
        except BaseException:
            if port is not None:
                self.ports.release(port, run_id)
            raise
        return run_id

    async def start_graph_run(
        self,
        graph: Graph,
        run_input: Any,
        *,
        labels: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Record a new graph run's head (GraphRunStarted); once this returns the run exists
        durably. Check its agents and tools first (``graph_agents``): nothing is written for a
        graph that does not resolve.

        Raises:
            OperationRefused: bad_request for labels over the bounds, run_exists when
                ``run_id`` already has history, and what ``graph_agents`` raises.
        """
        checked_labels(labels)
        run_id = chosen_run_id(run_id) if run_id is not None else str(uuid.uuid4())
        unsent = files_not_sent(graph.nodes, self.definitions.registry.file_inputs())
        if unsent is not None:
            raise bad_request(unsent)
        await self.definitions.graph_agents(graph)
        head = GraphRunStarted(graph_hash=graph.hash, input=run_input, labels=labels)
        await open_log(self.access, run_id, [head])
        return run_id

    async def start_flow_run(
        self,
        files: FlowFiles,
        run_input: Any,
        *,
        labels: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Record a new run of a flow file: the pre-check of the whole flow and every member it
        reaches first (``graphs.check_flow``), then its agents, its graph and its files kept
        content-addressed, then the head naming the files' manifest.

        Raises:
            InvalidGraph: every error of the pre-check (the ``invalid_graph`` list); nothing
                was stored.
            OperationRefused: what ``start_graph_run`` raises for labels, ids, agents and tools.
        """
        checked_labels(labels)
        run_id = chosen_run_id(run_id) if run_id is not None else str(uuid.uuid4())
        checked = await self.definitions.checked_flow(files)
        if checked.graph is None:
            raise InvalidGraph(checked.errors)
        graph = checked.graph
        # Its nested flows' agents and tools too: a run starts only when all of it resolves.
        for reached in checked.graphs:
            await self.definitions.graph_agents(reached, known=checked.agents)
        for agent in checked.agents.values():
            source = checked.agent_files.get(agent.agent_def_hash)
            await self.definitions.register_agent(agent, source_path=source)
        for reached in checked.graphs:
            await self.definitions.register_graph(reached)
        manifest = await self.definitions.keep_flow_files(files)
        head = GraphRunStarted(graph_hash=graph.hash, input=run_input, labels=labels, flow=manifest)
        await open_log(self.access, run_id, [head])
        return run_id

    async def rerun_origin(self, origin: str, agent: AgentDefinition) -> RunView:
        """The view of the run a re-run of ``agent`` would reproduce, once it is known to be one.

        Raises:
            OperationRefused: unknown_run, wrong_state (the origin has not
                completed), bad_request (a built-in agent, or an origin that
                is itself driven by a client).
        """
        if agent.kind is AgentKind.BUILTIN:
            raise bad_request(
                "`replay_of` re-runs agent processes against their recorded model calls; this "
                "agent is a built-in one, whose recorded runs `salvor replay --dry-run RUN` "
                "derives without executing anything"
            )
        view = await self.reads.view(origin)
        if view.state is not RunState.COMPLETED:
            raise OperationRefused(
                ErrorCode.WRONG_STATE,
                f"run {origin} is {view.state.value}; "
                "only a completed run has a whole trajectory to re-run",
                details={"replay_of": origin, "state": view.state.value},
            )
        if view.driven_by == Actor.CLIENT:
            raise bad_request(
                f"run {origin} was driven by a client; a re-run reproduces an agent process's run"
            )
        return view
