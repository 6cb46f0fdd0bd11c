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
from ._state import ServerState


def add_graph_run_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @app.post("/v1/graph-runs")
    async def start_graph_run():
        body = await START_GRAPH_RUN.read()
        graph = await runtime.load_graph(body["graph_hash"])
        # The head is durable before we answer: a daemon killed right after the 201 still has
        # the run, and recovery walks it.
        run_id = await runtime.start_graph_run(graph, body.get("input"), labels=body.get("labels"))
        state.drivers.start(run_id)
        return RUN_STARTED.respond(201, run=run_id, status="running")
