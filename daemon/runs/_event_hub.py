"""In-process fan-out: each durable envelope reaches every live subscriber of its run.

The writer publishes right after a commit, on the trio thread, so a stream in
this daemon sees an event as soon as it is durable. A subscriber that falls
behind is not allowed to hold memory without bound: its queue is capped and,
once full, it is marked ``lagging`` and reads the gap back from the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import trio
from salvor.protocol import Envelope, RunView, encode_envelope, sse_frame, step

QUEUE_LIMIT = 1024


def event_frame(envelope: Envelope) -> bytes:
    """One server-sent event: the seq as its id, the pinned envelope as its data."""
    return sse_frame(encode_envelope(envelope), id=envelope.seq)


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """A durable envelope as published: its frame and the run's view after it,
    worked out once for every subscriber."""

    envelope: Envelope
    frame: bytes
    view: RunView


class Subscription:
    """Live envelopes of one run, in commit order; registered until closed.

    Use as a context manager (``with hub.subscribe(run_id) as sub``) or call
    ``close``: registration happens at subscribe time, so a caller can
    subscribe first and read the store second without missing a commit.
    """

    def __init__(self, hub: EventHub, run_id: str) -> None:
        self._hub = hub
        self.run_id = run_id
        self._send, self.receive = trio.open_memory_channel[LiveEvent](QUEUE_LIMIT)
        self.lagging = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _offer(self, event: LiveEvent) -> None:
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            # The reader is slow; it will read what it missed from the store.
            self.lagging = True
        except trio.ClosedResourceError:
            pass

    def close(self) -> None:
        self._hub._remove(self)
        self._send.close()


class EventHub:
    """Subscribers per run; ``publish`` is cheap when nobody listens."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[Subscription]] = {}

    def publish(self, envelopes: list[Envelope], view_before: RunView) -> None:
        if not envelopes:
            return
        subscribers = self._subscribers.get(envelopes[0].run_id)
        if not subscribers:
            return
        view = view_before
        events = []
        for envelope in envelopes:
            view = step(view, envelope)
            events.append(LiveEvent(envelope, event_frame(envelope), view))
        for subscription in subscribers:
            for event in events:
                subscription._offer(event)

    def subscriber_counts(self) -> dict[str, int]:
        """Live subscriptions by transport (``/metrics``): every one is an SSE stream's today."""
        return {"sse": sum(len(subscribers) for subscribers in self._subscribers.values())}

    def subscribe(self, run_id: str) -> Subscription:
        subscription = Subscription(self, run_id)
        self._subscribers.setdefault(run_id, set()).add(subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        subscribers = self._subscribers.get(subscription.run_id)
        if subscribers is not None:
            subscribers.discard(subscription)
            if not subscribers:
                del self._subscribers[subscription.run_id]
