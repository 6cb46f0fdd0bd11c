"""Run ownership as the daemon holds it: the lease's gate shuts at its local deadline and stays
shut for holds taken before a lapse; two nodes' holds on one run take turns through the store,
each claim's fence voiding the one before it; a peer on this machine is proven dead by its pid."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import trio
import trio.testing
from salvor.daemon.cluster import (
    LeaseLapsing,
    NodeIdentity,
    NodeLease,
    StoreDriving,
    dead_local_peers,
    pid_start,
    register,
)
from salvor.daemon.recording import DriveStopped, open_store_access
from salvor.protocol import EMPTY_VIEW, ModelCallRequested, RunStarted
from salvor.store import EventStore, Fenced, NodeRecord, OwnerRelease, RunOwner

RUN = "0b000000-0000-4000-8000-000000000001"


async def test_the_gate_shuts_at_the_deadline_and_for_holds_older_than_a_lapse(autojump_clock):
    lease = NodeLease(6, 2)
    with pytest.raises(LeaseLapsing):
        lease.check(RUN, 0)  # never registered: shut
    lease.renewed(trio.current_time())
    lease.check(RUN, 0)
    await trio.sleep(3.9)
    lease.check(RUN, 0)
    await trio.sleep(0.2)  # past sent + lease - margin, with no renewal
    with pytest.raises(LeaseLapsing):
        lease.check(RUN, 0)
    cut = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lease.watch, cut.append)
        await trio.testing.wait_all_tasks_blocked()
        assert len(cut) == 1 and "lapsing" in cut[0]
        lease.renewed(trio.current_time())
        lease.check(RUN, 0)
        lease.lapsed()  # the store said the lease had lapsed: every earlier hold is void
        lease.renewed(trio.current_time())
        with pytest.raises(LeaseLapsing):
            lease.check(RUN, 0)
        lease.check(RUN, 1)
        nursery.cancel_scope.cancel()


@pytest.fixture
def store(tmp_path):
    with EventStore.open(f"sqlite:///{tmp_path / 'salvor.db'}") as store:
        yield store


async def node(store: EventStore, name: str) -> StoreDriving:
    identity = NodeIdentity.here(name)
    lease = NodeLease(30, 2)
    await register(store.owners, identity, lease)
    return StoreDriving(store.owners, identity, lease)


async def test_two_nodes_take_turns_on_one_run_and_the_first_fence_goes_stale(store):
    first, second = await node(store, "first"), await node(store, "second")
    order = []
    async with trio.open_nursery() as nursery, first.hold(RUN):
        fence = first.fence(RUN)
        store.append(
            RUN,
            [RunStarted(agent_def_hash="sha256:" + "0" * 64, input=None)],
            EMPTY_VIEW,
            fence=fence,
        )

        async def second_drive() -> None:
            async with second.hold(RUN):
                order.append(("second", second.fence(RUN).epoch))

        nursery.start_soon(second_drive)
        with trio.move_on_after(0.5):
            await trio.sleep_forever()  # the second node keeps asking, and waits
        assert order == []
        assert store.owners.owner(RUN).node_id == first.node.node_id
        first.gate(RUN)  # the owner may act
        order.append(("first", fence.epoch))
    assert order == [("first", 1), ("second", 2)]
    view = store.read_view(RUN)
    intent = ModelCallRequested(request_hash="sha256:" + "1" * 64)
    with pytest.raises(Fenced):
        store.append(RUN, [intent], view, fence=fence)
    assert store.read_view(RUN) == view  # nothing of it was written


async def test_recovery_lets_go_of_a_run_a_live_peer_drives(store):
    first, second = await node(store, "first"), await node(store, "second")
    async with first.hold(RUN):
        store.append(
            RUN,
            [RunStarted(agent_def_hash="sha256:" + "0" * 64, input=None)],
            EMPTY_VIEW,
            fence=first.fence(RUN),
        )
        with pytest.raises(DriveStopped, match="driven by"):
            async with second.hold(RUN, wait=False):
                pass
        async with second.hold(RUN, here=True):  # an abandon's hold: this process only
            assert second.fence(RUN) is None


def test_a_peer_on_this_machine_is_dead_once_its_pid_is_gone_or_names_another_process():
    me = NodeIdentity.here("me")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = pid_start(child.pid)

        def peer(node_id: str, pid: int, start: str, boot: str = me.boot_id) -> NodeRecord:
            return NodeRecord(node_id, "peer", me.host, boot, pid, start, None, "", "", None)

        peers = [
            peer("alive", child.pid, started),
            peer("recycled", child.pid, str(int(started) - 1)),
            peer("elsewhere", child.pid, str(int(started) - 1), boot="another-boot"),
            peer("unknown-start", child.pid, ""),
        ]
        assert dead_local_peers(me, peers) == ("recycled",)
        child.kill()
        child.wait()
        assert dead_local_peers(me, peers) == ("alive", "recycled")
    finally:
        child.kill()
        child.wait()


async def test_a_run_a_nodes_access_creates_is_that_nodes_and_a_held_one_is_fenced(
    tmp_path,
) -> None:
    from salvor.daemon.recording import open_store_access

    url = f"sqlite:///{tmp_path / 'salvor.db'}"
    head = [RunStarted(agent_def_hash="sha256:" + "0" * 64, input=None)]
    async with open_store_access(url) as access:
        access.driving = driving = await node(access.store, "creator")
        me = driving.node.node_id
        # Created by no drive of this node (a start, a map item, a subagent's child, a fork):
        # this node's from its first event, not driven yet, so no peer's sweep finds it.
        await access.append(RUN, head, EMPTY_VIEW)
        assert access.store.owners.owner(RUN) == RunOwner(RUN, me, 0, False, True)
        assert access.store.owners.orphans("peer") == []
        # Created under a drive's hold: the drive's claim, driving.
        other = RUN[:-1] + "2"
        async with driving.hold(other):
            await access.append(other, head, EMPTY_VIEW)
            owner = access.store.owners.owner(other)
            assert (owner.node_id, owner.epoch, owner.driving) == (me, 1, True)
        # The first run's first drive claims it at epoch 1.
        async with driving.hold(RUN):
            owner = access.store.owners.owner(RUN)
            assert (owner.node_id, owner.epoch, owner.driving) == (me, 1, True)


async def test_a_drive_with_the_writer_claims_on_it_and_lets_go_in_its_group_commit(tmp_path):
    async with open_store_access(f"sqlite:///{tmp_path / 'salvor.db'}") as access:
        identity = NodeIdentity.here("solo")
        lease = NodeLease(30, 2)
        await register(access.store.owners, identity, lease)
        access.driving = StoreDriving(access.store.owners, identity, lease, writer=access)
        groups = []
        real = access.store.append_batch

        def append_batch(requests):
            groups.append([type(request).__name__ for request in requests])
            return real(requests)

        access.store.append_batch = append_batch
        writer_thread = []
        real_claim = access.store.owners.claim_many

        def claim_many(*args, **kwargs):
            writer_thread.append(threading.current_thread().name)
            return real_claim(*args, **kwargs)

        access.store.owners.claim_many = claim_many
        started = [RunStarted(agent_def_hash="sha256:" + "0" * 64, input=None)]
        async with access.driving.hold(RUN):
            await access.append(RUN, started, EMPTY_VIEW)
            groups.clear()
        # The claim ran on the writer's thread (with any others it took then), and the release
        # went in a group commit (beside whatever appends the writer took), not on its own.
        assert writer_thread == ["salvor-writer"]
        assert groups == [[OwnerRelease.__name__]]
        owner = access.store.owners.owner(RUN)
        assert owner.node_id == identity.node_id and not owner.driving
