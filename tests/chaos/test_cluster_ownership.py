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
