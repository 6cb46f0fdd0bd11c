"""The control-plane API over real HTTP: starting runs, reading them, and listing them.

Each test talks to the real daemon (``serve``: hypercorn, the routes, the
drivers, the store's writer thread) on a loopback port, over a real SQLite
file and, when ``SALVOR_TEST_POSTGRES_URL`` is set, a real PostgreSQL. The
model is the scripted provider; the tools are the demo registry's. Registering
agents, resume, and resolve and abandon have modules of their own
(``test_agent_registration``, ``test_resume``, ``test_resolve_and_abandon``).

Every refusal is checked for the one envelope, no traceback, and that the
store is exactly as it was.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import salvor
import trio

from tests.support.api import (
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
from tests.support.api_server import Server

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
