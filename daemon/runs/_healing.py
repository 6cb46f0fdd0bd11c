"""Runs whose drive stopped on a store fault, driven again once the store accepts writes.

A drive that stops because the database failed underneath it (a full disk, a
lock held past its timeout, a lost connection: ``store_fault``) leaves its
run mid-flight with nobody driving it. The store heals by itself; the run
should too. ``StoreHealing`` remembers such runs (in memory: a restart
recovers them anyway) and, with exponential backoff, first asks the store to
commit a write that changes nothing, then, once it does, starts a driver for
each run that was due. A drive that stopped for any other reason (a bug, a
refusal, a parked run) is never retried here.

Cancellation: ``heal_forever`` is a service task; cancelling it forgets
nothing durable, and every wait in it is bounded by the next retry.
"""

from __future__ import annotations

import logging
import math
import random as _random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
from salvor.store import StoreUnavailable

log = logging.getLogger("salvor.healing")


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """How long to wait before try ``n`` (1-based): ``first`` doubling up to ``ceiling``, jittered.

    The jitter draws each wait from the upper half of its slot, so many
    daemons (or runs) that failed together do not retry in step, and a
    wait is never shorter than half its nominal length.
    """

    first: float = 1.0
    ceiling: float = 60.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (0 < self.first <= self.ceiling) or not (0 <= self.jitter < 1):
            raise ValueError("a backoff needs 0 < first <= ceiling and 0 <= jitter < 1")

    def nominal(self, attempt: int) -> float:
        if attempt < 1:
            raise ValueError("attempts count from 1")
        # Capped before the power, so a long outage never overflows a float.
        doublings = min(attempt - 1, math.ceil(math.log2(self.ceiling / self.first)))
        return min(self.ceiling, self.first * 2**doublings)

    def delay(self, attempt: int, draw: float) -> float:
        """The wait before try ``attempt``, for a uniform ``draw`` in [0, 1)."""
        return self.nominal(attempt) * (1 - self.jitter * draw)


@dataclass(slots=True)
class _Waiting:
    attempts: int  # tries so far: write checks the store refused, and drives started
    first_fault_at: float
    due_at: float
    reason: str


class StoreHealing:
    """The runs a store fault stopped, and when each is tried again.

    ``stopped`` and ``settled`` are called by the driving set as drives end;
    ``heal_forever`` (a task of the server's) does the retrying.
    """

    def __init__(
        self,
        *,
        backoff: Backoff = Backoff(),
        give_up_after: float = 3600.0,
        clock: Callable[[], float] = trio.current_time,
        draw: Callable[[], float] = _random.random,
    ) -> None:
        self.backoff = backoff
        self.give_up_after = give_up_after
        self._clock = clock
        self._draw = draw
        # Runs waiting for their next try, and runs re-driven now (until their drive ends).
        self._waiting: dict[str, _Waiting] = {}
        self._trying: dict[str, _Waiting] = {}
        self._changed = trio.Event()

    def __len__(self) -> int:
        """How many runs are waiting to be re-driven or are being re-driven after a store fault."""
        return len(self._waiting) + len(self._trying)

    def waiting(self, run_id: str) -> bool:
        return run_id in self._waiting

    def stopped(self, run_id: str, error: StoreUnavailable) -> None:
        """A drive of ``run_id`` stopped on a store fault: try it again later (or give up on it)."""
        now = self._clock()
        entry = self._trying.pop(run_id, None) or self._waiting.pop(run_id, None)
        if entry is None:
            entry = _Waiting(attempts=0, first_fault_at=now, due_at=now, reason=error.message)
            log.warning(
                "run %s: its drive stopped on a store error (%s); it is driven "
                "again once the store accepts writes",
                run_id,
                error.message,
            )
        entry.reason = error.message
        if now - entry.first_fault_at >= self.give_up_after:
            self._give_up(run_id, entry)
            return
        entry.due_at = now + self.backoff.delay(entry.attempts + 1, self._draw())
        self._waiting[run_id] = entry
        self._changed.set()

    def settled(self, run_id: str, how: str) -> None:
        """A drive of ``run_id`` ended other than on a store fault; a healing run is healed."""
        self._waiting.pop(run_id, None)
        entry = self._trying.pop(run_id, None)
        if entry is not None:
            log.info(
                "run %s: re-driven after a store error, it got past the store on attempt %d (%s)",
                run_id,
                entry.attempts,
                how,
            )

    def forget(self, run_id: str) -> None:
        """Something else drives the run now (a resume, a wake): it is no longer this healer's."""
        self._waiting.pop(run_id, None)

    def next_due(self) -> float:
        return min((entry.due_at for entry in self._waiting.values()), default=math.inf)

    async def heal_forever(
        self,
        check_writable: Callable[[], Awaitable[None]],
        start: Callable[[str], bool],
        *,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Retry due runs until cancelled: check the store takes a write, then ``start`` each.

        ``start(run_id)`` starts a driver and returns whether it did (False:
        a driver was already there, or the server is stopping).
        """
        task_status.started()
        while True:
            self._changed = trio.Event()
            # Bounded: the earliest due retry, or a new fault arriving.
            with trio.move_on_at(self.next_due()):
                await self._changed.wait()
            await self.heal_due(check_writable, start)

    async def heal_due(
        self, check_writable: Callable[[], Awaitable[None]], start: Callable[[str], bool]
    ) -> int:
        """One round: the runs due now are re-driven if the store takes a write, else wait longer.

        Returns how many drivers were started.
        """
        now = self._clock()
        due = [run_id for run_id, entry in self._waiting.items() if entry.due_at <= now]
        if not due:
            return 0
        try:
            await check_writable()
        except StoreUnavailable as exc:
            self._refused(due, exc)
            return 0
        started = 0
        for run_id in due:
            entry = self._waiting.pop(run_id, None)
            if entry is None:
                continue  # settled or forgotten while the write check ran
            entry.attempts += 1
            self._trying[run_id] = entry
            log.info(
                "re-driving run %s after a store error (attempt %d)",
                run_id,
                entry.attempts,
                extra={"run": run_id},
            )
            if start(run_id):
                started += 1
            else:
                # A driver is there already (a resume got to it first) or the
                # server is stopping: either way not this healer's any more.
                self._trying.pop(run_id, None)
        return started

    def _refused(self, due: list[str], exc: StoreUnavailable) -> None:
        now = self._clock()
        # The runs due together wait together: one jittered wait for the cohort,
        # so a long outage costs one write check per retry, not one per run.
        # This refusal is one more try for each; the wait is the one before the try after it.
        tries = 1 + max(self._waiting[run_id].attempts for run_id in due)
        delay = self.backoff.delay(tries + 1, self._draw())
        waiting = 0
        for run_id in due:
            entry = self._waiting[run_id]
            entry.attempts += 1
            entry.reason = exc.message
            if now - entry.first_fault_at >= self.give_up_after:
                del self._waiting[run_id]
                self._give_up(run_id, entry)
                continue
            entry.due_at = now + delay
            waiting += 1
        if waiting:
            log.warning(
                "the store still refuses writes (%s); %d run(s) stopped by a store error are tried "
                "again in %.0fs",
                exc.message,
                waiting,
                delay,
            )

    def _give_up(self, run_id: str, entry: _Waiting) -> None:
        log.error(
            "gave up re-driving run %s after a store error: %d attempts over %.0fs, the last "
            "refused with: %s; `salvor resume %s` or a restart drives it again",
            run_id,
            entry.attempts,
            self._clock() - entry.first_fault_at,
            entry.reason,
            run_id,
            extra={"run": run_id},
        )
