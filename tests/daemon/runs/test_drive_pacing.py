"""Drives that start processes take a launch slot: with one slot, agent starts never overlap.

Each agent notes when it started and when it is about to exit; it never
calls the model, so a slot is freed only by the drive ending (the settle
bound is set far away). The three runs' agent lifetimes must then follow one
another, where before they all started together. Order, not wall time, is
asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.runs._drivers import DriverSet

NOTER = """\
import os, sys, time
from pathlib import Path
out = Path(os.environ["NOTES"])
with out.open("a") as notes:
    notes.write(f"start {time.monotonic()}\\n")
time.sleep(0.2)
with out.open("a") as notes:
    notes.write(f"end {time.monotonic()}\\n")
sys.exit(3)
"""


async def test_one_launch_slot_starts_one_agent_process_at_a_time(runtime, tmp_path: Path) -> None:
    script = tmp_path / "noter.py"
    script.write_text(NOTER)
    notes = tmp_path / "notes.txt"
    agent = parse_definition(
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script)])}\ntimeout = 60\n'
        f"[env]\nNOTES = {json.dumps(str(notes))}\n",
        "toml",
    )
    run_ids = [await runtime.starts.start_run(agent, f"case {n}") for n in range(3)]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            drivers = DriverSet(runtime, nursery, launches=1, launch_settle_seconds=3600)
            for run_id in run_ids:
                drivers.start(run_id, agent)
    kinds = [line.split()[0] for line in notes.read_text().splitlines()]
    assert kinds == ["start", "end"] * 3
    for run_id in run_ids:
        assert (
            await runtime.reads.view(run_id)
        ).state.value == "failed"  # exit 3: each drive did end
