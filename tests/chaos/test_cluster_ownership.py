"""Runs across real nodes: a run is owned from the instant it exists (a peer sweeping for
orphans never finds a new one ownerless), a dead node's runs are shared out among the live nodes
that take them over, and a WebSocket's run list on one node shows the runs another node creates
and drives.

Real `salvor serve` processes over one store, the scripted provider as the model holding each
run's first call in flight (so every run stays active), the store read directly for owners.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import trio
from salvor.store import EventStore
from trio_websocket import open_websocket_url

from tests.chaos.test_cluster_takeover import Cluster, plan
from tests.daemon.client_runs.test_client_runs import head
from tests.support.client_events import envelope

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


async def test_a_run_list_on_one_node_shows_the_runs_another_node_creates_and_drives(
    tmp_path: Path, store_url: str
) -> None:
    cluster = Cluster(tmp_path, store_url)
    try:
        await trio.to_thread.run_sync(cluster.start)
        watched = cluster.nodes[1].base_url.replace("http://", "ws://") + "/v1/ws"
        async with open_websocket_url(watched) as ws:
            await ws.send_message(json.dumps({"op": "watch_runs"}))
            # Nothing is driven on the watched node: every row comes through the change feed.
            runs = [
                await trio.to_thread.run_sync(cluster.start_run, 0, plan(case), 1)
                for case in range(3)
            ]
            states: dict[str, list[dict]] = {run_id: [] for run_id in runs}
            with trio.fail_after(60):
                while not all(states.values()):
                    message = json.loads(await ws.get_message())
                    assert message["type"] == "run", message
                    states[message["run"]].append(message["row"])
                await trio.to_thread.run_sync(cluster.hook.wait_held, len(runs))
                cluster.hook.picking = False
                cluster.hook.released.set()
                while not all(
                    seen[-1]["status"]["state"] == "completed" for seen in states.values()
                ):
                    message = json.loads(await ws.get_message())
                    states[message["run"]].append(message["row"])
                    last = message["row"]
        # Each run's rows are its changes, each told once, ending at its end; the last row is the
        # run list's entry on the watched node, field for field.
        for seen in states.values():
            assert all(a != b for a, b in itertools.pairwise(seen)), [
                (a, b) for a, b in itertools.pairwise(seen) if a == b
            ][:1]
        listed = await trio.to_thread.run_sync(
            lambda: cluster.http[1].get("/v1/runs").json()["runs"]
        )
        assert last == next(entry for entry in listed if entry["run"] == last["run"])
        await trio.to_thread.run_sync(cluster.check, Counter())
    finally:
        await trio.to_thread.run_sync(cluster.close)


def test_a_client_run_whose_node_dies_mid_lease_goes_on_through_another(
    tmp_path: Path, store_url: str
) -> None:
    cluster = Cluster(tmp_path, store_url)
    try:
        cluster.start()
        one, other = cluster.http
        opened = one.post("/v1/client-runs", json={}).json()
        run_id, drive = opened["run"], {"X-Drive-Token": opened["drive_token"]}
        events = f"/v1/client-runs/{run_id}/events"
        response = one.post(events, json={"events": [head(run_id)]}, headers=drive)
        assert response.json() == {"appended": [0]}, response.text
        # The client's node dies while the client holds its lease: the client goes on through
        # the other node under the same token, and that node neither hands the run to anyone
        # else nor drives it itself (it is the client's), through several of its sweeps.
        cluster.nodes[0].kill()
        step = envelope(run_id, 1, "RandomObserved", {"value": "0.5"})
        response = other.post(events, json={"events": [step]}, headers=drive)
        assert response.json() == {"appended": [1]}, response.text
        for _ in range(4):
            beat = other.post(f"/v1/client-runs/{run_id}/heartbeat", headers=drive)
            assert beat.status_code == 200, beat.text
            taken = other.post("/v1/client-runs", json={"run_id": run_id})
            assert taken.json()["error"]["code"] == "lease_held", taken.text
            assert cluster.run(1, run_id)["driver"] == "attached"
            time.sleep(1.0)  # a takeover sweep each second, and past the dead node's lease
        done = envelope(run_id, 2, "RunCompleted", {"output": {"answer": 42}})
        response = other.post(events, json={"events": [done]}, headers=drive)
        assert response.json() == {"appended": [2]}, response.text
        log = cluster.log(run_id)
        assert [e.seq for e in log] == [0, 1, 2]
        assert cluster.run(1, run_id)["status"]["state"] == "completed"
    finally:
        cluster.close()
