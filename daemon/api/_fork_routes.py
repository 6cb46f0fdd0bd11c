"""A graph run's recorded walk: ``GET /v1/runs/{id}/graph`` (its per-node projection),
``POST /v1/runs/{id}/fork`` (a new run re-walking it from a node) and ``GET /v1/runs/{id}/forks``
(the runs forked from it, a derived index).

A fork refuses, then records: every refusal (the plan's, an unacknowledged write, an origin
whose graph is no longer stored) comes before anything is written, and under ``dry_run`` as
well, which answers the plan and creates nothing. A fork that proceeds is one append (the child's
head and the origin's prefix), answered 201 once it is durable; the child is then driven like any
graph run.
"""

from __future__ import annotations

from quart_trio import QuartTrio

from ..recording import parse_run_id
from ._fork_schemas import FORK, FORK_CREATED, FORK_LIST, FORK_PLAN, FORK_SUMMARY, RUN_GRAPH
from ._state import ServerState


def add_fork_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @app.get("/v1/runs/<run_id>/graph")
    async def run_graph(run_id: str):
        run_id = parse_run_id(run_id)
        return RUN_GRAPH.respond(**await runtime.graph_projection(run_id))

    @app.post("/v1/runs/<run_id>/fork")
    async def fork_run(run_id: str):
        run_id = parse_run_id(run_id)
        body = await FORK.read()
        plan = await runtime.plan_fork(
            run_id, body["from_node"], body.get("acknowledge_writes") or []
        )
        if body.get("dry_run") is True:
            return FORK_PLAN.respond(**plan.dry_run_json())
        child, _ = await runtime.fork(plan)
        state.drivers.start(child)
        return FORK_CREATED.respond(201, run=child, status="running", forked_from=plan.forked_from)

    @app.get("/v1/runs/<run_id>/forks")
    async def run_forks(run_id: str):
        run_id = parse_run_id(run_id)
        forks = await runtime.list_forks(run_id)
        return FORK_LIST.respond(
            run=run_id,
            derived=True,
            forks=[
                FORK_SUMMARY.body(
                    run=view.run_id,
                    from_node=view.forked_from["from_node"],
                    through_seq=view.forked_from["through_seq"],
                    acknowledged_writes=view.forked_from["acknowledged_writes"],
                )
                for view in forks
            ],
        )
