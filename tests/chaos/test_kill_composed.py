"""Kill safety of composed runs: graph runs and subagent trees under SIGKILL, a kill during a
SIGTERM shutdown, and two kills in quick succession, on a real `salvor serve`.

The workload (``composed_refunds``: graph runs whose map items, and subagent trees whose leaves,
refund invoices of their own) and the stops, invariants and settling (``composed_harness``) are
modules of their own, shared with the cluster's and the workers' kill tests and the long run.
After every stop and at the end: every log contiguous and legal, each refund performed at most
once and every refund a log records done the bank's one, every map item's child finished
exactly once, nothing done by hand; at the end every tree completed or rests on a write whose
probe could not tell.

CI runs a short schedule here (14 stops on SQLite, 8 on PostgreSQL). The long run is a
script a person starts (``python -m tests.chaos.composed_chaos --kills 500``), printing one JSON
line; ``SALVOR_CHAOS_SEED`` picks the seed here.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from tests.chaos.composed_disk import run_disk_full_cycles
from tests.chaos.composed_harness import (
    KILL_DELAY,
    QUIET_SECONDS,
    SEED,
    SETTLE_SECONDS,
    kill_schedule,
    run_composed,
)
from tests.chaos.composed_refunds import Composed
from tests.support.disk import Filler, TmpfsRefused, tmpfs

# What the cluster's and the workers' kill tests and the long run import from here.
__all__ = [
    "KILL_DELAY",
    "QUIET_SECONDS",
    "SEED",
    "SETTLE_SECONDS",
    "Composed",
    "run_composed",
    "run_disk_full_cycles",
]

pytestmark = pytest.mark.kill


def test_composed_runs_killed_at_random_instants_perform_each_refund_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    kinds, kills = kill_schedule(store_url.startswith("sqlite"), SEED)
    harness = Composed(tmp_path, store_url, SEED)
    try:
        run_composed(harness, kinds, kills=kills, seconds=600)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))


def test_composed_runs_through_disk_full_cycles_heal_with_no_restart(tmp_path: Path) -> None:
    """The composed load on a SQLite store whose disk fills and frees again and again: every
    tree completes on the one daemon (no restart, no resume but a gate's answer), each refund
    once, and at least one cycle stopped a run (``/v1/health`` counted it healing)."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            disk = Filler(stack.enter_context(tmpfs(tmp_path / "disk", "64m")))
        except TmpfsRefused as refused:
            pytest.skip(str(refused))
        harness = Composed(tmp_path, f"sqlite:///{disk.store_dir / 'salvor.db'}", SEED)
        stack.callback(harness.close)  # before the unmount: the daemon holds the store open
        run_disk_full_cycles(harness, disk, cycles=6, seconds=600)
    figures = harness.figures(began)
    print("composed disk-full cycles:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["disk_full_cycles_that_stopped_a_run"] > 0, figures
    # No kill cut a write: every tree completed, none rests on a parked write.
    assert figures["roots_unfinished_at_the_end"] == 0, figures
