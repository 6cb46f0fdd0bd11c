"""A process agent with an MCP stand-in under a real `salvor serve` that is SIGKILLed mid-call.

The agent (the ``mcp`` SDK over ``$SALVOR_MCP_SERVER_FIX``) has finished a
write and is in the middle of a held read when the daemon is killed. The next
daemon re-drives the run by itself: the write is answered from the log (the
fixture server's ledger shows it once), the open read runs again on a server
the new daemon starts, and the run completes. A re-run then reproduces it
with no server started at all.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.chaos.test_kill_process_agent import wait_terminal
from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import SECRET
from tests.support.mcp_servers import FixtureServer
from tests.support.mcp_standin_agents import standin_agent
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script

pytestmark = pytest.mark.kill


def test_sigkill_of_the_daemon_mid_mcp_call_recovers_without_repeating_a_completed_call(
    tmp_path: Path, store_url: str
) -> None:
    fx = FixtureServer(tmp_path / "fx")
    fx.dir.mkdir()
    plan = [("write_note", {"text": "hi"}), ("lookup", {"key": "a", "hold": fx.hold("r")})]
    provider = ScriptedProvider(tool_loop_script(plan, final_text="noted"))
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env.update(SALVOR_AGENT_UPSTREAM=provider.base_url, SALVOR_AGENT_KEY=SECRET)
    daemon.allow_process_agents()
    definition = standin_agent(tmp_path, f"command = {fx.toml_command()}\n").stored_text
    try:
        daemon.start()
        with daemon.client(timeout=30) as client:
            agent = client.post(
                "/v1/agents", content=definition, headers={"Content-Type": "application/toml"}
            ).json()["agent"]
            run_id = client.post("/v1/runs", json={"agent": agent, "input": "note it"}).json()[
                "run"
            ]
            deadline = time.monotonic() + 30
            while len(fx.ledger) < 2:
                assert time.monotonic() < deadline, fx.ledger
                time.sleep(0.02)
            daemon.kill()
            fx.release("r")
            daemon.start()
            body = wait_terminal(client, run_id)
            assert body["status"]["state"] == "completed", body
            # The completed write is never executed again; the cut read is.
            assert [c["tool"] for c in fx.ledger] == ["write_note", "lookup", "lookup"]
            assert len(fx.starts) == 2
            rerun = client.post("/v1/runs", json={"replay_of": run_id}).json()["run"]
            assert wait_terminal(client, rerun)["status"]["state"] == "completed"
            assert len(fx.starts) == 2 and len(fx.ledger) == 3
        code, _ = daemon.terminate()
        assert code == 0
    finally:
        if daemon.alive():
            daemon.kill()
        provider.stop()
