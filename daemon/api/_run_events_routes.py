"""``GET /v1/runs/{id}/events``: a run's log as server-sent events, replay then live tail.

The stream subscribes to the in-process fan-out before it reads the store,
so nothing committed in between is missed, and it sends each seq exactly
once, in order (anything older than the cursor is skipped; a gap is read
back from the store). The store is read a page at a time, and each page is
written out before the next is read: a client that does not read holds
about one page here (the write waits on it), however long the log; its
live queue is bounded in bytes, and what overflows it is read back later.
Events another process writes into the same store (another node, the CLI)
arrive through the hub's change feed, one store read per run and notice
however many streams watch it. It ends with an ``end`` frame once
the run rests, or once nothing drives it here and nothing has arrived for a
grace period (``detached: true``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from quart import request
from quart.wrappers.response import IterableBody
from quart_trio import QuartTrio
from salvor.protocol import Envelope, sse_frame

from ..recording import parse_run_id
from ..runs import LiveEvent, Subscription, event_frame
from ..web import bad_request, unknown_run, whole_number
from ._answers import END_FRAME
from ._operation import RUN_ID, WHOLE, WHOLE_TEXT, Operation, route
from ._run_tail import Beat, TailEnd, envelope_of, tail_run
from ._schema import ref
from ._state import ServerState
from ._stream_slots import TOO_MANY_STREAMS, StreamSlot

HEADERS = {
    "Content-Type": "text/event-stream",
    # A run's events are for this reader alone: no cache between it and the daemon keeps them.
    "Cache-Control": "no-store",
    # nginx buffers proxied responses unless told not to.
    "X-Accel-Buffering": "no",
}

STREAM = Operation(
    method="get",
    rule="/v1/runs/<run_id>/events",
    operation_id="streamRunEvents",
    tag="runs",
    summary="The run's events as server-sent events: replay from the cursor, then the live tail",
    description=(
        "Each recorded event is one frame, `id: <seq>` and `data: <Envelope>`, with no `event:` "
        "field. When the run rests, one frame `event: end` with `data: <EndFrame>` closes the "
        "stream; `detached: true` when no driver here is running the run. Lines starting with `:` "
        "are keep-alive comments. `Last-Event-ID` (wins) or `from_seq` set the cursor; with "
        "neither the stream starts at seq 0."
    ),
    parameters=(
        *RUN_ID,
        {"name": "from_seq", "in": "query", "schema": WHOLE},
        {
            "name": "Last-Event-ID",
            "in": "header",
            "schema": WHOLE_TEXT,
            "description": "The last seq this client received; the stream resumes after it.",
        },
    ),
    refusals=("BadRequest", "UnknownRun"),
    responses={
        "429": TOO_MANY_STREAMS,
        "200": {
            "description": "The stream.",
            "content": {
                "text/event-stream": {
                    "schema": ref("StreamFrame"),
                    "x-frame-schemas": {"message": ref("Envelope"), "end": ref(END_FRAME.name)},
                }
            },
        },
    },
)
OPERATIONS = (STREAM,)

KEEP_ALIVE = sse_frame(comment="keep-alive")


def end_frame(body: dict) -> bytes:
    return sse_frame(json.dumps(body, ensure_ascii=False), event="end")


def _cursor() -> int:
    # Both are checked, though Last-Event-ID wins: a malformed from_seq is a 400 either way.
    from_seq = request.args.get("from_seq")
    seq = 0
    if from_seq is not None:
        seq = whole_number(from_seq)
        if seq is None:
            raise bad_request("from_seq must be a whole number (ASCII digits only)")
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id is not None:
        last = whole_number(last_event_id)
        if last is None:
            raise bad_request(
                "Last-Event-ID must be the seq of an event this stream sent (ASCII digits only)"
            )
        return last + 1
    return seq


def add_run_events_route(app: QuartTrio, state: ServerState) -> None:
    runtime = state.runtime

    @route(app, STREAM)
    async def events(run_id: str):
        run_id = parse_run_id(run_id)
        start = _cursor()
        slot = state.stream_slots.take(request.remote_addr)
        if not isinstance(slot, StreamSlot):
            return slot
        # Subscribe before reading the store, so no commit falls in between.
        subscription = state.hub.subscribe(run_id, state.stream_buffer_bytes)
        try:
            page = await runtime.reads.read_page(run_id, 0)
            if not page and not await state.attached(run_id):
                raise unknown_run(run_id)
        except BaseException:
            subscription.close()
            slot.release()
            raise

        frames = _StreamBody(_frames(state, run_id, subscription, page, start), subscription, slot)
        response = app.response_class(frames, status=200, headers=HEADERS)
        response.timeout = None
        return response


class _StreamBody(IterableBody):
    """The frames of one stream as a response body, and what the stream holds (its subscription,
    its slot) let go when the body is closed, whether or not it was ever iterated."""

    def __init__(
        self, frames: AsyncGenerator[bytes], subscription: Subscription, slot: StreamSlot
    ) -> None:
        super().__init__(frames)
        self._subscription = subscription
        self._slot = slot

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await super().__aexit__(*exc_info)
        finally:
            self._subscription.close()
            self._slot.release()


async def _frames(
    state: ServerState, run_id: str, subscription: Subscription, page: list[Envelope], start: int
) -> AsyncIterator[bytes]:
    """The stream's frames: the log from ``start`` (``page`` is its first page from seq 0; the
    prefix before ``start`` is folded, not sent), then the live tail, until an ``end`` frame."""
    clock = state.runtime.kit.clock
    tail = tail_run(state, run_id, subscription, page, beat_seconds=state.heartbeat_seconds)
    del page
    async with aclosing(tail):
        async for item in tail:
            if isinstance(item, TailEnd):
                end = {"detached": True} if item.detached else {}
                yield end_frame(END_FRAME.body(status=item.view.status_at(clock()), **end))
                return
            if isinstance(item, Beat):
                yield KEEP_ALIVE
                continue
            # Everything at hand goes out as one chunk: with many subscribers, one write per
            # burst instead of per event. Live items come with their frame made once at publish.
            chunk = [
                entry.frame if isinstance(entry, LiveEvent) else event_frame(entry)
                for entry in item
                if envelope_of(entry).seq >= start
            ]
            del item
            if chunk:
                data = b"".join(chunk)
                del chunk
                yield data
                del data
