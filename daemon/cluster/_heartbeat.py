"""The heartbeat: this node's row in the store, renewed, and what each renewal learns.

Registered before anything is driven; renewed every ``lease / 6`` seconds; retired on a graceful
stop, so peers take its runs at once instead of after the lease. Each beat also:

* asks which of the runs held here are no longer this node's (``lapsed_runs``: taken over by a
  peer, or ended elsewhere, as an abandon sent to another node ends them) and stops those drives;
* reads the node table, for the takeover sweep's dead peers and the API's ``driver_node``;
* tries again the releases the store did not take.

A renewal the store refuses (the lease had lapsed there) cuts every drive, voids every hold
(``NodeLease.lapsed``) and registers the node again; the takeover sweep then drives again what
peers did not take.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import trio

from ._lease import NodeLease
from ._node import NodeIdentity, dead_local_peers, successor
from ._store_driving import StoreDriving

log = logging.getLogger("salvor.cluster")

# How long after its lease lapsed a node's row is kept (a run it owned stays free to claim).
FORGET_NODES_AFTER_SECONDS = 24 * 3600.0


class Peers:
    """What the last look at the node table found: the peers proven dead on this machine."""

    def __init__(self) -> None:
        self.dead: tuple[str, ...] = ()
        self.nodes: list[Any] = []

    def saw(self, me: NodeIdentity, nodes: list[Any]) -> None:
        self.nodes = nodes
        self.dead = dead_local_peers(me, nodes)


async def register(owners: Any, node: NodeIdentity, lease: NodeLease) -> None:
    """Register (or register again) ``node`` with a fresh lease.

    Raises:
        StoreUnavailable: the store could not be reached; the lease stays shut.
    """
    sent = trio.current_time()
    await trio.to_thread.run_sync(
        partial(
            owners.register,
            node.node_id,
            name=node.name,
            host=node.host,
            pid=node.pid,
            pid_start=node.pid_start,
            boot_id=node.boot_id,
            lease_seconds=lease.lease_seconds,
        )
    )
    lease.renewed(sent)


async def keep_lease(
    owners: Any,
    node: NodeIdentity,
    lease: NodeLease,
    driving: StoreDriving,
    peers: Peers,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Register ``node``, report started, then renew its lease until cancelled; retire it then.

    ``driving.node`` is the node's identity from then on (a lapse gives it a new one).

    Raises:
        StoreUnavailable: the first registration failed; nothing was started.
    """
    await register(owners, node, lease)
    # Every start adds a node row: those long dead go, so the table stays as small as the cluster.
    await trio.to_thread.run_sync(owners.forget_nodes, FORGET_NODES_AFTER_SECONDS)
    peers.saw(node, await trio.to_thread.run_sync(owners.nodes))
    metrics = driving.metrics

    def lapsing(reason: str) -> None:
        if metrics is not None:
            metrics.lease_deadline_passes.inc()
        driving.cut_all(reason)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lease.watch, lapsing)
            task_status.started()
            while True:
                await trio.sleep(lease.heartbeat_seconds)
                try:
                    await _beat(owners, lease, driving, peers)
                except Exception as exc:  # noqa: BLE001 -- the lease's watch acts on its own
                    log.warning("this node's heartbeat failed (%s)", exc)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(lease.heartbeat_seconds):
            try:
                await trio.to_thread.run_sync(
                    owners.retire, driving.node.node_id, abandon_on_cancel=True
                )
            except Exception as exc:  # noqa: BLE001 -- peers then take over after the lease
                log.warning("this node could not retire in the store (%s)", exc)


async def _beat(owners: Any, lease: NodeLease, driving: StoreDriving, peers: Peers) -> None:
    node, metrics = driving.node, driving.metrics
    sent = trio.current_time()
    try:
        renewed = await trio.to_thread.run_sync(
            owners.renew, node.node_id, lease.lease_seconds, abandon_on_cancel=True
        )
    except Exception:
        if metrics is not None:
            metrics.lease_renewal_failures.inc()
        raise
    if metrics is not None:
        (metrics.lease_renewals if renewed else metrics.lease_lapses).inc()
    if renewed:
        lease.renewed(sent)
    else:
        log.warning(
            "this node's lease had lapsed in the store; its drives stop, and it registers again"
        )
        lease.lapsed()
        driving.cut_all("this node's lease lapsed, so another node may have taken the run")
        # Its id is dead for good (a peer may have buried it): the node lives on under a new one.
        driving.node = successor(driving.node)
        log.warning("this node registers again as %s", driving.node.node_id)
        await register(owners, driving.node, lease)
    await driving.release_left()
    held = driving.held_epochs()
    if held:
        lost = await trio.to_thread.run_sync(owners.lapsed_runs, driving.node.node_id, held)
        driving.stop_lost(lost)
    peers.saw(driving.node, await trio.to_thread.run_sync(owners.nodes))
