"""``GET /metrics``: the daemon's numbers in the Prometheus text format, for a scraper.

Behind the same auth as the ``/v1`` routes (the app's ``before_request`` check covers every path
it serves). What only a scrape can know is read here: the store's runs by state and open claims on
a reader thread (never the trio thread), the drivers and the fan-out's subscribers from memory;
the registry renders them with every counter the daemon has kept since it started.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from quart import Response
from quart_trio import QuartTrio

from ..metrics import Readings
from ._operation import Operation, error, route
from ._state import ServerState

METRICS = Operation(
    method="get",
    rule="/metrics",
    operation_id="getMetrics",
    tag="server",
    summary="The daemon's numbers in the Prometheus text format",
    description=(
        "Runs by state, appends and commits, events per group commit, commit latency, drivers "
        "live, stream subscribers, proxy and MCP call latency, claims held, reconciliations open; "
        "and of this node among those over its store: which node answered (`salvor_node_info`), "
        "its lease's renewals, failures and lapses, runs owned and taken over, fenced appends, "
        "the change feed's notices and reconnects. Behind the same auth as the `/v1` routes; the "
        "runs by state are read from the store at each scrape."
    ),
    responses={
        "200": {
            "description": "The exposition (`prometheus_client`'s text format).",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        "503": error(
            "The store cannot be read now (its runs by state are part of every scrape).",
            "store_unavailable",
        ),
    },
)
OPERATIONS = (METRICS,)


def add_metrics_route(app: QuartTrio, state: ServerState) -> None:
    @route(app, METRICS)
    async def metrics():
        # A store that cannot be read answers 503 store_unavailable (the envelope): a scrape
        # that silently dropped the runs would read as every run gone.
        runs_by_state, claims_held = await state.runtime.reads.census()
        readings = Readings(
            runs_by_state=runs_by_state,
            claims_held=claims_held,
            drivers_live=len(state.drivers),
            stream_subscribers=state.hub.subscriber_counts(),
        )
        return Response(
            state.metrics.exposition(readings), status=200, content_type=CONTENT_TYPE_LATEST
        )
