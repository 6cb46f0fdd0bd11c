"""One SSE stream's subscription to a run's live events: a queue bounded in bytes, whose reader
reads from the store whatever did not fit.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, Self

import trio
from salvor.protocol import RunView

from ._live_events import Listener, LiveEvent

# What one subscriber (an SSE stream, a WebSocket connection) may hold queued and unsent, in bytes
# of encoded events (``salvor serve --stream-buffer-bytes``).
BUFFER_BYTES = 1024 * 1024


class Hub(Protocol):
    """What a subscription uses of the hub that made it: an ``EventHub`` (which makes
    subscriptions, so a subscription names only what it uses, and the two modules import one
    way)."""

    def seed(self, run_id: str, next_seq: int, view: RunView) -> None: ...

    def remove(self, listener: Listener) -> None: ...


class Subscription:
    """Live envelopes of one run, in commit order, for one SSE stream; registered until closed.

    Use as a context manager (``with hub.subscribe(run_id) as sub``) or call
    ``close``: registration happens at subscribe time, so a caller can
    subscribe first and read the store second without missing a commit.
    Its queue holds at most ``limit_bytes`` of encoded events (one event past an empty queue,
    whatever its size); an event that does not fit is dropped and the subscription marked
    ``lagging``, and its reader reads the gap back from the store.
    """

    transport = "sse"

    def __init__(self, hub: Hub, run_id: str, limit_bytes: int = BUFFER_BYTES) -> None:
        self._hub = hub
        self.run_id = run_id
        self._limit_bytes = limit_bytes
        self._queue: deque[LiveEvent] = deque()
        self._queued_bytes = 0
        self._arrived = trio.lowlevel.ParkingLot()
        self._closed = False
        self.lagging = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _offer(self, event: LiveEvent) -> None:
        if self._closed:
            return
        if self._queue and self._queued_bytes + event.weight > self._limit_bytes:
            # The reader is slow; it will read what it missed from the store.
            self.lagging = True
            return
        self._queue.append(event)
        self._queued_bytes += event.weight
        self._arrived.unpark_all()

    def take(self) -> list[LiveEvent]:
        """Everything queued, without waiting."""
        taken = list(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        return taken

    async def wait(self) -> None:
        """Until something is queued (at once if something is)."""
        if not self._queue and not self._closed:
            await self._arrived.park()

    def seed(self, next_seq: int, view: RunView) -> None:
        """What this subscriber read of the store (``EventHub.seed``)."""
        self._hub.seed(self.run_id, next_seq, view)

    def close(self) -> None:
        self._hub.remove(self)
        self._closed = True
        self._queue.clear()
        self._queued_bytes = 0
        self._arrived.unpark_all()
