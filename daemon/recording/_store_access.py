"""The daemon's door to the store: one writer thread with group commit, reader threads.

The store is synchronous (SQLAlchemy); nothing blocks the trio thread. Every
append goes through one writer thread, which takes whatever appends have
queued up (from any number of runs), commits them in one transaction with
one fsync, and wakes each caller once its own rows are durable.

Appends reach the writer a scheduling batch at a time: every append made
while trio runs one batch of tasks is handed over together, by a task of
ours that runs in the next batch. Handed one by one, the writer (woken at
the trio thread's first system call) took the first append or two of a
busy batch alone, and the rest waited for the next commit: about two
appends per transaction on a busy daemon. Idle, the hand-over costs one
task switch, no wait: a lone append reaches the writer in the next batch,
which trio runs at once. Under a heavy stream from many callers, the writer
also holds a short window open before it commits (``GROUP_WINDOW_SECONDS``):
a transaction's fixed cost dwarfs what each further append adds to it.

Cancellation: waiting for an append is shielded. Once submitted, an append
either commits or fails, and the caller always learns which; a cancelled
driver never leaves the process unsure whether its events exist.

The shielded wait is bounded by the writer's life, not by a clock (a slow
fsync is no failure): when the writer thread ends, for whatever reason,
every append still waiting fails at once with ``StoreUnavailable``, and so
does every later one. A stop whose drain deadline has passed ``abandon``s the
appends the writer has not confirmed, the only case where a caller is left
not knowing whether its rows exist; the process is exiting then, and the
next start reads the answer from the log.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio
from salvor.protocol import Envelope, Event, RunView
from salvor.store import (
    AppendRequest,
    EventStore,
    Fence,
    Fenced,
    OwnerRelease,
    RunQuota,
    StoreUnavailable,
    notice_of,
)

from ..metrics import current_metrics
from ..processes import kill_after_commit_hook
from ._driving import InProcessDriving, RunDriving

log = logging.getLogger("salvor.store")

_STOP = object()
# What one run may make the store keep unless the operator says otherwise (``salvor serve``).
_DEFAULT_QUOTA = RunQuota()
# Bound on how many appends share one transaction: keeps one commit's
# latency predictable under a burst.
MAX_GROUP = 256
# The group-commit window: under a heavy stream of appends, the writer waits up to this long
# for more before it commits (less once the group holds ``GROUP_TARGET``), so that many appends
# share the fixed cost of a transaction (its statements, its fsync, the wake-up of the trio
# thread), much of it paid holding the interpreter lock the drives need. It opens only when the
# last transaction held appends of more than one caller and the appends of the last moments
# arrived fast enough to bring ``GROUP_WINDOW_APPENDS`` more within it: an idle or lightly
# loaded daemon, or one run appending alone however fast, commits at once; no append waits
# past the window.
GROUP_WINDOW_SECONDS = 0.025
GROUP_WINDOW_APPENDS = 4
GROUP_TARGET = 32
# The arrival rate the window is judged by: a moving average over about this many takes.
_RATE_TAKES = 8
# How long closing the store waits for the writer to finish what it holds;
# past it the writer (a daemon thread) is left to the process's exit.
WRITER_STOP_SECONDS = 10.0


class _RunClaim:
    """``RunOwners.claim`` for the writer, which makes the claims it takes together in one
    transaction (``RunOwners.claim_many``)."""

    __slots__ = ("dead_nodes", "node_id", "owners", "run_id")

    def __init__(self, owners: Any, run_id: str, node_id: str, dead_nodes: tuple) -> None:
        self.owners = owners
        self.run_id = run_id
        self.node_id = node_id
        self.dead_nodes = dead_nodes


class _Pending:
    __slots__ = ("done", "request", "result", "taken")

    def __init__(self, request: AppendRequest | OwnerRelease | _RunClaim) -> None:
        self.request = request
        self.done = trio.Event()
        self.result: Any = None
        # Set by the writer once it has taken this append into a transaction.
        self.taken = False


def _wake_all(group: list[_Pending]) -> None:
    for pending in group:
        pending.done.set()


def _unconfirmed(pending: _Pending, why: str) -> StoreUnavailable:
    if pending.taken:
        return StoreUnavailable(
            f"{why} while this append was being committed; whether it was committed is not known "
            "to this process (the log says so on the next start)"
        )
    return StoreUnavailable(f"{why} before this append was committed; nothing of it was written")


class StoreAccess:
    """Async access to an ``EventStore`` for trio code."""

    def __init__(
        self,
        store: EventStore,
        *,
        readers: int = 4,
        post_commit: Callable[[int, int], None] | None = None,
    ) -> None:
        self.store = store
        # Who drives which run in this process: every drive holds its run here (``_driving``).
        self.driving: RunDriving = InProcessDriving()
        # The kill tests' fault hook, or None: decided once here, so an append
        # with faults off makes no call and reads no environment.
        self.post_commit = post_commit
        # Lists of appends (one scheduling batch's each), then _STOP.
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # The appends made during the trio batch now running, handed to the writer together by
        # ``_hand_over`` (trio thread only). Without that task running, each goes on its own.
        self._batch: list[_Pending] = []
        self._batch_begun = trio.Event()
        self._handing_over = False
        self._hand_over_scope = trio.CancelScope()
        self._readers = trio.CapacityLimiter(readers)
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        # Appends submitted and not yet answered (kept on the trio thread).
        self._waiting: set[_Pending] = set()
        # Why no append can be committed any more (the writer ended, or the stop abandoned it).
        self._closed: str | None = None
        # Held while the writer takes a group and while an abandon closes: an
        # append is either taken (its outcome then unknown) or never written.
        self._taking = threading.Lock()
        self._writer_gone = trio.Event()
        # Called on the trio thread with every batch of envelopes once durable,
        # and the run's view before the batch (the stream fan-out listens here).
        self.on_commit: list[Callable[[list[Envelope], RunView], None]] = []
        # Called on the trio thread once an append that wrote an outbox row is durable (a store
        # opened with notifications on): the deliverer's poke, so a row waits for no timer.
        self.on_notification: list[Callable[[], None]] = []

    def _start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._writer, name="salvor-writer", daemon=True)
        self._thread.start()

    async def _stop(self) -> None:
        """Let the writer finish what it holds, within ``WRITER_STOP_SECONDS``; it takes no more."""
        self._handing_over = False
        self._hand_over_scope.cancel(reason="the store is closing")
        self._hand_batch()
        self._queue.put(_STOP)
        if self._thread is None:
            return
        with trio.move_on_after(WRITER_STOP_SECONDS):
            await self._writer_gone.wait()
        if self._writer_gone.is_set():
            await trio.to_thread.run_sync(self._thread.join)
        else:
            log.error(
                "the store's writer did not finish within %gs of the stop; the appends it "
                "holds are left to the database (the next start reads what was committed)",
                WRITER_STOP_SECONDS,
            )
            self.abandon("the daemon stopped")

    def _writer(self) -> None:
        """The writer thread: the write loop, then (however it ended) the trio side hears of it."""
        why = "the store is closed"
        try:
            self._write_loop()
        except BaseException as exc:  # whatever killed it, its callers must hear
            why = f"the store's writer thread died ({type(exc).__name__})"
            log.critical("%s: no append is committed until the daemon restarts", why, exc_info=True)
        try:
            self._token.run_sync_soon(self._writer_ended, why)
        except trio.RunFinishedError:
            pass  # trio has ended: nobody is waiting

    def _writer_ended(self, why: str) -> None:
        self._writer_gone.set()
        self.abandon(why)

    def abandon(self, why: str) -> None:
        """Fail every append not yet answered, and every later one, with ``why`` (trio thread only).

        An append the writer has taken may still commit after this; its
        caller hears that the outcome is not known.
        """
        with self._taking:
            if self._closed is None:
                self._closed = why
        for pending in list(self._waiting):
            if not pending.done.is_set() and pending.result is None:
                pending.result = _unconfirmed(pending, why)
                pending.done.set()

    def _start_handing_over(self) -> None:
        # A system task: in a nursery around the caller's block, an exception
        # of that block would reach the caller wrapped in an exception group.
        self._handing_over = True
        trio.lowlevel.spawn_system_task(self._hand_over, name="salvor store hand-over")

    async def _hand_over(self) -> None:
        """Hand the writer each scheduling batch's appends together, until the stop.

        Woken by a batch's first append, this task runs in the next batch,
        after every task of the first one has run (and made its appends).
        Once it ends, appends go to the writer one by one.
        """
        with self._hand_over_scope:
            try:
                while True:
                    await self._batch_begun.wait()
                    self._batch_begun = trio.Event()
                    self._hand_batch()
            finally:
                self._handing_over = False
                self._hand_batch()

    def _hand_batch(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._queue.put(batch)

    def _submit(self, pending: _Pending) -> None:
        if not self._handing_over:
            self._queue.put([pending])
            return
        if not self._batch:
            self._batch_begun.set()
        self._batch.append(pending)

    def _write_loop(self) -> None:
        # Taken from the queue and not yet committed: what did not fit in MAX_GROUP waits here.
        held: list[_Pending] = []
        stopping = False
        # Appends per second lately, and when the writer last took from the queue.
        rate = 0.0
        last_take = time.monotonic()
        # How many appends the last transaction held: one means a caller appending alone, whom
        # no window can help (its next append waits for this one).
        last_group = 0
        while held or not stopping:
            carried = len(held)
            if not held:
                item = self._queue.get()
                if item is _STOP:
                    return
                held = item
            # Whatever else queued up while the last transaction committed joins this one;
            # under a heavy stream, so does what arrives within the window.
            window_ends = time.monotonic()
            if last_group > 1 and rate * GROUP_WINDOW_SECONDS >= GROUP_WINDOW_APPENDS:
                window_ends += GROUP_WINDOW_SECONDS
            while len(held) < MAX_GROUP and not stopping:
                wait = window_ends - time.monotonic() if len(held) < GROUP_TARGET else 0
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                else:
                    held.extend(item)
            # Everything taken now arrived since the last take.
            taken_at = time.monotonic()
            rate += ((len(held) - carried) / max(taken_at - last_take, 1e-4) - rate) / _RATE_TAKES
            last_take = taken_at
            group, held = held[:MAX_GROUP], held[MAX_GROUP:]
            last_group = len(group)
            self._commit_group(group)

    def _commit_group(self, group: list[_Pending]) -> None:
        with self._taking:
            # Abandoned appends were answered "nothing written": they stay unwritten.
            if self._closed is not None:
                return
            for pending in group:
                pending.taken = True
        # Claims first, in a short transaction of their own: each is answered without waiting
        # for the store's write lock behind this process's own writer.
        batch = []
        claims: dict[tuple, list[_Pending]] = {}
        for pending in group:
            request = pending.request
            if isinstance(request, _RunClaim):
                key = (id(request.owners), request.node_id)
                claims.setdefault(key, []).append(pending)
            else:
                batch.append(pending)
        for claiming in claims.values():
            self._claim_together(claiming)
        if batch:
            try:
                results = self.store.append_batch([p.request for p in batch])
            except Exception as exc:  # noqa: BLE001 -- the batch failed: every caller hears why
                results = [exc] * len(batch)
            for pending, result in zip(batch, results):
                # A committed release's result is None: boxed, as "not answered yet" is None.
                pending.result = (result,) if result is None else result
        # One wake-up of the trio thread for the whole group, not one per append.
        self._token.run_sync_soon(_wake_all, group)

    async def append(
        self,
        run_id: str,
        events: Sequence[Event],
        view: RunView,
        *,
        claim: str | None = None,
        settle: str | None = None,
        release: str | None = None,
    ) -> tuple[list[Envelope], RunView]:
        """Append ``events`` after ``view`` durably; return the envelopes and the new view.

        ``claim``, ``settle``, ``release``: as ``EventStore.append`` takes them.

        Raises:
            GuardRefusal: the batch is not legal next; nothing was written.
            Fenced: another node has taken the run over from the drive holding it here;
                nothing was written.
            StoreError: a conflict or a database failure; nothing was written.
            StoreUnavailable: the writer has ended (died, or the store is
                closed) or the stop abandoned the append; its message says
                whether anything may have been written.

        Cancellation: shielded; the caller waits for the commit to finish,
        or for the writer's end.
        """
        result = await self._through_writer(
            AppendRequest(
                run_id=run_id,
                events=list(events),
                view=view,
                claim=claim,
                settle=settle,
                release=release,
                # The fence of the drive holding the run here (several nodes over one store):
                # once another node has taken the run over, the store writes nothing of this.
                fence=self.driving.fence(run_id, creating=view.next_seq == 0),
            ),
            "append",
        )
        if isinstance(result, BaseException):
            if isinstance(result, Fenced) and (metrics := current_metrics()) is not None:
                metrics.appends_fenced.inc()
            raise result
        envelopes, new_view = result
        if self.post_commit is not None:
            self.post_commit(envelopes[0].seq, envelopes[-1].seq)
        for listener in self.on_commit:
            listener(envelopes, view)
        # The same pure decision the store made inside the transaction, so nothing travels back
        # from the writer thread for it; a store without notifications skips it.
        if (
            self.on_notification
            and self.store.notifications
            and notice_of(view, envelopes, new_view) is not None
        ):
            for poke in self.on_notification:
                poke()
        return envelopes, new_view

    @staticmethod
    def _claim_together(claiming: list[_Pending]) -> None:
        """The claims one node makes through one ``RunOwners``, in one transaction."""
        first = claiming[0].request
        dead = tuple(sorted({node for p in claiming for node in p.request.dead_nodes}))
        try:
            outcomes = first.owners.claim_many(
                [p.request.run_id for p in claiming], first.node_id, dead_nodes=dead
            )
        except Exception as exc:  # noqa: BLE001 -- every claimer hears why
            outcomes = [exc] * len(claiming)
        for pending, outcome in zip(claiming, outcomes):
            pending.result = outcome

    async def _through_writer(self, request: AppendRequest | OwnerRelease | _RunClaim, what: str):
        """Hand ``request`` to the writer and wait, shielded, for its result (an exception is
        returned, not raised)."""
        if self._closed is not None or self._thread is None or not self._thread.is_alive():
            why = self._closed or "the store is closed"
            raise StoreUnavailable(f"{why}; nothing of this {what} was written")
        pending = _Pending(request)
        with trio.CancelScope(shield=True):
            self._waiting.add(pending)
            self._submit(pending)
            try:
                await pending.done.wait()
            finally:
                self._waiting.discard(pending)
        result = pending.result
        return result[0] if type(result) is tuple and len(result) == 1 else result

    async def release_owner(self, run_id: str, fence: Fence) -> None:
        """``RunOwners.release`` in the writer's next group commit: the drive holding ``run_id``
        under ``fence`` lets it go, with no transaction (nor fsync) of its own.

        Raises:
            StoreUnavailable: the store failed, or the writer has ended; the run may still be
                marked driving (the caller tries again later).

        Cancellation: shielded, as ``append``.
        """
        result = await self._through_writer(OwnerRelease(run_id, fence), "release")
        if isinstance(result, BaseException):
            raise result

    async def claim_run(
        self, owners: Any, run_id: str, node_id: str, dead_nodes: tuple = ()
    ) -> Any:
        """``owners.claim(run_id, node_id, dead_nodes=...)`` made by the writer between two group
        commits, in one transaction with the other claims it takes then (``claim_many``): drives
        starting together share a commit, and none waits for the store's write lock behind
        this process's writer. Raises as ``RunOwners.claim`` does.

        Cancellation: shielded, as ``append``.
        """
        result = await self._through_writer(_RunClaim(owners, run_id, node_id, dead_nodes), "claim")
        if isinstance(result, BaseException):
            raise result
        return result

    async def read(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a read-only store method on a reader thread."""
        if kwargs:
            fn = partial(fn, **kwargs)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._readers)

    async def check_writable(self) -> None:
        """Whether the store takes a write now (``EventStore.check_writable``), off the trio thread.

        Raises:
            StoreUnavailable: it does not (or this process's writer has ended); nothing changed.
        """
        if self._closed is not None:
            raise StoreUnavailable(f"{self._closed}; this daemon commits no more appends")
        # Not on a reader thread: a write waiting on a lock must not hold up reads.
        await trio.to_thread.run_sync(self.store.check_writable)


@asynccontextmanager
async def open_store_access(
    url: str,
    *,
    synchronous: str = "FULL",
    notifications: bool = False,
    commit_observer: Callable[[int, float, int], None] | None = None,
    quota: RunQuota | None = _DEFAULT_QUOTA,
) -> AsyncIterator[StoreAccess]:
    """Open the store at ``url`` and its writer thread for the life of the block.

    ``notifications``: appends write the outbox rows they call for (``EventStore.open``); only
    a daemon that delivers them asks for it. ``commit_observer``: told of each group commit on
    the writer thread, with its events, seconds and appends (``EventStore.open``); the daemon's
    metrics count there. ``quota``: what one run may make the store keep (``EventStore.open``); the
    defaults unless the operator set other limits.

    Raises:
        StoreUnavailable / StoreTooNew: the store cannot be opened; nothing was started.
    """
    post_commit = kill_after_commit_hook()
    store = await trio.to_thread.run_sync(
        lambda: EventStore.open(
            url,
            synchronous=synchronous,
            notifications=notifications,
            commit_observer=commit_observer,
            quota=quota,
        )
    )
    access = StoreAccess(store, post_commit=post_commit)
    access._start()
    access._start_handing_over()
    try:
        yield access
    finally:
        with trio.CancelScope(shield=True):
            await access._stop()
            # A writer left hung in the database may hold a connection that
            # closing waits on: bounded, and left to the process's exit past it.
            with trio.move_on_after(WRITER_STOP_SECONDS):
                await trio.to_thread.run_sync(store.close, abandon_on_cancel=True)


async def claim_to_settle(
    access: StoreAccess, run_id: str, seq: int, key: str | None
) -> str | None:
    """The idempotency identity a completion at ``seq`` settles: only
    one this very intent claimed."""
    if key is None:
        return None
    claim = await access.read(access.store.claims.get_claim, key)
    if claim is not None and claim.state == "open" and (claim.run_id, claim.seq) == (run_id, seq):
        return key
    return None
