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
    runtime = state.runtime
    driver = driven_as or run_id
    with subscription:
        view, next_seq = EMPTY_VIEW, 0
        # Not kept under its argument's name: a tail holds one page at a time.
        pending: list[Envelope | LiveEvent] = page
        del page
        # Whether ``pending`` is a page read from the store: the next page follows until one
        # comes back empty.
        paging = True
        last_progress = last_beat = trio.current_time()
        progress_seq = next_seq
        seeded = False
        while True:
            batch: list[Envelope | LiveEvent] = []
            seq_before = next_seq
            for item in pending:
                envelope = envelope_of(item)
                if envelope.seq != next_seq:
                    continue
                view = item.view if isinstance(item, LiveEvent) else step(view, envelope)
                next_seq += 1
                batch.append(item)
            if next_seq > progress_seq:
                progress_seq, last_progress = next_seq, trio.current_time()
            pending = []
            if batch:
                # Handed out before the next page is read: a reader that does not read holds
                # this, and only this.
                yield batch
                del batch
            if paging and next_seq > seq_before:
                pending = await runtime.reads.read_page(run_id, next_seq)
                continue
            paging = False
            if not seeded:
                # From here on the hub reads what another process commits.
                subscription.seed(next_seq, view)
                seeded = True
            if view.resting:
                later = await _after_rest(state, run_id, driver, view, next_seq)
                if later is None:
                    yield TailEnd(view)
                    return
                if later:
                    pending, paging = later, True
                    continue
            now = trio.current_time()
            quiet = now - last_progress >= state.detach_grace_seconds
            # A peer node's drive (its commits come through the hub's poll) is no detachment.
            if quiet and await state.attached_anywhere(driver):
                last_progress = now  # asked again after another grace
            if state.stopping.is_set() or (
                now - last_progress >= state.detach_grace_seconds
                and not await state.attached(driver)
            ):
                yield TailEnd(view, detached=True, stopping=state.stopping.is_set())
                return
            # What the hub queued while the last batch was handed out goes out at once; only an
            # empty queue waits (a timer per wait is most of a busy stream's own cost).
            pending = subscription.take()
            if not pending:
                wait = min(state.stream_poll_seconds, max(0.0, last_beat + beat_seconds - now))
                with trio.move_on_after(wait):
                    await subscription.wait()
                pending = subscription.take()
            if not subscription.lagging:
                if pending and pending[0].envelope.seq < next_seq:
                    pending = [e for e in pending if e.envelope.seq >= next_seq]
                if not pending:
                    # A quiet spell: what another process writes comes through the hub's feed.
                    if trio.current_time() - last_beat >= beat_seconds:
                        last_beat = trio.current_time()
                        yield BEAT
                    continue
                if pending[0].envelope.seq == next_seq:
                    continue
            # A gap or a lagging queue: read what is missing from the store, page by page.
            subscription.lagging = False
            pending, paging = await runtime.reads.read_page(run_id, next_seq), True


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
