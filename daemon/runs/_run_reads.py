"""What the store says of runs, read on reader threads: a run's view and log, listings, its
children, the reconciliation queue, the census, and which runs a sweep or a restart drives.

Nothing here records anything. The runs a restart drives again are decided here too, because
that is a read of the store and of the definitions it holds (which writes can be probed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from salvor.protocol import Actor, Envelope, Graph, RunState, RunView
from salvor.store import RunSummary

from ..agents import AgentDefinition, declares_probe, lane_called, probes_open_write
from ..client_runs import ClientTool
from ..flows import MAP_OF_LABEL, PARENT_LABEL
from ..graphs import graph_declares_probe, graph_probes_open_write
from ..mcp import McpServerSpec
from ..recording import StoreAccess
from ..web import OperationRefused, unknown_run
from ._definitions import Definitions
from ._event_hub import PAGE_BYTES, PAGE_EVENTS
from ._reconciliations import Reconciliation, reconciliation


def driver_of(view: RunView) -> str | None:
    """The run whose drive drives this one inline (a map item's graph run, a subagent's parent)."""
    labels = view.labels or {}
    return labels.get(MAP_OF_LABEL) or labels.get(PARENT_LABEL)


class RunReads:
    """Reads of one store's runs; ``definitions`` say which parked writes a drive can probe."""

    def __init__(
        self,
        access: StoreAccess,
        definitions: Definitions,
        *,
        clock: Callable[[], datetime],
        attachable_mcp: Mapping[str, McpServerSpec] | None = None,
    ) -> None:
        self.access = access
        self.definitions = definitions
        # What an MCP server attached at run time reaches (``--attachable-mcp``): an open write
        # of an attached tool is probed as a definition's is.
        self.attachable_mcp = attachable_mcp or {}
        # What "now" is when a caller does not say (``due_runs``).
        self.clock = clock

    async def view(self, run_id: str) -> RunView:
        """The run's folded view.

        Raises:
            OperationRefused: unknown_run.
        """
        view = await self.find_view(run_id)
        if view is None:
            raise unknown_run(run_id)
        return view

    async def find_view(self, run_id: str) -> RunView | None:
        """The run's folded view, or None when the store holds no such run."""
        return await self.access.read(self.access.store.read_view, run_id)

    async def read_log(self, run_id: str, from_seq: int = 0) -> list[Envelope]:
        """The run's events from ``from_seq`` on; empty for an unknown
        run or a cursor at the end."""
        return await self.access.read(self.access.store.read_log, run_id, from_seq)

    async def read_page(self, run_id: str, from_seq: int) -> list[Envelope]:
        """One page of the run's events from ``from_seq``: at most ``PAGE_EVENTS``, about
        ``PAGE_BYTES`` of payload (a stream reads a log so, never whole); empty for an unknown
        run or a cursor at the end."""
        return await self.access.read(
            self.access.store.read_log, run_id, from_seq, limit=PAGE_EVENTS, max_bytes=PAGE_BYTES
        )

    async def list_runs(self, **filters: Any) -> tuple[list[RunSummary], str | None]:
        """One page of run summaries (``EventStore.list_runs``'s filters)
        and the next page's cursor."""
        return await self.access.read(lambda: self.access.store.list_runs(**filters))

    async def list_children(self, run_id: str) -> list[RunSummary]:
        """The runs ``run_id``'s subagent calls started, oldest first. Reads only.

        Raises:
            OperationRefused: unknown_run.
        """
        await self.view(run_id)
        children, _ = await self.list_runs(label=(PARENT_LABEL, run_id))
        return children[::-1]

    async def reconciliations(
        self,
        client_tools: Mapping[str, ClientTool],
        *,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[list[Reconciliation], str | None]:
        """One page of the reconciliation queue (every run parked on a write of unknown
        outcome, oldest write first) and the next page's cursor. Reads only.

        ``client_tools`` are the declarations a client-performed write's resolve is checked
        against (the item says what they expect).

        Raises:
            BadCursor: ``after`` is not a cursor this store issued (400 bad_request).
        """
        page, cursor = await self.access.read(
            lambda: self.access.store.runs.parked_writes(limit=limit, after=after)
        )
        positions = [(p.run_id, p.view.pending.seq) for p in page]
        probed = await self.access.read(self.access.store.claims.probe_answers, positions)
        items = [
            reconciliation(p.run_id, p.view, client_tools, probed.get(at))
            for p, at in zip(page, positions, strict=True)
        ]
        return items, cursor

    async def interrupted_runs(self) -> list[str]:
        """Server-driven runs a restart drives again: those cut mid-flight, and those parked on
        a write whose tool declares a probe (their drive probes it first)."""
        candidates = await self.recovery_candidates()
        return await self.without_walked_children(candidates, set(candidates))

    async def recovery_candidates(self) -> list[str]:
        """What ``interrupted_runs`` chooses from: every run cut mid-flight and every parked
        write this daemon can probe, children included. One query and one listing; no run's
        view is read."""
        interrupted = await self.access.read(self.access.store.runs.interrupted_runs)
        return interrupted + await self.probed_writes()

    async def without_walked_children(self, runs: list[str], walked: set[str]) -> list[str]:
        """``runs`` less the children whose driver is in ``walked`` (a map item's graph run, a
        subagent's parent): recovery of a tree starts at its root, whose drive drives them. (A
        second drive of such a child would wait for the first: ``StoreAccess.driving``.) Reads
        the view of each of ``runs``, so a caller narrows them first."""
        store = self.access.store
        views = await self.access.read(lambda: [store.read_view(run) for run in runs])
        return [
            run
            for run, view in zip(runs, views, strict=True)
            if view is None or driver_of(view) not in walked
        ]

    async def probed_writes(self) -> list[str]:
        """Runs parked in needs_reconciliation whose open write this daemon can probe.

        An agent run's write is probed when its agent declares the probe; a graph run's when
        one of its graph's agent nodes does, or a tool node calls the write and the registry
        holds its probe (the walk probes it exactly as an agent run's loop does); a flow run's
        agent-file nodes are bound from the files kept with it, as its drive binds them. One
        listing read, one head read per parked graph run, and one load per distinct agent or
        graph; a run whose agent or graph is not
        stored here (or no longer builds) is left to a person.
        """
        parked, _ = await self.access.read(
            lambda: self.access.store.list_runs(state=RunState.NEEDS_RECONCILIATION.value)
        )
        agents: dict[str, AgentDefinition | None] = {}
        graphs: dict[tuple[str, str | None], tuple[Graph, list[AgentDefinition]] | None] = {}
        found = []
        for summary in parked:
            pending = summary.pending
            if pending is None or summary.driven_by == Actor.CLIENT:
                continue
            if summary.agent_def_hash is not None:
                digest = summary.agent_def_hash
                if digest not in agents:
                    try:
                        agents[digest] = await self.definitions.load_agent(digest)
                    except OperationRefused:
                        agents[digest] = None
                agent = agents[digest]
                if (
                    agent is not None
                    and declares_probe(
                        agent, self.definitions.registry, pending["tool"], pending.get("input")
                    )
                    or await self._attached_probe(summary.run_id, lane_called(pending))
                ):
                    found.append(summary.run_id)
            elif summary.graph_hash is not None:
                # A flow run's agent files bind its nodes: its head names them, as a drive reads.
                key = (summary.graph_hash, await self.definitions.run_flow(summary.run_id))
                if key not in graphs:
                    graphs[key] = await self.definitions.graph_and_agents(*key)
                if (
                    graphs[key] is not None
                    and graph_declares_probe(
                        *graphs[key], self.definitions.registry, pending["tool"]
                    )
                    or await self._attached_probe(summary.run_id, pending["tool"])
                ):
                    found.append(summary.run_id)
        return found

    async def _attached_probe(self, run_id: str, tool_name: str) -> bool:
        """Whether the parked run's open write ``tool_name`` is one attached to it at run time
        whose probe its drive runs (``probes_on_drive``). The run's log is read only when some
        attachable tool or server probes a tool of that name at all (``lane_called``: a process
        agent's call on its ``salvor`` lane is named by the tool it called)."""
        registry = self.definitions.registry
        tool = registry.get(tool_name)
        if not (
            (tool is not None and registry.probe_of(tool) is not None)
            or any(spec.probe_of(tool_name) for spec in self.attachable_mcp.values())
        ):
            return False
        view = await self.find_view(run_id)
        return view is not None and await self.probes_on_drive(view)

    async def probes_on_drive(self, view: RunView) -> bool:
        """Whether a drive of the parked run ``view`` probes its open write (an agent run's or a
        graph run's, as ``probed_writes`` decides); whatever else is wrong with its agent or
        graph, the dangling write is what a refusal says."""
        log = [] if view.run_id is None else await self.read_log(view.run_id)
        registry, attachable = self.definitions.registry, self.attachable_mcp
        if view.graph_hash is not None:
            flow = None if view.run_id is None else await self.definitions.run_flow(view.run_id)
            loaded = await self.definitions.graph_and_agents(view.graph_hash, flow)
            return loaded is not None and graph_probes_open_write(
                *loaded, registry, view, log, attachable
            )
        try:
            agent = await self.definitions.load_agent(view.agent_def_hash)
        except OperationRefused:
            return False
        return probes_open_write(agent, registry, view, log, attachable)

    async def log(self, run_id: str, from_seq: int = 0) -> list[Envelope]:
        """The run's events from ``from_seq`` on (``read_log``), a known run's only.

        Raises:
            OperationRefused: unknown_run, for a run with no event at all.
        """
        log = await self.read_log(run_id, from_seq)
        if not log and from_seq == 0:
            raise unknown_run(run_id)
        return log

    async def census(self) -> tuple[dict[str, int], int]:
        """Runs per state and the idempotency identities held open (``store.runs.census``), read
        on a reader thread.

        Raises:
            StoreUnavailable: the store cannot be read.
        """
        return await self.access.read(self.access.store.runs.census)

    async def due_runs(self, now: datetime | None = None) -> list[str]:
        """The sleeping runs whose timer is due at ``now`` (this runtime's clock by default)."""
        return await self.access.read(self.access.store.runs.due_runs, now or self.clock())
