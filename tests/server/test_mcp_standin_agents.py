"""Process agents with MCP stand-ins under ``salvor serve``: registered over the API without
starting any server, and recovered by the next daemon after a stop cut an MCP call off."""

from __future__ import annotations

import time

import trio

from tests.daemon.test_mcp_standins import standin_agent
from tests.daemon.test_process_agent import SECRET
from tests.support.mcp_servers import FixtureServer
from tests.support.scripted_provider import tool_loop_script


def _wait_for_ledger(fx: FixtureServer, n: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while len(fx.ledger) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"the fixture server executed {len(fx.ledger)} calls, not {n}")
        time.sleep(0.02)


async def test_a_stopped_daemon_leaves_an_open_mcp_read_to_the_next_one(server_factory, providers, tmp_path, monkeypatch):
    fx = FixtureServer(tmp_path / "fx")
    fx.dir.mkdir()
    plan = [("write_note", {"text": "hi"}), ("lookup", {"key": "a", "hold": fx.hold("r")})]
    provider = providers(tool_loop_script(plan, final_text="noted"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    text = standin_agent(tmp_path, f"command = {fx.toml_command()}\n").stored_text
    first = await server_factory(allow_process_agents=True)
    agent = await first.register_agent(text)
    assert fx.starts == []  # registering a process agent starts none of its servers
    run_id = await first.start_run(agent, "note it")
    await trio.to_thread.run_sync(_wait_for_ledger, fx, 2)
    await first.stop()  # the held lookup is cut off: its read intent stays open
    fx.release("r")
    second = await server_factory(allow_process_agents=True)
    body = await second.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    # The completed write ran once; the open read ran again.
    assert [c["tool"] for c in fx.ledger] == ["write_note", "lookup", "lookup"]
