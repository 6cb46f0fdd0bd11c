"""``GET /v1/ws``: one WebSocket carrying any number of runs and the run list (salvor's own
protocol; ``salvor.daemon.runs.LiveConnection`` holds its rules).

The route only moves messages: each text message received goes to the connection, and what the
connection's outbox gives is written out by one sender, which closes with the outbox's code
(1013 for a full buffer, 1008 for a bad message, 1001 when the daemon stops). The handshake's
auth is the app's ``before_websocket`` check: a refused one is answered with the error envelope
and never upgrades; so is a client over its cap of open streams (429). The listener closes a
message over 64 KiB with 1009 and a socket on which nothing arrives, not even a pong, after its
idle deadline.
"""

from __future__ import annotations

import trio
from quart import websocket
from quart_trio import QuartTrio
from salvor.protocol import RunView
from salvor.store import RunSummary

from ..runs import LiveConnection
from ._operation import Operation, error, route
from ._runs_routes import summary_body
from ._state import ServerState
from ._stream_slots import TOO_MANY_STREAMS, StreamSlot

LIVE = Operation(
    method="get",
    rule="/v1/ws",
    operation_id="liveWebSocket",
    tag="live",
    summary="One WebSocket carrying any number of runs' events and the run list",
    description=(
        "Upgrades to a WebSocket (salvor's own protocol; text frames, one JSON object each). "
        "Requests: `subscribe` (`run`, `from_seq`), `unsubscribe` (`run`), `watch_runs`, "
        "`unwatch_runs`. Messages: `event` (the Envelope, as the stream sends it), `status`, "
        "`run` (a run-list entry) and `error` (the error envelope's body). Closes 1013 when its "
        "outgoing buffer (1 MiB by default) is full, 1001 when the daemon stops, 1008 for a "
        "message that is not a JSON object, 1009 for one over 64 KiB; the server pings, and a "
        "socket on which nothing arrives (not even a pong) for 60 s is closed."
    ),
    responses={
        "101": {"description": "Switching to the WebSocket protocol."},
        "400": error(
            "A plain HTTP request, not a WebSocket handshake (`bad_request`).", "bad_request"
        ),
        "429": TOO_MANY_STREAMS,
    },
    websocket=True,
)
OPERATIONS = (LIVE,)


def run_summary(view: RunView) -> RunSummary:
    """The ``runs`` row the store writes for ``view``, as a listing reads it back."""
    return RunSummary(
        run_id=view.run_id,
        event_count=view.next_seq,
        first_recorded_at=view.first_recorded_at,
        last_recorded_at=view.last_recorded_at,
        status=view.status(),
        state=view.state.value,
        usage=view.usage(),
        step_count=view.step_count,
        agent_def_hash=view.agent_def_hash,
        graph_hash=view.graph_hash,
        labels=view.labels,
    )


def add_ws_route(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    def run_row(view: RunView) -> dict:
        summary = run_summary(view)
        return summary_body(summary, state, state.driver_seen(summary.run_id, summary.state))

    @route(app, LIVE)
    async def live():
        slot = state.stream_slots.take(websocket.remote_addr)
        if not isinstance(slot, StreamSlot):
            return slot  # refused before the upgrade
        try:
            await websocket.accept()
            async with trio.open_nursery() as nursery:
                connection = LiveConnection(
                    state.hub,
                    nursery,
                    read_page=runtime.reads.read_page,
                    attached=state.attached,
                    clock=runtime.kit.clock,
                    run_row=run_row,
                    outbox_limit=state.stream_buffer_bytes,
                )
                nursery.start_soon(_receive, connection)
                nursery.start_soon(_stop_with, state.stopping, connection)
                try:
                    outbox = connection.outbox
                    while (message := await outbox.get()) is not None:
                        await websocket.send(message)
                    await websocket.close(outbox.close_code, outbox.close_reason)
                finally:
                    connection.end()
                    nursery.cancel_scope.cancel(reason="the WebSocket closed")
        finally:
            slot.release()
        return None


async def _receive(connection: LiveConnection) -> None:
    while True:
        connection.handle(await websocket.receive())


async def _stop_with(stopping: trio.Event, connection: LiveConnection) -> None:
    await stopping.wait()
    connection.stop()
