"""This node's lease, as this process's own clock sees it, and the gate every effect passes.

The store keeps the lease (``nodes``: an expiry on the database's clock); a peer may take this
node's runs once it has expired there. So this process must stop starting effects before that
instant can come, whatever its own clock, network or scheduler do. It measures conservatively:
a renewal *sent* at local instant ``t`` extends the lease to at least ``t + lease`` on the
database's clock (the database stamps it later, never earlier), so up to the local instant
``t + lease - margin`` no peer can have taken anything. Past that deadline the gate is shut:
every drive that reaches an effect stops there (``LeaseLapsing``), leaving its intent open, and
every drive is cancelled outright (``watch``). The margin covers the gap between passing the
gate and the effect going out, and clock rate drift.

A renewal the store refuses (the lease had already lapsed there) means a peer may own any of
this node's runs now: the generation grows, so no hold taken before it passes the gate again,
even once a new lease is registered.

A paused process (SIGSTOP, a long GC, a VM migration) wakes with its monotonic clock past the
deadline: the gate is shut before it can do anything, and the watch cancels every drive.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from ..recording import DriveInterrupted

# The defaults keep a takeover within 10 s of a node's death: the lease, then one sweep.
DEFAULT_LEASE_SECONDS = 6.0
DEFAULT_FENCE_MARGIN_SECONDS = 2.0
# How many renewals fit in one lease: one or two lost in a row cost nothing.
HEARTBEATS_PER_LEASE = 6


class LeaseLapsing(DriveInterrupted):
    """This node may no longer start effects for the run: its lease is lapsing (or lapsed) in the
    store, so a peer may be taking the run over. Nothing was started; the intent stays open for
    whichever node drives the run next."""


class NodeLease:
    """The local deadline before which this node may start effects, renewed by its heartbeat."""

    def __init__(self, lease_seconds: float, margin_seconds: float) -> None:
        if not 0 <= margin_seconds < lease_seconds:
            raise ValueError("the fence margin must be at least 0 and shorter than the lease")
        self.lease_seconds = lease_seconds
        self.margin_seconds = margin_seconds
        # Grows each time the store said the lease had lapsed: holds taken before are void.
        self.generation = 0
        # Shut until the first registration (trio's clock: monotonic, and virtual in tests).
        self._deadline = -math.inf
        self._moved = trio.Event()

    @property
    def heartbeat_seconds(self) -> float:
        return self.lease_seconds / HEARTBEATS_PER_LEASE

    @property
    def open(self) -> bool:
        """Whether this node may start an effect now."""
        return trio.current_time() < self._deadline

    def renewed(self, sent_at: float) -> None:
        """The store took a renewal (or registration) sent at ``sent_at`` (trio's clock)."""
        deadline = sent_at + self.lease_seconds - self.margin_seconds
        if deadline > self._deadline:
            self._deadline = deadline
            self._moved.set()
            self._moved = trio.Event()

    def lapsed(self) -> None:
        """The store said the lease had lapsed: shut the gate and void every hold taken so far."""
        self.generation += 1
        self._deadline = -math.inf

    def check(self, run_id: str, generation: int) -> None:
        """The gate, for a drive of ``run_id`` whose hold was taken under ``generation``.

        Raises:
            LeaseLapsing: past the deadline, or the hold predates a lapse; nothing started.
        """
        if generation != self.generation:
            raise LeaseLapsing(
                f"this node's lease lapsed after it took run {run_id}, so another node may "
                "drive it now; its open call was not started here and is left to that node"
            )
        if not self.open:
            raise LeaseLapsing(
                f"this node's lease is lapsing (its last renewal is too old), so another node "
                f"may take run {run_id} over; its open call was not started here and is left "
                "to whichever node drives the run next"
            )

    async def watch(self, cut_all: Callable[[str], None]) -> None:
        """Each time the deadline passes with no renewal, call ``cut_all`` with the reason (it
        cancels every drive of this node), then wait for the next renewal. Runs until cancelled."""
        while True:
            deadline = self._deadline
            await trio.sleep_until(deadline)
            if self._deadline > deadline:
                continue  # renewed while this slept
            moved = self._moved
            cut_all(
                "this node's lease is lapsing (no renewal reached the store in time); the run is "
                "left to whichever node drives it next"
            )
            await moved.wait()
