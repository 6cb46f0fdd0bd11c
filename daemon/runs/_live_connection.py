"""One live connection (``/v1/ws``): its subscriptions to runs and the run list, its requests,
and its bounded outgoing buffer.

The transport (the route) hands each text message it receives to ``LiveConnection.handle`` and
writes out what ``Outbox.get`` gives it, then closes with the outbox's code. Everything else is
here:

* ``subscribe`` reads the run's log (after registering with the hub, so no commit falls in
  between), sends each seq from ``from_seq`` exactly once, in order, then a ``status`` message,
  then each live event and each change of status. A gap in what the hub hands over is read back
  from the store.
* The outbox is bounded in bytes (``BUFFER_BYTES``, ``salvor serve --stream-buffer-bytes``).
  What the hub hands over is offered without waiting (the hub never waits on a reader, so one
  slow connection cannot hold up a commit's fan-out); when it does not fit, the connection ends
  with 1013 and a reason, its subscriptions gone, and the client resumes from its cursors: a
  clear end beats a silent one, and the client knows its cursors. Catching up from the store is
  the connection's own work: it reads a page at a time and waits for room before queueing more,
  so a client that does not read holds about a buffer and a page here, however long the log.
* A message that is not a JSON object, or over 64 KiB, ends the connection with 1008 (the
  listener closes one over its frame limit with 1009 before it gets here). A request of a bad
  shape, an unknown op or an unknown run is answered with an ``error`` message and changes
  nothing.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import trio
from salvor.protocol import EMPTY_VIEW, CodedError, Envelope, RunView, excerpt, step

from ..recording import parse_run_id
from ..web import HTTP_WORDING, bad_request, internal, unknown_run
from ._event_hub import EventHub
from ._live_events import LiveEvent, RunChange, event_message
from ._subscription import BUFFER_BYTES

log = logging.getLogger("salvor.runs")

MAX_MESSAGE_BYTES = 64 * 1024

# Close codes (RFC 6455 and IANA's registry).
GOING_AWAY = 1001
POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013

# The fields of each request, beside ``op``: required, then optional.
_OPS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "subscribe": (frozenset({"run"}), frozenset({"from_seq"})),
    "unsubscribe": (frozenset({"run"}), frozenset()),
    "watch_runs": (frozenset(), frozenset()),
    "unwatch_runs": (frozenset(), frozenset()),
}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Outbox:
    """The connection's outgoing messages, bounded in bytes; closed once with a code and a reason.

    A message's weight is its length (the JSON text; a character is a byte for all but the rare
    non-ASCII ones). One message past an empty outbox is always taken, whatever its size.
    Closing drops what is still queued: a client that is closed on re-subscribes from its own
    cursors, so nothing it did not receive is lost to it.
    """

    def __init__(self, limit_bytes: int) -> None:
        self._limit = limit_bytes
        self._items: deque[str] = deque()
        self._bytes = 0
        self._ready = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        self.close_code: int | None = None
        self.close_reason = ""

    @property
    def closed(self) -> bool:
        return self.close_code is not None

    def _fits(self, message: str) -> bool:
        return not self._items or self._bytes + len(message) <= self._limit

    def offer(self, message: str) -> bool:
        """Queue ``message`` now, or close (1013) when it does not fit; whether it was queued."""
        if self.closed:
            return False
        if not self._fits(message):
            # A close reason is at most 123 bytes.
            self.close(
                TRY_AGAIN_LATER,
                f"outgoing buffer full ({self._bytes} bytes unsent); "
                "reconnect and resume from your cursors",
            )
            return False
        self._push(message)
        return True

    def force(self, message: str) -> None:
        """Queue ``message`` past the bound: one message that must follow what is queued."""
        if not self.closed:
            self._push(message)

    async def put(self, message: str) -> None:
        """Queue ``message`` once it fits (a no-op once closed)."""
        while not self._fits(message) and not self.closed:
            await self._room.park()
        if not self.closed:
            self._push(message)

    def _push(self, message: str) -> None:
        self._items.append(message)
        self._bytes += len(message)
        self._ready.unpark_all()

    async def get(self) -> str | None:
        """The next message to send; None once closed (``close_code`` says how to close)."""
        while not self._items and not self.closed:
            await self._ready.park()
        if self.closed:
            return None
        message = self._items.popleft()
        self._bytes -= len(message)
        self._room.unpark_all()
        return message

    def close(self, code: int, reason: str) -> None:
        """End the connection with ``code`` (the first close wins)."""
        if self.closed:
            return
        self.close_code, self.close_reason = code, reason
        self._items.clear()
        self._bytes = 0
        self._ready.unpark_all()
        self._room.unpark_all()


class _RunStream:
    """One run's subscription on a connection: its cursor, and the live events held back while it
    catches up from the store."""

    transport = "ws"

    def __init__(self, connection: LiveConnection, run_id: str, from_seq: int) -> None:
        self.connection = connection
        self.run_id = run_id
        self.from_seq = from_seq
        self.next_seq = 0
        self.view: RunView | None = None
        self.catching_up = True
        # Live events held back while catching up, and their weight (bounded like the outbox).
        self.held: deque[LiveEvent] = deque()
        self.held_bytes = 0
        self.scope = trio.CancelScope()

    def hold(self, event: LiveEvent) -> None:
        self.held.append(event)
        # Weighed as the outbox weighs it: the message this connection will send.
        self.held_bytes += len(event.message)

    def release(self) -> LiveEvent:
        event = self.held.popleft()
        self.held_bytes -= len(event.message)
        return event

    def _offer(self, event: LiveEvent) -> None:
        if self.catching_up:
            self.hold(event)
            if len(self.held) > 1 and self.held_bytes > self.connection.outbox_limit:
                self.connection.outbox.close(
                    TRY_AGAIN_LATER, f"run {self.run_id} outran the connection's catch-up"
                )
                self.connection.end()
            return
        seq = event.envelope.seq
        if seq < self.next_seq:
            return
        if seq > self.next_seq:
            # Something between us and the hub was missed: read it back from the store.
            self.catching_up = True
            self.hold(event)
            self.connection.spawn_catch_up(self)
            return
        self.next_seq, self.view = seq + 1, event.view
        outbox = self.connection.outbox
        if not outbox.offer(event.message):
            self.connection.end()
            return
        if event.status_changed and not outbox.offer(self.connection.status_message(event)):
            self.connection.end()


class LiveConnection:
    """The subscriptions and requests of one ``/v1/ws`` connection.

    Args:
        hub: the fan-out it subscribes to.
        nursery: where its catch-ups run (the connection's own).
        read_page: the store read, a page at a time (``Runtime.read_page``).
        attached: whether something drives a run here (a run not yet started but attached is
            not unknown).
        clock: the daemon's clock, for a status as seen now.
        run_row: a run's entry as ``GET /v1/runs`` lists it, from its view.
        outbox_limit: the bound on queued messages, in bytes (and on live events held back
            while a run catches up).
    """

    def __init__(
        self,
        hub: EventHub,
        nursery: trio.Nursery,
        *,
        read_page: Callable[[str, int], Awaitable[list[Envelope]]],
        attached: Callable[[str], Awaitable[bool]],
        clock: Callable[[], datetime],
        run_row: Callable[[RunView], dict],
        outbox_limit: int = BUFFER_BYTES,
    ) -> None:
        self._hub = hub
        self._nursery = nursery
        self._read_page = read_page
        self._attached = attached
        self._clock = clock
        self._run_row = run_row
        self.outbox_limit = outbox_limit
        self.outbox = Outbox(outbox_limit)
        self._streams: dict[str, _RunStream] = {}
        self._watching = False
        self.transport = "ws"

    # -- requests ------------------------------------------------------------------------------

    def handle(self, message: str | bytes) -> None:
        """Act on one received message; a bad one is answered or closes the connection."""
        if self.outbox.closed:
            return
        if isinstance(message, bytes):
            self.close(POLICY_VIOLATION, "messages are text frames, each one JSON object")
            return
        if len(message) * 4 > MAX_MESSAGE_BYTES and len(message.encode()) > MAX_MESSAGE_BYTES:
            self.close(POLICY_VIOLATION, f"a message may be at most {MAX_MESSAGE_BYTES} bytes")
            return
        try:
            request = json.loads(message)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            self.close(POLICY_VIOLATION, "each message must be one JSON object")
            return
        op = request.get("op")
        run = request.get("run") if isinstance(request.get("run"), str) else None
        try:
            self._perform(op, request)
        except CodedError as error:
            reply = {"type": "error", "op": op if isinstance(op, str) else None, "run": run}
            reply = {key: value for key, value in reply.items() if value is not None}
            if not self.outbox.offer(
                _json({**reply, "error": error.to_json(HTTP_WORDING)["error"]})
            ):
                self.end()

    def _perform(self, op: Any, request: dict) -> None:
        """
        Raises:
            OperationRefused: bad_request for an unknown op or a bad shape; nothing changed.
        """
        if not isinstance(op, str) or op not in _OPS:
            raise bad_request(
                f"`op` must be one of {', '.join(_OPS)}"
                + (f", not {excerpt(op)!r}" if isinstance(op, str) else "")
            )
        required, optional = _OPS[op]
        given = set(request) - {"op"}
        if missing := sorted(required - given):
            raise bad_request(f"`{op}` needs `{missing[0]}`")
        if unknown := sorted(given - required - optional):
            raise bad_request(f"`{op}` takes no `{excerpt(unknown[0])}`")
        if op == "watch_runs":
            if not self._watching:
                self._watching = True
                self._hub.watch(self)
        elif op == "unwatch_runs":
            self._watching = False
            self._hub.unwatch(self)
        elif op == "subscribe":
            from_seq = request.get("from_seq", 0)
            if not isinstance(from_seq, int) or isinstance(from_seq, bool) or from_seq < 0:
                raise bad_request("`from_seq` must be a whole number")
            self.subscribe(_run_id(request["run"]), from_seq)
        else:
            self.unsubscribe(_run_id(request["run"]))

    def subscribe(self, run_id: str, from_seq: int) -> None:
        """Send the run's events from ``from_seq`` (store first, then live), then its status;
        a run already subscribed here starts over from ``from_seq``."""
        self.unsubscribe(run_id)
        stream = _RunStream(self, run_id, from_seq)
        self._streams[run_id] = stream
        # Registered before the store is read, so no commit falls in between.
        self._hub.add(stream)
        self.spawn_catch_up(stream)

    def unsubscribe(self, run_id: str) -> None:
        stream = self._streams.pop(run_id, None)
        if stream is not None:
            stream.scope.cancel(reason=f"the client unsubscribed from run {run_id}")
            self._hub.remove(stream)

    # -- delivery ------------------------------------------------------------------------------

    def spawn_catch_up(self, stream: _RunStream) -> None:
        self._nursery.start_soon(self._catch_up, stream)

    async def _catch_up(self, stream: _RunStream) -> None:
        """Bring ``stream`` level with the log from the store, then hand it to the hub's events.

        Error handling: an unknown run is answered ``unknown_run`` and unsubscribed; a failed
        store read is answered ``internal`` the same way (the client may subscribe again).
        """
        with stream.scope:
            first = stream.view is None
            status_before = None if first else stream.view.status()
            try:
                await self._read_back(stream)
            except CodedError as error:
                self._refuse(stream, error)
                return
            except Exception:
                log.exception("catching up run %s on a live connection failed", stream.run_id)
                self._refuse(stream, internal())
                return
            # No checkpoint from here on: the first live event after the catch-up finds it done.
            view = stream.view
            stream.catching_up = False
            if first or view.status() != status_before:
                self.outbox.force(self._status_text(stream.run_id, view))

    async def _read_back(self, stream: _RunStream) -> None:
        """Send what the store holds from the stream's cursor, a page at a time, then what the
        hub held back, reading the store again for any gap; returns with nothing held back."""
        run_id = stream.run_id
        while True:
            while True:
                start = stream.next_seq
                envelopes = await self._read_page(run_id, start)
                if stream.view is None:
                    if not envelopes and not await self._attached(run_id):
                        raise unknown_run(run_id)
                    stream.view = EMPTY_VIEW
                for envelope in envelopes:
                    if envelope.seq != stream.next_seq:
                        continue
                    stream.view = step(stream.view, envelope)
                    stream.next_seq += 1
                    if envelope.seq >= stream.from_seq:
                        await self.outbox.put(event_message(envelope))
                del envelopes
                if stream.next_seq == start:
                    break  # the store has nothing more: level with it
            self._hub.seed(run_id, stream.next_seq, stream.view)
            while stream.held:
                event = stream.held[0]
                seq = event.envelope.seq
                if seq > stream.next_seq:
                    break  # a gap: read the store again
                stream.release()
                if seq < stream.next_seq:
                    continue
                stream.view, stream.next_seq = event.view, seq + 1
                if seq >= stream.from_seq:
                    await self.outbox.put(event.message)
            else:
                return

    def _refuse(self, stream: _RunStream, error: CodedError) -> None:
        if self._streams.get(stream.run_id) is stream:
            self.unsubscribe(stream.run_id)
        reply = {"type": "error", "op": "subscribe", "run": stream.run_id}
        self.outbox.force(_json({**reply, "error": error.to_json(HTTP_WORDING)["error"]}))

    def status_message(self, event: LiveEvent) -> str:
        """The ``status`` message after ``event``, made once for every connection."""
        text = event.extra.get("ws_status")
        if text is None:
            text = event.extra["ws_status"] = self._status_text(event.envelope.run_id, event.view)
        return text

    def _status_text(self, run_id: str, view: RunView) -> str:
        return _json({"type": "status", "run": run_id, "status": view.status_at(self._clock())})

    def _encode_change(self, view: RunView) -> str:
        return _json({"type": "run", "run": view.run_id, "row": self._run_row(view)})

    def _offer_change(self, change: RunChange) -> None:
        if not self.outbox.offer(change.encoded(self._encode_change)):
            self.end()

    # -- the end -------------------------------------------------------------------------------

    def close(self, code: int, reason: str) -> None:
        self.outbox.close(code, reason)
        self.end()

    def stop(self) -> None:
        """The daemon is stopping: close with 1001."""
        self.close(GOING_AWAY, "salvor is stopping; reconnect and resume from your cursors")

    def end(self) -> None:
        """Leave the hub (nothing more is offered to this connection); idempotent."""
        for run_id in list(self._streams):
            self.unsubscribe(run_id)
        if self._watching:
            self._watching = False
            self._hub.unwatch(self)


def _run_id(value: Any) -> str:
    if not isinstance(value, str):
        raise bad_request("`run` must be a run id (a UUID)")
    return parse_run_id(value)
