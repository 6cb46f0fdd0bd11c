"""Service agents under ``salvor serve``: the opt-in, and one live run per proxy port."""

from __future__ import annotations

import pytest
import trio

from tests.daemon.agents.test_process_agent import PLAN, SECRET
from tests.support.api import assert_error, snapshot
from tests.support.contract import Contract
from tests.support.scripted_provider import tool_loop_script
from tests.support.service_agents import free_port, service_definition, start_service


@pytest.fixture
def services(operator_declarations):
    """Start services; the test, as the operator, declares each one's origin
    (``--service-origin``)."""
    started = []

    def start(*args, **kwargs):
        service = start_service(*args, **kwargs)
        started.append(service)
        operator_declarations.service_origin(service.url)
        return service

    yield start
    for service in started:
        service.stop()


async def test_service_agents_over_http_need_the_operators_opt_in(server):
    response = await server.client.post(
        "/v1/agents",
        content=service_definition("http://127.0.0.1:8088/task", 4646),
        headers={"Content-Type": "application/toml"},
    )
    error = assert_error(response, 400, "bad_request")
    assert "--allow-process-agents" in error["message"] and "service agents" in error["message"]
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}


async def test_a_second_run_on_a_held_port_is_refused_and_recorded_nowhere(
    server_factory, providers, services, tmp_path, monkeypatch
):
    server = await server_factory(allow_process_agents=True)
    provider = providers(tool_loop_script(PLAN, final_text="settled"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    port = free_port()
    release = tmp_path / "release"
    service = services(
        tmp_path, "openai", f"http://127.0.0.1:{port}/v1", env={"RELEASE": str(release)}
    )
    agent = await server.register_agent(service_definition(service.url, port))
    first = await server.start_run(agent, "settle A-1")
    try:
        with trio.fail_after(20):
            while not service.entries("held"):
                await trio.sleep(0.01)
            # The proxy answers the agent before it records the completion: the snapshot waits
            # for that record, after which the held agent appends nothing until released.
            while (await server.client.get(f"/v1/runs/{first}")).json()["pending"] is not None:
                await trio.sleep(0.01)
        before = await snapshot(server)
        body = await Contract().call(
            server.client,
            "POST",
            "/v1/runs",
            expect=409,
            json={"agent": agent, "input": "settle B-2"},
        )
        assert body["error"]["code"] == "port_held"
        assert body["error"]["details"] == {"port": port, "run": first}
        assert str(port) in body["error"]["message"] and first in body["error"]["message"]
        assert await snapshot(server) == before
    finally:
        release.write_text("go")
    rested = await server.wait_resting(first)
    assert rested["status"]["state"] == "completed", rested
    assert rested["status"]["output"] == {"reply": "settled", "trigger_status": 200}
    # The port is free again once the run has ended.
    second = await server.start_run(agent, "settle A-1")
    assert (await server.wait_resting(second))["status"]["state"] == "completed"
