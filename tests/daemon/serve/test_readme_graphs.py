"""The README's "Running a graph" walkthroughs, run as written.

* Its curl block, against a real ``salvor serve --demo-tools``: the agents the graph names are
  registered first, the graph run stops at its gate, and the block's own resume line ends it.
* Its command line block on a store no daemon serves: the publish run is resumed by hand and
  completes, the tickets run completes with its totals.
* Its *Flows by name* block, against the same daemon once the curl block registered the agents:
  the graph kept as ``team/publish``, read back, and a run started by the name.
* The command line block beside the daemon serving that store: ``graph run`` works,
  ``salvor resume`` is refused in one sentence naming the request to that daemon, and that
  request, run as the sentence prints it, completes the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.chaos.test_kill_serve import Daemon
from tests.support.backends import SQLITE_ONLY
from tests.support.readme import pick_helper, sh_blocks
from tests.support.readme import shell as readme_shell

REPO = Path(__file__).resolve().parents[3]
# SQLite alone (tests/support/backends.py): the README's lines run as written, over the SQLite
# store its commands create.
STORE_BACKENDS = SQLITE_ONLY
SECTION = "### Running a graph"


def readme_blocks() -> tuple[str, list[str], list[str]]:
    """The `pick` helper, then the section's curl block and command line block, as lines."""
    blocks = [block.splitlines() for block in sh_blocks(SECTION)]
    assert len(blocks) == 3, blocks
    return pick_helper(), blocks[0], blocks[1]


def flows_by_name_block() -> list[str]:
    """The section's third block: a graph kept by name, read back, and run by the name."""
    return sh_blocks(SECTION)[2].splitlines()


def shell(lines: list[str], env: dict) -> subprocess.CompletedProcess:
    return readme_shell(lines, env, timeout=180)


def reader_env(store_url: str, **more: str) -> dict[str, str]:
    """The README's reader: `.venv/bin` on the PATH, the daemon's store the default one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SALVOR_", "NOTIFY_"))}
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**env, "PATH": path, "SALVOR_STORE": store_url, **more}


def state_of(client: httpx.Client, run_id: str, settled: str) -> dict:
    """The run's status once it is ``settled``: the resume answers before the drive it starts
    has ended (and while its write is in flight the folded state reads needs_reconciliation)."""
    deadline = time.monotonic() + 60
    while (status := client.get(f"/v1/runs/{run_id}").json()["status"])["state"] != settled:
        assert status["state"] not in ("failed", "abandoned"), status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


def test_the_curl_graph_walkthrough_registers_its_agents_and_runs_to_the_end(
    tmp_path: Path, store_url: str
) -> None:
    pick, curl_block, _ = readme_blocks()
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl", one_process=False)
    try:
        daemon.start()
        env = reader_env(store_url, S=daemon.base_url)
        result = shell([pick, *curl_block, 'echo "RUN=$RUN"'], env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "unknown_agent" not in result.stdout, result.stdout
        run_id = result.stdout.rsplit("RUN=", 1)[1].strip()
        # The stream ended at the gate, and the block's last line resumed the run.
        assert '"state": "suspended"' in result.stdout or '"state":"suspended"' in result.stdout
        with httpx.Client(base_url=daemon.base_url, timeout=30) as client:
            status = state_of(client, run_id, "completed")
            assert "publish" in status["output"], status
    finally:
        if daemon.alive():
            daemon.kill()


def test_the_command_line_graph_walkthrough_runs_as_written_with_no_daemon(
    tmp_path: Path, store_url: str
) -> None:
    _, _, commands = readme_blocks()
    env = reader_env(store_url, SALVOR_DEMO_EFFECTS=str(tmp_path / "effects.jsonl"))
    result = shell(commands, env)
    assert result.returncode == 0, result.stdout + result.stderr
    published = [line for line in result.stdout.splitlines() if " completed: " in line]
    assert len(published) == 2 and '"publish"' in published[0], result.stdout
    assert '"minutes": 4' in published[1] and '"tickets": 4' in published[1], result.stdout
    # With no daemon, a parked run's sentence names the salvor command that continues it.
    parked = shell([*commands[:3], "salvor log $RUN | tail -n 1"], env).stdout
    run_id = re.search(r"^run ([0-9a-f-]{36}) suspended", parked, re.MULTILINE).group(1)
    assert re.findall(r"`([^`]*)`", parked) == [f"salvor resume {run_id} --input JSON"], parked


def test_beside_the_daemon_resume_names_the_request_that_resumes_the_run(
    tmp_path: Path, store_url: str
) -> None:
    _, _, commands = readme_blocks()
    resume = next(i for i, line in enumerate(commands) if line.startswith("salvor resume"))
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl", one_process=False)
    try:
        daemon.start()
        env = reader_env(store_url, SALVOR_DEMO_EFFECTS=str(tmp_path / "effects.jsonl"))
        result = shell(["trap 'echo \"RUN=$RUN\"' EXIT", *commands[: resume + 1]], env)
        # The graph run started and parked beside the daemon; its resume was refused.
        assert result.returncode == 1, result.stdout + result.stderr
        run_id = result.stdout.rsplit("RUN=", 1)[1].strip()
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"salvor serve (pid {daemon.proc.pid}, {daemon.base_url}/)" in lines[0] or (
            f"salvor serve (pid {daemon.proc.pid}, {daemon.base_url})" in lines[0]
        ), lines[0]
        (request,) = re.findall(r"`([^`]*)`", lines[0])
        assert request.startswith(f"curl -s {daemon.base_url}/v1/runs/{run_id}/resume"), request
        # Where the run rests says the same: the request to the daemon, not `salvor resume`.
        logged = shell([f"salvor log {run_id} | tail -n 1"], env).stdout
        (hint,) = re.findall(r"`([^`]*)`", logged)
        assert hint == (
            f"curl -s {daemon.base_url}/v1/runs/{run_id}/resume "
            """-H 'Content-Type: application/json' -d '{"input": JSON}'"""
        ), logged
        with httpx.Client(base_url=daemon.base_url, timeout=30) as client:
            assert client.get(f"/v1/runs/{run_id}").json()["status"]["state"] == "suspended"
            answered = shell([request], env)
            assert answered.returncode == 0 and '"error"' not in answered.stdout, answered
            status = state_of(client, run_id, "completed")
            assert "publish" in status["output"], status
    finally:
        if daemon.alive():
            daemon.kill()


def test_the_flows_by_name_walkthrough_keeps_a_graph_and_runs_it_by_name(
    tmp_path: Path, store_url: str
) -> None:
    pick, curl_block, _ = readme_blocks()
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl", one_process=False)
    try:
        daemon.start()
        env = reader_env(store_url, S=daemon.base_url)
        # The curl block's registration of the agents publish.json names: its loop, to `done`.
        register = curl_block[: curl_block.index("done") + 1]
        result = shell([pick, *register, *flows_by_name_block()], env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert '"error"' not in result.stdout, result.stdout
        with httpx.Client(base_url=daemon.base_url, timeout=30) as client:
            (flow,) = client.get("/v1/flows").json()["flows"]
            assert (flow["flow"], flow["version"]) == ("team/publish", 1)
            (run,) = client.get("/v1/runs", params={"label": "salvor.flow:team/publish"}).json()[
                "runs"
            ]
            assert run["graph_hash"] == flow["graph"]
            state_of(client, run["run"], "suspended")
    finally:
        if daemon.alive():
            daemon.kill()
