"""A run cut inside a write, over real HTTP: its resume is ``needs_reconciliation``, ``resolve``
drives past the write, and ``abandon`` retires the run once, naming the write.

A run's crash state (an open write with no completion) is made the way a crash makes it: the
driver is cut mid-write by a daemon stop, and a new daemon opens the same store (a real SQLite
file and, when ``SALVOR_TEST_POSTGRES_URL`` is set, a real PostgreSQL). Every refusal is checked
for the one envelope, no traceback, and that the store is exactly as it was.
"""

from __future__ import annotations

from typing import Any

import trio
from salvor.daemon.tools._demo import demo_registry
from salvor.daemon.tools._registry import Tool
from salvor.protocol import Effect, ModelCallRequested

from tests.support.api import (
    FAR_WAKE,
    assert_error,
    get_run,
    list_entry,
    read_log_independently,
    register,
    rested,
    seed_run,
    snapshot,
)
from tests.support.api_server import Server

# -- reconciliation: resolve, and abandon ------------------------------------------


def _registry_with_a_charge(executions: list) -> Any:
    """The demo tools plus ``charge``, a write that hangs once it has
    acted (until the daemon stops)."""
    registry = demo_registry()

    async def charge(args: dict, call) -> dict:
        executions.append(args)
        await trio.sleep_forever()

    registry.register(
        Tool(
            name="charge",
            description="Charge a card. Moves money.",
            effect=Effect.WRITE,
            input_schema={"type": "object", "properties": {"amount": {"type": "integer"}}},
            handler=charge,
        )
    )
    return registry


async def _a_run_cut_mid_write(server_factory, providers) -> tuple[Server, str, str, Any, list]:
    """Drive a run into a write, stop the daemon mid-write, start a new one over the store."""
    executions: list = []
    registry = _registry_with_a_charge(executions)
    first = await server_factory(registry=registry)
    agent, provider = await register(
        first, providers, [("charge", {"amount": 10})], final_text="charged"
    )
    run_id = await first.start_run(agent, "charge it")
    with trio.fail_after(10):
        while not executions:
            await trio.sleep(0.01)
    live = await get_run(first, run_id)
    # An open write is a question only a person can answer, even while its driver runs.
    assert live["status"] == {"state": "needs_reconciliation"} and live["driver"] == "attached"
    await first.stop()
    second = await server_factory(registry=registry)
    return second, agent, run_id, provider, executions


async def test_resume_of_an_open_write_is_needs_reconciliation_and_resolve_drives_past_it(
    server_factory, providers
):
    server, _, run_id, provider, executions = await _a_run_cut_mid_write(server_factory, providers)
    log = await read_log_independently(server.store_url, run_id)
    intent = log[-1]
    assert intent.event.KIND.value == "ToolCallRequested"

    body = await get_run(server, run_id)
    assert body["status"] == {"state": "needs_reconciliation"} and body["driver"] == "none"
    assert body["pending"] == {
        "kind": "tool",
        "seq": intent.seq,
        "tool": "charge",
        "input": {"amount": 10},
        "effect": "write",
        "idempotency_key": None,
    }
    replay = (await server.client.get(f"/v1/runs/{run_id}/replay")).json()
    assert (
        replay["status"] == {"state": "needs_reconciliation"}
        and replay["pending"] == body["pending"]
    )

    before = await snapshot(server)
    for payload in ({}, {"input": {"approved": True}}):
        error = assert_error(
            await server.client.post(f"/v1/runs/{run_id}/resume", json=payload),
            409,
            "needs_reconciliation",
        )
        assert error["details"] == {
            "intent": {**body["pending"], "recorded_at": intent.recorded_at}
        }
    for bad in ({}, {"output": 1, "extra": 2}, [1]):
        assert_error(
            await server.client.post(f"/v1/runs/{run_id}/resolve", json=bad), 400, "bad_request"
        )
    assert await snapshot(server) == before
    assert len(executions) == 1

    response = await server.client.post(
        f"/v1/runs/{run_id}/resolve", json={"output": {"charge_id": "ch_by_hand"}}
    )
    assert response.status_code == 200
    assert response.json() == {"run": run_id, "resolved": True, "status": {"state": "running"}}
    # The resolve settled the write the run was parked on, so the daemon drives it on by itself:
    # no resume, no restart, and the write is never performed again.
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "charged"}
    log = await read_log_independently(server.store_url, run_id)
    resolved = log[intent.seq + 1].event
    assert resolved.KIND.value == "ToolCallCompleted" and resolved.settled_by == "operator"
    assert resolved.output == {"charge_id": "ch_by_hand"}
    assert len(executions) == 1
    assert provider.call_count == 2
    # A caller that resumes after its resolve (as it had to before) is told the run finished.
    response = await server.client.post(f"/v1/runs/{run_id}/resume")
    assert response.status_code == 200 and response.json()["outcome"] == "completed"
    assert_error(
        await server.client.post(f"/v1/runs/{run_id}/resolve", json={"output": 2}),
        409,
        "wrong_state",
    )


async def test_a_write_resolved_while_its_call_still_hangs_is_driven_on_once_it_returns(
    server_factory, providers
):
    """The person records the write's outcome while this daemon's own call is still out; when
    that call comes back its completion loses to the person's, and the run goes on from the
    recorded output: the write was performed once, and the run is not left without a driver."""
    executions: list = []
    answered = trio.Event()
    registry = demo_registry()

    async def charge(args: dict, call) -> dict:
        executions.append(args)
        await answered.wait()
        return {"charge_id": "ch_late"}

    registry.register(
        Tool(
            name="charge",
            description="Charge a card. Moves money.",
            effect=Effect.WRITE,
            input_schema={"type": "object", "properties": {"amount": {"type": "integer"}}},
            handler=charge,
        )
    )
    server = await server_factory(registry=registry)
    agent, provider = await register(
        server, providers, [("charge", {"amount": 10})], final_text="charged"
    )
    run_id = await server.start_run(agent, "charge it")
    with trio.fail_after(10):
        while not executions:
            await trio.sleep(0.01)
    live = await get_run(server, run_id)
    assert live["status"] == {"state": "needs_reconciliation"} and live["driver"] == "attached"
    response = await server.client.post(
        f"/v1/runs/{run_id}/resolve", json={"output": {"charge_id": "ch_by_hand"}}
    )
    assert response.status_code == 200, response.text
    answered.set()
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "charged"}
    assert len(executions) == 1
    log = await read_log_independently(server.store_url, run_id)
    completions = [e.event for e in log if e.event.KIND.value == "ToolCallCompleted"]
    assert [(c.output, c.settled_by) for c in completions] == [
        ({"charge_id": "ch_by_hand"}, "operator")
    ]
    assert provider.call_count == 2


async def test_abandon_an_open_write_names_it(server_factory, providers):
    server, _, run_id, _, _ = await _a_run_cut_mid_write(server_factory, providers)
    intent_seq = (await get_run(server, run_id))["pending"]["seq"]
    response = await server.client.post(f"/v1/runs/{run_id}/abandon")
    assert response.status_code == 200
    assert response.json() == {
        "run": run_id,
        "abandoned": True,
        "appended_seq": intent_seq + 1,
        "status": {"state": "abandoned", "unresolved_write": {"seq": intent_seq, "tool": "charge"}},
    }
    body = await get_run(server, run_id)
    assert body["status"]["state"] == "abandoned" and "driver" not in body
    assert "driver" not in await list_entry(server, run_id)


async def test_resolve_needs_a_dangling_write(server: Server, providers):
    agent, _ = await register(server, providers, [("request_approval", {})])
    suspended, _ = await rested(server, agent)
    interrupted = await seed_run(server, agent)
    model_open = await seed_run(
        server, agent, ModelCallRequested(request_hash="sha256:" + "0" * 64)
    )
    before = await snapshot(server)
    for run_id in (suspended, interrupted):
        assert_error(
            await server.client.post(f"/v1/runs/{run_id}/resolve", json={"output": 1}),
            409,
            "wrong_state",
        )
    assert_error(
        await server.client.post(f"/v1/runs/{model_open}/resolve", json={"output": None}),
        409,
        "wrong_state",
    )
    assert await snapshot(server) == before


async def test_abandon_retires_a_run_once(server: Server, providers):
    gate_agent, _ = await register(server, providers, [("request_approval", {})])
    plain_agent, _ = await register(server, providers)
    sleeping_agent, _ = await register(server, providers, [("wait_until", {"wake_at": FAR_WAKE})])

    suspended, body = await rested(server, gate_agent)
    response = await server.client.post(
        f"/v1/runs/{suspended}/abandon", json={"reason": "customer withdrew"}
    )
    assert response.status_code == 200
    assert response.json() == {
        "run": suspended,
        "abandoned": True,
        "appended_seq": body["event_count"],
        "status": {"state": "abandoned", "reason": "customer withdrew"},
    }
    after = await get_run(server, suspended)
    assert (
        after["status"] == {"state": "abandoned", "reason": "customer withdrew"}
        and "driver" not in after
    )
    assert after["event_count"] == body["event_count"] + 1

    sleeping, _ = await rested(server, sleeping_agent)
    response = await server.client.post(f"/v1/runs/{sleeping}/abandon", content=b"")
    assert response.status_code == 200 and response.json()["status"] == {"state": "abandoned"}

    interrupted = await seed_run(server, plain_agent)
    response = await server.client.post(f"/v1/runs/{interrupted}/abandon", json={})
    assert response.status_code == 200 and response.json()["appended_seq"] == 1

    completed, _ = await rested(server, plain_agent)
    before = await snapshot(server)
    for run_id in (suspended, sleeping, interrupted, completed):
        assert_error(
            await server.client.post(f"/v1/runs/{run_id}/abandon", json={"reason": "again"}),
            409,
            "wrong_state",
        )
    assert await snapshot(server) == before
    suspended_again, _ = await rested(server, gate_agent)
    before = await snapshot(server)
    for bad in ({"reason": 5}, {"reason": "x", "force": True}, [], {"why": "no"}):
        assert_error(
            await server.client.post(f"/v1/runs/{suspended_again}/abandon", json=bad),
            400,
            "bad_request",
        )
    assert await snapshot(server) == before
    # Abandoned is terminal: a resume reports it and leaves it alone.
    response = await server.client.post(
        f"/v1/runs/{suspended}/resume", json={"input": {"approved": True}}
    )
    assert response.status_code == 200 and response.json()["outcome"] == "abandoned"
