"""The takeover sweep: drive the runs whose owner is gone, each on exactly one node.

Once at start and then every ``TAKEOVER_SECONDS``, the store names the orphans
(``RunOwners.orphans``): active runs owned by nobody, or by a node whose lease expired, that
stopped, or that this machine's kernel proves dead (``dead_local_peers``). Of those, the runs a
restart has always recovered are handed to the driving set as recovery: the interrupted ones and
those parked on a write this daemon can probe, a tree from its root only (its walk drives the
rest), never a run a live ``salvor run`` holds by its run lock. Each drive's hold claims its run
(a compare-and-set on the owner), so when two nodes sweep the same orphan, one drives it and the
other lets it go (``hold(wait=False)``). The driving set paces them as it paced a restart's
recovery.

Runs this node's own lapsing lease cut off (``StoreDriving.take_cut``) are handed over too, once
the lease holds again: they are no orphans (their owner lives), and nobody else would drive them.

The orphans of a dead node are shared out among the live ones (``share``): each run has one
preferred node among those whose lease holds (by rendezvous hashing of node and run ids, which
every node computes alike), and a sweep takes the orphans that prefer its node, and
``SHARE_SLACK`` more. So when a node holding many runs dies, every survivor takes its
part within a sweep or so and they drive again sooner, instead of the first sweeper taking all.
An orphan still there after ``LEFT_SWEEPS`` of a node's sweeps (its preferred node did not take
it: it was paused, or died too) is taken by whoever sees it then: no run is left unclaimed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio

from ._lease import NodeLease
from ._store_driving import StoreDriving

log = logging.getLogger("salvor.cluster")

TAKEOVER_SECONDS = 1.0
# Orphans preferring other nodes that a sweep takes too: a lone orphan is taken by whoever
# sweeps first (its preferred node and this one race for it; the drive's hold lets one win).
SHARE_SLACK = 2
# How many sweeps an orphan preferring another node is left to it before this node takes it
# anyway: its peers learn of a death at their own heartbeats and sweep at their own instants.
LEFT_SWEEPS = 2


class Takeover:
    """One node's takeover sweep."""

    def __init__(
        self,
        owners: Any,
        lease: NodeLease,
        driving: StoreDriving,
        *,
        dead_nodes: Callable[[], tuple[str, ...]],
        candidates: Callable[[], Awaitable[list[str]]],
        walked_out: Callable[[list[str], set[str]], Awaitable[list[str]]],
        held_elsewhere: Callable[[list[str]], set[str]] | None,
        start: Callable[..., bool],
        before_first_of: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._owners = owners
        self._lease = lease
        self._driving = driving
        self._dead_nodes = dead_nodes
        # What a restart recovers is ``walked_out(candidates(), ...)`` (``RunReads``): the
        # candidates cheaply, then the children a root's walk drives left out, view by view.
        self._candidates = candidates
        self._walked_out = walked_out
        self._held_elsewhere = held_elsewhere
        self._start = start
        # Run before the first takeover of a peer's runs found dead (the agents it left).
        self._before = before_first_of
        self._seen_dead: set[str] = set()
        # The orphans earlier sweeps found and left to the node they prefer, with how many times
        # in a row: taken once left ``LEFT_SWEEPS`` times if they are orphans still.
        self._left: dict[str, int] = {}

    async def once(self, *, first: bool = False) -> int:
        """One sweep (``find``, then ``take``); returns how many drives it started.

        Raises:
            StoreUnavailable: the store could not be read; nothing was started.
        """
        return self.take(await self.find(first=first))

    async def find(self, *, first: bool = False) -> list[str]:
        """The runs this node should drive now: those whose owner is gone, and those its own
        lapsing lease cut off. ``first``: the start's sweep, which looks whether or not the
        store names orphans (a run parked on a write this daemon can probe is no orphan by the
        store's measure, yet a start has always probed it).

        Raises:
            StoreUnavailable: the store could not be read.
        """
        if not self._lease.open:
            return []  # a node that may not act takes nothing over
        cut = self._driving.take_cut()
        me, dead = self._driving.node.node_id, tuple(self._dead_nodes())
        if not first and not await trio.to_thread.run_sync(
            partial(self._owners.orphans, me, dead_nodes=dead, limit=1)
        ):
            self._left = {}
            return cut
        if self._before is not None and not first and not self._seen_dead.issuperset(dead):
            # The agent processes a dead peer on this machine left (its tether kills them too;
            # this is the second line) go before any copy of their runs starts here.
            await self._before()
        self._seen_dead.update(dead)
        # Whose owner is gone is asked of the store before any run's view is read: a sweep's
        # cost follows the orphans, not every run in flight across the cluster (reading each
        # active run's view put seconds between a lease's lapse and its takeover).
        recoverable = await self._candidates()
        owners = await trio.to_thread.run_sync(self._owners.owners, recoverable)
        orphaned = [run_id for run_id in recoverable if _orphaned(owners.get(run_id), me, dead)]
        candidates = await self._walked_out(orphaned, set(recoverable)) if orphaned else []
        if candidates and self._held_elsewhere is not None:
            skip = await trio.to_thread.run_sync(self._held_elsewhere, candidates)
            candidates = [run_id for run_id in candidates if run_id not in skip]
        if candidates:
            live = await trio.to_thread.run_sync(self._owners.live_nodes)
            candidates = self.share(candidates, [n for n in live if n not in dead])
        if candidates and not first:
            log.info("taking over %d run(s) whose owner is gone", len(candidates))
        return cut + [run_id for run_id in candidates if run_id not in cut]

    def share(self, orphans: list[str], live: list[str]) -> list[str]:
        """This node's part of ``orphans`` among the ``live`` nodes (this one counted whatever
        ``live`` says): all those preferring it, ``SHARE_SLACK`` more of any,
        and every one earlier sweeps left ``LEFT_SWEEPS`` times that is an orphan still. The
        rest are remembered for the next sweep."""
        me = self._driving.node.node_id
        nodes = sorted({*live, me})
        aged = [run_id for run_id in orphans if self._left.get(run_id, 0) >= LEFT_SWEEPS]
        fresh = [run_id for run_id in orphans if self._left.get(run_id, 0) < LEFT_SWEEPS]
        # Every orphan preferring this node, however unevenly the hash fell: one held back for
        # evenness waited a whole sweep for nobody (its peers leave it to this node).
        preferred = [run_id for run_id in fresh if _preferred(run_id, nodes) == me]
        chosen = {*aged, *preferred}
        chosen.update([run_id for run_id in fresh if run_id not in chosen][:SHARE_SLACK])
        self._left = {
            run_id: self._left.get(run_id, 0) + 1 for run_id in orphans if run_id not in chosen
        }
        return [run_id for run_id in orphans if run_id in chosen]

    def take(self, run_ids: list[str]) -> int:
        """Hand ``run_ids`` to the driving set as recovery; returns how many drives started."""
        return sum(self._start(run_id, recovery=True) for run_id in run_ids)

    async def forever(self, interval: float = TAKEOVER_SECONDS) -> None:
        """Sweep every ``interval`` seconds until cancelled (a failed sweep is logged and tried
        again at the next one)."""
        while True:
            await trio.sleep(interval)
            try:
                await self.once()
            except Exception as exc:  # noqa: BLE001 -- the store may come back: sweep again
                log.warning("the takeover sweep failed (%s); trying again", exc)


def _orphaned(owner: Any, me: str, dead: tuple[str, ...]) -> bool:
    """Whether a run with ``owner`` (a ``RunOwner``; None: no row) is nobody's to drive now: no
    owner, or another node whose lease lapsed or that is proven dead. A run of this node's own
    that no drive here holds stays as it is (its drive stopped for a reason: a resume says when)."""
    if owner is None or owner.node_id is None:
        return True
    return owner.node_id != me and (not owner.node_live or owner.node_id in dead)


def _preferred(run_id: str, nodes: list[str]) -> str:
    """The node of ``nodes`` that ``run_id`` prefers: the same on every node that sees the same
    live nodes (rendezvous hashing: a node's death moves only the runs that preferred it)."""
    return max(nodes, key=lambda node: hashlib.blake2b(f"{node}/{run_id}".encode()).digest())
