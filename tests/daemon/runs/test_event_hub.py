"""The fan-out itself, in virtual time: one publish per commit for every subscriber whatever its
transport, each encoding made once, and one read per run and notice for what another process
writes (the change feed's word, ``EventHub.moved``).

The store here is a dict of logs behind a ``read_log`` that counts its calls: the hub's contract
with the store is that one function.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing
from salvor.daemon.runs import PAGE_EVENTS, Batching, EventHub, LiveEvent, RunChange
from salvor.protocol import EMPTY_VIEW, RandomObserved, Resumed, RunCompleted, fold
from salvor.store import StoreUnavailable

from tests.protocol.logs import envelope, gate, model, model_done, started, tool, tool_done

RUN_A = "11111111-1111-4111-8111-111111111111"
RUN_B = "22222222-2222-4222-8222-222222222222"


class Store:
    """Logs by run, and how many times each was read."""

    def __init__(self) -> None:
        self.logs: dict[str, list] = {}
        self.reads: dict[str, int] = {}

    def commit(self, run_id: str, *events) -> list:
        log = self.logs.setdefault(run_id, [])
        envelopes = [envelope(len(log) + i, e, run_id=run_id) for i, e in enumerate(events)]
        log.extend(envelopes)
        return envelopes

    async def read_log(self, run_id: str, from_seq: int) -> list:
        self.reads[run_id] = self.reads.get(run_id, 0) + 1
        await trio.lowlevel.checkpoint()
        return self.logs.get(run_id, [])[from_seq:]


class WsListener:
    transport = "ws"

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.got: list[LiveEvent] = []

    def _offer(self, event: LiveEvent) -> None:
        self.got.append(event)


class Watcher:
    transport = "ws"

    def __init__(self) -> None:
        self.changes: list[RunChange] = []

    def _offer_change(self, change: RunChange) -> None:
        self.changes.append(change)


def drain(subscription) -> list[LiveEvent]:
    return subscription.take()


def test_one_publish_reaches_every_transport_with_each_encoding_made_once() -> None:
    hub, store = EventHub(), Store()
    streams = [hub.subscribe(RUN_A) for _ in range(3)]
    listeners = [WsListener(RUN_A) for _ in range(2)]
    for listener in listeners:
        hub.add(listener)
    watcher = Watcher()
    hub.watch(watcher)
    assert hub.subscriber_counts() == {"sse": 3, "ws": 3}
    envelopes = store.commit(RUN_A, started(), RandomObserved(value="ab"))
    hub.publish(envelopes, EMPTY_VIEW)
    got = [drain(s) for s in streams] + [listener.got for listener in listeners]
    # The same objects for every subscriber: nothing was worked out per subscriber.
    assert all([id(e) for e in events] == [id(e) for e in got[0]] for events in got)
    first = got[0][0]
    assert first.frame is first.frame and first.message is first.message
    assert [e.envelope.seq for e in got[0]] == [0, 1]
    assert [e.status_changed for e in got[0]] == [True, False]
    assert got[0][1].view == fold(envelopes)
    # The run list hears of the change of state (not_started to running), once.
    assert [c.view.state.value for c in watcher.changes] == ["running"]
    assert watcher.changes[0].encoded(str) is watcher.changes[0].encoded(repr)
    for stream in streams:
        stream.close()
    for listener in listeners:
        hub.remove(listener)
    hub.unwatch(watcher)
    assert hub.subscriber_counts() == {"sse": 0, "ws": 0}
    assert hub._feeds == {} and hub._subscribers == {}


@asynccontextmanager
async def following(
    hub: EventHub, read_log, driven_here=lambda run_id: False
) -> AsyncIterator[EventHub]:
    """The hub's follower running for the block (cancelled at its end)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hub.follow_forever, read_log, driven_here)
        yield hub
        nursery.cancel_scope.cancel()


async def test_a_notice_is_read_once_per_run_however_many_listen(autojump_clock) -> None:
    hub, store = EventHub(), Store()
    store.commit(RUN_A, started())
    store.commit(RUN_B, started())
    a_streams = [hub.subscribe(RUN_A) for _ in range(50)]
    b_listener = WsListener(RUN_B)
    hub.add(b_listener)
    # What each subscriber read of the store before it went live.
    for stream in a_streams:
        stream.seed(1, fold(store.logs[RUN_A]))
    hub.seed(RUN_B, 1, fold(store.logs[RUN_B]))
    driven_here = {RUN_B}
    async with following(hub, store.read_log, driven_here.__contains__):
        # Nothing is read while nothing moves, however long.
        await trio.sleep(3.5)
        assert store.reads == {}
        store.commit(RUN_A, RandomObserved(value="cd"), RunCompleted(output=1))
        store.commit(RUN_B, RandomObserved(value="ef"))
        hub.moved({RUN_A: 3, RUN_B: 2})
        await trio.testing.wait_all_tasks_blocked()
        # One read of A (not fifty), none of B: its commits are published by its driver here.
        assert store.reads == {RUN_A: 1}
        for stream in a_streams:
            assert [(e.envelope.seq, e.view.state.value) for e in drain(stream)] == [
                (1, "running"),
                (2, "completed"),
            ]
        # A notice of what was delivered already costs nothing, and an ended run is not followed.
        hub.moved({RUN_A: 3})
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {RUN_A: 1}
        assert hub.followed(driven_here.__contains__) == {}
        # Once nobody listens to A, it is read no more.
        for stream in a_streams:
            stream.close()
        driven_here.clear()
        hub.moved({RUN_A: 3, RUN_B: 2})
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {RUN_A: 1, RUN_B: 1}
        assert [e.envelope.seq for e in b_listener.got] == [1]


async def test_a_read_racing_a_publish_hands_each_seq_over_once(autojump_clock) -> None:
    hub, store = EventHub(), Store()
    store.commit(RUN_A, started())
    listener = WsListener(RUN_A)
    hub.add(listener)
    hub.seed(RUN_A, 1, fold(store.logs[RUN_A]))

    published = store.commit(RUN_A, RandomObserved(value="ab"))
    view_before = fold(store.logs[RUN_A][:1])

    async def read_then_publish(run_id: str, from_seq: int) -> list:
        log = await store.read_log(run_id, from_seq)
        # The commit is published while the follower's read is on its way back.
        hub.publish(published, view_before)
        return log

    async with following(hub, read_then_publish):
        hub.moved({RUN_A: 2})
        await trio.testing.wait_all_tasks_blocked()
    async with following(hub, store.read_log):
        hub.reconcile()
        await trio.testing.wait_all_tasks_blocked()
    assert [e.envelope.seq for e in listener.got] == [1]


async def test_a_notice_before_a_subscriber_has_read_the_run_is_kept_for_it(
    autojump_clock,
) -> None:
    # The subscriber read the store before the foreign commit, and the notice of that commit
    # came before it seeded the hub: what it says is kept, and read once the subscriber seeds.
    hub, store = EventHub(), Store()
    store.commit(RUN_A, started())
    stream = hub.subscribe(RUN_A)
    read_by_subscriber = fold(store.logs[RUN_A])
    store.commit(RUN_A, RandomObserved(value="ab"))
    async with following(hub, store.read_log):
        hub.moved({RUN_A: 2})
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {} and drain(stream) == []
        stream.seed(1, read_by_subscriber)
        await trio.testing.wait_all_tasks_blocked()
        assert [e.envelope.seq for e in drain(stream)] == [1]


async def test_after_a_reconcile_every_followed_run_is_read_once(autojump_clock) -> None:
    # The feed lost its connection: notices sent meanwhile are lost, so every run is read, and a
    # run a subscriber had not finished reading is read once it is seeded.
    hub, store = EventHub(), Store()
    for run_id in (RUN_A, RUN_B):
        store.commit(run_id, started())
    a, b = hub.subscribe(RUN_A), hub.subscribe(RUN_B)
    a.seed(1, fold(store.logs[RUN_A]))
    b_read = fold(store.logs[RUN_B])
    for run_id in (RUN_A, RUN_B):
        store.commit(run_id, RandomObserved(value="ab"))
    async with following(hub, store.read_log):
        hub.reconcile()
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {RUN_A: 1}
        assert [e.envelope.seq for e in drain(a)] == [1]
        b.seed(1, b_read)
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {RUN_A: 1, RUN_B: 1}
        assert [e.envelope.seq for e in drain(b)] == [1]


async def test_events_the_feed_read_go_out_once_and_a_gap_is_read_by_the_follower(
    autojump_clock,
) -> None:
    hub, store = EventHub(), Store()
    store.commit(RUN_A, started())
    stream = hub.subscribe(RUN_A)
    stream.seed(1, fold(store.logs[RUN_A]))
    store.commit(RUN_A, RandomObserved(value="a"), RandomObserved(value="b"))
    async with following(hub, store.read_log):
        # Handed over with the notice: no read of the hub's own.
        hub.arrived(RUN_A, store.logs[RUN_A][1:3], 3)
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {} and [e.envelope.seq for e in drain(stream)] == [1, 2]
        # The same again (a second notice of it): nothing goes out twice.
        hub.arrived(RUN_A, store.logs[RUN_A][1:3], 3)
        # Events past a gap (the notice of seq 3 was lost): the follower reads from the gap.
        store.commit(RUN_A, RandomObserved(value="c"), RandomObserved(value="d"))
        hub.arrived(RUN_A, store.logs[RUN_A][4:5], 5)
        await trio.testing.wait_all_tasks_blocked()
        assert store.reads == {RUN_A: 1} and [e.envelope.seq for e in drain(stream)] == [3, 4]


async def test_a_failed_read_is_tried_again(autojump_clock) -> None:
    hub, store = EventHub(), Store()
    store.commit(RUN_A, started())
    stream = hub.subscribe(RUN_A)
    stream.seed(1, fold(store.logs[RUN_A]))
    store.commit(RUN_A, RandomObserved(value="ab"))
    failures = [StoreUnavailable("the store is down")]

    async def flaky(run_id: str, from_seq: int) -> list:
        if failures:
            raise failures.pop()
        return await store.read_log(run_id, from_seq)

    async with following(hub, flaky):
        hub.moved({RUN_A: 2})
        await trio.testing.wait_all_tasks_blocked()
        assert drain(stream) == []
        await trio.sleep(1)
        assert [e.envelope.seq for e in drain(stream)] == [1]


# -- batching: a burst of a run's commits is one delivery ------------------------------------------


def driving_a(run_id: str) -> bool:
    """The driving set of these tests: a driver here goes on with run A only."""
    return run_id == RUN_A


def commit(hub: EventHub, store: Store, run_id: str, *events) -> None:
    """Commit ``events`` to the store and publish them, as the writer does."""
    before = fold(store.logs.get(run_id, []))
    hub.publish(store.commit(run_id, *events), before)


@asynccontextmanager
async def delivering(limit_seconds: float) -> AsyncIterator[tuple[EventHub, Store]]:
    """A batching hub (a driver here goes on with run A only) and its store, with the hub's
    delivery task running for the block (cancelled at its end)."""
    hub = EventHub(Batching(driving_a, limit_seconds=limit_seconds))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hub.deliver_forever)
        yield hub, Store()
        nursery.cancel_scope.cancel()


async def test_a_burst_is_held_until_the_run_waits_on_its_model(autojump_clock) -> None:
    async with delivering(0.05) as (hub, store):
        stream = hub.subscribe(RUN_A)
        commit(hub, store, RUN_A, started())
        await trio.sleep(0.01)
        commit(hub, store, RUN_A, model())
        commit(hub, store, RUN_A, model_done(1), tool())
        await trio.sleep(0.01)
        # The model call went out at once; the run goes on to its tool: that is held.
        assert [e.envelope.seq for e in drain(stream)] == [0, 1]
        commit(hub, store, RUN_A, tool_done(3), model())
        # It waits on its model again: what was held goes out with it, in one delivery.
        assert [e.envelope.seq for e in drain(stream)] == [2, 3, 4, 5]
    assert hub._held == {}


async def test_a_run_no_driver_here_goes_on_with_is_never_held(autojump_clock) -> None:
    # A client-driven run's next commit comes when its client sends it: nothing to wait for.
    async with delivering(60) as (hub, store):
        stream = hub.subscribe(RUN_B)
        commit(hub, store, RUN_B, started())
        commit(hub, store, RUN_B, RandomObserved(value="ab"))
        assert [e.envelope.seq for e in drain(stream)] == [0, 1]


async def test_a_hold_ends_at_its_limit(autojump_clock) -> None:
    async with delivering(0.05) as (hub, store):
        stream = hub.subscribe(RUN_A)
        commit(hub, store, RUN_A, started(), model(), model_done(1), tool())
        await trio.sleep(0.049)
        assert drain(stream) == []
        await trio.sleep(0.002)
        assert [e.envelope.seq for e in drain(stream)] == [0, 1, 2, 3]
        # A tool that takes long: each further commit waits no longer than the limit either.
        commit(hub, store, RUN_A, tool_done(3), model(), model_done(5), tool())
        await trio.sleep(0.051)
        assert [e.envelope.seq for e in drain(stream)] == [4, 5, 6, 7]


async def test_what_the_follower_reads_goes_out_after_what_is_held(autojump_clock) -> None:
    async with delivering(60) as (hub, store):
        stream = hub.subscribe(RUN_A)
        commit(hub, store, RUN_A, started())
        # Then another process writes to the run (its driver here has ended).
        store.commit(RUN_A, RandomObserved(value="ab"))
        async with following(hub, store.read_log):
            hub.moved({RUN_A: 2})
            await trio.testing.wait_all_tasks_blocked()
        assert [e.envelope.seq for e in drain(stream)] == [0, 1]
        # The follower read only what the hub had not seen, held or delivered.
        assert store.reads == {RUN_A: 1}


async def test_what_is_held_is_delivered_when_the_hub_stops(autojump_clock) -> None:
    async with delivering(60) as (hub, store):
        stream, watcher = hub.subscribe(RUN_A), Watcher()
        hub.watch(watcher)
        commit(hub, store, RUN_A, started(), model(), model_done(1), tool())
        await trio.sleep(1)
        assert drain(stream) == [] and watcher.changes == []
    assert [e.envelope.seq for e in drain(stream)] == [0, 1, 2, 3]
    assert [c.view.state.value for c in watcher.changes] == [
        "running",
        "awaiting_model",
        "running",
        "awaiting_tool",
    ]


def rows(watcher: Watcher) -> list[tuple[str, int]]:
    """What the watcher was told of each change: the run's state and event count."""
    return [(c.view.state.value, c.view.next_seq) for c in watcher.changes]


def test_a_row_the_change_feed_told_first_is_not_followed_by_an_older_one() -> None:
    # SQLite: the feed sees this process's own commits too. Its view of a run that nothing here
    # drives (a client's) can be read after a commit whose publish has not run yet.
    hub, store, watcher = EventHub(), Store(), Watcher()
    hub.watch(watcher)
    commit(hub, store, RUN_A, started())
    commit(hub, store, RUN_A, gate())
    before = fold(store.logs[RUN_A])
    envelopes = store.commit(RUN_A, Resumed(input={"approved": True}), RunCompleted(output=42))
    hub.listed([fold(store.logs[RUN_A])])
    hub.publish(envelopes, before)
    assert rows(watcher) == [("running", 1), ("suspended", 2), ("completed", 4)]


def test_events_read_after_a_later_row_was_told_change_no_row() -> None:
    # PostgreSQL: a notice's run views are read when it is handled, which can be after the next
    # commit; the notice's own events then reach the hub behind that later view.
    hub, store, watcher = EventHub(), Store(), Watcher()
    listener = WsListener(RUN_A)
    hub.add(listener)
    hub.watch(watcher)
    started_envelopes = store.commit(RUN_A, started(), gate())
    hub.seed(RUN_A, 0, EMPTY_VIEW)
    resumed = store.commit(RUN_A, Resumed(input={"approved": True}))
    store.commit(RUN_A, RunCompleted(output=42))
    hub.listed([fold(store.logs[RUN_A])])
    hub.arrived(RUN_A, started_envelopes + resumed, 3)
    # Every event reaches the run's subscriber; the run list stays at the end it was told.
    assert [e.envelope.seq for e in listener.got] == [0, 1, 2]
    assert rows(watcher) == [("completed", 4)]
    # A row the watchers were told the same of at a later point is not told again either.
    hub.listed([fold(store.logs[RUN_A])])
    assert rows(watcher) == [("completed", 4)]


def test_a_stream_queues_at_most_its_bytes_then_lags() -> None:
    hub, store = EventHub(), Store()
    big = "x" * 10_000
    slow = hub.subscribe(RUN_A, limit_bytes=25_000)
    hub.publish(store.commit(RUN_A, started()), EMPTY_VIEW)
    view = fold(store.logs[RUN_A])
    for _ in range(5):
        envelopes = store.commit(RUN_A, RandomObserved(value=big))
        hub.publish(envelopes, view)
        view = fold(store.logs[RUN_A])
    # The head and two of the large events fit; the rest were dropped, and the stream knows it
    # lags (its reader reads them back from the store).
    taken = slow.take()
    assert [e.envelope.seq for e in taken] == [0, 1, 2]
    assert sum(e.weight for e in taken) <= 25_000 and slow.lagging
    # Taking empties the queue: what comes next fits again.
    slow.lagging = False
    hub.publish(store.commit(RUN_A, RandomObserved(value=big)), view)
    assert [e.envelope.seq for e in slow.take()] == [6] and not slow.lagging
    # One event larger than the whole budget still reaches an empty queue.
    huge = store.commit(RUN_A, RandomObserved(value="y" * 60_000))
    hub.publish(huge, fold(store.logs[RUN_A][:-1]))
    assert [e.envelope.seq for e in slow.take()] == [7]
    slow.close()


async def test_the_follower_reads_a_page_at_a_time_and_only_runs_a_subscriber_has_read(
    autojump_clock,
) -> None:
    hub, store = EventHub(), Store()
    store.commit(RUN_A, started(), *(RandomObserved(value=str(n)) for n in range(599)))
    listener = WsListener(RUN_A)
    hub.add(listener)
    pages: list[tuple[int, int]] = []

    async def read_page(run_id: str, from_seq: int) -> list:
        page = (await store.read_log(run_id, from_seq))[:PAGE_EVENTS]
        pages.append((from_seq, len(page)))
        return page

    async with following(hub, read_page):
        # Nobody has read the run yet: its subscribers read it themselves, the follower does not.
        hub.moved({RUN_A: 600})
        await trio.testing.wait_all_tasks_blocked()
        assert pages == [] and listener.got == []
        hub.seed(RUN_A, 10, fold(store.logs[RUN_A][:10]))
        await trio.testing.wait_all_tasks_blocked()
    # Page after page while they come back full; the short one ends the read.
    assert pages == [(10, PAGE_EVENTS), (10 + PAGE_EVENTS, PAGE_EVENTS), (522, 78)]
    assert [e.envelope.seq for e in listener.got] == list(range(10, 600))
    hub.remove(listener)
