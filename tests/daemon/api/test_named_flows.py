"""Flows kept by name over real HTTP, on SQLite and PostgreSQL: ``POST /v1/graphs?name=`` makes
a name's versions, ``GET /v1/flows`` lists the names and ``GET /v1/flows/{ns}/{name}`` one with its
versions, ``POST /v1/graph-runs`` starts a run by ``flow_name``, and a run suspended on an old
version finishes on it after the name was edited (issue 32's test). Every refusal is the one
envelope, with nothing stored or recorded."""

from __future__ import annotations

import json

from salvor.daemon.runs import FlowCatalog

from tests.support.api import assert_error, snapshot
from tests.support.api_server import TOKEN, Server
from tests.support.contract import FLOW_PATHS, Contract

GATE = {
    "schema_version": 1,
    "nodes": [{"id": "approve", "kind": "gate", "prompt": "Go?"}],
    "edges": [],
}
# The next version: one more gate after the first, so a run of it rests at `again` once approved.
TWO_GATES = {
    "schema_version": 1,
    "nodes": [
        {"id": "approve", "kind": "gate", "prompt": "Go?"},
        {"id": "again", "kind": "gate", "prompt": "Really?"},
    ],
    "edges": [{"from": "approve", "to": "again"}],
}


async def _name(server: Server, flow: str, document: dict) -> dict:
    response = await server.client.post(f"/v1/graphs?name={flow}", json=document)
    assert response.status_code == 201, response.text
    return response.json()


async def _start(server: Server, flow: str, **fields) -> str:
    response = await server.client.post("/v1/graph-runs", json={"flow_name": flow, **fields})
    assert response.status_code == 201, response.text
    return response.json()["run"]


async def test_a_graph_submitted_with_a_name_is_listed_with_its_versions(server: Server) -> None:
    first = await _name(server, "team/triage", GATE)
    assert (first["flow"], first["version"], first["new_version"]) == ("team/triage", 1, True)
    second = await _name(server, "team/triage", TWO_GATES)
    assert (second["version"], second["new_version"]) == (2, True)
    again = await _name(server, "team/triage", TWO_GATES)
    assert (again["version"], again["new_version"], again["created"]) == (2, False, False)
    await _name(server, "alpha/one", GATE)
    # Without a name: stored, named nothing.
    plain = await server.client.post("/v1/graphs", json=GATE)
    assert set(plain.json()) == {"graph", "created"}

    listed = (await server.client.get("/v1/flows")).json()["flows"]
    assert [(f["flow"], f["version"], f["graph"]) for f in listed] == [
        ("alpha/one", 1, first["graph"]),
        ("team/triage", 2, second["graph"]),
    ]
    shown = (await server.client.get("/v1/flows/team/triage")).json()
    assert (shown["namespace"], shown["name"], shown["graph"]) == (
        "team",
        "triage",
        second["graph"],
    )
    assert [(v["version"], v["graph"]) for v in shown["versions"]] == [
        (1, first["graph"]),
        (2, second["graph"]),
    ]
    assert "run" not in shown["versions"][0]  # kept by a caller of the API, not a run
    assert shown["updated_at"] == shown["versions"][-1]["created_at"]


async def test_an_unknown_or_malformed_name_is_refused_in_the_envelope(server: Server) -> None:
    assert_error(await server.client.get("/v1/flows/team/nothing"), 404, "unknown_flow")
    before = await snapshot(server)
    error = assert_error(
        await server.client.post("/v1/graph-runs", json={"flow_name": "team/nothing"}),
        404,
        "unknown_flow",
    )
    assert error["details"] == {"flow": "team/nothing"}
    for flow in ("nothing", "a/b/c", "team/.hidden"):
        response = await server.client.post("/v1/graph-runs", json={"flow_name": flow})
        assert_error(response, 400, "bad_request")
        assert_error(
            await server.client.post(f"/v1/graphs?name={flow}", json=GATE), 400, "bad_request"
        )
    both = {"flow_name": "team/triage", "graph_hash": "sha256:" + "a" * 64}
    assert_error(await server.client.post("/v1/graph-runs", json=both), 400, "bad_request")
    assert await snapshot(server) == before
    assert (await server.client.get("/v1/graphs")).json()["graphs"] == []
    assert (await server.client.get("/v1/flows")).json()["flows"] == []


async def test_a_run_by_name_walks_the_current_version_and_is_labelled_with_it(
    server: Server,
) -> None:
    await _name(server, "team/triage", GATE)
    current = (await _name(server, "team/triage", TWO_GATES))["graph"]
    run_id = await _start(server, "team/triage", labels={"team": "docs"})
    body = await server.wait_resting(run_id)
    assert body["graph_hash"] == current
    assert body["labels"] == {"team": "docs", "salvor.flow": "team/triage"}
    # The daemon's label is its own: a caller cannot set it.
    response = await server.client.post(
        "/v1/graph-runs",
        json={"graph_hash": current, "labels": {"salvor.flow": "team/triage"}},
    )
    assert_error(response, 400, "bad_request")


async def test_a_run_suspended_on_an_old_version_finishes_on_it_after_an_edit(
    server: Server,
) -> None:
    old = (await _name(server, "team/triage", GATE))["graph"]
    run_id = await _start(server, "team/triage")
    assert (await server.wait_resting(run_id))["status"]["state"] == "suspended"

    # The flow is edited by name while the run waits at its gate, as a run's flow_write edits it.
    runtime = server.state.runtime
    host = FlowCatalog(runtime.definitions, credentials=runtime.kit.credentials)
    edited = await host.write_graph("team", "triage", json.dumps(TWO_GATES), author="editor-run")
    assert (edited["version"], edited["new_version"]) == (2, True)

    response = await server.client.post(f"/v1/runs/{run_id}/resume", json={"input": {}})
    assert response.status_code == 202, response.text
    body = await server.wait_resting(run_id)
    # Its own version had one gate: it completes, where the new one would wait at `again`.
    assert body["status"]["state"] == "completed", body
    assert body["graph_hash"] == old
    # A fork of it walks its own version too, labelled as it was.
    response = await server.client.post(f"/v1/runs/{run_id}/fork", json={"from_node": "approve"})
    assert response.status_code == 201, response.text
    fork = await server.wait_resting(response.json()["run"])
    assert (fork["graph_hash"], fork["labels"]) == (old, {"salvor.flow": "team/triage"})
    # A run started by the name now walks the new version.
    newer = await _start(server, "team/triage")
    assert (await server.wait_resting(newer))["graph_hash"] == edited["graph"]
    versions = (await server.client.get("/v1/flows/team/triage")).json()["versions"]
    assert [(v["graph"], v.get("run")) for v in versions] == [
        (old, None),
        (edited["graph"], "editor-run"),
    ]


async def test_flow_answers_match_the_document(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    named = await call(
        api, "POST", "/v1/graphs", expect=201, json=GATE, params={"name": "team/triage"}
    )
    assert named["version"] == 1
    await call(api, "POST", "/v1/graphs", expect=400, json=GATE, params={"name": "team"})
    await call(api, "POST", "/v1/graphs", expect=400, json=GATE, params={"other": "x"})
    await call(api, "GET", "/v1/flows", expect=200)
    flow = "/v1/flows/{namespace}/{name}"
    await call(api, "GET", flow, expect=200, namespace="team", name="triage")
    await call(api, "GET", flow, expect=404, namespace="team", name="nothing")
    anonymous = server.new_client()
    await call(anonymous, "GET", "/v1/flows", expect=401)
    await call(anonymous, "GET", flow, expect=401, namespace="team", name="triage")
    unreached = {seen for seen in contract.unreached() if seen[0] in FLOW_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
