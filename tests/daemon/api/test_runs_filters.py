"""``GET /v1/runs?agent=`` and ``?graph=``: the run list by what a run runs (the dashboard's
filters), with the other filters and paging, and a malformed hash refused."""

from __future__ import annotations

from salvor.protocol import EMPTY_VIEW, GraphRunStarted, RunCompleted

from tests.support.api import assert_error, seed_run, snapshot

REFUNDS, TRIAGE = "sha256:" + "a" * 64, "sha256:" + "b" * 64
PUBLISH = "sha256:" + "d" * 64


async def listed(server, **query) -> list[str]:
    runs, cursor = [], None
    while True:
        params = {**query, "limit": 1, **({"cursor": cursor} if cursor else {})}
        response = await server.client.get("/v1/runs", params=params)
        assert response.status_code == 200, response.text
        runs += [entry["run"] for entry in response.json()["runs"]]
        if (cursor := response.json().get("next_cursor")) is None:
            return runs


async def test_the_list_filters_by_agent_and_by_graph(server) -> None:
    refund = await seed_run(server, REFUNDS, labels={"desk": "eu"})
    done = await seed_run(server, REFUNDS, RunCompleted(output=1), labels={"desk": "us"})
    triage = await seed_run(server, TRIAGE)
    graph_run = "00000000-0000-4000-8000-00000000000d"
    await server.state.runtime.access.append(
        graph_run, [GraphRunStarted(graph_hash=PUBLISH, input=None)], EMPTY_VIEW
    )
    assert sorted(await listed(server, agent=REFUNDS)) == sorted([refund, done])
    assert await listed(server, agent=REFUNDS, status="completed") == [done]
    assert await listed(server, agent=REFUNDS, label="desk:eu") == [refund]
    assert await listed(server, agent=TRIAGE) == [triage]
    assert await listed(server, graph=PUBLISH) == [graph_run]
    assert await listed(server, graph=REFUNDS) == [] == await listed(server, agent=PUBLISH)


async def test_a_malformed_hash_is_refused_and_changes_nothing(server) -> None:
    before = await snapshot(server)
    for query in (
        {"agent": "refund-desk"},
        {"agent": "sha256:" + "A" * 64},
        {"graph": "sha256:" + "d" * 63},
        {"graph": ""},
    ):
        response = await server.client.get("/v1/runs", params=query)
        error = assert_error(response, 400, "bad_request")
        assert f"`{next(iter(query))}`" in error["message"]
    assert await snapshot(server) == before
