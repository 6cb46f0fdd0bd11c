"""Kill safety over one service of two workers (``salvor serve --workers 2``) on SQLite: the
composed load while its workers are SIGKILLed and paused past their lease, and the service
crashed, its supervisor killed alone, and stopped gracefully (``tests/chaos/workers_chaos.py``
says what each stop does and what is checked).

CI runs a short schedule; the long run is a script a person starts
(``python -m tests.chaos.cluster --workers 2 --stops 300``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos.cluster import checked_schedule
from tests.chaos.test_kill_composed import SEED
from tests.chaos.workers_chaos import Workers

pytestmark = pytest.mark.kill


def test_workers_killed_and_paused_perform_each_refund_once(tmp_path: Path) -> None:
    kinds = ["worker"] * 4 + ["pause", "pause", "all", "supervisor", "term"]
    random.Random(SEED).shuffle(kinds)
    harness = Workers(
        tmp_path,
        f"sqlite:///{tmp_path / 'salvor.db'}",
        SEED,
        workers=2,
        lease_seconds=3.0,
        fence_margin_seconds=1.0,
    )
    figures = checked_schedule(harness, kinds, name="workers chaos")
    assert figures["pauses"] == 2, figures
    # Every worker stop found its worker (4), the crash took both and the supervisor (3).
    assert figures["kills_by_kind"] == {"worker": 4, "all": 3, "supervisor": 1}, figures
