"""The contrib Python SDK and its example loop, against a real daemon.

The example agent (contrib/sdk/example/agent.py) drives a client-driven run:
the daemon performs its model calls (the scripted provider behind
SALVOR_MODEL_BASE_URL), the client performs its declared tool. It runs under
asyncio as a subprocess and under trio in-process, survives a daemon
restart in the middle of its drive, and never pays for a model call twice.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio
from salvor.daemon.client_runs._client_tools import load_declarations

from tests.support.scripted_provider import tool_loop_script

REPO = Path(__file__).resolve().parents[3]
SDK = REPO / "contrib" / "sdk"
sys.path.insert(0, str(SDK))

from example.agent import drive
from salvor_client import ClientRun, SalvorError

PLAN = [("lookup_order", {"order_id": "o-17"})]


@pytest.fixture
def declarations():
    return load_declarations([str(SDK / "example" / "lookup_order.toml")])


async def kinds(server, run_id: str) -> list[str]:
    log = (await server.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"]
    return [e["event"]["kind"] for e in log]


async def test_the_example_loop_runs_under_asyncio(
    server_factory, providers, declarations, monkeypatch
) -> None:
    provider = providers(tool_loop_script(PLAN, final_text="o-17 shipped with DHL"))
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    server = await server_factory(client_tools=declarations)
    result = await trio.run_process(
        [sys.executable, str(SDK / "example" / "agent.py"), server.url, "Where is order o-17?"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"reply": "o-17 shipped with DHL"}
    run_id = result.stderr.decode().split("run ", 1)[1].split()[0]
    assert await kinds(server, run_id) == [
        "RunStarted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "RunCompleted",
    ]
    assert provider.call_count == 2
    body = (await server.client.get(f"/v1/runs/{run_id}")).json()
    assert (
        body["status"]["state"] == "completed" and "driver" not in body
    )  # released on the way out


# Short, so the lease of a client that went away with its daemon lapses soon.
LEASE_TTL = 2.0


async def lease_lapsed(server, run_id: str) -> None:
    """Wait (bounded) until nothing drives the run: its lease lapsed."""
    with trio.fail_after(30):
        while (await server.client.get(f"/v1/runs/{run_id}")).json().get("driver") != "none":
            await trio.sleep(0.1)


async def test_a_daemon_restart_mid_drive_is_adopted_and_the_client_finishes(
    server_factory, providers, declarations, monkeypatch
) -> None:
    import example.agent as example

    provider = providers(tool_loop_script(PLAN, final_text="o-17 shipped"))
    monkeypatch.setenv("SALVOR_MODEL_BASE_URL", provider.base_url)
    first = await server_factory(client_tools=declarations, lease_ttl=LEASE_TTL)
    in_tool, stopped = trio.Event(), trio.Event()
    performed = []

    async def slow_lookup(tool_input, key):
        performed.append(key)
        if len(performed) == 1:
            in_tool.set()
            await stopped.wait()  # the daemon goes away while the client is inside its tool
        return {"status": "shipped"}

    monkeypatch.setattr(example, "lookup_order", slow_lookup)

    async def first_drive() -> None:
        with pytest.raises(Exception):  # noqa: B017 -- whichever transport error the vanished daemon gives
            await drive(first.url, "Where is o-17?", model="scripted-model")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_drive)
        await in_tool.wait()
        run_id = (await first.client.get("/v1/runs")).json()["runs"][0]["run"]
        await first.stop()
        stopped.set()
    second = await server_factory(client_tools=declarations, lease_ttl=LEASE_TTL)
    # The vanished client's lease is in the store, so the restarted daemon holds the run for it
    # until it lapses: then the client's next drive adopts the run.
    await lease_lapsed(second, run_id)
    output = await drive(second.url, "Where is o-17?", run_id, model="scripted-model")
    assert output == {"reply": "o-17 shipped"}
    # The first model call was answered from the log; the tool ran again under the same derived key.
    assert provider.call_count == 2 and sorted(provider.count_by_request_hash().values()) == [1, 1]
    assert len(performed) == 2 and performed[0] == performed[1]
    assert (await kinds(second, run_id))[-1] == "RunCompleted"


async def test_two_drivers_one_lease(server, declarations) -> None:
    async with ClientRun(server.url) as one:
        await one.start(agent="sha256:" + "1" * 64, input="x")
        other = ClientRun(server.url, run_id=one.run_id)
        with pytest.raises(SalvorError) as caught:
            await other.open()
        assert caught.value.code == "lease_held" and caught.value.details["lapses_in_seconds"] >= 1
        await other.__aexit__(None, None, None)
        assert await one.heartbeat() >= 1
        await one.complete("done")
    # Released on exit: a new driver opens at once and rebuilds its cursor from the log.
    async with ClientRun(server.url, run_id=one.run_id) as again:
        assert [e["event"]["kind"] for e in again.log] == ["RunStarted", "RunCompleted"]
