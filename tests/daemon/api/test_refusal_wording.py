"""A refusal over HTTP tells its caller the next step as an HTTP action (the route, its body), never
as a ``salvor`` command: the caller may have no shell on the daemon's machine.

One test per refusal that has a way out, each on a real daemon over a real store, the run's log
recorded by hand where that is all the refusal reads (what a crashed daemon or the CLI leaves).
Each also checks the one envelope, and that the refusal recorded nothing.
"""

from __future__ import annotations

import argparse
import re
import uuid

from salvor.daemon.cli._parser import command_parser
from salvor.protocol import EMPTY_VIEW, ModelCallRequested, SleepStarted, ToolCallRequested

from tests.protocol.graphs import publishing
from tests.support.api import (
    FAR_WAKE,
    NOBODY,
    assert_error,
    register,
    seed_run,
    snapshot,
)
from tests.support.graph_runs import PUBLISH_WRITE, published

# The module's subject sits above the store: the refusals read it through the same calls on
# either backend.
STORE_BACKENDS = ("sqlite",)
UNREGISTERED = "sha256:" + "0" * 64


def _commands() -> list[str]:
    (verbs,) = [a for a in command_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(verbs.choices)


# Any `salvor VERB` the command line has, quoted or not.
CLI_COMMAND = re.compile(r"\bsalvor\s+(?:" + "|".join(map(re.escape, _commands())) + r")\b")


def http_step(error: dict, *actions: str) -> str:
    """The refusal's message, once it names every one of ``actions`` and no command."""
    message = error["message"]
    for action in actions:
        assert action in message, message
    assert CLI_COMMAND.search(message) is None, message
    return message


async def test_an_unknown_agent_is_told_to_register_it_with_post_agents(server) -> None:
    orphan = await seed_run(server, UNREGISTERED)
    before = await snapshot(server)
    started = await server.client.post("/v1/runs", json={"agent": UNREGISTERED})
    http_step(assert_error(started, 404, "unknown_agent"), "POST /v1/agents")
    resumed = await server.client.post(f"/v1/runs/{orphan}/resume")
    message = http_step(assert_error(resumed, 404, "unknown_agent"), "POST /v1/agents")
    assert UNREGISTERED in message
    assert await snapshot(server) == before


async def test_a_dangling_write_is_resolved_with_post_resolve(server, providers) -> None:
    # publish_post is a write with no probe: a resume cannot settle it and refuses.
    agent, _ = await register(server, providers, tools=["publish_post"])
    write = ToolCallRequested(
        tool="publish_post", input={"title": "t"}, effect="write", idempotency_key=None
    )
    run_id = await seed_run(server, agent, write)
    before = await snapshot(server)
    refused = await server.client.post(f"/v1/runs/{run_id}/resume")
    error = assert_error(refused, 409, "needs_reconciliation")
    http_step(error, f"POST /v1/runs/{run_id}/resolve", '{"output": ', '{"not_landed": true}')
    assert error["details"]["intent"]["tool"] == "publish_post"
    assert await snapshot(server) == before


async def test_a_fork_of_a_parked_origin_is_told_to_resolve_it_with_post_resolve(server) -> None:
    graph = await server.client.post("/v1/graphs", json=publishing())
    assert graph.status_code == 201, graph.text
    parked = str(uuid.uuid4())
    await server.state.runtime.access.append(
        parked, published(graph.json()["graph"])[: PUBLISH_WRITE + 1], EMPTY_VIEW
    )
    before = await snapshot(server)
    refused = await server.client.post(f"/v1/runs/{parked}/fork", json={"from_node": "publish"})
    error = assert_error(refused, 409, "origin_needs_reconciliation")
    message = http_step(error, f"POST /v1/runs/{parked}/resolve", '{"output": ')
    assert message.endswith("then fork")
    assert await snapshot(server) == before


async def test_a_sleeping_run_says_when_it_wakes_and_that_the_daemon_wakes_it(server) -> None:
    run_id = await seed_run(server, UNREGISTERED, SleepStarted(wake_at=FAR_WAKE))
    before = await snapshot(server)
    refused = await server.client.post(f"/v1/runs/{run_id}/resume")
    error = assert_error(refused, 409, "still_sleeping")
    message = http_step(error, FAR_WAKE, "wake sweeper", f"POST /v1/runs/{run_id}/resume")
    assert "by itself" in message
    assert error["details"]["wake_at"] == FAR_WAKE
    assert await snapshot(server) == before


async def test_a_resolve_of_a_run_with_no_dangling_write_names_post_resume(server) -> None:
    run_id = await seed_run(
        server, UNREGISTERED, ModelCallRequested(request_hash="sha256:" + "1" * 64)
    )
    before = await snapshot(server)
    refused = await server.client.post(f"/v1/runs/{run_id}/resolve", json={"output": 1})
    http_step(assert_error(refused, 409, "wrong_state"), f"POST /v1/runs/{run_id}/resume")
    assert await snapshot(server) == before


async def test_the_client_run_routes_name_a_server_driven_run_as_such(server) -> None:
    run_id = await seed_run(server, UNREGISTERED)
    before = await snapshot(server)
    token = {"X-Drive-Token": "dt_not_a_lease"}
    for method, path in (
        ("POST", "heartbeat"),
        ("GET", "log"),
        ("POST", "events"),
        ("POST", "resolve"),
    ):
        response = await server.client.request(
            method, f"/v1/client-runs/{run_id}/{path}", headers=token, json={"events": []}
        )
        # The spec's code for a run these routes do not serve, named for what it is.
        message = http_step(assert_error(response, 404, "unknown_run"), f"GET /v1/runs/{run_id}")
        assert "server-driven" in message and "in this store" not in message, path
    missing = await server.client.get(f"/v1/client-runs/{NOBODY}/log")
    assert "server-driven" not in assert_error(missing, 404, "unknown_run")["message"]
    assert await snapshot(server) == before
