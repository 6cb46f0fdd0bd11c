"""The serving process's collector settings (``settle_collector``), in a process of its own: they
change the whole process, and the test's own must stay as it is."""

from __future__ import annotations

import json
import subprocess
import sys

from salvor.daemon.serve import YOUNG_THRESHOLD

PROBE = """
import gc, json
before = gc.get_threshold()
from salvor.daemon.serve import settle_collector
settle_collector()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_serving_freezes_the_start_and_collects_the_young_less_often() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    seen = json.loads(out.stdout)
    assert seen["after"] == [YOUNG_THRESHOLD, *seen["before"][1:]]
    assert YOUNG_THRESHOLD > seen["before"][0]
    # The imported modules and what they built are out of every collection's reach.
    assert seen["frozen"] > 10_000
