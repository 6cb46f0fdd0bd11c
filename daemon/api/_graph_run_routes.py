"""``POST /v1/graph-runs``: start a run of a stored graph.

The graph is loaded by its hash and every agent and tool its nodes name is resolved before
anything is written; the head (``GraphRunStarted``) is durable before the answer, and the walk
is handed to the driving set, as ``POST /v1/runs`` hands an agent run. From there a graph run is
an ordinary run: its status, stream, resume (a gate's approval checked against its schema),
abandon and recovery are the run routes'.
"""

from __future__ import annotations

from quart_trio import QuartTrio

from ._answers import RUN_STARTED
from ._bodies import START_GRAPH_RUN
from ._operation import Operation, error, route
from ._state import ServerState

START = Operation(
    method="post",
    rule="/v1/graph-runs",
    operation_id="startGraphRun",
    new_work=True,
    tag="graphs",
    summary=(
        "Start a run of a stored graph; answered once its head event is durable, then walked in "
        "the background"
    ),
    description=(
        "Every agent and tool the graph's nodes name is resolved first, so a run is started only "
        "when all of it resolves. Its events, status, stream, resume and abandon are an ordinary "
        "run's (a gate parks it as `suspended`)."
    ),
    body=START_GRAPH_RUN,
    answers={"201": ("The run exists; watch it on its event stream.", RUN_STARTED)},
    refusals=("PayloadTooLarge",),
    responses={
        "400": error(
            "Malformed body or labels over the bounds, or a node naming a process or service "
            "agent (`details.node`; agent nodes run built-in agents). Nothing recorded.",
            "bad_request",
        ),
        "404": error(
            "No graph stored under `graph_hash` (`unknown_graph`), or a node names an agent that "
            "is not registered or a tool this daemon lacks (`unknown_agent` / `unknown_tool`, "
            "`details.node`). Nothing recorded.",
            "unknown_graph",
            "unknown_agent",
            "unknown_tool",
        ),
        "503": error(
            "A node calls a tool and this daemon's host wired no tool registry "
            "(`details.node`, `details.tool`). Nothing recorded.",
            "tool_registry_unavailable",
        ),
    },
)
OPERATIONS = (START,)


def add_graph_run_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, START)
    async def start_graph_run():
        body = await START_GRAPH_RUN.read()
        graph = await runtime.definitions.load_graph(body["graph_hash"])
        # The head is durable before we answer: a daemon killed right after the 201 still has
        # the run, and recovery walks it.
        run_id = await runtime.starts.start_graph_run(
            graph, body.get("input"), labels=body.get("labels")
        )
        state.drivers.start(run_id)
        return RUN_STARTED.respond(201, run=run_id, status="running")
