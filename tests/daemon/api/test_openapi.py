"""The OpenAPI document: valid OpenAPI 3.1, complete, and true of real requests and responses.

* ``openapi-spec-validator`` accepts the document as OpenAPI 3.1.
* Every route the app registers is documented, and nothing else is.
* A real daemon (``serve`` in-process on a loopback port, with a bearer
  token, over SQLite) is driven through every endpoint, into
  every run state the demo tools reach and every refusal a client can
  provoke; each JSON body is validated (JSON Schema 2020-12, ``$ref``\\ s
  resolved into the document) against the schema documented for its path,
  method and status, and each stream frame against ``Envelope`` or
  ``EndFrame``. An answer with an undocumented status fails, and so does a
  documented status no request reached (only 500 and 408 are exempt).
* Every request body the daemon takes is validated against the document
  the daemon serves (``Contract.check_request``), for every endpoint that
  reads one and every agent kind; a body it refuses for its shape must be
  one the document refuses too.
* The fields each handler takes (as its refusal of an unknown one lists
  them) are exactly the document's properties, body by body and table by
  table of an agent definition.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from salvor.daemon.agents._credentials import (
    Credentials,
    DeclaredEndpoint,
    DeclaredOrigin,
    Undeclared,
)
from salvor.daemon.api import _openapi
from salvor.daemon.api._answers import ANSWERS, RELEASED, RUN_STARTED
from salvor.daemon.api._app import API_OPERATIONS, create_app
from salvor.daemon.api._openapi import openapi_document
from salvor.daemon.api._operation import operations_of
from salvor.daemon.client_runs import CLIENT_RUN_ANSWERS
from salvor.daemon.client_runs._answers import CLIENT_TOOL_OPENED, COMPLETED
from salvor.daemon.tools._demo import demo_registry
from salvor.daemon.tools._registry import SleepUntil, Tool, ToolRegistry
from salvor.daemon.web import is_http_url
from salvor.protocol import STATUS_DETAIL, WIRE_SCHEMAS, Effect, RunState
from salvor.store import SUMMARY_KEYS

from tests.support.api import killed_in_a_write
from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY
from tests.support.contract import (
    BASE,
    CHILD_PATHS,
    CLIENT_PERFORMED_PATHS,
    DOCUMENT,
    FORK_PATHS,
    GRAPH_PATHS,
    GRAPH_RUN_PATHS,
    METRICS_PATHS,
    MISSING_RUN,
    OVERSIZED,
    SESSION_PATHS,
    SETTINGS_PATHS,
    STEP_PATHS,
    UPLOAD_PATHS,
    Contract,
    below_the_free_space_floor,
    pointer,
)

# SQLite alone (tests/support/backends.py): what it tests is the document against the answers,
# which the handlers build the same way over either backend (tests/daemon/api/test_api keeps both).
STORE_BACKENDS = SQLITE_ONLY

REPO = Path(__file__).resolve().parents[3]
REFUND_DESK = (REPO / "contrib" / "agents" / "refund-desk.toml").read_text()
GATED = {  # as JSON, with a name
    "name": "gated",
    "model": "demo-planner",
    "system_prompt": "Ask first.",
    "llm": {"provider": "demo"},
    "tools": [{"name": "request_approval"}],
}
NAPPER = (
    'model = "demo-planner"\nsystem_prompt = "Nap."\n[llm]\nprovider = "demo"\n[[tools]]\n'
    'name = "nap"\n'
)
TIGHT = (
    'model = "demo-planner"\nsystem_prompt = "Look."\n[llm]\nprovider = "demo"\n[budgets]\n'
    'steps = 1\n[[tools]]\nname = "lookup_invoice"\n'
)


def test_document_is_valid_openapi_3_1() -> None:
    validate(DOCUMENT, cls=OpenAPIV31SpecValidator)
    assert DOCUMENT["openapi"].startswith("3.1.")


def test_served_llm_table_is_what_registration_accepts() -> None:
    """The served `[llm]` schema admits a table exactly when ``check_llm`` does (issue 12: the
    declared endpoints and their bound key variables, no `base_url_env`)."""
    credentials = Credentials(
        endpoints=(
            DeclaredEndpoint(base_url="http://10.0.0.5:8000/v1", key_env="LOCAL_KEY"),
            DeclaredEndpoint(base_url="http://10.0.0.6:8000"),
        ),
        environ={"SALVOR_MODEL_BASE_URL": "https://gateway.example.com"},
        strict=True,
    )
    served = openapi_document(
        API_OPERATIONS, process_agents=False, llm_choices=credentials.llm_choices()
    )
    validate(served, cls=OpenAPIV31SpecValidator)
    registry = Registry().with_resource(
        BASE, Resource.from_contents(served, default_specification=DRAFT202012)
    )
    schema = Draft202012Validator(
        {"$ref": f"{BASE}#/components/schemas/BuiltinAgent"}, registry=registry
    )
    urls = [
        None,
        "http://10.0.0.5:8000/v1",
        "http://10.0.0.6:8000",
        "https://gateway.example.com",
        "https://api.openai.com",
        "http://127.0.0.1:9999/x",
    ]
    keys = [None, "LOCAL_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "SALVOR_AGENT_KEY"]
    admitted = 0
    for provider in (None, "anthropic", "openai", "demo"):
        for url in urls:
            for key in keys:
                llm = {
                    name: value
                    for name, value in (
                        ("provider", provider),
                        ("base_url", url),
                        ("api_key_env", key),
                    )
                    if value is not None
                }
                try:
                    credentials.check_llm(
                        provider=provider or "anthropic",
                        base_url=url,
                        base_url_env=None,
                        api_key_env=key,
                    )
                    accepted = True
                except Undeclared:
                    accepted = False
                assert schema.is_valid({"model": "m", "llm": llm}) is accepted, llm
                admitted += accepted
    assert 0 < admitted < 4 * len(urls) * len(keys)
    assert not schema.is_valid({"model": "m", "llm": {"provider": "demo", "base_url_env": "HOME"}})


def test_served_service_and_mcp_urls_are_what_registration_accepts() -> None:
    """A service agent's trigger and an MCP `url` server: the served document admits a url and
    its header variables exactly when ``check_service`` / ``check_mcp_url`` do (the declared
    origins, each with the variables bound to it); with none declared, neither at all."""
    declared = (
        DeclaredOrigin(origin="http://127.0.0.1:9000", header_envs=frozenset({"SVC_TOKEN"})),
        DeclaredOrigin(origin="https://tools.example.com:443"),
    )
    urls = [
        "http://127.0.0.1:9000/task",
        "HTTP://127.0.0.1:9000",
        "http://127.0.0.1:9001/task",
        "https://tools.example.com/mcp",
        "https://TOOLS.example.com:443/mcp?x=1",
        "https://tools.example.com:8443/mcp",
        "http://tools.example.com/mcp",
    ]
    values = [None, "Bearer ${SVC_TOKEN}", "${HOME}", "$5 flat", "$${SVC_TOKEN}"]
    for credentials in (
        Credentials(service_origins=declared, mcp_origins=declared, strict=True),
        Credentials(strict=True),
    ):
        served = openapi_document(
            API_OPERATIONS,
            mcp_origins=credentials.origins("mcp"),
            service_origins=credentials.origins("service"),
        )
        registry = Registry().with_resource(
            BASE, Resource.from_contents(served, default_specification=DRAFT202012)
        )

        service, server = (
            Draft202012Validator({"$ref": f"{BASE}#/components/schemas/{name}"}, registry=registry)
            for name in ("ServiceAgent", "McpServer")
        )
        admitted = 0
        for url in urls:
            for value in values:
                headers = {} if value is None else {"X-Key": value}
                try:
                    credentials.check_service(url, headers)
                    accepted = True
                except Undeclared:
                    accepted = False
                agent = {"kind": "service", "url": url, "proxy_port": 9100, "headers": headers}
                assert service.is_valid(agent) is accepted, (url, value)
                try:
                    credentials.check_mcp_url("s", url, headers, None)
                    accepted = True
                except Undeclared:
                    accepted = False
                assert server.is_valid({"name": "s", "url": url, "headers": headers}) is accepted, (
                    url,
                    value,
                )
                admitted += accepted
        assert (admitted > 0) is bool(credentials.origins("mcp"))
        assert server.is_valid({"name": "s", "command": "mcp-server-time"})


async def test_every_route_is_documented(server) -> None:
    """The document's paths are the app's routes: read from the declarations its URL map holds,
    each registered once, and the same as the route modules' tables (``API_OPERATIONS``, the
    document without an app): a declaration no handler registers is missing from the URL map."""
    app = create_app(server.state)  # a second app over the same state: only its routes are read
    served = {
        (re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        # The page (/, /ui/<name>) and the reference (/docs) are not API: the document describes
        # /v1 and /metrics.
        if rule.rule.startswith("/v1/") or rule.rule == "/metrics"
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    documented = {
        (path, method) for path, operations in DOCUMENT["paths"].items() for method in operations
    }
    assert served == documented
    declared = operations_of(app)
    assert len(set(declared)) == len(declared)
    assert set(declared) == set(API_OPERATIONS), "a module's OPERATIONS and its handlers differ"
    assert {(o.path, o.method) for o in declared} == served


async def test_a_route_without_a_declaration_stops_the_document(server) -> None:
    """A handler registered the plain Quart way under /v1 has no declaration: the document (and
    so ``create_app``, which builds it) refuses, naming the route; the page's routes need none."""
    app = create_app(server.state)

    @app.get("/v1/undeclared/<run_id>")
    async def undeclared(run_id: str):
        return ""

    with pytest.raises(RuntimeError, match=r"without a declaration .*GET /v1/undeclared/<run_id>"):
        operations_of(app)


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


def _agent_kinds(tmp_path: Path) -> dict[str, dict]:
    """One JSON definition of every agent kind, each field of its kind given at least once."""
    from tests.support.mcp_servers import FixtureServer

    fixture = tmp_path / "fx"
    fixture.mkdir()
    stdio = FixtureServer(fixture).command()
    return {
        "built-in": {
            **GATED,
            "max_response_tokens": 512,
            "record_prompts": True,
            "output_schema": None,
            "budgets": {"steps": 5, "cost_usd": 0.5},
            "pricing": {"input_per_mtok": 1, "output_per_mtok": 2},
            "llm": {"provider": "demo", "max_retries": 1, "timeout_seconds": 30, "stream": False},
            "description": "Settles refunds.",
            "flow_tools": ["ask_user", "finish"],
            "inputs": ["invoice_id", {"name": "reason", "description": "Why"}],
            "outputs": [
                "verdict",
                {"name": "amount", "type": "number", "description": "Cents", "required": False},
            ],
        },
        "built-in with MCP servers": {
            "model": "demo-planner",
            "llm": {"provider": "demo"},
            "tools": [{"name": "lookup_invoice"}],
            "mcp_servers": [
                {
                    "name": "fx",
                    "command": stdio[0],
                    "args": stdio[1:],
                    "env": {"FX": "1"},
                    "cwd": str(tmp_path),
                    "effects": {"lookup": "read"},
                    "results": {"delete_everything": {"ok": True}},
                    "tools": ["lookup", "write_note", "delete_everything"],
                    "timeout": 20,
                },
                {
                    "name": "fx2",
                    "command": " ".join(stdio),
                    "effect_overrides": {"hang": "idempotent"},
                    "tools": ["hang"],
                },
            ],
        },
        "process": {
            "kind": "process",
            "name": "p",
            "command": [sys.executable, "-c", "pass"],
            "cwd": str(tmp_path),
            "env": {"AGENT_MODE": "test"},
            "timeout": 30,
            "record_prompts": False,
            "description": "A local agent.",
            "inputs": ["task"],
            "outputs": [{"name": "answer", "type": "object"}],
            "salvor_mcp": False,
            "output_from": "stdout",
        },
        "process with MCP servers": {
            "kind": "process",
            "command": "python3 agent.py",
            "mcp_servers": [
                {"name": "fx", "command": stdio},
                {"name": "web", "url": "http://127.0.0.1:9/mcp", "port": 47001},
            ],
        },
        "service": {
            "kind": "service",
            "name": "s",
            "url": "http://127.0.0.1:9/trigger",
            "proxy_port": 47002,
            "headers": {"X-Team": "refunds"},
            "timeout": 10,
            "record_prompts": True,
        },
    }


async def test_every_agent_kind_is_a_request_the_document_admits(
    server_factory, operator_declarations, tmp_path
) -> None:
    """Each kind registers (201) and the served document admits the very body; a daemon without
    --allow-process-agents serves a document that does not admit a process or service agent,
    and refuses them."""
    operator_declarations.mcp_origin("http://127.0.0.1:9")
    operator_declarations.service_origin("http://127.0.0.1:9")
    kinds = _agent_kinds(tmp_path)
    server = await server_factory(allow_process_agents=True)
    contract = await Contract.served(server.client)
    for definition in kinds.values():
        await contract.call(server.client, "POST", "/v1/agents", expect=201, json=definition)
    # TOML says the same in another syntax, and is held to the same schema.
    await contract.call(
        server.client,
        "POST",
        "/v1/agents",
        expect=201,
        content=REFUND_DESK,
        headers={"Content-Type": "application/toml"},
    )
    assert contract.requests == {("/v1/agents", "post")}
    # `effects` and `effect_overrides` are one table under two names: the daemon takes one, and so
    # does the document.
    schema_pointer = pointer(
        "paths", "/v1/agents", "post", "requestBody", "content", "application/json", "schema"
    )
    both = {
        "model": "m",
        "llm": {"provider": "demo"},
        "mcp_servers": [{"name": "fx", "command": ["fx"], "effects": {}, "effect_overrides": {}}],
    }
    assert not contract.admits(schema_pointer, both)
    await contract.call(server.client, "POST", "/v1/agents", expect=400, json=both)
    # The flow fields' enums and names are the parser's: what it refuses, the document does not
    # admit.
    for flow_field in (
        {"flow_tools": ["ask_usr"]},
        {"flow_tools": ["finish", "finish"]},
        {"outputs": [{"name": "a", "type": "date"}]},
        {"outputs": ["summary"]},
        {"inputs": ["not a name"]},
        {"description": "x" * 1025},
    ):
        refused = {"model": "m", "llm": {"provider": "demo"}, **flow_field}
        assert not contract.admits(schema_pointer, refused), flow_field
        await contract.call(server.client, "POST", "/v1/agents", expect=400, json=refused)
    for process_field in ({"output_from": "stdin"}, {"salvor_mcp": "no"}):
        refused = {"kind": "process", "command": ["true"], **process_field}
        assert not contract.admits(schema_pointer, refused), process_field
        await contract.call(server.client, "POST", "/v1/agents", expect=400, json=refused)
    await server.stop()  # one daemon per store

    plain = await server_factory()
    narrow = await Contract.served(plain.client)
    for kind in ("process", "service", "process with MCP servers"):
        assert not narrow.admits(schema_pointer, kinds[kind]), kind
        await narrow.call(plain.client, "POST", "/v1/agents", expect=400, json=kinds[kind])
    assert narrow.admits(schema_pointer, kinds["built-in"])


_TAKES = re.compile(r"unknown field `zz_undocumented`; this endpoint takes (.+)$")
_ALLOWED = re.compile(r"unknown field `zz_undocumented` in .+; allowed: (.+)$")


def _properties(document: dict, schema: dict) -> set[str]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "oneOf" in schema and "properties" not in schema:  # a nullable object
        schema = next(s for s in schema["oneOf"] if s.get("type") != "null")
        return _properties(document, schema)
    return set(schema["properties"])


async def _taken(
    client: httpx.AsyncClient, path: str, body: dict, pattern: re.Pattern, **kwargs: Any
) -> set[str]:
    """The fields the handler takes, as its refusal of an unknown one names them."""
    response = await client.post(path, json=body, **kwargs)
    assert response.status_code == 400, f"{path}: {response.text}"
    found = pattern.search(response.json()["error"]["message"])
    assert found, f"{path}: {response.text}"
    return set(found.group(1).split(", "))


async def test_the_document_names_exactly_the_fields_each_handler_takes(server_factory) -> None:
    """Every JSON body, every table of an agent definition, and the run list's query: the names the
    handler lists when it refuses an unknown one are the document's, no more, no fewer. The two
    fields a file on disk may give and HTTP refuses are refused here."""
    server = await server_factory(allow_process_agents=True)
    api, document = server.client, (await server.client.get("/v1/openapi.json")).json()
    schemas = document["components"]["schemas"]
    opened = (await api.post("/v1/client-runs")).json()
    token = {"X-Drive-Token": opened["drive_token"]}
    probe = {"zz_undocumented": 1}

    checked = 0
    for template, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody")
        # A graph document's fields are the validator's (tests/daemon/api/test_openapi_graphs.py).
        if template in ("/v1/agents", *GRAPH_PATHS) or body is None:
            continue
        if "application/json" not in body["content"]:
            continue  # an upload's body is an archive (tests/daemon/api/test_flow_uploads.py)
        run_id = opened["run"] if template.startswith("/v1/client-runs/") else MISSING_RUN
        taken = await _taken(api, template.format(run_id=run_id), probe, _TAKES, headers=token)
        assert taken == _properties(document, body["content"]["application/json"]["schema"]), (
            template
        )
        checked += 1
    assert checked == 16
    # A model step's request, checked whole by the step itself.
    taken = await _taken(
        api,
        f"/v1/client-runs/{opened['run']}/model-step",
        {"seq": 0, "request": probe},
        re.compile(r"`request` has an unknown field `zz_undocumented`; it takes (.+)$"),
        headers=token,
    )
    assert taken == set(schemas["ModelStep"]["properties"]["request"]["properties"])
    # The one query that refuses a name it does not take.
    response = await api.get("/v1/runs", params=probe)
    assert response.status_code == 400, response.text
    taken = re.fullmatch(
        r"unknown query parameter `zz_undocumented`; use (.+)", response.json()["error"]["message"]
    )
    assert taken, response.text
    assert set(taken.group(1).split(", ")) == {
        p["name"] for p in document["paths"]["/v1/runs"]["get"]["parameters"] if p["in"] == "query"
    }

    agents = "/v1/agents"
    tables = {
        "BuiltinAgent": ({}, {"system_prompt_path", "kind"}),
        "ProcessAgent": ({"kind": "process"}, set()),
        "ServiceAgent": ({"kind": "service"}, set()),
    }
    for name, (head, besides) in tables.items():
        assert (
            await _taken(api, agents, {**head, **probe}, _ALLOWED)
            == set(schemas[name]["properties"]) | besides
        )
    builtin = schemas["BuiltinAgent"]["properties"]
    for field in ("llm", "budgets", "pricing"):
        taken = await _taken(api, agents, {"model": "m", field: probe}, _ALLOWED)
        assert taken - {"base_url_env"} == _properties(document, builtin[field]), field
    assert await _taken(api, agents, {"model": "m", "tools": [probe]}, _ALLOWED) == _properties(
        document, builtin["tools"]["items"]
    )
    servers = _properties(document, schemas["McpServer"])
    assert await _taken(
        api, agents, {"model": "m", "mcp_servers": [probe]}, _ALLOWED
    ) == servers - {"port"}
    assert (
        await _taken(
            api, agents, {"kind": "process", "command": "x", "mcp_servers": [probe]}, _ALLOWED
        )
        == servers
    )

    # What the parser takes from a file but the document leaves out: HTTP refuses it.
    for definition, refusal in (
        (
            {"model": "m", "system_prompt_path": "prompt.txt"},
            "only read from agent files on the daemon's own disk",
        ),
        ({"model": "m", "llm": {"base_url_env": "HOME"}}, "only honoured in agent files"),
    ):
        response = await api.post(agents, json=definition)
        assert response.status_code == 400 and refusal in response.json()["error"]["message"], (
            response.text
        )


def test_every_refusal_is_listed_under_the_status_its_code_answers_with(monkeypatch) -> None:
    """The document is checked against the code -> status table when it is built; a code the table
    gives another status than the one the document lists it under stops the build, naming it."""
    _openapi._check_codes(DOCUMENT["paths"])
    # The table itself is read-only: the check is pointed at a copy that disagrees once.
    monkeypatch.setattr(_openapi, "CODE_STATUS", {**_openapi.CODE_STATUS, "lease_held": 423})
    with pytest.raises(RuntimeError, match=r"POST /v1/client-runs 409: lease_held"):
        _openapi._check_codes(DOCUMENT["paths"])


async def test_an_answer_is_built_with_the_fields_its_declaration_has() -> None:
    """A handler's answer and the document's schema for it are one declaration; an answer built with
    a field it lacks, or without a required one, is a bug that raises (the client gets the 500)."""
    response = RUN_STARTED.respond(201, run=MISSING_RUN, status="running", replay_of=None)
    assert response.status_code == 201
    assert json.loads(await response.get_data()) == {"run": MISSING_RUN, "status": "running"}
    with pytest.raises(RuntimeError, match="the Released answer was built with"):
        RELEASED.respond(released=True, lease="dt_x")
    with pytest.raises(RuntimeError, match="needs"):
        RUN_STARTED.respond(201, run=MISSING_RUN)
    for answer in ANSWERS:
        assert DOCUMENT["components"]["schemas"][answer.name] == answer.schema()


def test_the_document_describes_what_the_builders_build_from_their_own_declarations() -> None:
    """Every domain shape under ``components`` is its builder's declaration, not a copy of it: the
    core's (status, pending, envelope, replay, usage), the client-run answers, a run summary's
    keys. The document names exactly those and no hand-written twin shadows one."""
    schemas = DOCUMENT["components"]["schemas"]
    for name, schema in WIRE_SCHEMAS.items():
        assert schemas[name] == schema, name
    for shape in CLIENT_RUN_ANSWERS:
        assert schemas[shape.name] == shape.schema(), shape.name
    assert set(schemas["RunSummary"]["properties"]) == SUMMARY_KEYS | {"driver", "driver_node"}
    # A key the store's summary gains stops the document's build until it is described there.
    with pytest.raises(RuntimeError, match=r"a run summary .*but the code uses .*'parent_run'"):
        _openapi._run_summary(SUMMARY_KEYS | {"parent_run"})


def test_every_run_state_has_a_status_variant_in_the_served_document() -> None:
    """The served ``Status`` has one variant per ``RunState``, made from the fold's own table: the
    state, and the fields of the event that enters it (``STATUS_DETAIL``)."""
    variants = {
        variant["properties"]["state"]["const"]: variant
        for variant in DOCUMENT["components"]["schemas"]["Status"]["oneOf"]
    }
    assert set(variants) == {state.value for state in RunState}
    for state in RunState:
        detail = STATUS_DETAIL.get(state)
        fields = set(detail._field_names()) if detail else set()
        extra = {"overdue", "overdue_seconds"} if state is RunState.SLEEPING else set()
        assert set(variants[state.value]["properties"]) == {"state"} | fields | extra, state


def test_a_client_run_answer_built_with_a_field_its_shape_lacks_raises() -> None:
    """The client-run builders answer through their shape; one that writes a field the document
    does not describe, or drops a required one, is a bug that raises (the client gets the 500)."""
    key = "sha256:" + "0" * 64
    assert COMPLETED.build(seq=3, completed=True) == {"seq": 3, "completed": True}
    with pytest.raises(RuntimeError, match="the Completed answer was built with"):
        COMPLETED.build(seq=3, completed=True, at="now")
    with pytest.raises(RuntimeError, match="needs"):
        CLIENT_TOOL_OPENED.build(seq=3, idempotency_key=key, settled=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/trigger",
        "HTTPS://u:p@host:65535/x?y#z",
        "http://host:0",
        "http://host:65536",
        "http://a[b@host",
        "http://a]b@host",
        "ftp://host",
        "http://",
        "http://ho st",
        # Found by the fuzz: a bracket in the user part, which urlsplit refuses.
        "htTP://\U000bcdea%©ß[Jh÷nê,@6ÀĄččéeù\x86ä\x87Ⱥ#昛ê",
    ],
)
def test_a_service_url_the_document_admits_is_one_the_daemon_takes(url: str) -> None:
    pattern = DOCUMENT["components"]["schemas"]["ServiceAgent"]["properties"]["url"]["pattern"]
    assert bool(re.search(pattern, url)) is is_http_url(url)
