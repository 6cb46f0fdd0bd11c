"""A composed workload through disk-full cycles: the store's disk (a small tmpfs of its own) is
filled and freed again and again under the load while one daemon, never restarted, heals what
each cycle stopped (``/v1/health`` counts the roots healing).
"""

from __future__ import annotations

import random
import time

from tests.chaos.composed_harness import KILL_DELAY, ComposedLoad
from tests.support.disk import Filler

# A disk-full cycle: the disk stays full until a drive stopped on it (SQLite writes into the
# room its WAL file already has, so a fill may take a while to bite), then this much longer, at
# most FULL_AT_MOST; then the load runs on the freed disk this long before the next cycle.
FULL_AFTER_A_STOP = (0.0, 3.0)
FULL_AT_MOST = 30.0
FREED_FOR = (1.0, 6.0)


def disk_full_cycle(harness: ComposedLoad, disk: Filler, rng: random.Random) -> None:
    """Under the load, fill the store's disk at a random instant, keep it full until a drive
    stopped on it and a little longer (the load goes on: starts the store refuses are tried
    again), free it, and let the load run on. The daemon is not restarted: what the full
    disk stopped must heal by itself."""
    harness.operate_until(time.monotonic() + rng.uniform(*KILL_DELAY), top_up=True)
    disk.begin()
    harness.disk_full = True
    harness.disk_cycles += 1
    harness.stop_named = f"disk-full cycle {harness.disk_cycles}"
    bit = False
    try:
        deadline = time.monotonic() + FULL_AT_MOST
        while time.monotonic() < deadline:
            harness.operate(top_up=True)
            healing = _healing(harness)
            if healing and not bit:
                bit = True
                deadline = min(deadline, time.monotonic() + rng.uniform(*FULL_AFTER_A_STOP))
            harness.healing_seen = max(harness.healing_seen, healing)
            time.sleep(0.05)
    finally:
        disk.end()
        harness.disk_full = False
    harness.cycles_that_bit += bit
    harness.operate_until(time.monotonic() + rng.uniform(*FREED_FOR), top_up=True)


def _healing(harness: ComposedLoad) -> int:
    response = harness.call("GET", "/v1/health")
    return 0 if response is None else response.json()["healing"]


def run_disk_full_cycles(
    harness: ComposedLoad, disk: Filler, *, cycles: int, seconds: float
) -> None:
    """Fill and free the store's disk ``cycles`` times under the load (or until ``seconds``
    passed), with one daemon that is never restarted, then settle."""
    rng = random.Random(harness.seed + 3)
    began = time.monotonic()
    # The disk is a small tmpfs: the free-space floor would refuse every new run on it.
    harness.daemon.args += ["--min-free-bytes", "0"]
    # What this test is about is a drive stopped by the store, healing. A disk full for longer
    # than the node's lease (6 s by default; a full spell here lasts up to FULL_AT_MOST) also
    # lapses the lease, and that cuts every drive, a write between its send and its answer
    # included: its probe then cannot tell, and the tree rests for a person, as documented (the
    # lapse mid-effect is the cluster and workers kill tests' subject). The lease outlasts a spell.
    harness.daemon.args += ["--lease-seconds", str(3 * FULL_AT_MOST)]
    harness.daemon.start()
    harness.register()
    while harness.disk_cycles < cycles and time.monotonic() - began < seconds:
        disk_full_cycle(harness, disk, rng)
        if not harness.daemon.alive():
            harness.violation("the daemon died")
            return
    harness.settle()
    if harness.daemon.starts != 1:
        harness.violation(f"the daemon was started {harness.daemon.starts} times")
