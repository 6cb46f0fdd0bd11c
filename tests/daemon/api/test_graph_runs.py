"""``POST /v1/graph-runs`` and a graph run's life over real HTTP, on SQLite and PostgreSQL: walked
to a gate, an approval its schema refuses recording nothing, resumed, listed, abandoned, woken by
the sweeper, and recovered by a restarted daemon without repeating a completed call."""

from __future__ import annotations

import json
import threading

import pytest
import trio
from salvor.daemon.agents import parse_definition
from salvor.daemon.graphs import map_child_id
from salvor.daemon.tools import ToolRegistry

from tests.support.api import assert_error, get_run, register, snapshot
from tests.support.api_server import TOKEN, Server
from tests.support.contract import (
    GRAPH_RUN_PATHS,
    OVERSIZED,
    Contract,
    below_the_free_space_floor,
)
from tests.support.graph_runs import approval_graph
from tests.support.scripted_provider import text_reply

APPROVAL = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}


# What the demo tool request_approval asks for.
APPROVAL_TOOL_SCHEMA = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
}


async def submit(server: Server, document: dict) -> str:
    response = await server.client.post("/v1/graphs", json=document)
    assert response.status_code == 201, response.text
    return response.json()["graph"]


async def start(server: Server, graph: str, run_input=None, **fields) -> str:
    body = {"graph_hash": graph, "input": run_input, **fields}
    response = await server.client.post("/v1/graph-runs", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "running"
    return response.json()["run"]


async def kinds(server: Server, run_id: str) -> list[str]:
    log = await server.state.runtime.reads.log(run_id)
    return [envelope.event.KIND.value for envelope in log]


async def test_a_graph_run_walks_to_a_gate_and_completes_once_approved(
    server: Server, providers
) -> None:
    agent, provider = await register(server, providers, final_text="a draft")
    graph = await submit(server, approval_graph(agent, draft_input="$input.topic"))
    run_id = await start(
        server, graph, {"topic": "tides", "to": "a@example.com"}, labels={"team": "docs"}
    )
    body = await server.wait_resting(run_id)
    assert body["status"] == {
        "state": "suspended",
        "reason": "Send it?",
        "input_schema": APPROVAL,
    }

    before = await snapshot(server)
    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": "yes", "extra": 1}}
    )
    error = assert_error(response, 400, "approval_schema_violation")
    assert error["details"]["node"] == "approve"
    assert [v["path"] for v in error["details"]["violations"]] == ["$.approved"]
    assert await snapshot(server) == before

    response = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
    )
    assert response.status_code == 202, response.text
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed"
    assert set(body["status"]["output"]) == {"send"}
    assert (await kinds(server, run_id)).count("ToolCallRequested") == 1
    assert provider.call_count == 1

    stream = await server.client.get(f"/v1/runs/{run_id}/events")
    assert stream.text.count("event: end") == 1 and '"GraphRunStarted"' in stream.text
    assert stream.text.count('"NodeExited"') == 4
    # The gate recorded what it held up for approval: the draft flowing into it.
    narrated = {
        (event["kind"], event["payload"]["node"]): event["payload"]
        for event in (
            json.loads(line.removeprefix("data: ")).get("event")
            for line in stream.text.splitlines()
            if line.startswith("data: {")
        )
        if event and event["kind"] in ("NodeEntered", "NodeExited")
    }
    drafted = narrated["NodeExited", "draft"]["output"]
    assert drafted and narrated["NodeEntered", "approve"]["input"] == drafted

    (entry,) = [e for e in (await server.client.get("/v1/runs")).json()["runs"]]
    assert entry["run"] == run_id and entry["graph_hash"] == graph
    assert "agent_def_hash" not in entry and entry["labels"] == {"team": "docs"}
    # The run's own answer says the same.
    assert body["graph_hash"] == graph and body["labels"] == {"team": "docs"}
    assert "agent_def_hash" not in body and "driven_by" not in body


async def test_a_graph_run_that_does_not_resolve_is_refused_with_nothing_recorded(
    server: Server, providers
) -> None:
    agent, _ = await register(server, providers)
    missing_agent = "sha256:" + "1" * 64
    graphs = {
        "agent": await submit(server, approval_graph(missing_agent, draft_input="$input.topic")),
        "tool": await submit(
            server,
            {
                "schema_version": 1,
                "nodes": [{"id": "mail", "kind": "tool", "tool": "fax_it"}],
                "edges": [],
            },
        ),
        "ok": await submit(server, approval_graph(agent, draft_input="$input.topic")),
    }
    before = await snapshot(server)
    post = server.client.post
    refusals = [
        (
            await post("/v1/graph-runs", json={"graph_hash": "sha256:" + "2" * 64}),
            404,
            "unknown_graph",
        ),
        (await post("/v1/graph-runs", json={"graph_hash": graphs["agent"]}), 404, "unknown_agent"),
        (await post("/v1/graph-runs", json={"graph_hash": graphs["tool"]}), 404, "unknown_tool"),
        (
            await post("/v1/graph-runs", json={"graph_hash": graphs["ok"], "labels": {"": "x"}}),
            400,
            "bad_request",
        ),
        (await post("/v1/graph-runs", json={"graph": graphs["ok"]}), 400, "bad_request"),
    ]
    details = [assert_error(r, status, code).get("details") for r, status, code in refusals]
    assert details[1]["node"] == "draft" and details[2]["node"] == "mail"
    assert await snapshot(server) == before


async def test_a_process_or_service_agent_in_an_agent_node_is_refused_naming_the_node(
    server: Server,
) -> None:
    # Registered past the HTTP opt-in: the refusal is the graph run's, whatever let them in.
    definitions = {
        "process": 'name = "proc"\nkind = "process"\ncommand = ["true"]\n',
        "service": (
            'name = "svc"\nkind = "service"\nurl = "http://127.0.0.1:9/run"\nproxy_port = 47999\n'
        ),
    }
    graphs = {}
    for kind, text in definitions.items():
        agent = parse_definition(text, "toml")
        await server.state.runtime.definitions.register_agent(agent)
        node = {"id": f"by_{kind}", "kind": "agent", "agent": agent.agent_def_hash}
        graphs[kind] = (
            agent.agent_def_hash,
            await submit(server, {"schema_version": 1, "nodes": [node], "edges": []}),
        )
    before = await snapshot(server)
    for kind, (agent, graph) in graphs.items():
        response = await server.client.post("/v1/graph-runs", json={"graph_hash": graph})
        details = assert_error(response, 400, "bad_request")["details"]
        assert details == {"node": f"by_{kind}", "agent": agent}
        message = response.json()["error"]["message"]
        assert f"node 'by_{kind}' names a {kind} agent" in message
    assert await snapshot(server) == before


async def test_a_graph_run_parked_at_its_gate_is_abandoned(server: Server, providers) -> None:
    agent, _ = await register(server, providers)
    run_id = await start(
        server,
        await submit(server, approval_graph(agent, draft_input="$input.topic")),
        {"topic": "t"},
    )
    await server.wait_resting(run_id)
    response = await server.client.post(f"/v1/runs/{run_id}/abandon", json={"reason": "no"})
    assert response.status_code == 200, response.text
    assert (await server.wait_resting(run_id))["status"]["state"] == "abandoned"


async def test_the_wake_sweeper_wakes_a_graph_run_at_its_delay(server_factory) -> None:
    server = await server_factory(wake_interval=0.05)
    graph = await submit(
        server,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "cool_off", "kind": "delay", "seconds": 0.2},
                {"id": "tally", "kind": "fold", "over": "$input", "reducer": "sum"},
            ],
            "edges": [{"from": "cool_off", "to": "tally"}],
        },
    )
    run_id = await start(server, graph, [2, 3])
    with trio.fail_after(30):
        while (body := await server.wait_resting(run_id))["status"]["state"] == "sleeping":
            await trio.sleep(0.05)
    assert body["status"] == {"state": "completed", "output": {"tally": 5}}
    assert "SleepStarted" in await kinds(server, run_id)


async def test_a_restarted_daemon_walks_on_without_repeating_a_completed_call(
    server_factory, providers
) -> None:
    """The daemon stops while the second agent node's model call is in flight; the next daemon
    recovers the run on start and re-issues only that call."""
    held, arrived = threading.Event(), threading.Event()

    def script(call):
        task = call.request["messages"][0]["content"][0]["text"]
        return text_reply(f"after {task}")

    def hold_the_second(call) -> None:
        if call.request["messages"][0]["content"][0]["text"].startswith("after"):
            arrived.set()
            held.wait(timeout=30)

    first = await server_factory()
    provider = providers(script, on_call=hold_the_second)
    agent, _ = await register(first, lambda *_a, **_k: provider)
    graph = await submit(
        first,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "one", "kind": "agent", "agent": agent},
                {
                    "id": "mail",
                    "kind": "tool",
                    "tool": "send_email",
                    "input": {"to": "c@example.com", "subject": "s", "body": "$nodes.one"},
                },
                {"id": "two", "kind": "agent", "agent": agent, "input": "$nodes.one"},
            ],
            "edges": [{"from": "one", "to": "mail"}, {"from": "mail", "to": "two"}],
        },
    )
    run_id = await start(first, graph, "go")
    await trio.to_thread.run_sync(arrived.wait, 30)
    await first.stop()
    held.set()

    second = await server_factory()
    body = await second.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": {"two": "after after go"}}
    counts = provider.count_by_request_hash()
    assert sorted(counts.values()) == [1, 2]  # node one's call once, node two's re-issued
    assert (await kinds(second, run_id)).count("ToolCallRequested") == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_graph_run_answers_match_the_document(server_factory, providers) -> None:
    """Every status the document lists for /v1/graph-runs, and a gate's refused approval on
    resume, against the served document (tests.support.contract)."""
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    agent, _ = await register(server, providers)
    graph = await submit(server, approval_graph(agent, draft_input="$input.topic"))
    started = await call(
        api,
        "POST",
        "/v1/graph-runs",
        expect=201,
        json={"graph_hash": graph, "input": {"topic": "t"}},
    )
    await call(api, "POST", "/v1/graph-runs", expect=400, json={"graph_hash": graph, "x": 1})
    # Asked for as a stream: the run's lines until it rests (here at the graph's gate).
    ndjson = {"Accept": "application/x-ndjson"}
    body = {"graph_hash": graph, "input": {"topic": "t"}}
    lines = await call(api, "POST", "/v1/graph-runs", expect=200, json=body, headers=ndjson)
    assert [lines[0]["type"], lines[-1]["type"]] == ["started", "result"]
    assert lines[-1]["status"] == "suspended" and lines[-1]["baseline_writes"] == []
    # A client at its cap of open streams is refused before the run starts (429).
    slots = server.state.stream_slots
    cap, slots.cap = slots.cap, 1
    held = slots.take("127.0.0.1")
    before = len((await api.get("/v1/runs")).json()["runs"])
    await call(api, "POST", "/v1/graph-runs", expect=429, json=body, headers=ndjson)
    assert len((await api.get("/v1/runs")).json()["runs"]) == before
    held.release()
    slots.cap = cap
    await call(api, "POST", "/v1/graph-runs", expect=404, json={"graph_hash": "sha256:0"})
    flow = {"path": "/p/.salvor/flows/f.yaml", "canonical": "/p/.salvor/flows/f.yaml"}
    await call(api, "POST", "/v1/graph-runs", expect=422, json={"flow": {**flow, "content": "%"}})
    await call(
        api,
        "POST",
        "/v1/graph-runs",
        expect=413,
        content=OVERSIZED,
        headers={"Content-Type": "application/json"},
    )
    await call(server.new_client(), "POST", "/v1/graph-runs", expect=401, json={})
    with below_the_free_space_floor(server.state):
        body = {"graph_hash": graph, "input": {"topic": "t"}}
        await call(api, "POST", "/v1/graph-runs", expect=507, json=body)
    await server.wait_resting(started["run"])
    refused = await call(
        api,
        "POST",
        "/v1/runs/{run_id}/resume",
        expect=400,
        run_id=started["run"],
        json={"input": {}},
    )
    assert refused["error"]["code"] == "approval_schema_violation"

    # A host that wired no tool registry: the graph's tool node (`send`) cannot run there, so
    # neither a new run of it nor a resume of the one parked at its gate is taken.
    await server.stop()  # one daemon per store: the next one takes it over
    unwired = await server_factory(
        auth_token=TOKEN, registry=ToolRegistry.unwired(), demo_tools=False
    )
    body = {"graph_hash": graph, "input": {"topic": "t"}}
    await call(unwired.client, "POST", "/v1/graph-runs", expect=503, json=body)
    await call(
        unwired.client,
        "POST",
        "/v1/runs/{run_id}/resume",
        expect=503,
        run_id=started["run"],
        json={"input": {"approved": True}},
    )

    unreached = {seen for seen in contract.unreached() if seen[0] in GRAPH_RUN_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
    assert ("/v1/graph-runs", "post") in contract.requests


async def test_a_map_item_parked_on_a_person_walks_its_graph_on_once_resumed(
    server: Server, providers
) -> None:
    """A child whose agent asks for approval parks; the graph run's walk records the other items
    and stops; resuming the child over HTTP completes it, and its graph run walks on by itself."""
    asker, _ = await register(
        server, providers, [("request_approval", {"reason": "ok?"})], final_text="asked"
    )
    teller, _ = await register(server, providers, final_text="told")
    graph = await submit(
        server,
        {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "ask",
                    "kind": "map",
                    "over": "$input",
                    "body": {"kind": "agent", "agent": asker},
                },
                {"id": "tell", "kind": "agent", "agent": teller},
            ],
            "edges": [{"from": "ask", "to": "tell"}],
        },
    )
    run_id = await start(server, graph, ["only"])
    child = map_child_id(run_id, "ask", 0)
    with trio.fail_after(30):
        # The child exists once the walk started it; the walk stops once it parked.
        while (await server.client.get(f"/v1/runs/{child}")).json().get("status") != {
            "state": "suspended",
            "reason": "ok?",
            "input_schema": APPROVAL_TOOL_SCHEMA,
        } or server.state.drivers.driving(run_id):
            await trio.sleep(0.02)
    assert (await get_run(server, run_id))["status"]["state"] == "running"

    response = await server.client.post(
        f"/v1/runs/{child}/resume", json={"input": {"approved": True}}
    )
    assert response.status_code == 202, response.text
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": {"tell": "told"}}
    # The graph run's usage is its own node's model call and its map item's child's calls.
    spent = (await get_run(server, child))["usage"]
    assert spent["input_tokens"] > 0
    log = await server.state.runtime.reads.log(run_id)
    (item,) = [e.event for e in log if e.event.KIND.value == "MapItemCompleted"]
    assert item.usage == spent
    own = [e.event.usage for e in log if e.event.KIND.value == "ModelCallCompleted"]
    assert len(own) == 1
    assert body["usage"] == {key: spent[key] + own[0][key] for key in spent}
    (entry,) = [
        e for e in (await server.client.get("/v1/runs")).json()["runs"] if e["run"] == run_id
    ]
    assert entry["usage"] == body["usage"]


async def test_a_graph_naming_files_is_refused_over_the_api_with_nothing_recorded(
    server: Server,
) -> None:
    documents = [
        {"id": "step", "kind": "agent", "agent_file": "../agents/a.toml"},
        {"id": "step", "kind": "flow", "flow": "other"},
        {"id": "step", "kind": "snapshot", "name": "seen", "of": "$input"},
    ]
    for node in documents:
        graph = await submit(server, {"schema_version": 1, "nodes": [node], "edges": []})
        before = await snapshot(server)
        response = await server.client.post("/v1/graph-runs", json={"graph_hash": graph})
        message = assert_error(response, 400, "bad_request")["message"]
        assert "update the salvor client" in message and "node 'step'" in message, message
        assert await snapshot(server) == before
