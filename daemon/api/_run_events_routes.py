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

import trio
from quart import request
from quart.wrappers.response import IterableBody
from quart_trio import QuartTrio
from salvor.protocol import EMPTY_VIEW, Envelope, RunState, RunView, sse_frame, step

from ..recording import parse_run_id
from ..runs import LiveEvent, Subscription, event_frame
from ..web import bad_request, unknown_run, whole_number
from ._answers import END_FRAME
from ._operation import RUN_ID, WHOLE, WHOLE_TEXT, Operation, route
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
    """The stream's frames: the log from ``start`` (``page`` is its first page from seq 0), then
    the live tail, until an ``end`` frame."""
    runtime = state.runtime
    with subscription:
        view, next_seq = EMPTY_VIEW, 0
        # Not kept under its argument's name: a stream holds one page at a time.
        pending: list[Envelope | LiveEvent] = page
        del page
        # Whether ``pending`` is a page read from the store: the next page follows until one
        # comes back empty (the prefix before ``start`` is folded, not sent).
        paging = True
        last_progress = last_beat = trio.current_time()
        progress_seq = next_seq
        seeded = False
        while True:
            # Everything at hand goes out as one chunk: with many
            # subscribers, one write per burst instead of per event.
            chunk: list[bytes] = []
            seq_before = next_seq
            for item in pending:
                # Live items come with their frame and view worked out
                # once at publish; store reads are folded here.
                envelope = item.envelope if isinstance(item, LiveEvent) else item
                if envelope.seq != next_seq:
                    continue
                if isinstance(item, LiveEvent):
                    view, frame = item.view, item.frame
                else:
                    view, frame = step(view, envelope), None
                next_seq += 1
                if envelope.seq >= start:
                    chunk.append(frame or event_frame(envelope))
            if next_seq > progress_seq:
                progress_seq, last_progress = next_seq, trio.current_time()
            pending = []
            if chunk:
                # Written before the next page is read: a reader that does not read holds this
                # (and only this: the frames it was joined from are let go first).
                data = b"".join(chunk)
                del chunk
                yield data
                del data
            if paging and next_seq > seq_before:
                pending = await runtime.reads.read_page(run_id, next_seq)
                continue
            paging = False
            if not seeded:
                # From here on the hub reads what another process commits.
                subscription.seed(next_seq, view)
                seeded = True
            if view.resting:
                later = await _after_rest(state, run_id, view, next_seq)
                if later is None:
                    yield end_frame(END_FRAME.body(status=view.status_at(runtime.kit.clock())))
                    return
                if later:
                    pending, paging = later, True
                    continue
            now = trio.current_time()
            quiet = now - last_progress >= state.detach_grace_seconds
            # A peer node's drive (its commits come through the hub's poll) is no detachment.
            if quiet and await state.attached_anywhere(run_id):
                last_progress = now  # asked again after another grace
            if state.stopping.is_set() or (
                now - last_progress >= state.detach_grace_seconds
                and not await state.attached(run_id)
            ):
                yield end_frame(
                    END_FRAME.body(status=view.status_at(runtime.kit.clock()), detached=True)
                )
                return
            # What the hub queued while the last chunk was written goes out at once; only an
            # empty queue waits (a timer per wait is most of a busy stream's own cost).
            pending = subscription.take()
            if not pending:
                wait = min(
                    state.stream_poll_seconds,
                    max(0.0, last_beat + state.heartbeat_seconds - now),
                )
                with trio.move_on_after(wait):
                    await subscription.wait()
                pending = subscription.take()
            if not subscription.lagging:
                if pending and pending[0].envelope.seq < next_seq:
                    pending = [e for e in pending if e.envelope.seq >= next_seq]
                if not pending:
                    # A quiet spell: what another process writes comes through the hub's feed.
                    if trio.current_time() - last_beat >= state.heartbeat_seconds:
                        last_beat = trio.current_time()
                        yield KEEP_ALIVE
                    continue
                if pending[0].envelope.seq == next_seq:
                    continue
            # A gap or a lagging queue: read what is missing from the store, page by page.
            subscription.lagging = False
            pending, paging = await runtime.reads.read_page(run_id, next_seq), True


async def _after_rest(
    state: ServerState, run_id: str, view: RunView, next_seq: int
) -> list[Envelope] | None:
    """None when the run rests where ``view`` says; else what to go on with.

    A write's intent is recorded before the write runs, so the log folds to
    needs_reconciliation while a driver is still executing it (here, on a peer node, or a
    client holding its lease): not a resting point (an empty list: wait for what comes). And
    what this stream folded was read before the driver was asked about: one that finished the
    write and ended in between has committed what follows, so the store is read once more
    (from ``next_seq``) before the stream says the run rests there.
    """
    if view.state is not RunState.NEEDS_RECONCILIATION:
        return None
    if await state.attached_anywhere(run_id):
        return []
    later = await state.runtime.reads.read_page(run_id, next_seq)
    return later or None
