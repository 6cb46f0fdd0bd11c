"""The OpenAPI document is true of real answers.

A real daemon (``serve`` in-process on a loopback port, with a bearer token, over SQLite) is
driven through every endpoint, into every run state the demo tools reach and every refusal a
client can provoke; each JSON body is validated (JSON Schema 2020-12, ``$ref``\\ s resolved into
the document) against the schema documented for its path, method and status, and each stream
frame against ``Envelope`` or ``EndFrame``. An answer with an undocumented status fails, and so
does a documented status no request reached (only 500 and 408 are exempt).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from salvor.daemon.api._app import API_OPERATIONS
from salvor.daemon.api._openapi import openapi_document
from salvor.daemon.tools._demo import demo_registry
from salvor.daemon.tools._registry import SleepUntil, Tool, ToolRegistry
from salvor.protocol import Effect

from tests.support.api import killed_in_a_write
from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY
from tests.support.contract import (
    CHILD_PATHS,
    CLIENT_PERFORMED_PATHS,
    DOCUMENT,
    FLOW_PATHS,
    FORK_PATHS,
    GATED,
    GRAPH_PATHS,
    GRAPH_RUN_PATHS,
    METRICS_PATHS,
    MISSING_RUN,
    OVERSIZED,
    REFUND_DESK,
    SESSION_PATHS,
    SETTINGS_PATHS,
    STEP_PATHS,
    UPLOAD_PATHS,
    Contract,
    below_the_free_space_floor,
)

# SQLite alone (tests/support/backends.py): what it tests is the document against the answers,
# which the handlers build the same way over either backend (tests/daemon/api/test_api keeps both).
STORE_BACKENDS = SQLITE_ONLY

NAPPER = (
    'model = "demo-planner"\nsystem_prompt = "Nap."\n[llm]\nprovider = "demo"\n[[tools]]\n'
    'name = "nap"\n'
)
TIGHT = (
    'model = "demo-planner"\nsystem_prompt = "Look."\n[llm]\nprovider = "demo"\n[budgets]\n'
    'steps = 1\n[[tools]]\nname = "lookup_invoice"\n'
)


def _napper_registry():
    demo = demo_registry()
    # The dangling write must stay a person's (a probed one is driven on resume), so the
    # 409 needs_reconciliation of a resume is exercised: this daemon's refund has no probe.
    registry = ToolRegistry(
        [
            dataclasses.replace(demo.get(name), probe=None)
            if name == "issue_refund"
            else demo.get(name)
            for name in demo.names()
        ]
    )

    async def nap(args: dict, call) -> SleepUntil:
        return SleepUntil(wake_at=datetime.now(UTC) + timedelta(hours=1))

    registry.register(
        Tool(
            name="nap",
            description="Sleep for an hour.",
            effect=Effect.READ,
            input_schema={"type": "object", "properties": {}},
            handler=nap,
        )
    )
    return registry


async def test_real_responses_match_the_document(server_factory, store_url, tmp_path) -> None:
    server = await server_factory(auth_token=TOKEN, registry=_napper_registry())
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call

    # -- the document itself, capabilities, and auth on every route --------------------------------
    served = openapi_document(
        API_OPERATIONS,
        tools=server.state.runtime.kit.registry.names(),
        skills=server.state.runtime.kit.registry.skills.names(),
        process_agents=False,
        llm_choices=server.state.credentials.llm_choices(),
        mcp_origins=server.state.credentials.origins("mcp"),
        service_origins=server.state.credentials.origins("service"),
    )
    assert await call(api, "GET", "/v1/openapi.json", expect=200) == json.loads(json.dumps(served))
    await call(api, "GET", "/v1/capabilities", expect=200)
    await call(api, "GET", "/v1/health", expect=200)
    await call(api, "GET", "/v1/tools", expect=200)
    anonymous = server.new_client()
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            if operation.get("security") == [{}]:
                continue  # documented as open to anyone: the login (tests/daemon/api/test_session)
            await call(
                anonymous,
                method.upper(),
                path,
                expect=401,
                run_id=MISSING_RUN,
                agent_hash="sha256:0",
                graph_hash="sha256:0",
                namespace="team",
                name="triage",
            )

    # -- agents ------------------------------------------------------------------------------------
    toml = {"Content-Type": "application/toml"}
    refund = (await call(api, "POST", "/v1/agents", expect=201, content=REFUND_DESK, headers=toml))[
        "agent"
    ]
    assert (await call(api, "POST", "/v1/agents", expect=201, content=REFUND_DESK, headers=toml))[
        "created"
    ] is False
    gated = (await call(api, "POST", "/v1/agents", expect=201, json=GATED))["agent"]
    napper = (await call(api, "POST", "/v1/agents", expect=201, content=NAPPER, headers=toml))[
        "agent"
    ]
    tight = (await call(api, "POST", "/v1/agents", expect=201, content=TIGHT, headers=toml))[
        "agent"
    ]
    await call(api, "POST", "/v1/agents", expect=400, content="model = ", headers=toml)
    await call(
        api, "POST", "/v1/agents", expect=400, json={**GATED, "budget": {}}
    )  # a typo'd field
    await call(api, "GET", "/v1/agents", expect=200)
    with below_the_free_space_floor(server.state):
        await call(api, "POST", "/v1/agents", expect=507, json={**GATED, "name": "low"})
        await call(api, "POST", "/v1/runs", expect=507, json={"agent": gated, "input": {}})
    assert (await call(api, "GET", "/v1/agents/{agent_hash}", expect=200, agent_hash=gated))[
        "name"
    ] == "gated"
    await call(api, "GET", "/v1/agents/{agent_hash}", expect=404, agent_hash="sha256:" + "0" * 64)

    # -- runs into every state the demo tools reach ------------------------------------------------
    async def start(agent: str, **fields: Any) -> str:
        body = await call(api, "POST", "/v1/runs", expect=201, json={"agent": agent, **fields})
        return body["run"]

    completed = await start(refund, input={"invoice_id": "INV-1"}, labels={"env": "test"})
    suspended = await start(gated, input={"invoice_id": "INV-2"})
    sleeping = await start(napper)
    over_budget = await start(tight)
    parked = await start(gated)
    await call(api, "POST", "/v1/runs", expect=409, json={"agent": refund, "run_id": completed})
    await call(api, "POST", "/v1/runs", expect=404, json={"agent": "sha256:" + "1" * 64})
    await call(
        api,
        "POST",
        "/v1/runs",
        expect=400,
        json={"agent": refund, "labels": {f"k{i}": "v" for i in range(17)}},
    )
    await call(api, "POST", "/v1/runs", expect=400, json={"agent": refund, "colour": "red"})
    for run_id in (completed, suspended, sleeping, over_budget, parked):
        await server.wait_resting(run_id)
    dangling = await killed_in_a_write(store_url, tmp_path, "INV-5")
    abandoned_write = await killed_in_a_write(store_url, tmp_path, "INV-6")

    states = {}
    for run_id in (completed, suspended, sleeping, over_budget, dangling):
        body = await call(api, "GET", "/v1/runs/{run_id}", expect=200, run_id=run_id)
        states[body["status"]["state"]] = run_id
        await call(api, "GET", "/v1/runs/{run_id}/replay", expect=200, run_id=run_id)
        frames = await call(api, "GET", "/v1/runs/{run_id}/events", expect=200, run_id=run_id)
        assert frames[-1][0] == "end"
    assert set(states) == {
        "completed",
        "suspended",
        "sleeping",
        "budget_exceeded",
        "needs_reconciliation",
    }
    for template in ("/v1/runs/{run_id}", "/v1/runs/{run_id}/replay", "/v1/runs/{run_id}/events"):
        await call(api, "GET", template, expect=404, run_id=MISSING_RUN)
        await call(api, "GET", template, expect=400, run_id="not-a-uuid")
    await call(
        api,
        "GET",
        "/v1/runs/{run_id}/events",
        expect=400,
        run_id=completed,
        params={"from_seq": "-1"},
    )
    tail = await call(
        api, "GET", "/v1/runs/{run_id}/events", run_id=completed, headers={"Last-Event-ID": "3"}
    )
    assert tail[0][1]["seq"] == 4
    # A client at its cap of open streams is refused before anything is read (429).
    slots = server.state.stream_slots
    cap, slots.cap = slots.cap, 1
    held = slots.take("127.0.0.1")
    await call(api, "GET", "/v1/runs/{run_id}/events", expect=429, run_id=completed)
    held.release()
    slots.cap = cap

    # -- listing -----------------------------------------------------------------------------------
    await call(api, "GET", "/v1/runs", expect=200)
    page = await call(api, "GET", "/v1/runs", expect=200, params={"limit": "2"})
    await call(
        api, "GET", "/v1/runs", expect=200, params={"limit": "2", "cursor": page["next_cursor"]}
    )
    await call(
        api, "GET", "/v1/runs", expect=200, params={"status": "suspended", "label": "env:test"}
    )
    await call(api, "GET", "/v1/runs", expect=400, params={"limit": "0"})
    await call(api, "GET", "/v1/runs", expect=400, params={"state": "completed"})
    queue = await call(api, "GET", "/v1/reconciliations", expect=200, params={"limit": "1"})
    assert [item["run"] for item in queue["reconciliations"]] == [dangling]
    await call(api, "GET", "/v1/reconciliations", expect=400, params={"limit": "0"})

    # -- verbs and their refusals ------------------------------------------------------------------
    resume = "/v1/runs/{run_id}/resume"
    await call(api, "POST", resume, expect=200, run_id=completed)
    await call(api, "POST", resume, expect=400, run_id=suspended)  # no input
    await call(
        api, "POST", resume, expect=400, run_id=suspended, json={"input": {"approved": "yes"}}
    )
    await call(api, "POST", resume, expect=409, run_id=dangling)
    await call(api, "POST", resume, expect=409, run_id=sleeping)
    await call(api, "POST", resume, expect=404, run_id=MISSING_RUN)
    await call(
        api, "POST", resume, expect=202, run_id=suspended, json={"input": {"approved": True}}
    )
    await call(
        api, "POST", resume, expect=202, run_id=over_budget, json={"input": {"extend_by": 5}}
    )

    resolve = "/v1/runs/{run_id}/resolve"
    await call(api, "POST", resolve, expect=409, run_id=completed, json={"output": {}})
    await call(api, "POST", resolve, expect=400, run_id=dangling, json={})
    await call(api, "POST", resolve, expect=404, run_id=MISSING_RUN, json={"output": {}})
    await call(
        api,
        "POST",
        resolve,
        expect=200,
        run_id=dangling,
        json={"output": {"refund_id": "rf_by_hand"}},
    )

    tools = "/v1/runs/{run_id}/tools"
    await call(api, "POST", tools, expect=200, run_id=parked, json={"tools": ["lookup_invoice"]})
    await call(api, "POST", tools, expect=400, run_id=parked, json={"url": "http://evil.test/mcp"})
    await call(api, "POST", tools, expect=404, run_id=parked, json={"tools": ["no_such_tool"]})
    await call(api, "POST", tools, expect=404, run_id=MISSING_RUN, json={"tools": ["nap"]})
    await call(api, "POST", tools, expect=409, run_id=completed, json={"tools": ["nap"]})

    abandon = "/v1/runs/{run_id}/abandon"
    await call(api, "POST", abandon, expect=200, run_id=parked, json={"reason": "not needed"})
    await call(
        api, "POST", abandon, expect=200, run_id=abandoned_write
    )  # status carries unresolved_write
    await call(api, "POST", abandon, expect=409, run_id=completed)
    await call(api, "POST", abandon, expect=400, run_id=parked, json={"reason": 7})
    await call(api, "POST", abandon, expect=404, run_id=MISSING_RUN)

    for run_id in (suspended, over_budget):
        await server.wait_resting(run_id)
    listing = await call(api, "GET", "/v1/runs", expect=200)
    assert {entry["status"]["state"] for entry in listing["runs"]} >= {"completed", "abandoned"}

    # -- client-driven runs ------------------------------------------------------------------------
    await call(api, "GET", "/v1/client-tools", expect=200)
    opened = await call(api, "POST", "/v1/client-runs", expect=201)
    client_run, token = opened["run"], {"X-Drive-Token": opened["drive_token"]}
    head = {
        "run_id": client_run,
        "seq": 0,
        "schema_version": 1,
        "recorded_at": "2026-01-01T00:00:00.000000Z",
        "event": {"kind": "RunStarted", "payload": {"agent_def_hash": refund, "input": None}},
    }
    events = "/v1/client-runs/{run_id}/events"
    await call(api, "POST", events, expect=401, run_id=client_run, json={"events": [head]})
    await call(
        api,
        "POST",
        events,
        expect=403,
        run_id=client_run,
        json={"events": [head]},
        headers={"X-Drive-Token": "dt_wrong"},
    )
    await call(
        api,
        "POST",
        events,
        expect=422,
        run_id=client_run,
        headers=token,
        json={
            "events": [
                {
                    **head,
                    "event": {
                        "kind": "ModelCallRequested",
                        "payload": {"request_hash": "sha256:" + "0" * 64},
                    },
                }
            ]
        },
    )
    await call(
        api,
        "POST",
        events,
        expect=409,
        run_id=client_run,
        headers=token,
        json={"events": [{**head, "seq": 3}]},
    )
    await call(
        api, "POST", events, expect=400, run_id=client_run, headers=token, json={"events": []}
    )
    await call(
        api, "POST", events, expect=404, run_id=MISSING_RUN, headers=token, json={"events": [head]}
    )
    with below_the_free_space_floor(server.state):
        await call(
            api,
            "POST",
            events,
            expect=507,
            run_id=client_run,
            headers=token,
            json={"events": [head]},
        )
    await call(
        api, "POST", events, expect=200, run_id=client_run, headers=token, json={"events": [head]}
    )
    await call(api, "POST", "/v1/client-runs", expect=409, json={"run_id": client_run})
    await call(api, "POST", "/v1/client-runs", expect=409, json={"run_id": completed})
    await call(api, "POST", "/v1/client-runs", expect=400, json={"record_prompts": "yes"})
    assert (
        await call(
            api, "POST", "/v1/client-runs", expect=200, json={"run_id": client_run}, headers=token
        )
    )["drive_token"] == token["X-Drive-Token"]
    await call(
        api,
        "GET",
        "/v1/client-runs/{run_id}/log",
        expect=200,
        run_id=client_run,
        params={"from_seq": "0"},
    )
    await call(api, "GET", "/v1/client-runs/{run_id}/log", expect=404, run_id=completed)
    await call(api, "GET", "/v1/client-runs/{run_id}/log", expect=400, run_id="not-a-uuid")
    beat = "/v1/client-runs/{run_id}/heartbeat"
    await call(api, "POST", beat, expect=200, run_id=client_run, headers=token)
    await call(api, "POST", beat, expect=401, run_id=client_run)
    await call(
        api, "POST", beat, expect=403, run_id=client_run, headers={"X-Drive-Token": "dt_wrong"}
    )
    await call(api, "POST", beat, expect=404, run_id=MISSING_RUN, headers=token)
    await call(api, "POST", beat, expect=400, run_id="not-a-uuid")
    release = "/v1/client-runs/{run_id}/release"
    await call(api, "POST", release, expect=403, run_id=client_run)
    await call(api, "POST", release, expect=400, run_id="not-a-uuid")
    assert (await call(api, "POST", release, expect=200, run_id=client_run, headers=token))[
        "released"
    ] is True
    await call(api, "POST", "/v1/client-runs", expect=200, json={"run_id": client_run})

    # -- oversized bodies, on every route that reads one -------------------------------------------
    retaken = await call(api, "POST", "/v1/client-runs", expect=201, json={"run_id": MISSING_RUN})
    for template, headers in (
        ("/v1/agents", toml),
        ("/v1/runs", {}),
        (resume, {}),
        (resolve, {}),
        (abandon, {}),
        (tools, {}),
        ("/v1/client-runs", {}),
        (events, {"X-Drive-Token": retaken["drive_token"]}),
    ):
        run_id = MISSING_RUN if template == events else completed
        await call(
            api,
            "POST",
            template,
            expect=413,
            run_id=run_id,
            content=OVERSIZED,
            headers={"Content-Type": "application/json", **headers},
        )

    # The server-performed steps need a model executor;
    # tests/daemon/client_runs/test_steps.py covers them.
    elsewhere = (
        STEP_PATHS
        + CLIENT_PERFORMED_PATHS
        + GRAPH_PATHS
        + FLOW_PATHS
        + GRAPH_RUN_PATHS
        + UPLOAD_PATHS
        + FORK_PATHS
        + SETTINGS_PATHS
        + SESSION_PATHS
    )
    elsewhere += CHILD_PATHS + METRICS_PATHS
    # The WebSocket's upgrade (101): tests/daemon/api/test_ws.py.
    elsewhere += ("/v1/ws",)
    unreached = {seen for seen in contract.unreached() if seen[0] not in elsewhere}
    # A graph run's resume on a host that wired no tool registry: test_graph_runs.py.
    unreached.discard((resume, "post", "503"))
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
    untaken = {
        (path, method)
        for path, operations in DOCUMENT["paths"].items()
        for method, operation in operations.items()
        if "requestBody" in operation and path not in elsewhere
    } - contract.requests
    assert not untaken, f"no request body taken and checked against the document: {sorted(untaken)}"
