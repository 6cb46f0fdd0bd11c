"""The reconciliation queue over HTTP (``GET /v1/reconciliations``) and the operator's
``not_landed`` resolve, on a real daemon over a real store (SQLite, and PostgreSQL when set).

The parked runs are real: a built-in run killed inside its write by the CLI
(``SALVOR_FAULT_KILL_IN_TOOL``), and a client-driven run whose client recorded the intent of a
write its declaration does not let it complete. Every answer is validated against the document.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import trio
from salvor.daemon.client_runs import load_declarations
from salvor.daemon.tools._demo import EFFECTS_ENV, EffectLedger, demo_registry
from salvor.daemon.tools._registry import ToolRegistry
from salvor.protocol import TOOL_ERROR_KEY, EventKind

from tests.support.api import (
    assert_error,
    killed_in_a_write,
    read_log_independently,
    snapshot,
)
from tests.support.api_server import TOKEN
from tests.support.client_events import run_started
from tests.support.contract import MISSING_RUN, Contract
from tests.support.spawn import run_salvor

PAYOUT = """
name = "payout"
effect = "write"
idempotency_key = ["payout_ref"]
require_equal = ["amount"]
[input_schema]
type = "object"
required = ["amount", "payout_ref"]
[output_schema]
type = "object"
required = ["payout_id"]
"""
QUEUE = "/v1/reconciliations"
CLIENT_AGENT = "sha256:" + "c" * 64
RESOLVE = "/v1/runs/{run_id}/resolve"


async def client_write_parked(api, contract: Contract) -> str:
    """A client-driven run whose client recorded a payout's intent and may not complete it."""
    opened = await contract.call(api, "POST", "/v1/client-runs", expect=201)
    run_id, token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    head = run_started(run_id, CLIENT_AGENT, {"desk": "pay"})
    await contract.call(
        api,
        "POST",
        "/v1/client-runs/{run_id}/events",
        expect=200,
        run_id=run_id,
        headers=token,
        json={"events": [head]},
    )
    await contract.call(
        api,
        "POST",
        "/v1/client-runs/{run_id}/client-tool-intent",
        expect=200,
        run_id=run_id,
        headers=token,
        json={"seq": 1, "tool": "payout", "input": {"amount": 70, "payout_ref": "po-1"}},
    )
    return run_id


def unprobed_demo_tools() -> ToolRegistry:
    """The demo tools with ``issue_refund`` declaring no probe: a daemon with these never
    settles a parked refund by itself (its takeover sweep recovers a dead CLI's run parked on a
    write only to probe it), so the runs a test parks stay parked until it acts."""
    tools = [demo_registry().get(name) for name in demo_registry().names()]
    return ToolRegistry(
        [replace(tool, probe=None) if tool.name == "issue_refund" else tool for tool in tools]
    )


async def test_the_queue_lists_exactly_the_parked_runs_oldest_first(
    server_factory, store_url, tmp_path
) -> None:
    payout = tmp_path / "payout.toml"
    payout.write_text(PAYOUT)
    server = await server_factory(
        auth_token=TOKEN,
        client_tools=load_declarations([str(payout)]),
        registry=unprobed_demo_tools(),
    )
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call

    first = await killed_in_a_write(store_url, tmp_path, "INV-5", {"invoice": "INV-5"})
    client = await client_write_parked(api, contract)
    # Not parked: a run that completed, and one parked then resolved.
    resolved = await killed_in_a_write(store_url, tmp_path, "INV-6", {"invoice": "INV-6"})
    await call(api, "POST", RESOLVE, expect=200, run_id=resolved, json={"output": {"ok": 1}})
    # The daemon drives the resolved run on by itself; it leaves the queue for good once it rests.
    assert (await server.wait_resting(resolved))["status"]["state"] == "completed"

    queue = await call(api, "GET", QUEUE, expect=200)
    assert "next_cursor" not in queue
    items = queue["reconciliations"]
    assert [item["run"] for item in items] == [first, client]

    built_in, by_client = items
    # The intent as the run's status shows its pending call.
    parked = await call(api, "GET", "/v1/runs/{run_id}", expect=200, run_id=first)
    assert built_in["intent"] == {**parked["pending"], "recorded_at": parked["last_recorded_at"]}
    listed = {e["run"]: e for e in (await call(api, "GET", "/v1/runs", expect=200))["runs"]}
    assert built_in == {
        "run": first,
        "agent": listed[first]["agent_def_hash"],
        "labels": {"invoice": "INV-5"},
        "parked_since": built_in["intent"]["recorded_at"],
        "intent": built_in["intent"],
        "idempotency_key": built_in["intent"]["idempotency_key"],
        "probe": None,
        "resolve": {
            "path": f"/v1/runs/{first}/resolve",
            "performed_by": "salvor",
            "output_schema": None,
            "require_equal": {},
        },
    }
    assert built_in["intent"]["tool"] == "issue_refund"
    assert built_in["intent"]["input"]["invoice_id"] == "INV-5"
    run = await call(api, "GET", "/v1/runs/{run_id}", expect=200, run_id=client)
    assert by_client["intent"] == {
        **run["pending"],
        "recorded_at": run["last_recorded_at"],
    }
    assert by_client["parked_since"] == run["last_recorded_at"] > built_in["parked_since"]
    assert by_client["idempotency_key"] == run["pending"]["idempotency_key"] is not None
    assert (by_client["labels"], by_client["agent"]) == ({"desk": "pay"}, CLIENT_AGENT)
    assert by_client["resolve"] == {
        "path": f"/v1/runs/{client}/resolve",
        "performed_by": "client",
        "output_schema": {"type": "object", "required": ["payout_id"]},
        "require_equal": {"amount": 70},
    }

    # -- paging, as GET /v1/runs pages ------------------------------------------------------------
    page = await call(api, "GET", QUEUE, expect=200, params={"limit": "1"})
    assert [item["run"] for item in page["reconciliations"]] == [first]
    rest = await call(
        api, "GET", QUEUE, expect=200, params={"limit": "1", "cursor": page["next_cursor"]}
    )
    assert [item["run"] for item in rest["reconciliations"]] == [client]
    assert "next_cursor" not in rest

    # -- refusals: the one envelope, nothing changed ----------------------------------------------
    before = await snapshot(server)
    for params in (
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "two"},
        {"cursor": "not-a-cursor"},
        {"status": "needs_reconciliation"},
    ):
        response = await api.get(QUEUE, params=params)
        assert_error(response, 400, "bad_request")
        await call(api, "GET", QUEUE, expect=400, params=params)
    assert_error(await server.new_client().get(QUEUE), 401, "unauthorized")
    assert await snapshot(server) == before


async def test_an_http_resolve_records_that_a_write_did_not_land(
    server_factory, store_url, tmp_path
) -> None:
    server = await server_factory()
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    dangling = await killed_in_a_write(store_url, tmp_path, "INV-7", {"invoice": "INV-7"})
    pending = (await call(api, "GET", "/v1/runs/{run_id}", run_id=dangling))["pending"]

    before = await snapshot(server)
    for body in ({}, {"not_landed": True, "output": {}}, {"not_landed": False}, {"not_landed": 1}):
        response = await api.post(f"/v1/runs/{dangling}/resolve", json=body)
        assert_error(response, 400, "bad_request")
    await call(api, "POST", RESOLVE, expect=404, run_id=MISSING_RUN, json={"not_landed": True})
    assert await snapshot(server) == before

    answer = await call(
        api, "POST", RESOLVE, expect=200, run_id=dangling, json={"not_landed": True}
    )
    assert answer["resolved"] is True and answer["status"]["state"] != "needs_reconciliation"
    # The daemon drives it on (the model is told the refund did not happen) to where it rests.
    assert (await server.wait_resting(dangling))["status"]["state"] == "completed"
    completion = (await read_log_independently(store_url, dangling))[pending["seq"] + 1].event
    assert completion.KIND is EventKind.TOOL_CALL_COMPLETED
    assert (completion.seq, completion.settled_by) == (pending["seq"], "operator")
    error = completion.output[TOOL_ERROR_KEY]
    assert error["kind"] == "not_landed" and "did not happen" in error["message"]
    assert (await call(api, "GET", QUEUE, expect=200))["reconciliations"] == []
    refused = await call(
        api, "POST", RESOLVE, expect=409, run_id=dangling, json={"not_landed": True}
    )
    assert refused["error"]["code"] == "wrong_state"


async def test_a_resolved_run_is_driven_on_at_once_and_its_write_is_never_performed_again(
    server_factory, store_url, tmp_path, monkeypatch
) -> None:
    """Resolving never leaves a run `running` with no driver: a resolve over HTTP is followed by
    the served daemon's own drive, and a resolve from a shell (no daemon) by the next start's."""
    ledger = EffectLedger(str(tmp_path / "effects.jsonl"))
    monkeypatch.setenv(EFFECTS_ENV, str(tmp_path / "effects.jsonl"))
    # Killed after the bank was sent each refund and before it answered: their probe cannot tell.
    offline, served = [
        await killed_in_a_write(store_url, tmp_path, invoice, kill_in="issue_refund:sent")
        for invoice in ("INV-8", "INV-9")
    ]
    resolve = functools.partial(
        run_salvor,
        ["resolve", offline, "--store", store_url, "--output", '{"refund_id": "rf_by_hand"}'],
        capture_output=True,
        text=True,
    )
    by_shell = await trio.to_thread.run_sync(resolve)
    assert by_shell.returncode == 0, by_shell
    # It says what takes the run on: a resume, or the next start of a daemon on this store.
    assert f"`salvor resume {offline}`" in by_shell.stdout and "next starts" in by_shell.stdout

    server = await server_factory()
    api, contract = server.client, await Contract.served(server.client)
    # The start drives the one the shell resolved; the other is parked by its probe.
    assert (await server.wait_resting(offline))["status"]["state"] == "completed"
    parked = await server.wait_resting(served)
    assert parked["status"] == {"state": "needs_reconciliation"} and parked["driver"] == "none"
    queue = await contract.call(api, "GET", QUEUE, expect=200)
    assert [item["run"] for item in queue["reconciliations"]] == [served]

    answer = await contract.call(
        api, "POST", RESOLVE, expect=200, run_id=served, json={"output": {"refund_id": "rf_2"}}
    )
    assert answer["status"] == {"state": "running"}
    # No resume, no restart: this daemon drives it on to the end.
    done = await server.wait_resting(served)
    assert done["status"]["state"] == "completed" and "driver" not in done
    assert (await contract.call(api, "GET", QUEUE, expect=200))["reconciliations"] == []
    for run_id in (offline, served):
        log = await read_log_independently(store_url, run_id)
        settled = [e.event for e in log if getattr(e.event, "settled_by", None) == "operator"]
        assert len(settled) == 1, run_id
    # Each refund was sent to the bank once, and neither was sent again after its resolve.
    sent = [r["input"]["invoice_id"] for r in await ledger.records("issue_refund:sent")]
    assert sorted(sent) == ["INV-8", "INV-9"]
    assert await ledger.records("issue_refund") == []
