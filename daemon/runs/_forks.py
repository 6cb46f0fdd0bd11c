"""The verbs on a graph run's recorded walk: its per-node projection, forking it from a node, and
the forks cut from it.

None of it drives anything: it reads logs and, for a fork, records one new run's head in one
append (``open_log``). Every refusal is raised before anything is recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from salvor.protocol import (
    Envelope,
    ErrorCode,
    ForkPlan,
    Graph,
    GraphRunStarted,
    InvalidGraph,
    NodeEntered,
    NodeKind,
    RunView,
    fork_head,
    graph_from_value,
    plan_fork,
    project_graph,
)
from salvor.store import EventStore

from ..graphs import map_child_id
from ..recording import StoreAccess, chosen_run_id
from ..web import OperationRefused, bad_request, unknown_graph, unknown_run
from ._run_starts import open_log


class Forks:
    """Graph-run projection and forks over one store."""

    def __init__(self, access: StoreAccess) -> None:
        self.access = access

    async def graph_projection(self, run_id: str) -> dict:
        """The run's per-node projection (``protocol.project_graph``). Reads only.

        The graph document, when this store still holds it, says which nodes are maps; without
        it the projection is made from the log alone.

        Raises:
            OperationRefused: unknown_run, or not_a_graph_run for an agent run.
        """
        store = self.access.store
        # The log, the document and the projection on a reader thread: a long log or a big
        # document is work the trio thread must not do.
        return await self.access.read(_projection, store, run_id)

    async def plan_fork(
        self,
        origin: str,
        from_node: str,
        acknowledged: Iterable[int] = (),
        *,
        document: Graph | None = None,
    ) -> ForkPlan:
        """Plan forking ``origin`` from ``from_node`` (``protocol.plan_fork``). Reads only.

        ``document``: the origin's graph supplied again (``salvor fork --graph``); it must hash
        as the one the origin recorded, and then this store need not hold it (``fork`` stores it
        with the child).

        Raises:
            OperationRefused: unknown_run; bad_request when ``document`` is another graph;
                unknown_graph when this store no longer holds the origin's graph and it was not
                supplied (both after every refusal of the plan itself).
            ForkRefused: not_a_graph_run, origin_needs_reconciliation, invalid_fork_node, or
                bad_request for an acknowledged seq that is not a write of the re-walked segment.
        """
        store, acknowledged = self.access.store, list(acknowledged)
        plan = await self.access.read(_planned, store, origin, from_node, acknowledged, document)
        if document is not None:
            if document.hash != plan.graph_hash:
                raise bad_request(
                    f"the graph supplied hashes to {document.hash}, but run {origin} walks "
                    f"{plan.graph_hash}; a fork reuses its origin's graph unchanged"
                )
        elif await self.access.read(store.definitions.get_graph, plan.graph_hash) is None:
            raise unknown_graph(plan.graph_hash)
        return plan

    async def fork(
        self, plan: ForkPlan, *, run_id: str | None = None, document: Graph | None = None
    ) -> tuple[str, RunView]:
        """Record the child of ``plan``: its head and the origin's prefix, in ONE append.

        Once this returns the child exists durably, between two nodes, with nothing open; it is
        driven like any graph run interrupted there (the caller starts that). The origin is not
        touched. ``document`` (the graph ``plan_fork`` was given) is stored first, so the child's
        graph is there to drive it by; stored content-addressed, it changes nothing that was.

        Raises:
            ForkRefused: write_replay_hazard while a write of the segment is unacknowledged.
            OperationRefused: run_exists when ``run_id`` already has history.
            Nothing is recorded on any of them.
        """
        plan.check_proceeds()
        run_id = chosen_run_id(run_id) if run_id is not None else str(uuid.uuid4())
        if document is not None:
            await self.access.read(
                lambda: self.access.store.definitions.put_graph(
                    document.hash, document=document.document, summary=document.summary()
                )
            )
        return run_id, await open_log(self.access, run_id, fork_head(plan))

    async def list_forks(self, run_id: str) -> list[RunView]:
        """The views of the runs forked from ``run_id``, oldest first. Reads only.

        Raises:
            OperationRefused: unknown_run.
        """
        store = self.access.store
        if await self.access.read(store.read_view, run_id) is None:
            raise unknown_run(run_id)
        return await self.access.read(store.runs.list_forks, run_id)


def _projection(store: EventStore, run_id: str) -> dict:
    log = store.read_log(run_id)
    if not log:
        raise unknown_run(run_id)
    head = log[0].event
    if not isinstance(head, GraphRunStarted):
        raise OperationRefused(
            ErrorCode.NOT_A_GRAPH_RUN,
            f"run {run_id} is an agent run, not a graph run; it has no per-node projection",
        )
    return project_graph(head.graph_hash, log, graph=_stored_graph(store, head.graph_hash))


def _stored_graph(store: EventStore, graph_hash: str) -> Graph | None:
    stored = store.definitions.get_graph(graph_hash)
    if stored is None:
        return None
    try:
        return graph_from_value(stored.document)
    except InvalidGraph:
        # Stored under an older build's rules and refused by this one's: what needs the
        # document (map progress, map items) is left out rather than guessed.
        return None


def _planned(
    store: EventStore,
    origin: str,
    from_node: str,
    acknowledged: list[int],
    document: Graph | None,
) -> ForkPlan:
    log = store.read_log(origin)
    if not log:
        raise unknown_run(origin)
    return plan_fork(
        log, from_node, acknowledged, map_items=_map_items(store, log, from_node, document)
    )


def _map_items(
    store: EventStore, log: list[Envelope], from_node: str, document: Graph | None
) -> dict[int, list[list[Envelope]]]:
    """The logs of the child runs of every map node the origin entered from ``from_node`` on,
    by that node's entry seq (``plan_fork``'s ``map_items``). Each item's run id is the one the
    walker derives, so an item not started yet reads as an empty log."""
    head = log[0].event
    if not isinstance(head, GraphRunStarted):
        return {}
    entry = next(
        (e.seq for e in log if isinstance(e.event, NodeEntered) and e.event.node == from_node),
        None,
    )
    graph = document if document is not None else _stored_graph(store, head.graph_hash)
    if entry is None or graph is None or graph.hash != head.graph_hash:
        return {}  # the plan's own refusal, or unknown_graph, is what to say
    maps = {node.id for node in graph.nodes if node.kind is NodeKind.MAP}
    return {
        e.seq: [
            store.read_log(map_child_id(e.run_id, e.event.node, index))
            for index in range(len(e.event.input))
        ]
        for e in log[entry:]
        if isinstance(e.event, NodeEntered)
        and e.event.node in maps
        and isinstance(e.event.input, list)
    }
