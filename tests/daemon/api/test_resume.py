"""``POST /v1/runs/{id}/resume`` over real HTTP: a gate's input, a signal wait, a budget's
extension, a sleep before and after its instant, an interrupted run, and the refusals.

Each test talks to the real daemon (``serve``) on a loopback port, over a real SQLite file and,
when ``SALVOR_TEST_POSTGRES_URL`` is set, a real PostgreSQL; the model is the scripted provider.
Every refusal is checked for the one envelope, no traceback, and that the store is exactly as it
was.
"""

from __future__ import annotations

import trio
from salvor.protocol import parse_instant

from tests.support.api import (
    APPROVAL_SCHEMA,
    FAR_WAKE,
    assert_error,
    get_run,
    read_log_independently,
    register,
    rested,
    seed_run,
    snapshot,
)
from tests.support.api_server import Server
from tests.support.scripted_provider import ErrorReply

# -- resume ---------------------------------------------------------------------------


async def test_resume_a_gate_needs_a_conforming_input(server: Server, providers):
    agent, provider = await register(
        server,
        providers,
        [("request_approval", {"reason": "refund over 100"})],
        final_text="approved",
    )
    run_id, body = await rested(server, agent)
    assert body["status"] == {
        "state": "suspended",
        "reason": "refund over 100",
        "input_schema": APPROVAL_SCHEMA,
    }
    assert body["driver"] == "none"
    before = await snapshot(server)
    refusals = [
        None,
        b"",
        {},
        {"input": None},
        {"input": {"approved": "yes"}},
        {"input": {}},
        {"input": "ok"},
    ]
    for payload in refusals:
        if payload is None:
            response = await server.client.post(f"/v1/runs/{run_id}/resume")
        elif isinstance(payload, bytes):
            response = await server.client.post(f"/v1/runs/{run_id}/resume", content=payload)
        else:
            response = await server.client.post(f"/v1/runs/{run_id}/resume", json=payload)
        assert_error(response, 400, "bad_request")
    assert await snapshot(server) == before
    assert provider.call_count == 1

    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
    )
    assert response.status_code == 202
    assert response.json() == {"run": run_id, "status": "running", "outcome": "driving"}
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "approved"}

    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
    )
    assert response.status_code == 200
    assert response.json() == {"run": run_id, "outcome": "completed", "status": done["status"]}
    assert provider.call_count == 2
    assert (await get_run(server, run_id))["event_count"] == done["event_count"]


async def test_a_signal_wait_says_so(server: Server, providers):
    agent, _ = await register(
        server, providers, [("request_approval", {"reason": "webhook", "signal": True})]
    )
    _, body = await rested(server, agent)
    assert body["status"] == {
        "state": "suspended",
        "reason": "webhook",
        "input_schema": APPROVAL_SCHEMA,
        "kind": "signal",
    }


async def test_resume_over_budget_needs_an_extension(server: Server, providers):
    plan = [("lookup_invoice", {"invoice_id": f"INV-{i}"}) for i in range(2)]
    agent, provider = await register(
        server, providers, plan, final_text="all looked up", extra="[budgets]\nsteps = 1\n"
    )
    run_id, body = await rested(server, agent)
    assert body["status"] == {
        "state": "budget_exceeded",
        "budget": {"kind": "steps", "limit": 1},
        "observed": 1,
    }
    assert body["driver"] == "none"
    before = await snapshot(server)
    for payload in (
        {},
        {"input": None},
        {"input": {}},
        {"input": {"extend_by": 0}},
        {"input": {"extend_by": -1}},
        {"input": {"extend_by": 1, "x": 1}},
        {"input": "more"},
    ):
        assert_error(
            await server.client.post(f"/v1/runs/{run_id}/resume", json=payload), 400, "bad_request"
        )
    assert await snapshot(server) == before

    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"extend_by": 5}}
    )
    assert response.status_code == 202 and response.json()["outcome"] == "driving"
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "all looked up"}
    assert provider.call_count == 3


async def test_resume_before_the_wake_instant_is_still_sleeping(server: Server, providers):
    agent, provider = await register(server, providers, [("wait_until", {"wake_at": FAR_WAKE})])
    run_id, body = await rested(server, agent)
    status = body["status"]
    assert set(status) == {"state", "wake_at"} and status["state"] == "sleeping"
    assert parse_instant(status["wake_at"]) == parse_instant(FAR_WAKE)
    assert body["driver"] == "none"
    before = await snapshot(server)

    for payload in ({}, {"input": {"approved": True}}):
        response = await server.client.post(f"/v1/runs/{run_id}/resume", json=payload)
        error = assert_error(response, 409, "still_sleeping")
        details = error["details"]
        assert set(details) == {"wake_at", "remaining_seconds"}
        assert details["wake_at"] == status["wake_at"]
        assert isinstance(details["remaining_seconds"], int)
        expected = (
            parse_instant(FAR_WAKE) - parse_instant(body["last_recorded_at"])
        ).total_seconds()
        assert -1 < expected - details["remaining_seconds"] < 600
    assert await snapshot(server) == before
    assert provider.call_count == 1
    assert "driver" in await get_run(server, run_id)


async def test_resume_after_the_wake_instant_wakes_the_run(server: Server, providers):
    agent, provider = await register(
        server, providers, [("wait_until", {"seconds": 0.3})], final_text="woke"
    )
    run_id, body = await rested(server, agent)
    assert body["status"]["state"] == "sleeping"
    wake_at = parse_instant(body["status"]["wake_at"])
    with trio.fail_after(30):  # the instant passes; the view says so
        while "overdue" not in (late := await get_run(server, run_id))["status"]:
            await trio.sleep(0.01)
    assert late["status"]["overdue"] is True and isinstance(late["status"]["overdue_seconds"], int)
    assert parse_instant(late["status"]["wake_at"]) == wake_at

    response = await server.client.post(f"/v1/runs/{run_id}/resume")
    assert response.status_code == 202 and response.json()["outcome"] == "driving"
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "woke"}
    assert provider.call_count == 2


async def test_resume_recovers_an_interrupted_run_and_ignores_an_input(server: Server, providers):
    agent, provider = await register(
        server, providers, [("lookup_invoice", {"invoice_id": "INV-3"})]
    )
    run_id = await seed_run(server, agent)  # a daemon died right after recording the head
    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"ignored": True}}
    )
    assert response.status_code == 202
    assert response.json() == {"run": run_id, "status": "running", "outcome": "driving"}
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "done"}
    kinds = [e.event.KIND.value for e in await read_log_independently(server.store_url, run_id)]
    assert "Resumed" not in kinds
    assert provider.call_count == 2


async def test_resume_refusals_and_finished_runs(server: Server, providers):
    agent, _ = await register(server, providers)
    failing, _ = await register(
        server, providers, script=lambda call: ErrorReply(400, "model not found")
    )
    orphan = await seed_run(server, "sha256:" + "0" * 64)
    client_run = await seed_run(server, agent, driven_by="client")
    before = await snapshot(server)
    assert_error(await server.client.post(f"/v1/runs/{orphan}/resume"), 404, "unknown_agent")
    error = assert_error(
        await server.client.post(f"/v1/runs/{client_run}/resume"), 409, "client_driven_run"
    )
    assert "details" not in error
    assert await snapshot(server) == before

    failed, body = await rested(server, failing)
    assert body["status"]["state"] == "failed" and "model not found" in body["status"]["error"]
    assert "driver" not in body
    response = await server.client.post(f"/v1/runs/{failed}/resume")
    assert response.status_code == 200
    assert response.json() == {"run": failed, "outcome": "failed", "status": body["status"]}

    completed, _ = await rested(server, agent)
    # A finished run is reported, never driven again.
    response = await server.client.post(f"/v1/runs/{completed}/resume", json={"input": 1})
    assert response.status_code == 200 and response.json()["outcome"] == "completed"
