"""``/v1/reconciliations``: the queue of runs parked on a write of unknown outcome, oldest first.

A read: it drives nothing and records nothing. Each item says what ``POST
/v1/runs/{id}/resolve`` expects, so a person can work the queue from this answer alone.
"""

from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ._answers import RECONCILIATION, RECONCILIATION_LIST
from ._operation import Operation, route
from ._queries import RECONCILIATIONS_QUERY, page_of
from ._state import ServerState

LIST = Operation(
    method="get",
    rule="/v1/reconciliations",
    operation_id="listReconciliations",
    tag="runs",
    summary=(
        "The runs parked on a write of unknown outcome, oldest write first, with what resolving "
        "each expects"
    ),
    description=(
        "Ordered by when the write's intent was recorded, then run id. A read: nothing is driven "
        "or recorded."
    ),
    parameters=tuple(RECONCILIATIONS_QUERY.described()),
    answers={"200": ("One page of the queue.", RECONCILIATION_LIST)},
    refusals=("BadRequest",),
)
OPERATIONS = (LIST,)


def add_reconciliation_routes(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, LIST)
    async def list_reconciliations():
        RECONCILIATIONS_QUERY.refuse_unknown(request.args)
        page, next_cursor = await runtime.reads.reconciliations(
            state.client_tools, **page_of(request.args)
        )
        return RECONCILIATION_LIST.respond(
            reconciliations=[RECONCILIATION.body(**item.to_json()) for item in page],
            next_cursor=next_cursor,
        )
