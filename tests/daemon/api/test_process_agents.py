"""Process agents under ``salvor serve``: registered over the API, driven through
the daemon's one proxy listener, and recovered by the next daemon after a stop."""

from __future__ import annotations

import json
import sys
import threading

import trio

from tests.daemon.agents.test_process_agent import AGENT, PLAN, SECRET
from tests.support.backends import SQLITE_ONLY
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is process agents' registration and runs
# over HTTP.
STORE_BACKENDS = SQLITE_ONLY


def definition(tmp_path, mode: str) -> str:
    path = tmp_path / "agent.py"
    path.write_text(AGENT)
    return (
        'name = "proc"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(path), mode])}\n"
        f"timeout = 60\n[env]\nPIDFILE = {json.dumps(str(tmp_path / 'agent.pid'))}\n"
    )


async def test_process_agents_over_http_need_the_operators_opt_in(server, tmp_path):
    response = await server.client.post(
        "/v1/agents",
        content=definition(tmp_path, "openai"),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code == 400
    assert "--allow-process-agents" in response.json()["error"]["message"]
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}


async def test_a_process_agent_runs_through_the_daemons_proxy(
    server_factory, providers, tmp_path, monkeypatch
):
    server = await server_factory(allow_process_agents=True)
    provider = providers(tool_loop_script(PLAN, final_text="settled"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    agent = await server.register_agent(definition(tmp_path, "openai-stream"))
    # Its kind says a re-run of its runs can work.
    assert (await server.client.get(f"/v1/agents/{agent}")).json()["kind"] == "process"
    run_id = await server.start_run(agent, "settle A-1")
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    assert body["status"]["output"] == {"reply": "settled", "exit_code": 0}
    assert provider.call_count == 3
    assert server.state.runtime.kit.proxy.url.startswith("http://127.0.0.1:")


def held_provider(providers, monkeypatch):
    """The upstream for these agents, holding the second model call until ``release`` is set."""
    release = threading.Event()

    def on_call(call) -> None:
        if call.index == 1:
            release.wait(20)

    provider = providers(tool_loop_script(PLAN), on_call=on_call)
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    return provider, release


async def test_a_stopped_daemon_leaves_the_run_to_the_next_one_which_replays_it(
    server_factory, providers, tmp_path, monkeypatch
):
    provider, release = held_provider(providers, monkeypatch)
    first = await server_factory(allow_process_agents=True)
    agent = await first.register_agent(definition(tmp_path, "anthropic"))
    run_id = await first.start_run(agent, "settle A-1")
    try:
        await trio.to_thread.run_sync(provider.wait_for_calls, 2, 30)
        await (
            first.stop()
        )  # cancels the drive: the agent's process group is killed, the intent stays open
    finally:
        release.set()
    second = await server_factory(allow_process_agents=True)
    body = await second.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    assert body["status"]["output"] == {"reply": "done", "exit_code": 0}
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 2]


async def test_a_killed_agent_process_is_restarted_by_the_daemon_and_replayed(
    server_factory, providers, tmp_path, monkeypatch
):
    import os
    import signal

    provider, release = held_provider(providers, monkeypatch)
    server = await server_factory(allow_process_agents=True)
    agent = await server.register_agent(definition(tmp_path, "openai"))
    run_id = await server.start_run(agent, "settle A-1")
    try:
        await trio.to_thread.run_sync(provider.wait_for_calls, 2, 30)
        first = int((tmp_path / "agent.pid").read_text())
        os.kill(first, signal.SIGKILL)
        # The cut call is held until the restarted process is up, so its late
        # answer cannot reach the old (closed) session first.
        with trio.fail_after(20):
            while int((tmp_path / "agent.pid").read_text() or first) == first:
                await trio.sleep(0.01)
    finally:
        release.set()
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    assert int((tmp_path / "agent.pid").read_text()) != first
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 2]


async def test_a_rerun_over_http_reproduces_a_completed_run_with_zero_upstream_calls(
    server_factory, providers, tmp_path, monkeypatch
):
    server = await server_factory(allow_process_agents=True)
    provider = providers(tool_loop_script(PLAN, final_text="settled"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    agent = await server.register_agent(definition(tmp_path, "anthropic-stream"))
    origin = await server.start_run(agent, "settle A-1")
    assert (await server.wait_resting(origin))["status"]["state"] == "completed"
    client = server.client
    # Refusals first: each answers the envelope and records nothing.
    refusals = [
        ({"replay_of": origin, "input": "other"}, 400, "bad_request"),
        ({"replay_of": 7}, 400, "bad_request"),
        ({"replay_of": "0b5c1a52-6a7e-4d0e-9a52-3f7c2a9e0d11"}, 404, "unknown_run"),
        ({}, 400, "bad_request"),
    ]
    for body, status, code in refusals:
        response = await client.post("/v1/runs", json=body)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), (
            response.text
        )
    (tmp_path / "broken").mkdir()
    broken_path = tmp_path / "broken" / "agent.py"
    broken_path.write_text("import sys\nsys.exit(4)\n")
    broken = await server.register_agent(
        f'kind = "process"\ncommand = {json.dumps([sys.executable, str(broken_path)])}\n'
    )
    failed = await server.start_run(broken, "x")
    assert (await server.wait_resting(failed))["status"]["state"] == "failed"
    response = await client.post("/v1/runs", json={"replay_of": failed})
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "wrong_state"
    assert response.json()["error"]["details"] == {"replay_of": failed, "state": "failed"}
    listed = len((await client.get("/v1/runs")).json()["runs"])

    response = await client.post(
        "/v1/runs", json={"replay_of": origin, "labels": {"check": "nightly"}}
    )
    assert response.status_code == 201, response.text
    assert response.json()["replay_of"] == origin
    rerun = response.json()["run"]
    body = await server.wait_resting(rerun)
    assert body["status"] == {
        "state": "completed",
        "output": {"reply": "settled", "exit_code": 0},
    }, body
    assert body["replay_of"] == origin
    assert provider.call_count == 3  # the origin's; the re-run made none
    assert len((await client.get("/v1/runs")).json()["runs"]) == listed + 1


async def test_a_process_agent_whose_mcp_server_program_is_missing_is_a_400_at_registration(
    server_factory, tmp_path
):
    server = await server_factory(allow_process_agents=True)
    text = definition(tmp_path, "openai").replace(
        "[env]",
        '[[mcp_servers]]\nname = "notes"\ncommand = "salvor-no-such-mcp-server --stdio"\n[env]',
        1,
    )
    response = await server.client.post(
        "/v1/agents", content=text, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_request"
    assert (
        "MCP server 'notes'" in error["message"]
        and "'salvor-no-such-mcp-server'" in error["message"]
    )
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}
