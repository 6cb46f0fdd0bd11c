"""The daemon's door to the store: one writer thread with group commit, reader threads.

The store is synchronous (SQLAlchemy); nothing blocks the trio thread. Every
append goes through one writer thread, which takes whatever appends have
queued up (from any number of runs), commits them in one transaction with
one fsync, and wakes each caller once its own rows are durable.

Cancellation: waiting for an append is shielded. Once submitted, an append
either commits or fails, and the caller always learns which; a cancelled
driver never leaves the process unsure whether its events exist.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from salvor.protocol import Envelope, Event, RunView
from salvor.store import AppendRequest, EventStore

from ..processes import kill_after_commit

_STOP = object()
# Bound on how many appends share one transaction: keeps one commit's
# latency predictable under a burst.
MAX_GROUP = 256


class _Pending:
    __slots__ = ("done", "request", "result")

    def __init__(self, request: AppendRequest) -> None:
        self.request = request
        self.done = trio.Event()
        self.result: Any = None


def _wake_all(group: list[_Pending]) -> None:
    for pending in group:
        pending.done.set()


class StoreAccess:
    """Async access to an ``EventStore`` for trio code."""

    def __init__(self, store: EventStore, *, readers: int = 4) -> None:
        self.store = store
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._readers = trio.CapacityLimiter(readers)
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        # Called on the trio thread with every batch of envelopes once durable,
        # and the run's view before the batch (the stream fan-out listens here).
        self.on_commit: list[Callable[[list[Envelope], RunView], None]] = []

    def _start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._write_loop, name="salvor-writer", daemon=True)
        self._thread.start()

    async def _stop(self) -> None:
        self._queue.put(_STOP)
        if self._thread is not None:
            await trio.to_thread.run_sync(self._thread.join)

    def _write_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            group = [first]
            stop = False
            while len(group) < MAX_GROUP:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True
                    break
                group.append(item)
            try:
                results = self.store.append_batch([p.request for p in group])
            except Exception as exc:  # noqa: BLE001 -- the whole batch failed: every caller hears why
                results = [exc] * len(group)
            for pending, result in zip(group, results):
                pending.result = result
            # One wake-up of the trio thread for the whole group, not one per append.
            self._token.run_sync_soon(_wake_all, group)
            if stop:
                return

    async def append(
        self,
        run_id: str,
        events: Sequence[Event],
        view: RunView,
        *,
        claim: str | None = None,
        settle: str | None = None,
    ) -> tuple[list[Envelope], RunView]:
        """Append ``events`` after ``view`` durably; return the envelopes and the new view.

        Raises:
            GuardRefusal: the batch is not legal next; nothing was written.
            StoreError: a conflict or a database failure; nothing was written.

        Cancellation: shielded; the caller waits for the commit to finish.
        """
        pending = _Pending(AppendRequest(run_id=run_id, events=list(events), view=view, claim=claim, settle=settle))
        with trio.CancelScope(shield=True):
            self._queue.put(pending)
            await pending.done.wait()
        if isinstance(pending.result, BaseException):
            raise pending.result
        envelopes, new_view = pending.result
        kill_after_commit(envelopes[0].seq, envelopes[-1].seq)
        for listener in self.on_commit:
            listener(envelopes, view)
        return envelopes, new_view

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a read-only store method on a reader thread."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self._readers)

    async def check_writable(self) -> None:
        """Whether the store takes a write now (``EventStore.check_writable``), off the trio thread.

        Raises:
            StoreUnavailable: it does not; nothing changed.
        """
        # Not on a reader thread: a write waiting on a lock must not hold up reads.
        await trio.to_thread.run_sync(self.store.check_writable)


@asynccontextmanager
async def open_store_access(url: str, *, synchronous: str = "FULL") -> AsyncIterator[StoreAccess]:
    """Open the store at ``url`` and its writer thread for the life of the block.

    Raises:
        StoreUnavailable / StoreTooNew: the store cannot be opened; nothing was started.
    """
    store = await trio.to_thread.run_sync(lambda: EventStore.open(url, synchronous=synchronous))
    access = StoreAccess(store)
    access._start()
    try:
        yield access
    finally:
        with trio.CancelScope(shield=True):
            await access._stop()
            await trio.to_thread.run_sync(store.close)


async def claim_to_settle(access: StoreAccess, run_id: str, seq: int, key: str | None) -> str | None:
    """The idempotency identity a completion at ``seq`` settles: only one this very intent claimed."""
    if key is None:
        return None
    claim = await access.read(access.store.get_claim, key)
    if claim is not None and claim.state == "open" and (claim.run_id, claim.seq) == (run_id, seq):
        return key
    return None
