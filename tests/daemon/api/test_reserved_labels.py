"""The flow labels at every HTTP door that takes labels from a caller (POST /v1/runs, POST
/v1/graph-runs, a client run's RunStarted): ``salvor.parent`` and ``salvor.map_of`` are the
daemon's own, ``salvor.autonomous`` is "true" or "false"; a refusal is one 400 and records
nothing."""

from __future__ import annotations

import pytest

from tests.daemon.api.test_graph_runs import submit
from tests.daemon.client_runs.test_client_runs import append, head, open_run
from tests.support.api import assert_error, list_entry, register, rested, snapshot
from tests.support.api_server import Server
from tests.support.graph_runs import approval_graph

REFUSED = [
    ({"salvor.parent": "00000000-0000-4000-8000-000000000000"}, "`salvor.parent` is written by"),
    ({"team": "a", "salvor.map_of": "g"}, "`salvor.map_of` is written by the daemon alone"),
    ({"salvor.autonomous": "yes"}, '`salvor.autonomous` is "true"'),
    ({"salvor.autonomous": "TRUE"}, "not 'TRUE'"),
]


@pytest.mark.parametrize(("labels", "fragment"), REFUSED)
async def test_every_door_refuses_the_daemons_labels_and_records_nothing(
    server: Server, providers, labels, fragment
):
    agent, provider = await register(server, providers)
    graph = await submit(server, approval_graph(agent))
    opened = await open_run(server.client)
    before = await snapshot(server)
    started = await server.client.post("/v1/runs", json={"agent": agent, "labels": labels})
    walked = await server.client.post(
        "/v1/graph-runs", json={"graph_hash": graph, "labels": labels}
    )
    appended = await append(
        server.client, opened["run"], opened["drive_token"], [head(opened["run"], labels=labels)]
    )
    messages = [assert_error(r, 400, "bad_request")["message"] for r in (started, walked)]
    assert all(fragment in message for message in messages)
    assert assert_error(appended, 400, "bad_request")["message"] == "events[0]: " + messages[0]
    assert await snapshot(server) == before
    assert provider.call_count == 0


async def test_a_caller_may_mark_its_run_tree_autonomous(server: Server, providers):
    agent, _ = await register(server, providers)
    for value in ("true", "false"):
        run_id, rest = await rested(server, agent, labels={"salvor.autonomous": value})
        assert rest["status"]["state"] == "completed"
        assert (await list_entry(server, run_id))["labels"] == {"salvor.autonomous": value}
