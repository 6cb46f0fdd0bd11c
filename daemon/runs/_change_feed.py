"""What other processes commit to the store, told to the event hub: so a stream on this node
carries a run live whoever drives it (another node, a worker, a ``salvor run`` beside us).

A ``ChangeFeed`` is one service per process, never a poll per subscriber:

* ``InProcessFeed``: nothing beyond the hub's own ``publish`` (a hub no other process writes
  beside: the tests of the fan-out itself).
* ``NoticeFeed`` (PostgreSQL): one session LISTENs on the store's channel in a thread of its
  own; each notice of another store handle (the runs a transaction appended, the first and last
  seq of their new events) goes to the hub on the trio thread, with the new events of the runs
  somebody here listens to: carried by the notice when they are small, else read on that
  thread. A lost session is reopened with backoff, and
  once it listens again the hub reads every run it follows (``EventHub.reconcile``): notices
  sent while it was deaf are lost, so nothing may depend on them.
* ``DataVersionFeed`` (SQLite): a thread reads ``PRAGMA data_version`` on a connection of its
  own every ``TICK_SECONDS`` (``IDLE_TICK_SECONDS`` while no stream here listens to a run; a
  read is a few microseconds, and the value changes only when some connection committed): one
  thread per process, never a poll per subscriber or per run. On a change, one trip to a
  reader thread asks the event counts of the runs the hub follows and reads the first new page
  of those that moved, and the hub fans it out.

Either way the hub drops what it already delivered (a commit of this process arrives through
``publish`` first, almost always) and reads the rest once per run, however many listen.

While a run list is watched here (a WebSocket's ``watch_runs``), the feed also tells the hub of
the runs other processes change (``EventHub.listed``), once per change however many watch: on
PostgreSQL the views of each notice's runs, read on the listener's thread; on SQLite one query
per change for the runs that may have moved (``ChangeSignal.listed``: new ones, those in the
indexed states a drive passes through, and those last seen short of an end) and the views of
those whose event count moved. SQLite's changes are read at a tick, so a status a run held for
less than a tick may not be shown; the run's next status always is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol

import trio
from salvor.protocol import (
    TERMINAL_STATES,
    Envelope,
    MalformedEvent,
    decode_envelope,
    format_instant,
)
from salvor.store import ChangeNotice, EventStore, StoreError

from ..metrics import DaemonMetrics
from ..recording import StoreAccess
from ._event_hub import PAGE_BYTES, PAGE_EVENTS, EventHub

log = logging.getLogger("salvor.runs")

# How often the SQLite feed reads data_version while some stream here listens to a run: a
# foreign commit reaches a stream within about this, plus a query and a read (about 1% of a core
# spent on the reads, measured on two cores); and while none listens (about 0.1%).
TICK_SECONDS = 0.01
IDLE_TICK_SECONDS = 0.1
# How many moved runs a change (SQLite) or a notice (PostgreSQL) has read on the feed's own
# thread, the first new page of each, handed over with the word that they moved; past it the
# hub's follower reads them, concurrently.
READ_AHEAD_RUNS = 16
# How often the PostgreSQL listener's thread looks up from its wait (to see whether to stop).
WAKE_SECONDS = 0.25
# A run first recorded this long before an ask is still looked for by the next one (SQLite): its
# instant is its writer's, taken before its transaction committed.
LISTED_MARGIN = timedelta(seconds=5)
# Backoff between attempts to reopen a lost listener (or watch), doubling up to the last.
BACKOFF_SECONDS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class ChangeFeed(Protocol):
    """What tells the hub of commits other processes make to the store."""

    async def serve(self, hub: EventHub, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Tell ``hub`` until cancelled; started once it hears every commit from then on (or,
        when the store cannot be reached yet, once it has tried and keeps trying)."""
        ...


def change_feed(
    access: StoreAccess,
    driven_here: Callable[[str], bool],
    metrics: DaemonMetrics | None = None,
) -> ChangeFeed:
    """The feed for ``access``'s store: notices on PostgreSQL, data_version on SQLite.

    Args:
        driven_here: whether a driver in this process drives a run (its commits all reach the
            hub through ``publish``; the feed leaves it alone).
        metrics: the daemon's instruments, which count what the feed hears and its reconnects.
    """
    if access.store.dialect == "postgresql":
        return NoticeFeed(access, driven_here, metrics)
    return DataVersionFeed(access, driven_here, metrics)


class InProcessFeed:
    """No other process writes beside this one: the hub's ``publish`` is the whole feed."""

    async def serve(self, hub: EventHub, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()


class _ThreadFeed:
    """A feed whose watching happens in a thread of its own, stopped when the feed is cancelled,
    with the hub's follower beside it."""

    def __init__(
        self,
        access: StoreAccess,
        driven_here: Callable[[str], bool],
        metrics: DaemonMetrics | None = None,
    ) -> None:
        self._access = access
        self._store: EventStore = access.store
        self._driven_here = driven_here
        self._token: trio.lowlevel.TrioToken | None = None
        self._metrics = metrics

    def _heard(self) -> None:
        """One change of another process heard (counted on the watching thread: the counters
        are thread-safe)."""
        if self._metrics is not None:
            self._metrics.feed_notices.inc()

    def _reconnected(self) -> None:
        if self._metrics is not None:
            self._metrics.feed_reconnects.inc()

    async def serve(self, hub: EventHub, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        stop = threading.Event()
        ready = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hub.follow_forever, self._read_page, self._driven_here)
            nursery.start_soon(_stop_when_cancelled, stop)
            await self._start(nursery, hub)
            # A thread of its own for the feed's life, outside the pool the readers share.
            watching = partial(trio.to_thread.run_sync, limiter=trio.CapacityLimiter(1))
            nursery.start_soon(watching, self._watch, hub, stop, ready)
            await ready.wait()
            task_status.started()

    async def _start(self, nursery: trio.Nursery, hub: EventHub) -> None:
        """Whatever else the feed runs on the trio side."""

    async def _read_page(self, run_id: str, from_seq: int) -> list:
        return await self._access.read(self._read_now, run_id, from_seq)

    def _read_now(self, run_id: str, from_seq: int) -> list:
        return self._store.read_log(run_id, from_seq, limit=PAGE_EVENTS, max_bytes=PAGE_BYTES)

    # What the feed does, in the log's words.
    does, doing = "watches", "watching"

    def _open(self) -> Any:
        """A session of the feed's own on the store (with ``close``).

        Raises:
            StoreError: the store cannot be reached; nothing is left open.
        """
        raise NotImplementedError

    def _caught_up(self, hub: EventHub) -> None:
        """The session is open: what was committed before it is read now (on its thread)."""
        raise NotImplementedError

    def _follow(self, session: Any, hub: EventHub, stop: threading.Event) -> None:
        """Tell the hub what ``session`` hears until ``stop`` is set (on its thread).

        Raises:
            Exception: the session failed; the caller closes it and opens another.
        """
        raise NotImplementedError

    def _watch(self, hub: EventHub, stop: threading.Event, ready: trio.Event) -> None:
        """The feed's thread: open a session, follow it, and open another with backoff when it
        is lost, until ``stop`` is set. ``ready`` is set once it first listens, or first failed
        to (the daemon serves all the same, and the feed keeps trying)."""
        failures = 0
        while not stop.is_set():
            try:
                session = self._open()
            except StoreError as error:
                if failures == 0:
                    log.warning(
                        "%s; streams carry only this process's commits until it %s",
                        error,
                        self.does,
                    )
                failures += 1
                self._post(ready.set)
                stop.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1])
                continue
            if failures:
                log.info("%s for the store's changes again", self.doing)
                self._reconnected()
            failures = 0
            self._caught_up(hub)
            self._post(ready.set)
            try:
                self._follow(session, hub, stop)
            except Exception as error:  # noqa: BLE001 -- the driver's, whatever it is: anew
                log.warning(
                    "%s for the store's changes failed (%s); %s again",
                    self.doing,
                    error,
                    self.doing,
                )
                failures = 1
                stop.wait(BACKOFF_SECONDS[0])
            finally:
                session.close()

    def _post(self, fn: Callable, *args: object) -> None:
        """Run ``fn(*args)`` on the trio thread soon, from the watching thread; never waits."""
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass  # trio has ended: nobody listens any more


async def _stop_when_cancelled(stop: threading.Event) -> None:
    try:
        await trio.sleep_forever()
    finally:
        stop.set()


class NoticeFeed(_ThreadFeed):
    """PostgreSQL: one LISTENing session per process, reopened with backoff when lost."""

    does, doing = "listens", "listening"

    def _open(self) -> Any:
        listener = self._store.changes.listener()
        listener.open()
        return listener

    def _caught_up(self, hub: EventHub) -> None:
        # Listening from here on: anything committed before is read now, once per run
        # followed (nothing is followed yet at the first start).
        self._post(hub.reconcile)

    def _follow(self, session: Any, hub: EventHub, stop: threading.Event) -> None:
        while not stop.is_set():
            for notice in session.notices(WAKE_SECONDS):
                self._heard()
                self._hand_over(hub, notice)

    def _hand_over(self, hub: EventHub, notice: ChangeNotice) -> None:
        """Tell the hub of ``notice`` (on the listener's thread). The new events of the few runs
        somebody here listens to are read here and handed over with it, so they reach the
        streams with one wake-up of the trio thread, as a commit here does; a notice naming
        more leaves the reading to the hub's follower (concurrent, a task per run)."""
        if notice.runs is None:
            self._post(hub.reconcile)
            return
        if hub.watching:
            self._list(hub, notice.runs)
        listened = [run_id for run_id in notice.runs if hub.listens_to(run_id)]
        if not listened:
            return
        if len(listened) > READ_AHEAD_RUNS:
            self._post(hub.moved, notice.counts())
            return
        for run_id in listened:
            first, last = notice.runs[run_id]
            envelopes = _carried(notice, run_id)
            if envelopes is None:
                try:
                    envelopes = self._read_now(run_id, first)
                except StoreError:
                    envelopes = []  # the follower reads it (and says why it could not)
            self._post(hub.arrived, run_id, envelopes, last + 1)

    def _list(self, hub: EventHub, runs: Iterable[str]) -> None:
        """The run list's word of a notice's runs (on the listener's thread): their views, read
        once per notice however many watch."""
        try:
            views = [view for run_id in runs if (view := self._store.read_view(run_id))]
        except StoreError as error:
            log.warning("the run list missed a change: %s", error)
            return
        self._post(hub.listed, views)


def _carried(notice: ChangeNotice, run_id: str) -> list[Envelope] | None:
    """The events ``notice`` carries for ``run_id``, decoded; None when it carries none (or
    none this build can read: the store is read instead)."""
    carried = notice.envelopes.get(run_id)
    if carried is None:
        return None
    try:
        envelopes = [decode_envelope(envelope) for envelope in carried]
    except MalformedEvent:
        return None
    return envelopes if all(e.run_id == run_id for e in envelopes) else None


class DataVersionFeed(_ThreadFeed):
    """SQLite: ``data_version`` read every ``TICK_SECONDS`` by one thread; on a change, one query
    of the followed runs' event counts."""

    def __init__(
        self,
        access: StoreAccess,
        driven_here: Callable[[str], bool],
        metrics: DaemonMetrics | None = None,
    ) -> None:
        super().__init__(access, driven_here, metrics)
        self._changed = trio.Event()
        # Pages read with the event counts, by (run, from seq): the hub's follower takes them
        # instead of reading again (one trip to a reader thread per change, not two).
        self._read_ahead: dict[tuple[str, int], list] = {}
        # While a run list is watched: what the last ask found of each run (None: nobody
        # watches).
        self._listing: dict[str, Any] | None = None

    async def _read_page(self, run_id: str, from_seq: int) -> list:
        page = self._read_ahead.pop((run_id, from_seq), None)
        return page if page is not None else await super()._read_page(run_id, from_seq)

    def _ask(self, followed: dict[str, int | None]) -> tuple[dict[str, int], dict]:
        """The followed runs' event counts, and the first new page of each that moved (on a
        reader thread)."""
        counts = self._store.changes.event_counts(followed)
        pages = {}
        for run_id, count in counts.items():
            start = followed[run_id]
            if start is not None and count > start and len(pages) < READ_AHEAD_RUNS:
                pages[run_id, start] = self._read_now(run_id, start)
        return counts, pages

    async def _start(self, nursery: trio.Nursery, hub: EventHub) -> None:
        nursery.start_soon(self._ask_forever, hub)

    async def _list(self, hub: EventHub) -> None:
        """The run list's word of what moved (on each change while a run list is watched): one
        query through a reader thread for the runs that may have (``ChangeSignal.listed``), and
        the views of those whose event count changed.

        Error handling: a failed read is logged; the next change asks again.
        """
        since = hub.watched_since
        if since is None:
            return
        try:
            views = await self._access.read(self._ask_listed, since)
        except StoreError as error:
            log.warning("the run list missed a change: %s", error)
            return
        hub.listed(views)

    def _ask_listed(self, watched_since: str) -> list:
        """(On a reader thread.) The views of the runs that moved since the last ask; at the
        first ask of a watch, of those that moved since it began."""
        first = self._listing is None
        known = {} if first else self._listing
        since = format_instant(datetime.now(UTC) - LISTED_MARGIN)
        # A run at an end never moves again: it is not asked for by name.
        named = [run_id for run_id, run in known.items() if run.state not in TERMINAL_STATES]
        found = self._store.changes.listed(min(since, watched_since), named, resting=first)
        moved = [
            run_id
            for run_id, run in found.items()
            if (
                (run_id in known and known[run_id].event_count != run.event_count)
                or (run_id not in known and (not first or run.last_recorded_at >= watched_since))
            )
            # A drive here tells the watchers of its own commits (a lookup in a dict).
            and not self._driven_here(run_id)
        ]
        self._listing = found
        return [view for run_id in moved if (view := self._store.read_view(run_id))]

    def _stir(self) -> None:
        self._changed.set()

    async def _ask_forever(self, hub: EventHub) -> None:
        """On each change: which followed runs moved, in one query through a reader thread.

        Error handling: a failed query is logged and asked again after a backoff (a change
        lost to a failed query must not stall a stream).
        """
        failures = 0
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            followed = hub.followed(self._driven_here)
            if hub.watching:
                await self._list(hub)
            elif self._listing is not None:
                self._listing = None  # nobody watches: the next watch starts afresh
            if not followed:
                continue
            try:
                counts, pages = await self._access.read(self._ask, followed)
            except StoreError as error:
                if failures == 0:
                    log.warning("asking the store which runs moved failed: %s", error)
                failures += 1
                await trio.sleep(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1])
                self._changed.set()
                continue
            failures = 0
            # What the follower does not take at once is stale by the next change.
            self._read_ahead = pages
            hub.moved(counts)

    def _open(self) -> Any:
        return self._store.changes.data_version_watch()

    def _caught_up(self, hub: EventHub) -> None:
        # Watching from here on: anything committed before is asked about now.
        self._post(self._stir)

    def _follow(self, session: Any, hub: EventHub, stop: threading.Event) -> None:
        while not stop.wait(TICK_SECONDS if hub.listened or hub.watching else IDLE_TICK_SECONDS):
            if session.changed():
                self._heard()
                self._post(self._stir)
