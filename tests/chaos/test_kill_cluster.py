"""Kill safety over a cluster: the composed load on several `salvor serve` nodes over one store,
nodes SIGKILLed one at a time and all at once, stopped gracefully, and paused past their lease
(``tests/chaos/cluster.py`` says what each stop does and what is checked).

CI runs a short schedule: two nodes on SQLite, three on PostgreSQL. The long run is a script a
person starts (``python -m tests.chaos.cluster --stops 350 [--store postgresql://...]``).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster, run_cluster
from tests.chaos.test_kill_composed import SEED

pytestmark = pytest.mark.kill


def test_cluster_nodes_killed_and_paused_perform_each_refund_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    sqlite = store_url.startswith("sqlite")
    kinds = ["node"] * 4 + ["pause", "pause", "all", "term"]
    random.Random(SEED).shuffle(kinds)
    harness = Cluster(
        tmp_path,
        store_url,
        SEED,
        nodes=2 if sqlite else 3,
        lease_seconds=3.0,
        fence_margin_seconds=1.0,
    )
    try:
        run_cluster(harness, kinds, stops=len(kinds), seconds=600)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("cluster chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["pauses"] == 2, figures
