"""What ``/metrics`` says of a node among several over one store (issue 30, item 5): one
``salvor_node_info`` series names the node that answered (no other series carries it), and the
cluster's counters move where their events happen: a claim that takes a dead node's run, a
renewal the store took, could not take or refused, the lease running out on the node's own
clock, an append the store refused as fenced.

Real stores (an SQLite file; a store fault is the nodes table renamed away), real threads, trio's
real clock for the heartbeat; on PostgreSQL, the change feed's listening session ended by the
server.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from salvor.daemon.cluster import NodeIdentity, NodeLease, Peers, StoreDriving, keep_lease, register
from salvor.daemon.metrics import DaemonMetrics, NodeReading, Readings, counting_into, stop_counting
from salvor.daemon.recording import open_store_access
from salvor.daemon.runs import EventHub, change_feed
from salvor.protocol import EMPTY_VIEW, ModelCallRequested, RunStarted
from salvor.store import EventStore, Fenced, normalize_store_url

RUN = "0b000000-0000-4000-8000-0000000000a1"
STARTED = RunStarted(agent_def_hash="sha256:" + "0" * 64, input=None)
WAIT = 20.0
# The application_name of a change feed's listening session, before its process id.
LISTENER_NAME = "salvor changes"


def samples(metrics: DaemonMetrics) -> dict[tuple, float]:
    text = metrics.exposition(Readings()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: DaemonMetrics, name: str) -> float:
    return samples(metrics).get((name, ()), 0.0)


def test_a_scrape_names_its_node_in_one_info_series_and_in_no_other() -> None:
    metrics = DaemonMetrics()
    assert not any(name.startswith("salvor_node") for name, _ in samples(metrics))
    metrics.read_node(
        lambda: NodeReading(name="node1", node_id="node1:41:abc123", runs_owned=3, lease_open=False)
    )
    metrics.observe_commit(2, 0.001)
    scraped = samples(metrics)
    info = [labels for name, labels in scraped if name == "salvor_node_info"]
    assert info == [(("node", "node1"), ("node_id", "node1:41:abc123"))]
    assert scraped[("salvor_node_info", info[0])] == 1
    assert scraped[("salvor_runs_owned", ())] == 3
    assert scraped[("salvor_lease_open", ())] == 0
    # Every other series stays as it was: no node label to start afresh at each restart.
    assert not any(
        dict(labels).get("node") for name, labels in scraped if name != "salvor_node_info"
    )
    for counter in (
        "salvor_lease_renewals_total",
        "salvor_lease_renewal_failures_total",
        "salvor_lease_deadline_passes_total",
        "salvor_lease_lapses_total",
        "salvor_takeovers_total",
        "salvor_appends_fenced_total",
        "salvor_change_feed_notices_total",
        "salvor_change_feed_reconnects_total",
    ):
        assert scraped[(counter, ())] == 0, counter
    # A worker of --workers: the info series carries its index, as every series does.
    worker = DaemonMetrics(worker=1)
    worker.read_node(lambda: NodeReading(name="node1", node_id="node1:42:def456"))
    assert (
        samples(worker)[
            (
                "salvor_node_info",
                (("node", "node1"), ("node_id", "node1:42:def456"), ("worker", "1")),
            )
        ]
        == 1
    )


@pytest.fixture
def store(tmp_path: Path):
    with EventStore.open(f"sqlite:///{tmp_path / 'salvor.db'}") as store:
        yield store


async def node(store: EventStore, name: str, metrics: DaemonMetrics, **options) -> StoreDriving:
    identity = NodeIdentity.here(name)
    lease = NodeLease(30, 2)
    await register(store.owners, identity, lease)
    return StoreDriving(store.owners, identity, lease, metrics=metrics, **options)


async def test_a_claim_counts_a_takeover_only_when_it_took_a_run_from_a_node_mid_drive(store):
    first_metrics, second_metrics, third_metrics = DaemonMetrics(), DaemonMetrics(), DaemonMetrics()
    first = await node(store, "first", first_metrics)
    # The second node has proven the first dead (as a dead pid on this machine proves it).
    second = await node(store, "second", second_metrics, dead_nodes=lambda: [first.node.node_id])
    third = await node(store, "third", third_metrics)
    async with first.hold(RUN):
        store.append(RUN, [STARTED], EMPTY_VIEW, fence=first.fence(RUN))
        assert first.reading().runs_owned == 1
        # The first never lets go (it "died" mid-drive): the second takes the run over.
        async with second.hold(RUN):
            assert second.reading() == NodeReading(
                name="second", node_id=second.node.node_id, runs_owned=1, lease_open=True
            )
            assert value(second_metrics, "salvor_takeovers_total") == 1
        assert second.reading().runs_owned == 0
    # The second let the run go as a drive ends: the third's claim is a handover, no takeover.
    async with third.hold(RUN):
        pass
    assert value(third_metrics, "salvor_takeovers_total") == 0
    assert value(first_metrics, "salvor_takeovers_total") == 0


async def test_an_append_the_store_refuses_as_fenced_is_counted(tmp_path: Path):
    metrics = DaemonMetrics()
    counting = counting_into(metrics)
    try:
        async with open_store_access(f"sqlite:///{tmp_path / 'salvor.db'}") as access:
            store = access.store
            first = await node(store, "first", metrics)
            access.driving = first
            peer = await node(
                store, "peer", DaemonMetrics(), dead_nodes=lambda: [first.node.node_id]
            )
            async with first.hold(RUN):
                _, view = await access.append(RUN, [STARTED], EMPTY_VIEW)
                async with peer.hold(RUN):
                    pass  # the peer took the run over meanwhile: the first's fence is stale
                intent = ModelCallRequested(request_hash="sha256:" + "1" * 64)
                with pytest.raises(Fenced):
                    await access.append(RUN, [intent], view)
            assert value(metrics, "salvor_appends_fenced_total") == 1
    finally:
        stop_counting(counting)


async def until(check, what: str) -> None:
    with trio.fail_after(WAIT):
        while not check():
            await trio.sleep(0.02)


async def test_the_heartbeat_counts_renewals_failures_a_local_deadline_and_a_lapse(tmp_path):
    path = tmp_path / "salvor.db"
    metrics = DaemonMetrics()
    with EventStore.open(f"sqlite:///{path}") as store:
        identity = NodeIdentity.here("beating")
        # A renewal every 0.2 s; the gate shuts 0.8 s after the last one the store took.
        lease = NodeLease(1.2, 0.4)
        driving = StoreDriving(store.owners, identity, lease, metrics=metrics)
        metrics.read_node(driving.reading)

        def rename(old: str, new: str) -> None:
            with sqlite3.connect(path, timeout=10) as db:
                db.execute(f"ALTER TABLE {old} RENAME TO {new}")

        async with trio.open_nursery() as nursery:
            await nursery.start(keep_lease, store.owners, identity, lease, driving, Peers())
            await until(lambda: value(metrics, "salvor_lease_renewals_total") >= 2, "renewals")
            assert value(metrics, "salvor_lease_open") == 1
            # The store fails every renewal until the table is back: the lease runs out here.
            await trio.to_thread.run_sync(rename, "nodes", "nodes_away")
            await until(
                lambda: value(metrics, "salvor_lease_deadline_passes_total") >= 1,
                "the local deadline passed",
            )
            assert value(metrics, "salvor_lease_renewal_failures_total") >= 1
            assert value(metrics, "salvor_lease_open") == 0
            assert value(metrics, "salvor_lease_lapses_total") == 0
            # Until the lease has run out on the database's clock too (it lasts 1.2 s from the
            # last renewal the store took, not 0.8 s).
            await trio.sleep(lease.lease_seconds)
            await trio.to_thread.run_sync(rename, "nodes_away", "nodes")
            # The lease had lapsed in the store by then: the renewal is refused, and the node
            # registers again under a new id, which the info series names.
            await until(lambda: value(metrics, "salvor_lease_lapses_total") == 1, "the lapse")
            await until(lambda: value(metrics, "salvor_lease_open") == 1, "a lease again")
            node_ids = [
                dict(labels)["node_id"]
                for name, labels in samples(metrics)
                if name == "salvor_node_info"
            ]
            assert node_ids == [driving.node.node_id] != [identity.node_id]
            nursery.cancel_scope.cancel()


# The notices and the listening session are PostgreSQL's.
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_change_feed_counts_what_it_hears_and_each_time_it_listens_again(
    store_url: str,
) -> None:
    import psycopg

    metrics = DaemonMetrics()
    async with open_store_access(store_url) as access, trio.open_nursery() as nursery:
        await nursery.start(change_feed(access, lambda run_id: False, metrics).serve, EventHub())
        with EventStore.open(store_url) as other:  # another process's handle, as far as the
            other.append(RUN, [STARTED], EMPTY_VIEW)  # feed can tell
        await until(lambda: value(metrics, "salvor_change_feed_notices_total") >= 1, "a notice")
        assert value(metrics, "salvor_change_feed_reconnects_total") == 0
        # The server ends the listening session (a restart, a network cut, an operator).
        conninfo = normalize_store_url(store_url).replace("postgresql+psycopg://", "postgresql://")

        def cut() -> int:
            with psycopg.connect(conninfo, autocommit=True) as db:
                return db.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (f"{LISTENER_NAME} {os.getpid()}",),
                ).fetchone()[0]

        assert await trio.to_thread.run_sync(cut) == 1
        await until(
            lambda: value(metrics, "salvor_change_feed_reconnects_total") == 1, "listening again"
        )
        nursery.cancel_scope.cancel()
