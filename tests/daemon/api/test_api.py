"""The control-plane API over real HTTP: every endpoint, status and error code.

Each test talks to the real daemon (``serve``: hypercorn, the routes, the
drivers, the store's writer thread) on a loopback port, over a real SQLite
file and, when ``SALVOR_TEST_POSTGRES_URL`` is set, a real PostgreSQL. The
model is the scripted provider; the tools are the demo registry's. A run's
crash state (an open write with no completion) is made the way a crash makes
it: the driver is cut mid-write by a daemon stop, and a new daemon opens the
same store.

Every refusal is checked for the one envelope, no traceback, and that the
store is exactly as it was.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import salvor
import trio
from salvor.daemon.tools._demo import demo_registry
from salvor.daemon.tools._registry import Tool
from salvor.protocol import Effect, ModelCallRequested, parse_instant

from tests.support.api import (
    APPROVAL_SCHEMA,
    FAR_WAKE,
    NOBODY,
    Gate,
    assert_error,
    get_run,
    list_entry,
    raw_sql,
    read_log_independently,
    register,
    rested,
    seed_run,
    snapshot,
)
from tests.support.api_server import Server, agent_toml
from tests.support.scripted_provider import ErrorReply, tool_loop_script

# -- agents ------------------------------------------------------------------------


async def test_agents_register_list_and_read_back(server: Server, providers):
    provider = providers(tool_loop_script([]))
    plain = agent_toml(provider.base_url, tools=["lookup_invoice"])
    response = await server.client.post(
        "/v1/agents", content=plain, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"agent", "created"} and body["created"] is True
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", body["agent"])
    anonymous = body["agent"]

    again = await server.client.post(
        "/v1/agents", content=plain, headers={"Content-Type": "application/toml"}
    )
    assert again.status_code == 201 and again.json() == {"agent": anonymous, "created": False}

    read = await server.client.get(f"/v1/agents/{anonymous}")
    assert read.status_code == 200
    assert read.json() == {
        "agent": anonymous,
        "format": "toml",
        "definition": plain,
        "kind": "builtin",
    }  # no `name` key at all

    # The same fields as JSON, with a display name: the name plays no part in the hash.
    fields = {
        "name": "support-triage",
        "model": "scripted-model",
        "system_prompt": "Triage.",
        "llm": {"provider": "anthropic", "base_url": provider.base_url, "max_retries": 0},
    }
    named_json = json.dumps(fields)
    response = await server.client.post(
        "/v1/agents", content=named_json, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 201 and response.json()["created"] is True
    named = response.json()["agent"]
    read = await server.client.get(f"/v1/agents/{named}")
    assert read.json() == {
        "agent": named,
        "format": "json",
        "definition": named_json,
        "name": "support-triage",
        "kind": "builtin",
    }
    # The same definition under another name: the same identity, renamed (its stored text is
    # the one that names it). One that names nothing leaves the name as it is.
    renamed = (
        'name = "billing desk"\nmodel = "scripted-model"\nsystem_prompt = "Triage."\n[llm]\n'
        f'provider = "anthropic"\nbase_url = "{provider.base_url}"\nmax_retries = 0\n'
    )
    response = await server.client.post(
        "/v1/agents", content=renamed, headers={"Content-Type": "application/toml"}
    )
    assert response.status_code == 201 and response.json() == {"agent": named, "created": False}
    unnamed = json.dumps({k: v for k, v in fields.items() if k != "name"})
    response = await server.client.post(
        "/v1/agents", content=unnamed, headers={"Content-Type": "application/json"}
    )
    assert response.json() == {"agent": named, "created": False}

    read = await server.client.get(f"/v1/agents/{named}")
    assert read.json() == {
        "agent": named,
        "format": "toml",
        "definition": renamed,
        "name": "billing desk",
        "kind": "builtin",
    }

    listing = (await server.client.get("/v1/agents")).json()
    assert set(listing) == {"agents"}
    assert listing["agents"] == [
        {"agent": anonymous},
        {"agent": named, "name": "billing desk"},
    ]  # still in the order they were first registered

    # A 64-character name is the longest allowed.
    response = await server.client.post(
        "/v1/agents",
        content=agent_toml(provider.base_url, name="n" * 64),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code == 201


async def test_an_unregistered_agent_is_404(server: Server):
    assert_error(await server.client.get("/v1/agents/sha256:" + "0" * 64), 404, "unknown_agent")
    assert_error(await server.client.get("/v1/agents/not-even-a-hash"), 404, "unknown_agent")


def _bad_definitions(base_url: str) -> list[tuple[str | None, bytes]]:
    good = agent_toml(base_url)
    toml = "application/toml"
    return [
        ("text/plain", good.encode()),
        (None, good.encode()),
        ("application/x-www-form-urlencoded", good.encode()),
        (toml, b"model = "),
        (toml, b"\xff\xfe not utf-8"),
        (toml, b""),
        (toml, (good + "\nsurprise = 1\n").encode()),
        (toml, b'model = "m"\n[[tools]]\nname = "no_such_tool"\n'),
        (toml, agent_toml(base_url, name="n" * 65).encode()),
        (toml, agent_toml(base_url, name="   ").encode()),
        (toml, agent_toml(base_url, name="").encode()),
        (toml, b'name = 3\nmodel = "m"\n'),
        (toml, b'system_prompt = "no model"\n'),
        (toml, b'model = "m"\nkind = "process"\n'),
        (toml, b'model = "m"\n[budgets]\ntokens = inf\n'),
        (toml, b"a = " + b"[" * 5000 + b"]" * 5000),
        ("application/json", b'{"model": "m",'),
        ("application/json", b"[]"),
        ("application/json", b'"model"'),
        ("application/json", b'{"model": "m", "system_prompt": "\\ud800"}'),
        ("application/json", b'{"model": "m", "budgets": {"tokens": Infinity}}'),
        ("application/json", b"[" * 5000 + b"]" * 5000),
    ]


async def test_agent_definitions_that_do_not_build_are_400_and_register_nothing(
    server: Server, providers
):
    provider = providers(tool_loop_script([]))
    for content_type, body in _bad_definitions(provider.base_url):
        headers = {"Content-Type": content_type} if content_type else {}
        response = await server.client.post("/v1/agents", content=body, headers=headers)
        if content_type in ("application/toml", "application/json"):
            assert_error(response, 400, "bad_request")
        else:  # sent as none of the definition's types (or as none at all)
            assert_error(response, 415, "unsupported_media_type")
    assert (await server.client.get("/v1/agents")).json() == {"agents": []}
    assert await snapshot(server) == ([], [])


# -- starting runs -----------------------------------------------------------------


async def test_a_201_means_the_head_is_durable_and_a_live_run_reports_its_driver(
    server: Server, providers
):
    gate = Gate()
    agent, provider = await register(server, providers, [], final_text="finished", on_call=gate)
    try:
        response = await server.client.post(
            "/v1/runs",
            json={
                "agent": agent,
                "input": {"invoice": "INV-1"},
                "labels": {"build": "42", "env": "prod"},
            },
        )
        assert response.status_code == 201
        body = response.json()
        assert set(body) == {"run", "status"} and body["status"] == "running"
        run_id = body["run"]
        assert str(uuid.UUID(run_id)) == run_id

        # Read straight from the store, over a connection of our own: the head is already there.
        log = await read_log_independently(server.store_url, run_id)
        assert log[0].seq == 0 and log[0].event.KIND.value == "RunStarted"
        assert log[0].event.input == {"invoice": "INV-1"} and log[0].event.labels == {
            "build": "42",
            "env": "prod",
        }
        assert log[0].event.agent_def_hash == agent

        # The driver is inside its first model call (held by the provider).
        await gate.wait_arrived()
        with trio.fail_after(10):
            while (live := await get_run(server, run_id))["status"]["state"] != "awaiting_model":
                await trio.sleep(0.01)
        assert live["driver"] == "attached"
        assert live["pending"]["kind"] == "model" and live["pending"]["seq"] == 1
        assert set(live["pending"]) == {"kind", "seq", "request_hash"}
        assert live["usage"] == {"input_tokens": 0, "output_tokens": 0}
        assert live["event_count"] == 2
        entry = await list_entry(server, run_id)
        assert entry["driver"] == "attached" and entry["status"] == {"state": "awaiting_model"}
        assert entry["step_count"] == 1 and entry["usage"] == {
            "input_tokens": 0,
            "output_tokens": 0,
        }
        assert (
            entry["labels"] == {"build": "42", "env": "prod"} and entry["agent_def_hash"] == agent
        )
    finally:
        gate.open.set()

    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "finished"}
    assert "driver" not in done and done["pending"] is None
    # What a listing's entry says of the run, beside its pending call (and no graph, no client).
    assert set(done) == {
        "run",
        "status",
        "event_count",
        "usage",
        "pending",
        "first_recorded_at",
        "last_recorded_at",
        "agent_def_hash",
        "labels",
    }
    assert done["agent_def_hash"] == agent and done["labels"] == {"build": "42", "env": "prod"}
    entry = await list_entry(server, run_id)
    assert "driver" not in entry
    assert entry["step_count"] == 1 and entry["usage"] == {"input_tokens": 10, "output_tokens": 5}
    assert provider.call_count == 1


async def test_a_chosen_run_id_is_used_and_a_second_start_under_it_is_run_exists(
    server: Server, providers
):
    agent, provider = await register(server, providers)
    chosen = "6F0C8A52-0D6E-4C1B-9A56-3F2A1B7C9D10"
    response = await server.client.post("/v1/runs", json={"agent": agent, "run_id": chosen})
    assert response.status_code == 201 and response.json()["run"] == chosen.lower()
    await server.wait_resting(chosen.lower())
    before = await snapshot(server)
    for run_id in (chosen, chosen.lower()):
        response = await server.client.post(
            "/v1/runs", json={"agent": agent, "run_id": run_id, "input": "again"}
        )
        assert_error(response, 409, "run_exists")
    assert await snapshot(server) == before
    assert provider.call_count == 1


async def test_start_refusals_create_nothing(server: Server, providers):
    agent, provider = await register(server, providers)
    before = await snapshot(server)
    too_many = {f"k{i}": "v" for i in range(17)}
    refusals = [
        ({"agent": agent, "labels": too_many}, 400, "bad_request"),
        ({"agent": agent, "labels": {"k" * 65: "v"}}, 400, "bad_request"),
        (
            {"agent": agent, "labels": {"é" * 33: "v"}},
            400,
            "bad_request",
        ),  # 66 bytes, 33 characters
        ({"agent": agent, "labels": {"k": "v" * 257}}, 400, "bad_request"),
        ({"agent": agent, "labels": {"k": "é" * 129}}, 400, "bad_request"),  # 258 bytes
        ({"agent": agent, "labels": {"": "v"}}, 400, "bad_request"),
        ({"agent": agent, "labels": {"k": 1}}, 400, "bad_request"),
        ({"agent": agent, "labels": ["k", "v"]}, 400, "bad_request"),
        ({"agent": "sha256:" + "0" * 64, "labels": too_many}, 400, "bad_request"),  # bounds first
        ({"agent": "sha256:" + "0" * 64}, 404, "unknown_agent"),
        ({"agent": 7}, 400, "bad_request"),
        ({"input": 1}, 400, "bad_request"),
        ({"agent": agent, "run_id": "not-a-uuid"}, 400, "bad_request"),
        ({"agent": agent, "run_id": 12}, 400, "bad_request"),
        ({"agent": agent, "surprise": True}, 400, "bad_request"),
    ]
    for body, status, code in refusals:
        assert_error(await server.client.post("/v1/runs", json=body), status, code)
    assert await snapshot(server) == before
    assert provider.call_count == 0

    # The bounds themselves are allowed: 16 labels, 64-byte keys, 256-byte values.
    at_bounds = {f"k{i:02}" + "x" * 61: "v" * 256 for i in range(16)}
    run_id, _ = await rested(server, agent, labels=at_bounds)
    assert (await list_entry(server, run_id))["labels"] == at_bounds


# -- reading runs -------------------------------------------------------------------


async def test_a_run_never_driven_reports_true_zeros_and_no_driver(server: Server, providers):
    agent, _ = await register(server, providers)
    fresh = await seed_run(server, agent)
    empty = await seed_run(server, agent, labels={})
    labelled = await seed_run(server, agent, labels={"env": "prod"})

    body = await get_run(server, fresh)
    assert body["status"] == {"state": "running"}
    assert body["event_count"] == 1 and body["pending"] is None
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert body["driver"] == "none"
    assert body["first_recorded_at"] == body["last_recorded_at"]

    listing = {e["run"]: e for e in (await server.client.get("/v1/runs")).json()["runs"]}
    entry = listing[fresh]
    assert entry == {
        "run": fresh,
        "status": {"state": "running"},
        "event_count": 1,
        "first_recorded_at": body["first_recorded_at"],
        "last_recorded_at": body["last_recorded_at"],
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "step_count": 0,
        "agent_def_hash": agent,
        "driver": "none",
    }
    assert "labels" not in listing[empty]  # an explicit {} is not asserted either
    assert listing[labelled]["labels"] == {"env": "prod"}
    # The run's own answer says the same of its labels.
    assert "labels" not in body and "labels" not in await get_run(server, empty)
    assert (await get_run(server, labelled))["labels"] == {"env": "prod"}


async def test_a_corrupt_runs_row_degrades_only_its_own_entry(server: Server, providers):
    agent, _ = await register(server, providers)
    good, _ = await rested(server, agent, labels={"k": "v"})
    bad, _ = await rested(server, agent, labels={"k": "v"})
    await raw_sql(
        server.store_url,
        "UPDATE runs SET status = :junk, labels = :junk WHERE run_id = :run_id",
        junk="{not json",
        run_id=bad,
    )

    response = await server.client.get("/v1/runs")
    assert response.status_code == 200
    listing = {e["run"]: e for e in response.json()["runs"]}
    assert set(listing[bad]) == {"run", "event_count", "first_recorded_at", "last_recorded_at"}
    assert listing[bad]["event_count"] == 4
    assert listing[good]["status"] == {"state": "completed", "output": "done"}
    assert listing[good]["labels"] == {"k": "v"} and listing[good]["step_count"] == 1
    # The degraded run is still a run: filters and pages skip or carry it, never fail.
    assert (await server.client.get("/v1/runs", params={"label": "k:v"})).json()["runs"] == [
        listing[good]
    ]
    page = await server.client.get("/v1/runs", params={"limit": 1})
    assert page.status_code == 200 and len(page.json()["runs"]) == 1


async def test_unknown_and_malformed_run_ids(server: Server):
    assert_error(await server.client.get(f"/v1/runs/{NOBODY}"), 404, "unknown_run")
    assert_error(await server.client.get(f"/v1/runs/{NOBODY}/replay"), 404, "unknown_run")
    assert_error(await server.client.get(f"/v1/runs/{NOBODY}/events"), 404, "unknown_run")
    for verb, body in (("resume", {}), ("resolve", {"output": 1}), ("abandon", {})):
        assert_error(
            await server.client.post(f"/v1/runs/{NOBODY}/{verb}", json=body), 404, "unknown_run"
        )
    for bad in ("not-a-uuid", "123", "6f0c8a52-0d6e-4c1b-9a56", "%20", NOBODY + "0"):
        for suffix in ("", "/replay", "/events"):
            assert_error(await server.client.get(f"/v1/runs/{bad}{suffix}"), 400, "bad_request")
        for verb in ("resume", "resolve", "abandon"):
            assert_error(
                await server.client.post(f"/v1/runs/{bad}/{verb}", json={"output": 1}),
                400,
                "bad_request",
            )
    assert await snapshot(server) == ([], [])


async def test_replay_is_the_fold_and_executes_nothing(server: Server, providers):
    agent, provider = await register(
        server, providers, [("lookup_invoice", {"invoice_id": "INV-7"})]
    )
    run_id, body = await rested(server, agent)
    response = await server.client.get(f"/v1/runs/{run_id}/replay")
    assert response.status_code == 200
    assert response.json() == {
        "status": {"state": "completed", "output": "done"},
        "usage": body["usage"],
        "next_seq": body["event_count"],
        "pending": None,
    }
    assert provider.call_count == 2
    assert (await get_run(server, run_id))["event_count"] == body["event_count"]


async def test_capabilities_name_this_build(server: Server):
    response = await server.client.get("/v1/capabilities")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"capabilities", "server"}
    assert isinstance(body["capabilities"], dict)
    assert body["server"]["version"] == salvor.__version__
    root = Path(salvor.daemon.__file__).resolve().parent.parent
    if (root / ".git").exists():
        commit = body["server"]["commit"]
        assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", commit)
        # A commit this checkout really has.
        await trio.run_process(
            ["git", "-C", str(root), "cat-file", "-e", commit.removesuffix("-dirty") + "^{commit}"]
        )
    else:
        assert "commit" not in body["server"]


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


# -- listing -----------------------------------------------------------------------------


async def test_listing_pages_filters_and_refuses_bad_queries(server: Server, providers):
    plain, _ = await register(server, providers)
    gate, _ = await register(server, providers, [("request_approval", {})])
    started: list[str] = []

    async def start(i: int) -> None:
        agent, batch = (gate, "gate") if i % 10 == 0 else (plain, "plain")
        started.append(await server.start_run(agent, i, labels={"batch": batch, "n": str(i)}))

    async with trio.open_nursery() as nursery:
        limiter = trio.CapacityLimiter(16)

        async def limited(i: int) -> None:
            async with limiter:
                await start(i)

        for i in range(250):
            nursery.start_soon(limited, i)

    with trio.fail_after(60):
        while True:
            runs = (await server.client.get("/v1/runs")).json()["runs"]
            states = [r["status"]["state"] for r in runs]
            if (
                states.count("completed") == 225
                and states.count("suspended") == 25
                and len(server.state.drivers) == 0
            ):
                break
            await trio.sleep(0.05)

    everything = (await server.client.get("/v1/runs")).json()
    assert "next_cursor" not in everything
    full = everything["runs"]
    assert sorted(r["run"] for r in full) == sorted(started)
    order = [(r["first_recorded_at"], r["run"]) for r in full]
    assert order == sorted(order, reverse=True)  # newest first, run id breaking ties

    pages, cursor = [], None
    while True:
        params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        body = (await server.client.get("/v1/runs", params=params)).json()
        pages.append(body["runs"])
        cursor = body.get("next_cursor")
        if cursor is None:
            break
        assert isinstance(cursor, str) and cursor
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [r["run"] for p in pages for r in p] == [r["run"] for r in full]

    suspended = (await server.client.get("/v1/runs", params={"status": "suspended"})).json()
    assert len(suspended["runs"]) == 25 and "next_cursor" not in suspended
    assert all(
        r["status"]["state"] == "suspended" and r["driver"] == "none" for r in suspended["runs"]
    )
    first = (
        await server.client.get("/v1/runs", params={"status": "completed", "limit": 200})
    ).json()
    rest = (
        await server.client.get(
            "/v1/runs", params={"status": "completed", "limit": 200, "cursor": first["next_cursor"]}
        )
    ).json()
    assert len(first["runs"]) == 200 and len(rest["runs"]) == 25 and "next_cursor" not in rest
    assert all("driver" not in r for r in first["runs"] + rest["runs"])
    assert (await server.client.get("/v1/runs", params={"status": "running"})).json() == {
        "runs": []
    }

    gates = (await server.client.get("/v1/runs", params={"label": "batch:gate"})).json()["runs"]
    assert len(gates) == 25 and all(r["labels"]["batch"] == "gate" for r in gates)
    paged = (
        await server.client.get("/v1/runs", params={"label": "batch:gate", "limit": 10})
    ).json()
    assert len(paged["runs"]) == 10 and "next_cursor" in paged
    one = (await server.client.get("/v1/runs", params={"label": "n:7"})).json()["runs"]
    assert [r["labels"] for r in one] == [{"batch": "plain", "n": "7"}]
    both = (
        await server.client.get("/v1/runs", params={"label": "batch:gate", "status": "completed"})
    ).json()
    assert both == {"runs": []}
    assert (await server.client.get("/v1/runs", params={"label": "batch:nope"})).json() == {
        "runs": []
    }
    assert (await server.client.get("/v1/runs", params={"label": "batch:"})).json() == {"runs": []}

    for params in (
        {"status": "bogus"},
        {"status": ""},
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "abc"},
        {"limit": "1001"},
        {"limit": "1.5"},
        {"label": "nocolon"},
        {"label": ":v"},
        {"cursor": "garbage"},
        {"cursor": "W10"},
        {"page": "2"},
    ):
        assert_error(await server.client.get("/v1/runs", params=params), 400, "bad_request")
