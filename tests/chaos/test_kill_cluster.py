"""Kill safety over a cluster: the composed load on several `salvor serve` nodes over one store,
nodes SIGKILLed one at a time and all at once, stopped gracefully, and paused past their lease
(``tests/chaos/cluster.py`` says what each stop does and what is checked).

CI runs a short schedule: two nodes on SQLite, three on PostgreSQL. The long run is a script a
person starts (``python -m tests.chaos.cluster --stops 350 [--store postgresql://...]``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos.cluster import Cluster, checked_schedule
from tests.chaos.test_kill_composed import SEED

pytestmark = pytest.mark.kill


def test_cluster_nodes_killed_and_paused_perform_each_refund_once(
    tmp_path: Path, store_url: str
) -> None:
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
    figures = checked_schedule(harness, kinds, name="cluster chaos")
    assert figures["pauses"] == 2, figures
