"""A caller cannot choose a run id salvor derives for a child, so it cannot plant a map's results.

A map item's run id is uuid5 over its graph run's id, its node and its index (a subagent's over its
parent's id and its call's seq): anyone can compute it in advance. On main a client opened a
client-driven run under the id of a map's first item while the graph run waited at its gate,
recorded a forged ``RunCompleted``, and once the gate was approved the map took that forged output
as its item's result. Now every id a caller chooses for a new run (``POST /v1/runs``,
``POST /v1/client-runs``, and the command line's ``--run-id``) is refused when it is name-based
(version 3 or 5), and the map's item is the run the map started.
"""

from __future__ import annotations

import json
import uuid

import trio
from salvor.daemon.flows import child_run_id
from salvor.daemon.graphs import map_child_id

from tests.support.api import register
from tests.support.api_server import Server
from tests.support.client_events import envelope, run_started
from tests.support.graph_runs import APPROVAL

FORGED = {"verdict": "forged by the caller"}


async def test_a_map_s_item_cannot_be_planted_under_its_derived_id(server: Server, providers):
    teller, provider = await register(server, providers, final_text="told")
    submitted = await server.client.post(
        "/v1/graphs",
        json={
            "schema_version": 1,
            "nodes": [
                {"id": "approve", "kind": "gate", "prompt": "Go?", "approval_schema": APPROVAL},
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input",
                    "body": {"kind": "agent", "agent": teller},
                },
            ],
            "edges": [{"from": "approve", "to": "each"}],
        },
    )
    assert submitted.status_code == 201, submitted.text
    started = await server.client.post(
        "/v1/graph-runs", json={"graph_hash": submitted.json()["graph"], "input": ["only"]}
    )
    assert started.status_code == 201, started.text
    run_id = started.json()["run"]
    with trio.fail_after(30):
        while (await server.client.get(f"/v1/runs/{run_id}")).json()["status"]["state"] != (
            "suspended"
        ):
            await trio.sleep(0.02)

    # The attack: the first item's id is known before the map starts it.
    planted = map_child_id(run_id, "each", 0)
    opened = await server.client.post("/v1/client-runs", json={"run_id": planted})
    if opened.status_code == 201:
        token = opened.json()["drive_token"]
        head = run_started(planted, teller)
        done = envelope(planted, 1, "RunCompleted", {"output": FORGED})
        planting = await server.client.post(
            f"/v1/client-runs/{planted}/events",
            json={"events": [head, done]},
            headers={"X-Drive-Token": token},
        )
        assert planting.status_code == 200, planting.text
    approved = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}}
    )
    assert approved.status_code == 202, approved.text
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    assert "forged" not in json.dumps(body)
    assert "told" in json.dumps(body["status"]["output"])
    child = (await server.client.get(f"/v1/runs/{planted}")).json()
    assert child["status"]["state"] == "completed" and "forged" not in json.dumps(child)
    assert provider.call_count == 1
    # The id was refused outright: nothing was planted.
    assert opened.status_code == 400, opened.text
    refusal = opened.json()["error"]
    assert refusal["code"] == "bad_request"
    assert "name-based UUID (version 5)" in refusal["message"]
    assert "the kind salvor derives for the runs it starts itself" in refusal["message"]


async def test_no_new_run_takes_a_name_based_id(server: Server, providers) -> None:
    agent, _ = await register(server, providers)
    parent = str(uuid.uuid4())
    for run_id in (
        child_run_id(parent, 3),  # a subagent's
        str(uuid.uuid3(uuid.NAMESPACE_URL, "https://example.invalid/")),
    ):
        for path, body in (
            ("/v1/runs", {"agent": agent, "input": None, "run_id": run_id}),
            ("/v1/client-runs", {"run_id": run_id}),
        ):
            refused = await server.client.post(path, json=body)
            assert refused.status_code == 400, (path, refused.text)
            assert "name-based UUID" in refused.json()["error"]["message"]
        assert (await server.client.get(f"/v1/runs/{run_id}")).status_code == 404
    # Random and time-ordered ids are the caller's to choose.
    for run_id in (str(uuid.uuid4()), "01937f5e-2b1c-7a3d-9e4f-5a6b7c8d9e0f"):
        taken = await server.client.post(
            "/v1/runs", json={"agent": agent, "input": None, "run_id": run_id}
        )
        assert taken.status_code == 201, taken.text
        assert taken.json()["run"] == run_id
