"""The deliverer: a task in the serve nursery that empties the store's notification outbox.

It wakes when an append wrote a row (``poke``, from the store access) and when the soonest
row falls due, reads the due rows oldest first in bounded batches, and delivers each to every
target the operator named. Every target accepted it: the row is marked delivered. Any refused
or failed: the attempt is counted and the row comes due again after an exponential backoff
(1 s doubling, at most 5 min apart). It never gives up: the outbox is the only record that the
operator has not been told yet, and a receiver down for a day hears of it when it is back.
Delivery is at least once: a row whose delivery succeeded may be sent again when the mark did
not reach the store (or the daemon died between the two), and a retry goes to every target
again; a receiver tells repeats apart by ``(run, seq, kind)``.

A write's intent makes its run ``needs_reconciliation`` in the log while the write is still
being performed, so an ``unknown_write`` row is only delivered once nothing here drives the run
any more and the run is still parked on that very write; a write that completed meanwhile
withdraws it unsent, one still in flight postpones it.

Several daemons over one store each run a deliverer, and each row goes to one of them: a
deliverer claims the due rows it takes (``Outbox.claim_due``) for long enough to deliver them
all, and delivers only what it claimed. A deliverer that dies mid-way leaves its rows to be
claimed again once the claim runs out (at least once, as above).

Nothing here is on a run's path: drivers never wait for a delivery, and a dead receiver slows
nothing but its own rows' retries. Store calls run on threads.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol
from urllib.parse import urlsplit

import trio
from salvor.protocol import RunState
from salvor.store import Notification, NotificationKind, StoreError

from ..recording import StoreAccess
from ._targets import Command, NotifyConfig, Webhook

log = logging.getLogger("salvor.notify")

BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 300.0
# Rows read per store round trip, and how many of them are in delivery at once.
# Rows claimed per store round trip, all of them in delivery at once: a claim holds no row that
# is not being delivered, so it can be short (``claim_seconds``).
BATCH = CONCURRENT_DELIVERIES = 8
# How often an idle deliverer looks at the outbox anyway (a row written by another process
# over this store gets no poke), and how soon it looks again after the store failed it.
IDLE_SECONDS = 60.0
STORE_RETRY_SECONDS = 5.0
# Beyond the longest a claimed row can take to deliver, before its claim runs out: the store
# round trips around it, a slow thread, the clocks of two nodes apart.
CLAIM_MARGIN_SECONDS = 10.0


def retry_delay(attempts: int, *, base: float = BACKOFF_BASE_SECONDS) -> float:
    """Seconds before the next attempt of a row that has failed ``attempts`` times (>= 1)."""
    return min(base * 2 ** min(attempts - 1, 64), BACKOFF_CAP_SECONDS)


class Target(Protocol):
    async def deliver(self, body: bytes) -> str | None: ...


def _utc_now() -> datetime:
    return datetime.now(UTC)


async def _nothing_in_flight(run_id: str) -> bool:
    return False


def claim_seconds(config: NotifyConfig) -> float:
    """How long a deliverer holds the rows it claimed: one delivery to every target in turn, each
    taking its full timeout (a batch's rows are delivered side by side). A deliverer killed
    holding rows delays them this long at most; one that stops lets them go at once."""
    targets = bool(config.webhook) + bool(config.command)
    return targets * config.timeout + CLAIM_MARGIN_SECONDS


class Deliverer:
    """Delivers the outbox of ``access``'s store to the targets of ``config``.

    Args:
        access: the daemon's store access (its store was opened with notifications on).
        config: the operator's targets.
        in_flight: whether something drives the run right now (a driver here, a client's lease
            on any node): its open write is being performed, not waiting on a person.
        node: who claims rows in the store (this daemon's node id; a fresh one by default).
        clock: the wall clock the outbox's instants are read against.
        backoff_base: the first retry's delay; it doubles per failed attempt up to the cap.
        recheck_seconds: how soon an ``unknown_write`` whose run is in flight is looked at again.
    """

    def __init__(
        self,
        access: StoreAccess,
        config: NotifyConfig,
        *,
        in_flight: Callable[[str], Awaitable[bool]] = _nothing_in_flight,
        node: str | None = None,
        clock: Callable[[], datetime] = _utc_now,
        backoff_base: float = BACKOFF_BASE_SECONDS,
        recheck_seconds: float = 1.0,
    ) -> None:
        self._access = access
        self._config = config
        self._in_flight = in_flight
        self.node = node or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._hold = claim_seconds(config)
        self._clock = clock
        self._backoff_base = backoff_base
        self._recheck = recheck_seconds
        self._poked = trio.Event()
        self._limiter = trio.CapacityLimiter(CONCURRENT_DELIVERIES)
        self._webhook = (
            Webhook(config.webhook, config.secret, config.timeout) if config.webhook else None
        )
        self._targets: list[Target] = [self._webhook] if self._webhook else []
        if config.command:
            self._targets.append(Command(config.command, config.timeout))

    def poke(self) -> None:
        """A row was written: look at the outbox now (trio thread; never waits)."""
        self._poked.set()

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled, then close the targets. Reports started at once.

        Cancellation: a delivery cut mid-way leaves its row due as it was (or, if the cut came
        between a receiver's answer and the mark, delivered again later: at least once), and
        the rows this deliverer claimed are let go for another daemon to take at once.
        """
        targets = []
        if self._config.webhook:
            parts = urlsplit(self._config.webhook)
            # The origin only: a webhook's path often carries a token of its own.
            targets.append(f"the webhook at {parts.scheme}://{parts.netloc.rpartition('@')[2]}")
        if self._config.command:
            targets.append(f"the command {self._config.command[0]}")
        log.info("notifications go to %s", " and ".join(targets))
        try:
            task_status.started()
            while True:
                # A fresh event before reading: a row written while this round delivers pokes
                # the next round instead of being lost.
                self._poked = trio.Event()
                wait = await self._round()
                with trio.move_on_after(wait):
                    await self._poked.wait()
        finally:
            with trio.CancelScope(shield=True):
                await self._let_claims_go()
                await self.aclose()

    async def _let_claims_go(self) -> None:
        # Bounded: a store that does not answer leaves the claims to run out by themselves.
        with trio.move_on_after(STORE_RETRY_SECONDS):
            try:
                await trio.to_thread.run_sync(
                    self._access.store.outbox.release, self.node, abandon_on_cancel=True
                )
            except StoreError as exc:
                log.warning(
                    "the notifications this daemon claimed stay claimed until their claim runs "
                    "out: %s",
                    exc.message,
                )

    async def aclose(self) -> None:
        """Close the webhook's connections (``serve`` does so as it ends)."""
        if self._webhook is not None:
            await self._webhook.aclose()

    async def _round(self) -> float:
        """Deliver what is due; the seconds until the outbox should be looked at again."""
        try:
            await self.deliver_due()
            due = await self._access.read(self._access.store.outbox.next_due)
        except StoreError as exc:
            log.warning("the notification outbox cannot be read now: %s", exc.message)
            return STORE_RETRY_SECONDS
        if due is None:
            return IDLE_SECONDS
        return min(max((due - self._clock()).total_seconds(), 0.0), IDLE_SECONDS)

    async def deliver_due(self) -> int:
        """Claim and deliver every row due now, a batch at a time; how many were delivered.

        Every row of a batch leaves the due set (delivered, retried later, postponed or
        withdrawn), so this ends once the due rows are through.

        Raises:
            StoreError: the outbox could not be read or a row not marked; the rows not yet
                marked are due as they were.
        """
        store = self._access.store
        delivered = 0
        while True:
            # A write: not on a reader thread, where it would hold up reads while it waits.
            batch = await trio.to_thread.run_sync(
                lambda: store.outbox.claim_due(
                    self.node, self._clock(), hold_seconds=self._hold, limit=BATCH
                )
            )
            if not batch:
                return delivered
            outcomes: list[bool] = []
            failures: list[StoreError] = []
            async with trio.open_nursery() as nursery:
                for row in batch:
                    nursery.start_soon(self._handle_one, row, outcomes, failures)
            delivered += sum(outcomes)
            if failures:
                # A row left unmarked is still due: reading again now would only spin.
                raise failures[0]
            if len(batch) < BATCH:
                return delivered

    async def _handle_one(
        self, row: Notification, outcomes: list[bool], failures: list[StoreError]
    ) -> None:
        try:
            outcomes.append(await self._handle(row))
        except StoreError as exc:
            failures.append(exc)
        except Exception:  # a bug here must not end the daemon's nursery
            log.exception("notification %d could not be delivered (a bug in salvor)", row.id)
            # Backed off as a refusal is, so the row neither spins nor is lost.
            delay = retry_delay(row.attempts + 1, base=self._backoff_base)
            try:
                until = self._clock() + timedelta(seconds=delay)
                await trio.to_thread.run_sync(
                    lambda: self._access.store.outbox.failed(row.id, until, node=self.node)
                )
            except StoreError as exc:
                failures.append(exc)

    async def _handle(self, row: Notification) -> bool:
        """Deliver one row and mark how it went; whether it was delivered."""
        async with self._limiter:
            if row.kind == NotificationKind.UNKNOWN_WRITE and not await self._still_unknown(row):
                return False
            body = row.body.encode("utf-8")
            reasons = [reason for t in self._targets if (reason := await t.deliver(body))]
            store = self._access.store
            if not reasons:
                await trio.to_thread.run_sync(store.outbox.mark_delivered, row.id)
                return True
            attempts = row.attempts + 1
            delay = retry_delay(attempts, base=self._backoff_base)
            until = self._clock() + timedelta(seconds=delay)
            await trio.to_thread.run_sync(
                lambda: store.outbox.failed(row.id, until, node=self.node)
            )
            log.warning(
                "notification %d (%s of run %s at seq %d) not delivered, attempt %d: %s; "
                "next attempt in %gs",
                row.id,
                row.kind,
                row.run_id,
                row.seq,
                attempts,
                "; ".join(reasons),
                math.ceil(delay * 1000) / 1000,
            )
            return False

    async def _still_unknown(self, row: Notification) -> bool:
        """Whether the write of an ``unknown_write`` row waits on a person now; if it does not,
        the row is withdrawn (the write completed) or postponed (it is still being performed)."""
        store = self._access.store
        view = await self._access.read(store.read_view, row.run_id)
        parked = (
            view is not None
            and view.state is RunState.NEEDS_RECONCILIATION
            and view.pending is not None
            and view.pending.seq == row.seq
        )
        if not parked:
            await trio.to_thread.run_sync(store.outbox.withdraw, row.id)
            return False
        if await self._in_flight(row.run_id):
            until = self._clock() + timedelta(seconds=self._recheck)
            await trio.to_thread.run_sync(
                lambda: store.outbox.postpone(row.id, until, node=self.node)
            )
            return False
        return True
