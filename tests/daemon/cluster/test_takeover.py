"""The takeover sweep over a real store: it drives the runs of a dead node, leaves those a live
peer drives alone, and reads no view of theirs to decide (its cost follows the orphans, not every
run in flight across the cluster)."""

from __future__ import annotations

import trio
from salvor.daemon.cluster import NodeIdentity, NodeLease, StoreDriving, Takeover, register
from salvor.protocol import EMPTY_VIEW, RunStarted

PEER_RUNS = 12
AGENT = "sha256:" + "0" * 64


def _run_id(n: int) -> str:
    return f"0c000000-0000-4000-8000-{n:012d}"


async def _registered(store, name: str, lease_seconds: float) -> tuple[NodeIdentity, NodeLease]:
    identity, lease = NodeIdentity.here(name), NodeLease(lease_seconds, 0)
    await register(store.owners, identity, lease)
    return identity, lease


def _started_by(store, run_id: str, node: NodeIdentity) -> None:
    fence = store.owners.claim(run_id, node.node_id).fence
    store.append(run_id, [RunStarted(agent_def_hash=AGENT, input=None)], EMPTY_VIEW, fence=fence)


async def test_a_sweep_takes_a_dead_nodes_run_and_reads_no_view_of_a_live_peers(runtime):
    store = runtime.access.store
    me, lease = await _registered(store, "me", 30)
    peer, _ = await _registered(store, "peer", 30)
    gone, _ = await _registered(store, "gone", 0.5)
    orphan = _run_id(PEER_RUNS)
    _started_by(store, orphan, gone)
    for run_id in [_run_id(n) for n in range(PEER_RUNS)]:
        _started_by(store, run_id, peer)
    # The dead node's lease lapses by the database's clock (bounded: a minute at most).
    with trio.fail_after(60):
        while not store.owners.orphans(me.node_id):
            await trio.sleep(0.05)
    assert [o.run_id for o in store.owners.orphans(me.node_id)] == [orphan]

    driving = StoreDriving(store.owners, me, lease)
    started: list[str] = []
    read: list[str] = []
    read_view = store.read_view

    def counted(run_id: str):
        read.append(run_id)
        return read_view(run_id)

    store.read_view = counted
    try:
        takeover = Takeover(
            store.owners,
            lease,
            driving,
            dead_nodes=tuple,
            candidates=runtime.reads.recovery_candidates,
            walked_out=runtime.reads.without_walked_children,
            held_elsewhere=None,
            start=lambda run_id, recovery: started.append(run_id) or True,
        )
        assert await takeover.once() == 1
    finally:
        store.read_view = read_view
    assert started == [orphan]
    assert read == [orphan]
