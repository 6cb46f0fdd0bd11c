"""``RunDriving`` across processes: a drive holds its run here and owns it in the store.

In this process, the in-process hold still keeps one drive per run (``InProcessDriving``). Across
processes the run's owner in the store does: a hold claims the run (``RunOwners.claim``, a
compare-and-set that grows the run's epoch) and releases it when the drive ends. The claim's
fence goes with every append the drive makes (``StoreAccess.append``), so once another node has
claimed the run, anything this drive still tries to record is refused in the same transaction
(``Fenced``) and nothing of it is written.

A claim another live node holds is waited for (its owner is asked again with a backoff of up to
``POLL_MAX_SECONDS``): a resume or an answer sent to this node for a run a peer drives is
recorded at once, and driven here once that peer lets the run go, or its lease lapses.

The gate (``gate``) is asked before every effect starts: only a hold taken under this node's
current lease generation, with the lease's local deadline still ahead, passes (``NodeLease``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from salvor.store import Fence, Fenced

from ..metrics import DaemonMetrics, NodeReading
from ..recording import DriveStopped, InProcessDriving
from ._lease import LeaseLapsing, NodeLease
from ._node import NodeIdentity

log = logging.getLogger("salvor.cluster")

POLL_FIRST_SECONDS = 0.05
POLL_MAX_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class _Held:
    fence: Any  # the store's ``Fence``: (node, epoch)
    generation: int  # the lease generation the claim was made under


class StoreDriving:
    """Holds runs for this node's drives, in this process and in the store."""

    def __init__(
        self,
        owners: Any,
        node: NodeIdentity,
        lease: NodeLease,
        *,
        dead_nodes: Callable[[], Iterable[str]] = tuple,
        metrics: DaemonMetrics | None = None,
        writer: Any = None,
    ) -> None:
        self._owners = owners
        # The process's store writer (``StoreAccess``), or None: claims then run on its thread
        # and releases join its group commits, instead of each taking the store's write lock
        # beside it (on SQLite a writer that finds the lock taken sleeps in the busy handler).
        self._writer = writer
        # The daemon's instruments: takeovers are counted where a claim wins one.
        self.metrics = metrics
        # This node's identity now (the heartbeat gives it a new one after a lapse).
        self.node = node
        self.lease = lease
        self._dead_nodes = dead_nodes
        self._local = InProcessDriving()
        self._held: dict[str, _Held] = {}
        # Releases the store did not take (it was unreachable): tried again by the heartbeat,
        # since a run left driving=1 under a live node is one no peer takes over.
        self._unreleased: dict[str, Any] = {}
        # Runs whose drives the lapsing lease cut off: driven again here once it holds again
        # (``take_cut``), unless a peer has taken them meanwhile.
        self._cut: set[str] = set()

    # -- RunDriving -----------------------------------------------------------

    def driven(self, run_id: str) -> bool:
        return self._local.driven(run_id)

    def stop(self, run_id: str, reason: str) -> int:
        return self._local.stop(run_id, reason)

    def fence(self, run_id: str, *, creating: bool = False) -> Any | None:
        held = self._held.get(run_id)
        if held is not None:
            return held.fence
        # A run this node creates is its own from that append on (not yet driving it): a peer's
        # sweep never finds it ownerless, and its first drive here claims it (epoch 1).
        return Fence.creating(self.node.node_id) if creating else None

    def gate(self, run_id: str) -> None:
        held = self._held.get(run_id)
        if held is None:
            # Not a drive of this node (a client-driven run's step): nothing to fence.
            return
        try:
            self.lease.check(run_id, held.generation)
        except LeaseLapsing:
            self._cut.add(run_id)
            raise

    @contextlib.asynccontextmanager
    async def hold(
        self,
        run_id: str,
        *,
        here: bool = False,
        wait: bool = True,
        shown: Callable[[], None] | None = None,
    ) -> AsyncIterator[None]:
        if self._local.held_by_this_task(run_id):
            yield  # this task holds it already (and owns it, unless it held it ``here``)
            return
        if shown is not None and self._local.driven(run_id):
            shown()  # another drive here holds it (and owns it in the store, or waits to)
        async with self._local.hold(run_id):
            if here:
                yield
                return
            fence = await self._claim(run_id, wait, shown)
            if shown is not None:
                shown()
            held = _Held(fence, self.lease.generation)
            self._held[run_id] = held
            try:
                yield
            finally:
                if self._held.get(run_id) is held:
                    del self._held[run_id]
                with trio.CancelScope(shield=True):
                    await self._release(run_id, fence)

    # -- the store ------------------------------------------------------------

    async def _claim(self, run_id: str, wait: bool, shown: Callable[[], None] | None = None) -> Any:
        """Claim ``run_id`` for this node: its fence, once the claim won. ``shown`` is called
        when the claim finds another live node holding the run, or this node's lease lapsed (and
        this one waits for either to change).

        Raises:
            DriveStopped: (``wait`` False) another live node drives it; nothing was taken.
        """
        delay = POLL_FIRST_SECONDS
        while True:
            claim = partial(
                self._owners.claim, run_id, self.node.node_id, dead_nodes=tuple(self._dead_nodes())
            )
            try:
                if self._writer is None:
                    claimed = await trio.to_thread.run_sync(claim)
                else:
                    claimed = await self._writer.claim_run(
                        self._owners, run_id, self.node.node_id, tuple(self._dead_nodes())
                    )
            except Fenced:
                # This node's own lease lapsed: it claims nothing until it registered again.
                if not wait:
                    raise DriveStopped(
                        f"run {run_id} is not taken: this node's lease lapsed"
                    ) from None
                if shown is not None:
                    shown()  # nothing shows until the lease holds again: not worth a wait
            else:
                if claimed.fence is not None:
                    if claimed.taken_from is not None and self.metrics is not None:
                        self.metrics.takeovers.inc()
                    return claimed.fence
                if not wait:
                    holder = claimed.owner.node_id if claimed.owner else "another node"
                    raise DriveStopped(f"run {run_id} is driven by {holder}; it is left to it")
                if shown is not None:
                    shown()
            await trio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_SECONDS)

    async def _release(self, run_id: str, fence: Any) -> None:
        try:
            if self._writer is None:
                await trio.to_thread.run_sync(self._owners.release, run_id, fence)
            else:
                await self._writer.release_owner(run_id, fence)
        except Exception as exc:  # noqa: BLE001 -- the heartbeat tries again; the run is intact
            self._unreleased[run_id] = fence
            log.warning(
                "run %s: its release in the store failed (%s); tried again with the next heartbeat",
                run_id,
                type(exc).__name__,
            )

    async def release_left(self) -> None:
        """Try again the releases the store did not take (the heartbeat's)."""
        for run_id, fence in list(self._unreleased.items()):
            if run_id in self._held:
                self._unreleased.pop(run_id, None)
                continue
            try:
                await trio.to_thread.run_sync(self._owners.release, run_id, fence)
            except Exception:  # noqa: BLE001 -- still unreachable: the next heartbeat tries
                return
            self._unreleased.pop(run_id, None)

    # -- the node's lease -----------------------------------------------------

    def reading(self) -> NodeReading:
        """This node as ``/metrics`` reports it (from memory; on the trio thread)."""
        return NodeReading(
            name=self.node.name,
            node_id=self.node.node_id,
            runs_owned=len(self._held),
            lease_open=self.lease.open,
        )

    def held_epochs(self) -> dict[str, int]:
        """The runs this node's drives hold in the store now, with the epoch each claim took."""
        return {run_id: held.fence.epoch for run_id, held in self._held.items()}

    def stop_lost(self, run_ids: Iterable[str]) -> None:
        """Stop the drives of runs this node no longer owns (taken over, or ended elsewhere)."""
        for run_id in run_ids:
            # The hold keeps its (now stale) fence: whatever the drive still tries to record on
            # its way out is refused by the store, never written unfenced.
            if self._local.stop(run_id, "it was taken over by another node, or ended elsewhere"):
                log.info("run %s was taken over or ended elsewhere; its drive here stops", run_id)

    def cut_all(self, reason: str) -> None:
        """Cancel every drive this node holds in the store (its lease is lapsing)."""
        if self._held:
            log.warning("%s: stopping %d drive(s)", reason, len(self._held))
        for run_id in list(self._held):
            self._cut.add(run_id)
            self._local.stop(run_id, reason)

    def take_cut(self) -> list[str]:
        """The runs the lease cut off and no drive here holds: to be driven again (and claimed
        again, which fails for a run a peer took meanwhile)."""
        cut = [run_id for run_id in self._cut if not self._local.driven(run_id)]
        self._cut.difference_update(cut)
        return cut
