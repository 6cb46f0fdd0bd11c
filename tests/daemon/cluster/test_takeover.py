"""The takeover sweep over a real store: it drives the runs of a dead node, leaves those a live
peer drives alone, and reads no view of theirs to decide (its cost follows the orphans, not every
run in flight across the cluster)."""

from __future__ import annotations

import trio
from salvor.daemon.cluster import NodeIdentity, NodeLease, StoreDriving, Takeover, register
from salvor.daemon.cluster._takeover import SHARE_SLACK, _preferred
from salvor.protocol import EMPTY_VIEW, RunStarted
from salvor.store import Fence

PEER_RUNS = 12
AGENT = "sha256:" + "0" * 64


def _run_id(n: int) -> str:
    return f"0c000000-0000-4000-8000-{n:012d}"


async def _registered(store, name: str, lease_seconds: float) -> tuple[NodeIdentity, NodeLease]:
    identity, lease = NodeIdentity.here(name), NodeLease(lease_seconds, 0)
    await register(store.owners, identity, lease)
    return identity, lease


def _started_by(store, run_id: str, node: NodeIdentity) -> None:
    # What a claim of a run with no row yet gives, without asking (a short lease may lapse
    # while many runs are started).
    fence = Fence(node.node_id, 1)
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


async def test_a_dead_nodes_runs_are_shared_and_what_a_peer_left_is_taken_next(runtime):
    store = runtime.access.store
    sweepers = [await _registered(store, name, 30) for name in ("a", "b")]
    idle, _ = await _registered(store, "idle", 30)  # live, and never sweeps
    gone, _ = await _registered(store, "gone", 0.5)
    orphans = [_run_id(n) for n in range(30)]
    for run_id in orphans:
        _started_by(store, run_id, gone)
    with trio.fail_after(60):
        while not store.owners.orphans(sweepers[0][0].node_id):
            await trio.sleep(0.05)

    def sweep_of(identity: NodeIdentity, lease: NodeLease) -> tuple[Takeover, list[str]]:
        started: list[str] = []
        takeover = Takeover(
            store.owners,
            lease,
            StoreDriving(store.owners, identity, lease),
            dead_nodes=tuple,
            candidates=runtime.reads.recovery_candidates,
            walked_out=runtime.reads.without_walked_children,
            held_elsewhere=None,
            # A drive's claim, as the driving set's would take it.
            start=lambda run_id, recovery: bool(
                started.append(run_id) or store.owners.claim(run_id, identity.node_id).fence
            ),
        )
        return takeover, started

    (first, by_a), (second, by_b) = (sweep_of(*node) for node in sweepers)
    await first.once()
    await second.once()
    # Each takes every orphan preferring it, however many, and at most the slack of the others:
    # none twice.
    assert by_a and by_b and not set(by_a) & set(by_b)
    nodes = sorted(identity.node_id for identity, _ in sweepers) + [idle.node_id]
    for (identity, _), took, other in zip(sweepers, (by_a, by_b), (by_b, by_a)):
        own = {r for r in orphans if _preferred(r, sorted(nodes)) == identity.node_id}
        # (b's own may have gone to a, which swept first, as its slack)
        assert own - set(other) <= set(took)
        assert len(set(took) - own) <= SHARE_SLACK
    # The idle node's part is left to it for a while (a's next sweep takes only the slack of
    # the others), then a takes the rest.
    taken = set(by_a) | set(by_b)
    assert len(taken) < len(orphans)
    a_id = sweepers[0][0].node_id
    by_a.clear()
    await first.once()
    not_preferred = [r for r in by_a if _preferred(r, sorted(nodes)) != a_id]
    assert len(not_preferred) <= SHARE_SLACK
    await first.once()
    assert sorted(taken | set(by_a)) == sorted(orphans)
    assert store.owners.orphans(sweepers[1][0].node_id) == []


def test_a_sweep_takes_every_orphan_that_prefers_its_node_however_unevenly_the_hash_fell():
    # 30 orphans prefer "a" and 10 prefer "b": a takes its 30 in one sweep (and the slack of
    # b's), none left for a later sweep (each sweep apart is a second more of a run standing).
    candidates = [_run_id(n) for n in range(400)]
    mine = [r for r in candidates if _preferred(r, ["a", "b"]) == "a"][:30]
    theirs = [r for r in candidates if _preferred(r, ["a", "b"]) == "b"][:10]
    driving = type("Driving", (), {"node": NodeIdentity("a", "a", "h", 1, "0", "boot")})()
    takeover = Takeover(
        None,
        NodeLease(30, 0),
        driving,
        dead_nodes=tuple,
        candidates=None,
        walked_out=None,
        held_elsewhere=None,
        start=None,
    )
    chosen = takeover.share(mine + theirs, ["a", "b"])
    assert set(mine) <= set(chosen)
    assert len(set(chosen) - set(mine)) == SHARE_SLACK
