"""A daemon restarted after SIGKILL under many process agents answers before it has recovered them.

Sixteen runs of a process agent (a Python script that notes its start and
then sleeps) are in flight when ``salvor serve`` is SIGKILLed. The next
daemon must recover all of them, which means starting sixteen interpreters
again (two launch slots, each held a second: about eight seconds); it sends
READY and answers ``GET /v1/health`` first, while most of them are still
queued behind the launch slots, then starts them a few at a time. The test
asserts that order (never a wall time) and prints the times. Before,
recovery started every driver before READY and up to 64 agent processes at
once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.test_kill_serve import Daemon

pytestmark = pytest.mark.kill

RUNS = 16
BOUND = 120.0

SLEEPER = """\
import os, sys, time
from pathlib import Path
Path(os.environ["MARKERS"], str(os.getpid())).write_text(str(time.time()))
time.sleep(600)
"""


def _started(markers: Path) -> int:
    return sum(1 for _ in markers.iterdir())


def _wait_for(what: str, check, daemon: Daemon, seconds: float = BOUND) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds:g}s\n{daemon.log()}")
        time.sleep(0.05)


def test_a_restart_answers_health_while_its_process_agents_are_still_being_recovered(
    tmp_path: Path,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    daemon = Daemon(tmp_path, f"sqlite:///{tmp_path / 'salvor.db'}", tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    definition = (
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script)])}\ntimeout = 600\n'
        f"[env]\nMARKERS = {json.dumps(str(markers))}\n"
    )
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            ).json()["agent"]
            for n in range(RUNS):
                assert (
                    client.post("/v1/runs", json={"agent": agent, "input": f"case {n}"}).status_code
                    == 201
                )
            _wait_for("every agent process starting", lambda: _started(markers) == RUNS, daemon)
        daemon.kill()
        for marker in markers.iterdir():
            marker.unlink()

        spawned = time.monotonic()
        daemon.start()
        ready = time.monotonic() - spawned
        with daemon.client(timeout=30) as client:
            health = client.get("/v1/health")
            answered = time.monotonic() - spawned
            started_then = _started(markers)
            assert health.status_code == 200, health.text
            body = health.json()
            assert body["status"] == "ok"
            # The order this test is about: the answer came while recovery was still going on.
            assert body["recovering"] > 0, body
            assert started_then < RUNS

            def recovered() -> bool:
                return (
                    _started(markers) == RUNS and client.get("/v1/health").json()["recovering"] == 0
                )

            _wait_for("every interrupted run being driven again", recovered, daemon)
            done = time.monotonic() - spawned
        print(
            f"restart with {RUNS} process agents in flight: READY {ready:.2f}s, first health "
            f"answer {answered:.2f}s (recovering {body['recovering']}, {started_then} agents "
            f"started), all {RUNS} agents started again {done:.2f}s"
        )
    finally:
        if daemon.proc is not None and daemon.alive():
            daemon.terminate()
