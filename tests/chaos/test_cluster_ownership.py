"""Run ownership across real nodes: a run is owned from the instant it exists (a peer sweeping
for orphans never finds a new one ownerless), and a dead node's runs are shared out among the
live nodes that take them over.

Real `salvor serve` processes over one store, the scripted provider as the model holding each
run's first call in flight (so every run stays active), the store read directly for owners.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from salvor.store import EventStore

from tests.chaos.test_cluster_takeover import Cluster, plan

pytestmark = pytest.mark.kill

NEW_RUNS = 40
VICTIMS_RUNS = 60
SWEEP_SECONDS = 0.01


def test_a_peer_sweeping_for_orphans_never_finds_a_new_run_ownerless(
    tmp_path: Path, store_url: str
) -> None:
    cluster = Cluster(tmp_path, store_url)
    cluster.nodes = cluster.nodes[:1]  # the creating node; the peer is the sweeper below
    cluster.http = cluster.http[:1]
    won: list[str] = []
    seen: list[str] = []
    stop = threading.Event()
    try:
        cluster.start()

        def peer() -> None:
            # A node sweeping far more often than a real one (every 10 ms, not every second),
            # claiming every orphan it is shown, as its sweep's drives would.
            with EventStore.open(store_url) as store:
                store.owners.register(
                    "sweeping-peer", name="peer", host="h", pid=1, lease_seconds=300
                )
                while not stop.is_set():
                    for orphan in store.owners.orphans("sweeping-peer"):
                        seen.append(orphan.run_id)
                        if store.owners.claim(orphan.run_id, "sweeping-peer").fence is not None:
                            won.append(orphan.run_id)
                    time.sleep(SWEEP_SECONDS)

        sweeper = threading.Thread(target=peer)
        sweeper.start()
        try:
            runs = [cluster.start_run(0, plan(case), hold_at=0) for case in range(NEW_RUNS)]
            cluster.hook.wait_held(NEW_RUNS)
        finally:
            stop.set()
            sweeper.join()
        assert (seen, won) == ([], [])
        creator = cluster.node_id(0)
        with EventStore.open(store_url) as store:
            owners = store.owners.owners(runs)
        assert {(o.node_id, o.epoch, o.driving) for o in owners.values()} == {(creator, 1, True)}
        cluster.hook.picking = False
        cluster.hook.released.set()
        for run_id in runs:
            cluster.wait_state(0, run_id, "completed")
        cluster.check(Counter())
    finally:
        cluster.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_dead_nodes_runs_are_shared_among_the_live_nodes(tmp_path: Path, store_url: str) -> None:
    cluster = Cluster(tmp_path, store_url, names=("n1", "n2", "n3"))
    try:
        cluster.start()
        runs = [cluster.start_run(0, plan(case), hold_at=0) for case in range(VICTIMS_RUNS)]
        cluster.hook.wait_held(VICTIMS_RUNS)
        cluster.nodes[0].kill()
        cut = Counter(cluster.hook.held)
        # Every run drives again on a survivor: its model call is issued again (held again).
        cluster.hook.wait_held(2 * VICTIMS_RUNS)
        with EventStore.open(store_url) as store:
            owners = store.owners.owners(runs)
        taken = Counter(owner.node_id for owner in owners.values())
        assert set(taken) == {cluster.node_id(1), cluster.node_id(2)}, taken
        # Each took about its half (the first sweeper took every one of them before).
        assert min(taken.values()) >= VICTIMS_RUNS // 4, taken
        cluster.hook.picking = False
        cluster.hook.released.set()
        for run_id in runs:
            cluster.wait_state(1, run_id, "completed")
        cluster.check(cut)
    finally:
        cluster.close()
