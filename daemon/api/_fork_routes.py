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
from ._operation import RUN_ID, Operation, error, error_schema, route
from ._schema import ref
from ._state import ServerState

_NOT_A_GRAPH_RUN = error_schema(["not_a_graph_run"])

GRAPH_PROJECTION = Operation(
    method="get",
    rule="/v1/runs/<run_id>/graph",
    operation_id="getRunGraph",
    tag="runs",
    summary="A graph run's per-node projection: the nodes its walk reached, and how",
    description=(
        "Read from the run's log. A node not reached is absent (not `skipped`); `current_node` "
        "only while a node is entered and not exited; `branch_case`, `map` and `forked_from` only "
        "when recorded."
    ),
    parameters=RUN_ID,
    answers={"200": ("The projection.", RUN_GRAPH)},
    refusals=("BadRequest", "UnknownRun"),
    responses={
        "409": error(
            "The run is an agent run (its log opens with RunStarted).", schema=_NOT_A_GRAPH_RUN
        )
    },
)
FORK_RUN = Operation(
    method="post",
    rule="/v1/runs/<run_id>/fork",
    operation_id="forkRun",
    new_work=True,
    tag="runs",
    summary=(
        "Fork a graph run from a node into a new run, refusing to re-fire a recorded write nobody "
        "acknowledged"
    ),
    description=(
        "The child's log is the origin's below the fork node's entry, under the child's own head "
        "(`forked_from`), written in one append; the origin is untouched. The child is then "
        "driven from the fork node like a recovered graph run. Every refusal applies under "
        "`dry_run` too, and records nothing."
    ),
    parameters=RUN_ID,
    body=FORK,
    answers={
        "200": ("`dry_run`: the plan; nothing was created.", FORK_PLAN),
        "201": ("The child exists durably and is driving.", FORK_CREATED),
    },
    refusals=("BadRequest", "PayloadTooLarge"),
    responses={
        "404": error(
            "No run under that id, or the origin's graph is no longer stored.",
            "unknown_run",
            "unknown_graph",
        ),
        "409": error(
            "write_replay_hazard (`details.writes`), origin_needs_reconciliation "
            "(`details.intent`), invalid_fork_node (`details.entered`), or not_a_graph_run. "
            "Nothing recorded.",
            schema={
                "oneOf": [
                    ref("WriteReplayHazardError"),
                    ref("OriginNeedsReconciliationError"),
                    ref("InvalidForkNodeError"),
                    _NOT_A_GRAPH_RUN,
                ]
            },
        ),
    },
)
FORKS = Operation(
    method="get",
    rule="/v1/runs/<run_id>/forks",
    operation_id="listRunForks",
    tag="runs",
    summary="The runs forked from a run, oldest first: a derived index",
    parameters=RUN_ID,
    answers={"200": ("The forks.", FORK_LIST)},
    refusals=("BadRequest", "UnknownRun"),
)
OPERATIONS = (GRAPH_PROJECTION, FORK_RUN, FORKS)


def add_fork_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, GRAPH_PROJECTION)
    async def run_graph(run_id: str):
        run_id = parse_run_id(run_id)
        return RUN_GRAPH.respond(**await runtime.forks.graph_projection(run_id))

    @route(app, FORK_RUN)
    async def fork_run(run_id: str):
        run_id = parse_run_id(run_id)
        body = await FORK.read()
        plan = await runtime.forks.plan_fork(
            run_id, body["from_node"], body.get("acknowledge_writes") or []
        )
        if body.get("dry_run") is True:
            return FORK_PLAN.respond(**plan.dry_run_json())
        child, _ = await runtime.forks.fork(plan)
        state.drivers.start(child)
        return FORK_CREATED.respond(201, run=child, status="running", forked_from=plan.forked_from)

    @route(app, FORKS)
    async def run_forks(run_id: str):
        run_id = parse_run_id(run_id)
        forks = await runtime.forks.list_forks(run_id)
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
