"""``GET /v1/runs/{id}/graph``, ``POST /v1/runs/{id}/fork`` and ``GET /v1/runs/{id}/forks`` over
real HTTP, on SQLite and PostgreSQL.

The origins are graph-run logs appended by hand through the daemon's own store access
(``tests.support.graph_runs``), so these tests need no graph walker. Every response is validated
against the OpenAPI document and every status it lists for these paths is reached. A refusal
records nothing: no run appears, and the origin's log is byte for byte what it was.

The first test's children are checked through their log and status only (their graph names
agents this daemon does not hold, so the drive the fork starts stops at once, recording nothing);
the second forks a run the walker drove, and the walker drives each child on from its node.
"""

from __future__ import annotations

import uuid

from salvor.daemon.graphs import map_child_id
from salvor.protocol import (
    EMPTY_VIEW,
    RunStarted,
    ToolCallCompleted,
    ToolCallRequested,
    encode_envelope,
)

from tests.protocol.graphs import publishing
from tests.support.api import register
from tests.support.api_server import TOKEN
from tests.support.contract import (
    FORK_PATHS,
    MISSING_RUN,
    OVERSIZED,
    Contract,
    below_the_free_space_floor,
)
from tests.support.graph_runs import (
    DRAFT_WRITE,
    ENTERED_AT,
    PUBLISH_WRITE,
    SKIP_REASON,
    agent_run,
    published,
)

ITEM_WITH_A_WRITE = [
    RunStarted(agent_def_hash="sha256:" + "a" * 64, input={"minutes": 3}),
    ToolCallRequested(tool="log_minutes", input={"n": 3}, effect="write", idempotency_key=None),
    ToolCallCompleted(seq=1, output={"ok": True}),
]
EACH = ENTERED_AT["each"]
FORK = "/v1/runs/{run_id}/fork"
GRAPH = "/v1/runs/{run_id}/graph"
FORKS = "/v1/runs/{run_id}/forks"


async def _record(server, events) -> str:
    run_id = str(uuid.uuid4())
    await server.state.runtime.access.append(run_id, events, EMPTY_VIEW)
    return run_id


async def _log_bytes(server, run_id: str) -> list[str]:
    return [encode_envelope(e) for e in await server.state.runtime.reads.read_log(run_id)]


async def test_projection_and_forks_over_http(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    api, contract = server.client, await Contract.served(server.client)
    call = contract.call
    graph_hash = (await call(api, "POST", "/v1/graphs", expect=201, json=publishing()))["graph"]
    origin = await _record(server, published(graph_hash))
    agent = await _record(server, agent_run())
    parked = await _record(server, published(graph_hash)[: PUBLISH_WRITE + 1])
    orphan = await _record(server, published("sha256:" + "e" * 64))
    # The first item of the map `each` wrote, in a run of its own (under the walker's id for it).
    item = map_child_id(origin, "each", 0)
    await server.state.runtime.access.append(item, ITEM_WITH_A_WRITE, EMPTY_VIEW)
    assert (await call(api, "GET", "/v1/capabilities", expect=200))["capabilities"]["fork"] is True

    # -- the projection ------------------------------------------------------------------------
    projection = await call(api, "GET", GRAPH, expect=200, run_id=origin)
    assert "current_node" not in projection and "forked_from" not in projection
    assert projection["graph_hash"] == graph_hash
    assert [(n["node"], n["state"]) for n in projection["nodes"]] == [
        ("research", "exited"),
        ("draft", "exited"),
        ("approve", "exited"),
        ("route", "exited"),
        ("publish", "exited"),
        ("cool_off", "skipped"),
        ("each", "exited"),
        ("tally", "exited"),
    ]
    nodes = {n["node"]: n for n in projection["nodes"]}
    assert nodes["route"]["branch_case"] == "true"
    assert nodes["cool_off"]["reason"] == SKIP_REASON
    assert nodes["each"]["map"] == {"items": 2, "completed": 2}
    assert "map" not in nodes["research"] and "branch_case" not in nodes["research"]
    at_the_write = await call(api, "GET", GRAPH, expect=200, run_id=parked)
    assert at_the_write["current_node"] == "publish"
    await call(api, "GET", GRAPH, expect=409, run_id=agent)
    await call(api, "GET", GRAPH, expect=404, run_id=MISSING_RUN)
    await call(api, "GET", GRAPH, expect=400, run_id="not-a-run")

    # -- every refusal, recording nothing -------------------------------------------------------
    runs_before = (await api.get("/v1/runs")).json()["runs"]
    origin_before = await _log_bytes(server, origin)
    bare = await call(api, "POST", FORK, expect=409, run_id=origin, json={"from_node": "publish"})
    assert bare["error"]["code"] == "write_replay_hazard"
    recorded = (await server.state.runtime.reads.read_log(origin))[PUBLISH_WRITE]
    publish_write, item_write = bare["error"]["details"]["writes"]
    assert publish_write == {
        "seq": PUBLISH_WRITE,
        "tool": "publish_post",
        "input": {"text": "draft one"},
        "idempotency_key": None,
        "recorded_at": recorded.recorded_at,
    }
    # The map `each` is walked again too, and its first item wrote.
    assert item_write["seq"] == EACH and item_write["tool"] == "log_minutes"
    assert (item_write["run"], item_write["run_seq"]) == (item, 1)
    narrowed = await call(
        api,
        "POST",
        FORK,
        expect=409,
        run_id=origin,
        # 8.0 is the integer 8 to JSON (and to the document's schema).
        json={"from_node": "research", "acknowledge_writes": [float(DRAFT_WRITE)]},
    )
    assert [w["seq"] for w in narrowed["error"]["details"]["writes"]] == [PUBLISH_WRITE, EACH]
    refusals = [
        (origin, {"from_node": "ghost"}, 409, "invalid_fork_node"),
        (origin, {"from_node": "cool_off", "dry_run": True}, 409, "invalid_fork_node"),
        (agent, {"from_node": "research"}, 409, "not_a_graph_run"),
        (parked, {"from_node": "publish"}, 409, "origin_needs_reconciliation"),
        (orphan, {"from_node": "publish", "acknowledge_writes": [20]}, 404, "unknown_graph"),
        (orphan, {"from_node": "publish", "dry_run": True}, 404, "unknown_graph"),
        (MISSING_RUN, {"from_node": "publish"}, 404, "unknown_run"),
        (origin, {"from_node": "publish", "acknowledge_writes": [DRAFT_WRITE]}, 400, "bad_request"),
        (origin, {"from_node": "publish", "acknowledge_writes": [-1]}, 400, "bad_request"),
        (origin, {"from_node": "publish", "acknowledge_writes": [20.5]}, 400, "bad_request"),
        (origin, {"from_node": "publish", "acknowledge_writes": 20}, 400, "bad_request"),
        (origin, {"from_node": 7}, 400, "bad_request"),
        (origin, {"from_node": "publish", "dry_run": "yes"}, 400, "bad_request"),
        (origin, {"acknowledge_writes": []}, 400, "bad_request"),
    ]
    for run_id, body, status, code in refusals:
        refused = await call(api, "POST", FORK, expect=status, run_id=run_id, json=body)
        assert refused["error"]["code"] == code, (body, refused)
    intent = (
        await call(api, "POST", FORK, expect=409, run_id=parked, json={"from_node": "research"})
    )["error"]["details"]["intent"]
    assert (intent["seq"], intent["tool"]) == (PUBLISH_WRITE, "publish_post")
    await call(
        api,
        "POST",
        FORK,
        expect=413,
        run_id=origin,
        content=OVERSIZED,
        headers={"Content-Type": "application/json"},
    )

    each = await call(api, "POST", FORK, expect=409, run_id=origin, json={"from_node": "each"})
    assert each["error"]["details"]["writes"] == [item_write]

    # -- a dry run plans, and creates nothing ---------------------------------------------------
    each = await call(
        api,
        "POST",
        FORK,
        expect=200,
        run_id=origin,
        json={"from_node": "each", "acknowledge_writes": [EACH], "dry_run": True},
    )
    assert each["writes"] == [item_write] and each["would_proceed"] is True
    plan = await call(
        api,
        "POST",
        FORK,
        expect=200,
        run_id=origin,
        json={"from_node": "draft", "acknowledge_writes": [DRAFT_WRITE], "dry_run": True},
    )
    assert plan == {
        "dry_run": True,
        "origin": origin,
        "from_node": "draft",
        "through_seq": 6,
        "graph_hash": graph_hash,
        "prefix_event_count": 7,
        "writes": plan["writes"],
        "unacknowledged_writes": [PUBLISH_WRITE, EACH],
        "would_proceed": False,
    }
    assert [(w["seq"], w["tool"]) for w in plan["writes"]] == [
        (DRAFT_WRITE, "save_draft"),
        (PUBLISH_WRITE, "publish_post"),
        (EACH, "log_minutes"),
    ]
    assert (await api.get("/v1/runs")).json()["runs"] == runs_before
    assert await _log_bytes(server, origin) == origin_before
    assert (await call(api, "GET", FORKS, expect=200, run_id=origin))["forks"] == []

    # -- forks that proceed ---------------------------------------------------------------------
    created = await call(
        api,
        "POST",
        FORK,
        expect=201,
        run_id=origin,
        json={"from_node": "publish", "acknowledge_writes": [PUBLISH_WRITE, EACH]},
    )
    child = created["run"]
    assert created["status"] == "running"
    assert created["forked_from"] == {
        "run_id": origin,
        "through_seq": 18,
        "from_node": "publish",
        "graph_hash": graph_hash,
        "acknowledged_writes": [PUBLISH_WRITE, EACH],
    }
    assert await _log_bytes(server, origin) == origin_before
    origin_log = await server.state.runtime.reads.read_log(origin)
    child_log = await server.state.runtime.reads.read_log(child)
    assert len(child_log) == 19
    assert child_log[0].event.forked_from == created["forked_from"]
    assert [e.event for e in child_log[1:]] == [e.event for e in origin_log[1:19]]
    assert {e.run_id for e in child_log} == {child}
    assert (await api.get(f"/v1/runs/{child}")).json()["status"] == {"state": "running"}
    child_projection = await call(api, "GET", GRAPH, expect=200, run_id=child)
    assert child_projection["forked_from"] == created["forked_from"]
    assert [n["node"] for n in child_projection["nodes"]] == [
        "research",
        "draft",
        "approve",
        "route",
    ]
    assert "current_node" not in child_projection
    with below_the_free_space_floor(server.state):
        await call(api, "POST", FORK, expect=507, run_id=origin, json={"from_node": "tally"})
    # After every write, there is nothing to acknowledge.
    later = await call(api, "POST", FORK, expect=201, run_id=origin, json={"from_node": "tally"})
    listing = await call(api, "GET", FORKS, expect=200, run_id=origin)
    assert listing == {
        "run": origin,
        "derived": True,
        "forks": [
            {
                "run": child,
                "from_node": "publish",
                "through_seq": 18,
                "acknowledged_writes": [PUBLISH_WRITE, EACH],
            },
            {
                "run": later["run"],
                "from_node": "tally",
                "through_seq": 27,
                "acknowledged_writes": [],
            },
        ],
    }
    assert (await call(api, "GET", FORKS, expect=200, run_id=child))["forks"] == []
    await call(api, "GET", FORKS, expect=404, run_id=MISSING_RUN)
    await call(api, "GET", FORKS, expect=400, run_id="not-a-run")

    anonymous = server.new_client()
    for method, template in (("GET", GRAPH), ("POST", FORK), ("GET", FORKS)):
        kwargs = {"json": {"from_node": "publish"}} if method == "POST" else {}
        await call(anonymous, method, template, expect=401, run_id=origin, **kwargs)

    unreached = {seen for seen in contract.unreached() if seen[0] in FORK_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"
    assert (FORK, "post") in contract.requests


def _refund_graph(agent: str) -> dict:
    return {
        "schema_version": 1,
        "nodes": [
            {"id": "draft", "kind": "agent", "agent": agent, "input": "$input.invoice"},
            {
                "id": "refund",
                "kind": "tool",
                "tool": "issue_refund",
                "input": {"invoice_id": "$input.invoice", "amount_cents": 300},
            },
            {
                "id": "mail",
                "kind": "tool",
                "tool": "send_email",
                "input": {"to": "a@example.com", "subject": "Refund", "body": "$nodes.draft"},
            },
        ],
        "edges": [{"from": "draft", "to": "refund"}, {"from": "refund", "to": "mail"}],
    }


async def _calls(server, run_id: str) -> list[tuple[str, str]]:
    """(kind, what) of each model and tool intent in the run's log."""
    return [
        (e.event.KIND.value, getattr(e.event, "tool", "model"))
        for e in await server.state.runtime.reads.read_log(run_id)
        if e.event.KIND.value in ("ModelCallRequested", "ToolCallRequested")
    ]


async def test_a_walked_run_forked_walks_on_from_its_node(server, providers) -> None:
    """The walker drives the child from the fork node: nothing of the prefix runs again, the
    re-walked segment does, and its write only once acknowledged."""
    agent, provider = await register(server, providers, final_text="a refund note")
    graph = (await server.client.post("/v1/graphs", json=_refund_graph(agent))).json()["graph"]
    response = await server.client.post(
        "/v1/graph-runs", json={"graph_hash": graph, "input": {"invoice": "INV-4"}}
    )
    origin = response.json()["run"]
    assert (await server.wait_resting(origin))["status"]["state"] == "completed"
    assert await _calls(server, origin) == [
        ("ModelCallRequested", "model"),
        ("ToolCallRequested", "issue_refund"),
        ("ToolCallRequested", "send_email"),
    ]
    assert provider.call_count == 1

    # From the last node: no write after it, so no acknowledgement; only the email runs again.
    response = await server.client.post(f"/v1/runs/{origin}/fork", json={"from_node": "mail"})
    assert response.status_code == 201, response.text
    child = response.json()["run"]
    body = await server.wait_resting(child)
    assert body["status"]["state"] == "completed", body
    assert await _calls(server, child) == await _calls(server, origin)
    assert provider.call_count == 1  # the draft came with the prefix
    child_log = await server.state.runtime.reads.read_log(child)
    sent = [e.event for e in child_log if getattr(e.event, "tool", None) == "send_email"]
    origin_log = await server.state.runtime.reads.read_log(origin)
    (origin_sent,) = [e.event for e in origin_log if getattr(e.event, "tool", None) == "send_email"]
    # The idempotent call presents its origin's key: the provider collapses the duplicate.
    assert [e.idempotency_key for e in sent] == [origin_sent.idempotency_key]

    # From the write's node: refused until the write is acknowledged, then walked.
    (write,) = [e for e in origin_log if getattr(e.event, "tool", None) == "issue_refund"]
    response = await server.client.post(f"/v1/runs/{origin}/fork", json={"from_node": "refund"})
    assert response.status_code == 409, response.text
    assert [w["seq"] for w in response.json()["error"]["details"]["writes"]] == [write.seq]
    response = await server.client.post(
        f"/v1/runs/{origin}/fork", json={"from_node": "refund", "acknowledge_writes": [write.seq]}
    )
    assert response.status_code == 201, response.text
    again = response.json()["run"]
    assert (await server.wait_resting(again))["status"]["state"] == "completed"
    assert [what for _, what in await _calls(server, again)] == [
        "model",
        "issue_refund",
        "send_email",
    ]
    assert provider.call_count == 1
    forks = (await server.client.get(f"/v1/runs/{origin}/forks")).json()["forks"]
    assert [(f["run"], f["from_node"]) for f in forks] == [(child, "mail"), (again, "refund")]
