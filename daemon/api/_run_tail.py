"""One run's committed events as a stream follows them: its log from the store a page at a time,
then the live tail from the event hub, until the run rests.

The reader subscribes to the hub before it reads the store, so nothing committed in between is
missed, and gets each seq exactly once, in order (anything older is skipped; a gap is read back
from the store). Each batch is handed out before the next page is read: a reader that does not
read holds about one page, however long the log. Events another process commits (another node,
the CLI) arrive through the hub's change feed. The tail ends once the run rests, or once nothing
drives it and nothing has arrived for a grace period (detached), or when the daemon stops.
The SSE stream of a run and the ndjson stream of a graph run both read runs through it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio
from salvor.protocol import EMPTY_VIEW, Envelope, RunState, RunView, step

from ..runs import LiveEvent, Subscription
from ._state import ServerState


@dataclass(frozen=True, slots=True)
class TailEnd:
    """The last thing a tail hands out: where the run is, and why the tail stopped there
    (``detached``: nothing drives it here; ``stopping``: the daemon stops)."""

    view: RunView
    detached: bool = False
    stopping: bool = False


class Beat:
    """A quiet spell as long as the heartbeat: the reader says it is still there."""


BEAT = Beat()

# What a tail hands out: new events in seq order (an event published here comes with its view
# and encodings worked out once), a beat, and last its end.
TailItem = list[Envelope | LiveEvent] | Beat | TailEnd


def envelope_of(item: Envelope | LiveEvent) -> Envelope:
    return item.envelope if isinstance(item, LiveEvent) else item


async def tail_run(
    state: ServerState,
    run_id: str,
    subscription: Subscription,
    page: list[Envelope],
    *,
    beat_seconds: float,
    driven_as: str | None = None,
) -> AsyncIterator[TailItem]:
    """The events of ``run_id`` from seq 0 (``page``: its first page, read after ``subscription``
    was taken), then its live tail, until a ``TailEnd``.

    ``driven_as``: the run whose drive moves this one (a nested flow's root, which drives its
    children inline); whether the tail is detached is asked of it. Closes ``subscription``.
    """
    read_page = state.runtime.reads.read_page
    tail = _Tail(state, run_id, subscription, beat_seconds, driven_as or run_id)
    with subscription:
        # Not kept under its argument's name: a tail holds one page at a time. ``paging``:
        # whether ``pending`` is a page read from the store (the next follows until one is empty).
        pending: list[Envelope | LiveEvent] = page
        del page
        paging, seeded = True, False
        while True:
            seq_before = tail.next_seq
            batch = tail.take(pending)
            pending = []
            if batch:
                # Handed out before the next page is read: a reader that does not read holds
                # this, and only this.
                yield batch
                del batch
            if paging and tail.next_seq > seq_before:
                pending = await read_page(run_id, tail.next_seq)
                continue
            paging = False
            if not seeded:
                # From here on the hub reads what another process commits.
                subscription.seed(tail.next_seq, tail.view)
                seeded = True
            end = await tail.end()
            if isinstance(end, TailEnd):
                yield end
                return
            if end:  # what a write's driver committed after the log folded to its intent
                pending, paging = end, True
                continue
            got = await tail.wait()
            if isinstance(got, Beat):
                yield got
            elif got is None:  # a gap or a lagging queue: read what is missing, page by page
                pending, paging = await read_page(run_id, tail.next_seq), True
            else:
                pending = got


class _Tail:
    """Where a tail is: the view and next seq it has handed out, when it last moved and last
    beat, and the questions it asks of the hub and the drivers."""

    def __init__(
        self,
        state: ServerState,
        run_id: str,
        subscription: Subscription,
        beat_seconds: float,
        driver: str,
    ) -> None:
        self.state, self.run_id, self.subscription = state, run_id, subscription
        self.beat_seconds, self.driver = beat_seconds, driver
        self.view, self.next_seq = EMPTY_VIEW, 0
        self.last_progress = self.last_beat = trio.current_time()

    def take(self, pending: list[Envelope | LiveEvent]) -> list[Envelope | LiveEvent]:
        """What of ``pending`` comes next, in seq order (anything else skipped), folded in."""
        batch = []
        for item in pending:
            envelope = envelope_of(item)
            if envelope.seq != self.next_seq:
                continue
            self.view = item.view if isinstance(item, LiveEvent) else step(self.view, envelope)
            self.next_seq += 1
            batch.append(item)
        if batch:
            self.last_progress = trio.current_time()
        return batch

    async def end(self) -> TailEnd | list[Envelope]:
        """The tail's end when the run rests or is detached (or the daemon stops); else what
        to go on with (empty: wait for what comes)."""
        state = self.state
        if self.view.resting:
            later = await _after_rest(state, self.run_id, self.driver, self.view, self.next_seq)
            if later is None:
                return TailEnd(self.view)
            if later:
                return later
        now = trio.current_time()
        quiet = now - self.last_progress >= state.detach_grace_seconds
        # A peer node's drive (its commits come through the hub's poll) is no detachment.
        if quiet and await state.attached_anywhere(self.driver):
            self.last_progress = now  # asked again after another grace
        if state.stopping.is_set() or (
            now - self.last_progress >= state.detach_grace_seconds
            and not await state.attached(self.driver)
        ):
            return TailEnd(self.view, detached=True, stopping=state.stopping.is_set())
        return []

    async def wait(self) -> list[LiveEvent] | Beat | None:
        """What the hub queued next (at once when something is), a beat after a quiet spell as
        long as the heartbeat, or None when the queue lags or skips a seq (read the store)."""
        subscription = self.subscription
        # Only an empty queue waits: a timer per wait is most of a busy stream's own cost.
        pending = subscription.take()
        if not pending:
            now = trio.current_time()
            wait = min(
                self.state.stream_poll_seconds,
                max(0.0, self.last_beat + self.beat_seconds - now),
            )
            with trio.move_on_after(wait):
                await subscription.wait()
            pending = subscription.take()
        if subscription.lagging:
            subscription.lagging = False
            return None
        if pending and pending[0].envelope.seq < self.next_seq:
            pending = [e for e in pending if e.envelope.seq >= self.next_seq]
        if not pending:
            # A quiet spell: what another process writes comes through the hub's feed.
            if trio.current_time() - self.last_beat >= self.beat_seconds:
                self.last_beat = trio.current_time()
                return BEAT
            return []
        return pending if pending[0].envelope.seq == self.next_seq else None


async def _after_rest(
    state: ServerState, run_id: str, driver: str, view: RunView, next_seq: int
) -> list[Envelope] | None:
    """None when the run rests where ``view`` says; else what to go on with.

    A write's intent is recorded before the write runs, so the log folds to
    needs_reconciliation while a driver is still executing it (here, on a peer node, or a
    client holding its lease): not a resting point (an empty list: wait for what comes). And
    what the tail folded was read before the driver was asked about: one that finished the
    write and ended in between has committed what follows, so the store is read once more
    (from ``next_seq``) before the tail says the run rests there.
    """
    if view.state is not RunState.NEEDS_RECONCILIATION:
        return None
    if await state.attached_anywhere(driver):
        return []
    later = await state.runtime.reads.read_page(run_id, next_seq)
    return later or None
