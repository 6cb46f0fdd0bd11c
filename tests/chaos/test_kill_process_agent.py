"""A process agent under a real `salvor serve` that is SIGKILLed mid-call.

The agent is a script on the real anthropic or openai SDK, streaming over
Messages or over Responses; the scripted provider holds its second model
call until the daemon has been killed. The next daemon
re-drives the run by itself: it starts the agent again, the proxy answers the
first call from the log, re-issues the cut one, and the run completes. No
completed call is served twice, and no byte of the upstream key reaches the
store or the daemon's output.

The first agent dies with the killed daemon, at once (it is tethered to the
daemon's process, ``_spawn``), though its client would keep retrying the
vanished proxy: the restarted daemon finds nothing left to sweep before it
starts the second copy. The same holds for a SIGKILLed `salvor run`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import AGENT, PLAN, SECRET
from tests.support.processes import gone, wait_gone
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script
from tests.support.spawn import run_salvor, salvor_process

# What a kill tests is the daemon's recovery, which past the model proxy does not know the wire
# format: one plain and one streamed format on SQLite, a third on PostgreSQL. Each format's own
# recording and replay after a restart of its agent is tests/daemon/agents/test_process_agent.py's.
# The third daemon logs JSON lines (--log-format json): the key reaches neither format's log.
KILL_MODES = [
    ("sqlite", "openai", "text"),
    ("sqlite", "anthropic-stream", "text"),
    ("postgres", "openai-responses", "json"),
]

pytestmark = pytest.mark.kill


def wait_terminal(client: httpx.Client, run_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"/v1/runs/{run_id}").json()
        if body["status"]["state"] in ("completed", "failed", "abandoned"):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


@pytest.mark.parametrize(("store_url", "mode", "log_format"), KILL_MODES, indirect=["store_url"])
def test_sigkill_of_the_daemon_mid_call_recovers_the_process_run_by_replay(
    tmp_path: Path, store_url: str, mode: str, log_format: str
) -> None:
    release = threading.Event()

    def on_call(call) -> None:
        if call.index == 1:
            release.wait(30)

    provider = ScriptedProvider(tool_loop_script(PLAN, final_text="settled"), on_call=on_call)
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env.update(SALVOR_AGENT_UPSTREAM=provider.base_url, SALVOR_AGENT_KEY=SECRET)
    daemon.allow_process_agents()
    daemon.args += ["--log-format", log_format]
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    pidfile = tmp_path / "agent.pid"
    definition = (
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script), mode])}\n'
        # Retries keep an orphan alive after its proxy vanished, as a real
        # client's would: it must not die of its own accord before the check.
        f'timeout = 60\n[env]\nPIDFILE = {json.dumps(str(pidfile))}\nRETRIES = "50"\n'
    )
    first_agent = None
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            ).json()["agent"]
            run_id = client.post("/v1/runs", json={"agent": agent, "input": "settle A-1"}).json()[
                "run"
            ]
            provider.wait_for_calls(2, 30)
            first_agent = int(pidfile.read_text())
            daemon.kill()
            release.set()
            assert wait_gone(first_agent), "the first agent outlived its SIGKILLed daemon"
            daemon.start()
            assert "killed agent process" not in daemon.log(1)  # nothing was left for the sweep
            deadline = time.monotonic() + 60
            while True:
                body = client.get(f"/v1/runs/{run_id}").json()
                if body["status"]["state"] in ("completed", "failed"):
                    break
                assert time.monotonic() < deadline, body
                time.sleep(0.05)
        assert body["status"]["state"] == "completed", body
        assert body["status"]["output"] == {"reply": "settled", "exit_code": 0}
        # The first call was answered from the log; only the cut one was served again.
        assert sorted(provider.count_by_request_hash().values()) == [1, 1, 2]
        assert {call.api_key for call in provider.calls} == {SECRET}
        served = provider.call_count
        with daemon.client(timeout=30) as client:
            # The recovered run re-runs from its log with no upstream call at all ...
            rerun = client.post("/v1/runs", json={"replay_of": run_id}).json()["run"]
            assert wait_terminal(client, rerun)["status"] == body["status"]
            # ... and an edited agent (its tool result changed) fails the
            # re-run at its second call, named.
            edited = client.post(
                "/v1/agents",
                content=definition.replace('RETRIES = "50"', 'AMOUNT = "43"'),
                headers={"Content-Type": "application/toml"},
            ).json()["agent"]
            failed = client.post("/v1/runs", json={"replay_of": run_id, "agent": edited}).json()[
                "run"
            ]
            status = wait_terminal(client, failed)["status"]
            assert status["state"] == "failed" and status["error"].startswith("model call 2 "), (
                status
            )
            assert f"origin run {run_id}" in status["error"]
        assert provider.call_count == served
        code, _ = daemon.terminate()
        assert code == 0
        for index in range(daemon.starts):
            assert SECRET not in daemon.log(index)
        if log_format == "json":
            logs = [tmp_path / f"serve-{index:03d}.log" for index in range(daemon.starts)]
            lines = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
            assert all(line.keys() >= {"time", "level", "logger", "message"} for line in lines)
            # The restarted daemon's drive of the recovered run says how it rested, naming it.
            assert any(line.get("run") == run_id for line in lines), lines
        if store_url.startswith("sqlite:///"):
            db = Path(store_url.removeprefix("sqlite:///"))
            for path in db.parent.glob(db.name + "*"):
                assert SECRET.encode() not in path.read_bytes()
    finally:
        release.set()
        if daemon.alive():
            daemon.kill()
        if first_agent is not None:
            try:
                os.kill(
                    first_agent, signal.SIGKILL
                )  # an orphan of the killed daemon, if it outlived it
            except ProcessLookupError:
                pass
        provider.stop()


def test_an_agent_dies_with_its_sigkilled_cli_drive_and_resume_completes_the_run(
    tmp_path: Path, store_url: str
) -> None:
    """`salvor run` is killed mid-call; its agent dies with it; `salvor resume` finds no
    orphan and completes the run."""
    release = threading.Event()

    def on_call(call) -> None:
        if call.index == 1:
            release.wait(30)

    provider = ScriptedProvider(tool_loop_script(PLAN, final_text="settled"), on_call=on_call)
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    pidfile = tmp_path / "agent.pid"
    agent_file = tmp_path / "agent.toml"
    agent_file.write_text(
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(script), "openai"])}\n'
        f'timeout = 60\n[env]\nPIDFILE = {json.dumps(str(pidfile))}\nRETRIES = "50"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALVOR_")}
    env.update(
        SALVOR_STORE=store_url, SALVOR_AGENT_UPSTREAM=provider.base_url, SALVOR_AGENT_KEY=SECRET
    )
    run_id = "5a1f0000-0000-4000-8000-000000000001"
    first_agent = None
    driver = salvor_process(
        ["run", str(agent_file), "--input", '"settle A-1"', "--run-id", run_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        provider.wait_for_calls(2, 30)
        first_agent = int(pidfile.read_text())
        driver.kill()
        driver.wait()
        release.set()
        assert wait_gone(first_agent), "the first agent outlived its SIGKILLed `salvor run`"
        resumed = run_salvor(
            ["resume", run_id], env=env, capture_output=True, text=True, timeout=120
        )
        assert resumed.returncode == 0, resumed
        assert "killed agent process" not in resumed.stderr
        assert resumed.stdout.startswith(f"run {run_id} completed: "), resumed.stdout
        assert sorted(provider.count_by_request_hash().values()) == [1, 1, 2]
    finally:
        release.set()
        if driver.poll() is None:
            driver.kill()
        if first_agent is not None and not gone(first_agent):
            os.kill(first_agent, signal.SIGKILL)
        provider.stop()
