"""In-process fan-out: each durable envelope reaches every live subscriber of its run, and each
change of a run's status reaches every watcher of the run list.

The writer publishes right after a commit, on the trio thread, so a stream in
this daemon sees an event as soon as it is durable. Publishing works out each
envelope's view once and hands the same ``LiveEvent`` to every subscriber,
whatever its transport; the encodings a transport sends (the SSE frame, the
WebSocket message) are made on first use and kept on the event, so a frame is
encoded once however many streams carry it. Publishing never waits: a
subscriber that cannot take an event now is told so at once (an SSE stream
reads the gap back from the store, a WebSocket connection is closed).

A run's commits come in bursts (a model call answered and its tool requested, the
tool done and the next model call requested: two commits a few milliseconds apart),
and with many subscribers each delivery is a write per stream. So a hub given a
``Batching`` holds the events of a run a driver here goes on with until the run waits
on the world (a model call, a person, a timer: ``waits_on_the_world``) or the first
held is at its age limit, then delivers what it holds at once: one write per stream
per burst. ``deliver_forever`` is the task that releases a hold at its limit; a hub
without a ``Batching`` (tests of the fan-out itself) delivers at publish.

Events another process writes into the store (another node, a worker, a ``salvor run`` beside
the daemon) never pass through ``publish``. The store's change feed (``_change_feed``) tells the
hub which runs moved and how far (``moved``); ``follow_forever`` reads what is new, once per run
however many listen, for the runs somebody listens to and nothing here drives, and fans it out
exactly as a commit here would be. A notice for what was already delivered costs nothing; after
the feed may have missed notices (its connection dropped) ``reconcile`` has every followed run
read once.

Memory is bounded in bytes, not in events: a store read takes one page (``PAGE_EVENTS`` events,
about ``PAGE_BYTES`` of payload), never a whole log, and a subscriber queues at most
``BUFFER_BYTES`` of encoded events (the events themselves are shared by every subscriber); past
that it is told it lags. A reader that does not read holds about a page and a buffer, however
long the log.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import trio
from salvor.protocol import (
    TERMINAL_STATES,
    Envelope,
    PendingKind,
    RunView,
    format_instant,
    step,
)
from salvor.store import StoreError

from ._live_events import Listener, LiveEvent, RunChange, Watcher, status_changed
from ._subscription import BUFFER_BYTES, Subscription

# One store read of a stream, the hub's follower or a WebSocket's catch-up: at most this many
# events, and no more than fit in about this many bytes of payload (the first is read whatever
# its size).
PAGE_EVENTS = 256
PAGE_BYTES = 256 * 1024
# How many SSE streams and WebSockets one client (peer address) may hold open at once
# (``salvor serve --max-streams-per-client``; 0: no cap).
MAX_STREAMS_PER_CLIENT = 128
# How many runs the run-list watchers' last word is kept for (the oldest is forgotten first: a
# run forgotten is told of again at its next change, never left out; its mark against a late
# older change goes with it, which takes this many other runs changing between the two paths).
LISTED_RUNS = 10_000
# How long the follower waits before it reads a run again after the store failed a read.
RETRY_SECONDS = 0.5

log = logging.getLogger("salvor.runs")


class _RunFeed:
    """What the hub knows of one listened-to run: the last view it published or read, so a read
    of the store fetches only what is new, and how far the change feed says the log reaches."""

    __slots__ = ("next_seq", "unsure", "view", "wanted")

    def __init__(self) -> None:
        self.next_seq = 0
        self.view: RunView | None = None
        # The event count the change feed last reported for the run (what exists in the store).
        self.wanted = 0
        # Whether a notice may have been missed before a subscriber seeded the run (``reconcile``).
        self.unsure = False


ReadLog = Callable[[str, int], Awaitable[list[Envelope]]]


@dataclass(frozen=True)
class Batching:
    """How a run's published events are held for the rest of their burst: only while a driver
    in this process goes on with the run (``driven_here``: its next commit comes at once; a
    client-driven run's comes when its client sends it), until the run waits on a model call or
    rests, and never past ``limit_seconds`` after the first held one."""

    driven_here: Callable[[str], bool]
    limit_seconds: float = 0.05


def waits_on_the_world(view: RunView) -> bool:
    """Whether a run at ``view`` waits for something that takes a while (a model's answer, a
    person, a timer), rather than going on to its next commit at once."""
    return view.resting or (view.pending is not None and view.pending.kind is PendingKind.MODEL)


class _Held:
    """A run's events published and not yet delivered, and when they are due at the latest."""

    __slots__ = ("due", "events")

    def __init__(self, events: list[LiveEvent], due: float) -> None:
        self.events = events
        self.due = due


class EventHub:
    """Subscribers per run, and watchers of the run list; ``publish`` is cheap when nobody
    listens."""

    def __init__(self, batching: Batching | None = None) -> None:
        self._subscribers: dict[str, set[Listener]] = {}
        self._feeds: dict[str, _RunFeed] = {}
        self._watchers: set[Watcher] = set()
        # What the run-list watchers were last told of each run ((event count, state, detail)),
        # so a run another process changed is told once per change and never back in time; and
        # since when they watch (the store's instant form; None while nobody watches).
        self._listed: dict[str, tuple[int, object, object]] = {}
        self.watched_since: str | None = None
        # With batching: what each run has published and not yet delivered (deliver_forever
        # releases it), and the event that wakes that task when a run starts being held.
        self._batching = batching
        self._held: dict[str, _Held] = {}
        self._stirred = trio.Event()
        # From the change feed: runs whose store log reaches past what was delivered (read by
        # ``follow_forever``), the runs being read now, whether every followed run must be read
        # (``reconcile``), and the event that wakes the follower.
        self._stale: set[str] = set()
        self._following: set[str] = set()
        self._reconciling = False
        self._moved = trio.Event()

    def publish(self, envelopes: list[Envelope], view_before: RunView) -> None:
        """Hand the envelopes of one commit, in order, to the run's subscribers, and each status
        change to the run-list watchers. Never waits, never raises for a subscriber."""
        if not envelopes:
            return
        run_id = envelopes[0].run_id
        subscribers = self._subscribers.get(run_id)
        if not subscribers and not self._watchers:
            return
        view = view_before
        events = []
        for envelope in envelopes:
            before, view = view, step(view, envelope)
            events.append(LiveEvent(envelope, view, status_changed=status_changed(before, view)))
        # Known to the follower from now on, delivered or held: it never reads them again.
        self._advance(run_id, events)
        if (
            self._batching is None
            or waits_on_the_world(events[-1].view)
            or not self._batching.driven_here(run_id)
        ):
            self._deliver(run_id, self._take_held(run_id, events))
            return
        held = self._held.get(run_id)
        if held is not None:
            held.events += events
        else:
            self._held[run_id] = _Held(events, trio.current_time() + self._batching.limit_seconds)
            self._stirred.set()

    async def deliver_forever(self) -> None:
        """Deliver what a run holds once it is at its limit (``Batching``), until cancelled; what
        is still held then is delivered on the way out (an open stream's last view is current).
        """
        assert self._batching is not None, "a hub without batching delivers at publish"
        try:
            while True:
                due = min((held.due for held in self._held.values()), default=math.inf)
                with trio.move_on_at(due):
                    await self._stirred.wait()
                self._stirred = trio.Event()
                now = trio.current_time()
                for run_id, held in list(self._held.items()):
                    if held.due <= now:
                        self._deliver(run_id, self._take_held(run_id))
        finally:
            for run_id in list(self._held):
                self._deliver(run_id, self._take_held(run_id))

    def _take_held(self, run_id: str, then: list[LiveEvent] = ()) -> list[LiveEvent]:
        """What ``run_id`` holds, released, followed by ``then``."""
        held = self._held.pop(run_id, None)
        return [*held.events, *then] if held is not None else list(then)

    def _advance(self, run_id: str, events: list[LiveEvent]) -> None:
        feed = self._feeds.get(run_id)
        if feed is not None and events[-1].envelope.seq >= feed.next_seq:
            feed.next_seq, feed.view = events[-1].envelope.seq + 1, events[-1].view

    def _deliver(self, run_id: str, events: list[LiveEvent]) -> None:
        # Copies: a subscriber may close (and so leave the set) while it is offered an event.
        for subscription in list(self._subscribers.get(run_id, ())):
            for event in events:
                subscription._offer(event)
        if self._watchers:
            changes = [
                RunChange(e.view) for e in events if e.status_changed and self._note_listed(e.view)
            ]
            for watcher in list(self._watchers):
                for change in changes:
                    watcher._offer_change(change)

    def _note_listed(self, view: RunView) -> bool:
        """Remember what the watchers are told of ``view``'s run; False when they were told it
        already, or were told of a later point of its log.

        One commit can reach the watchers by two paths: its publish, and the change feed's view
        of the run (on SQLite the feed hears this process's own commits; on PostgreSQL a notice's
        views are read after its commit, maybe after the next one, and its events come after
        them). The view may be read, and told, before the publish or the events of an earlier
        commit arrive; telling those then would take a watcher back to a state the run has left,
        and a run at its end would stay shown there. Each path is in log order by itself, so a
        change is told only when it is past the last one told (the row's ``event_count``).
        """
        told = self._listed.get(view.run_id)
        if told is not None and (view.next_seq <= told[0] or (view.state, view.detail) == told[1:]):
            return False
        self._listed.pop(view.run_id, None)
        self._listed[view.run_id] = (view.next_seq, view.state, view.detail)
        if len(self._listed) > LISTED_RUNS:
            del self._listed[next(iter(self._listed))]
        return True

    def listed(self, views: list[RunView]) -> None:
        """The change feed's word for the run list (trio thread): ``views`` are runs another
        process changed; each whose state or status the watchers were not told yet goes out to
        them as a commit here would. Never waits."""
        changes = [RunChange(view) for view in views if self._note_listed(view)]
        for watcher in list(self._watchers):
            for change in changes:
                watcher._offer_change(change)

    def subscribe(self, run_id: str, limit_bytes: int = BUFFER_BYTES) -> Subscription:
        """An SSE stream's subscription to one run, queueing at most ``limit_bytes``."""
        subscription = Subscription(self, run_id, limit_bytes)
        self.add(subscription)
        return subscription

    def add(self, listener: Listener) -> None:
        """Register ``listener`` for its run's events from now on."""
        self._subscribers.setdefault(listener.run_id, set()).add(listener)
        self._feeds.setdefault(listener.run_id, _RunFeed())

    def remove(self, listener: Listener) -> None:
        subscribers = self._subscribers.get(listener.run_id)
        if subscribers is not None:
            subscribers.discard(listener)
            if not subscribers:
                del self._subscribers[listener.run_id]
                self._feeds.pop(listener.run_id, None)

    def seed(self, run_id: str, next_seq: int, view: RunView) -> None:
        """What a subscriber read of the store: the follower reads from there on (so an event
        another process commits after that read reaches it)."""
        feed = self._feeds.get(run_id)
        if feed is not None and (next_seq > feed.next_seq or feed.view is None):
            feed.next_seq, feed.view = next_seq, view
        if feed is not None and (feed.unsure or feed.wanted > feed.next_seq):
            # The feed told of events past what this subscriber read (or may have missed some
            # while nobody had read the run): the follower reads them.
            feed.unsure = False
            self._stale.add(run_id)
            self._moved.set()

    def watch(self, watcher: Watcher) -> None:
        if not self._watchers:
            self.watched_since = format_instant(datetime.now(UTC))
        self._watchers.add(watcher)

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)
        if not self._watchers:
            self.watched_since = None
            self._listed.clear()

    @property
    def watching(self) -> bool:
        """Whether a run list is watched here. Safe to read from any thread: the change feed
        then tells ``listed`` of the runs other processes change."""
        return bool(self._watchers)

    def subscriber_counts(self) -> dict[str, int]:
        """Live subscriptions by transport: ``{"sse": streams, "ws": a connection's runs and its
        watch of the run list, each one}``."""
        counts = {"sse": 0, "ws": 0}
        for subscribers in self._subscribers.values():
            for listener in subscribers:
                counts[listener.transport] = counts.get(listener.transport, 0) + 1
        for watcher in self._watchers:
            counts[watcher.transport] = counts.get(watcher.transport, 0) + 1
        return counts

    # -- what other processes commit (the change feed) ----------------------------------------

    @property
    def listened(self) -> bool:
        """Whether any run has a subscriber here. Safe to read from any thread (one ``len`` of
        a dict): the SQLite feed's thread watches more often while it is true."""
        return bool(self._feeds)

    def listens_to(self, run_id: str) -> bool:
        """Whether ``run_id`` has a subscriber here. Safe to call from any thread (one lookup in
        a dict): the PostgreSQL feed's thread reads a noticed run's events only then."""
        return run_id in self._feeds

    def arrived(self, run_id: str, envelopes: list[Envelope], count: int) -> None:
        """The change feed's word with the events it read (trio thread): the store holds
        ``count`` events of ``run_id``, and ``envelopes`` are some of them, in order. What is new
        of them goes out as a commit here would; anything past them is left to the follower."""
        feed = self._feeds.get(run_id)
        if feed is None:
            return
        if feed.view is not None and envelopes:
            self._take(run_id, feed.next_seq, feed.view, envelopes)
        self.moved({run_id: count})

    def followed(self, driven_here: Callable[[str], bool]) -> dict[str, int | None]:
        """The runs whose foreign commits somebody here waits for (listened to, not driven here:
        a driver here publishes every commit; not known to have ended), each with the seq the hub
        reads it from next (None while no subscriber has read it: it reads it itself)."""
        return {
            run_id: None if feed.view is None else feed.next_seq
            for run_id, feed in self._feeds.items()
            if (feed.view is None or feed.view.state not in TERMINAL_STATES)
            and not driven_here(run_id)
        }

    def moved(self, counts: Mapping[str, int]) -> None:
        """The change feed's word (trio thread): each run's log holds ``counts[run_id]`` events
        in the store. A run nobody here listens to, or whose events were all delivered, costs
        nothing; the others are read by ``follow_forever``. Never waits."""
        stirred = False
        for run_id, count in counts.items():
            feed = self._feeds.get(run_id)
            if feed is None or count <= feed.next_seq:
                continue
            feed.wanted = max(feed.wanted, count)
            if feed.view is not None:
                self._stale.add(run_id)
                stirred = True
        if stirred:
            self._moved.set()

    def reconcile(self) -> None:
        """The change feed may have missed notices (its connection was lost and is back): every
        followed run is read once, and a run a subscriber is still reading is read once it is
        seeded. Never waits."""
        for feed in self._feeds.values():
            feed.unsure = feed.view is None
        self._reconciling = True
        self._moved.set()

    async def follow_forever(self, read_page: ReadLog, driven_here: Callable[[str], bool]) -> None:
        """Read and fan out what the change feed said moved, until cancelled: one task per run
        being read, so a long read of one run holds up no other.

        Error handling: a failed read is logged and tried again after ``RETRY_SECONDS`` (a
        notice lost to a failed read must not stall a stream).
        """
        async with trio.open_nursery() as nursery:
            while True:
                await self._moved.wait()
                self._moved = trio.Event()
                if self._reconciling:
                    self._reconciling = False
                    self._stale.update(
                        run_id for run_id, feed in self._feeds.items() if feed.view is not None
                    )
                for run_id in list(self._stale):
                    if run_id not in self._following:
                        self._following.add(run_id)
                        nursery.start_soon(self._follow_run, read_page, driven_here, run_id)

    async def _follow_run(
        self, read_page: ReadLog, driven_here: Callable[[str], bool], run_id: str
    ) -> None:
        """Read ``run_id`` on while the feed says its log reaches further than delivered."""
        try:
            while True:
                self._stale.discard(run_id)
                feed = self._feeds.get(run_id)
                if feed is None or feed.view is None or driven_here(run_id):
                    return
                start = feed.next_seq
                if not await self._read_on(read_page, run_id):
                    await trio.sleep(RETRY_SECONDS)
                    continue
                feed = self._feeds.get(run_id)
                if feed is None or (run_id not in self._stale and feed.next_seq == start):
                    return  # gone, or nothing more to read
                if run_id not in self._stale and feed.wanted <= feed.next_seq:
                    return
        finally:
            self._following.discard(run_id)

    def _take(self, run_id: str, start: int, view: RunView, envelopes: list[Envelope]) -> bool:
        """Fan out what of ``envelopes`` (read from the store) follows ``start``, where the hub
        is at ``view``; whether anything did."""
        events = []
        for envelope in envelopes:
            if envelope.seq != view.next_seq:
                continue
            before, view = view, step(view, envelope)
            events.append(LiveEvent(envelope, view, status_changed=status_changed(before, view)))
        if not events or events[0].envelope.seq != start:
            return False
        self._advance(run_id, events)
        # After anything still held of the run, so each subscriber gets it in seq order.
        self._deliver(run_id, self._take_held(run_id, events))
        return True

    async def _read_on(self, read_page: ReadLog, run_id: str) -> bool:
        """Read ``run_id`` from where the hub is and fan out what is new; False when the store
        failed (logged)."""
        while True:
            feed = self._feeds.get(run_id)
            if feed is None or feed.view is None:
                return True
            start, view = feed.next_seq, feed.view
            try:
                envelopes = await read_page(run_id, start)
            except StoreError as error:
                log.warning(
                    "reading run %s for events another process wrote failed: %s", run_id, error
                )
                return False
            feed = self._feeds.get(run_id)
            if feed is None or not envelopes or feed.next_seq != start:
                return True  # gone, nothing new, or published meanwhile
            if not self._take(run_id, start, view, envelopes):
                return True
            if len(envelopes) < PAGE_EVENTS:
                # Most likely the end (a page of large events stops short): a notice of more
                # brings the follower back.
                return True
