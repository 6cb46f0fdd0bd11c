"""Process agents with MCP stand-ins under ``salvor serve``: registered over the API without
starting any server, and recovered by the next daemon after a stop cut an MCP call off."""

from __future__ import annotations

import time

import trio

from tests.daemon.agents.test_process_agent import SECRET
from tests.support.api import read_log_independently
from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import FixtureServer
from tests.support.mcp_standin_agents import standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is stand-ins driven over the HTTP API.
STORE_BACKENDS = SQLITE_ONLY


def _wait_for_ledger(fx: FixtureServer, n: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while len(fx.ledger) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"the fixture server executed {len(fx.ledger)} calls, not {n}")
        time.sleep(0.02)


async def test_a_stopped_daemon_leaves_an_open_mcp_read_to_the_next_one(
    server_factory, providers, tmp_path, monkeypatch
):
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


async def test_a_process_run_an_mcp_tool_parks_is_resumed_and_woken_over_the_api(
    server_factory, providers, tmp_path, monkeypatch
):
    """``_meta.salvor`` on a stand-in's tool result under ``salvor serve``: a suspend waits for
    ``POST /resume`` (a wrong input is refused, recording nothing); a ``sleep_until`` is woken by
    the sweeper. The parking tool runs once either way."""
    from datetime import UTC, datetime, timedelta

    from salvor.protocol import format_instant

    from tests.daemon.proxies.test_mcp_standin_parking import APPROVAL, SUSPEND

    fx = FixtureServer(tmp_path / "fx")
    fx.dir.mkdir()
    wake_at = format_instant(datetime.now(UTC) + timedelta(seconds=2))
    plan = [("park", {"salvor": SUSPEND}), ("park", {"salvor": {"sleep_until": wake_at}})]
    provider = providers(tool_loop_script(plan, final_text="refunded"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    text = standin_agent(tmp_path, f"command = {fx.toml_command()}\n").stored_text
    server = await server_factory(allow_process_agents=True, wake_interval=0.2)
    agent = await server.register_agent(text)
    run_id = await server.start_run(agent, "refund it")
    body = await server.wait_resting(run_id)
    assert body["status"] == {
        "state": "suspended",
        "reason": "approve the refund",
        "input_schema": APPROVAL,
    }, body
    count = body["event_count"]
    refused = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": "yes"}}
    )
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "bad_request")
    assert (await server.client.get(f"/v1/runs/{run_id}")).json()["event_count"] == count
    resumed = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
    )
    assert resumed.status_code in (200, 202), resumed.text
    # The second park sleeps; the sweeper wakes it once due, and the run completes.
    with trio.fail_after(30):
        while (body := (await server.client.get(f"/v1/runs/{run_id}")).json())["status"][
            "state"
        ] != "completed":
            # A write in flight folds to needs_reconciliation while its driver is attached.
            assert (
                body["status"]["state"] in ("running", "sleeping")
                or body.get("driver") == "attached"
            ), body
            await trio.sleep(0.05)
    assert [c["tool"] for c in fx.ledger] == ["park", "park"]
    kinds = [e.kind for e in await read_log_independently(server.store_url, run_id)]
    assert ["Suspended", "Resumed", "SleepStarted", "NowObserved", "SleepCompleted"] == [
        k
        for k in kinds
        if k in ("Suspended", "Resumed", "SleepStarted", "NowObserved", "SleepCompleted")
    ]
