"""What one daemon used to keep in its memory is kept in the store (issue 30): a client run's drive
lease and a login session taken through one node work through any other node over the same store.

Two nodes in one test: two in-process apps, each with its own store access (its own engine and
writer thread) over one store, each with the server state ``salvor serve`` builds
(``server_state``). Two ``salvor serve`` processes over one store are still refused on this
branch (the store lock), which is what the in-process pair stands in for; the last test pairs a
real ``salvor serve`` process with an in-process node beside it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import trio
from salvor.daemon.agents import Credentials
from salvor.daemon.api._app import create_app
from salvor.daemon.metrics import DaemonMetrics
from salvor.daemon.recording import open_store_access
from salvor.daemon.runs import DriverSet, EventHub, Runtime
from salvor.daemon.serve import ServeConfig
from salvor.daemon.serve._server_state import server_state
from salvor.daemon.tools import ToolRegistry
from salvor.store import normalize_store_url, open_locks

from tests.chaos.test_kill_serve import TOKEN_VAR, Daemon
from tests.daemon.client_runs.test_client_runs import head
from tests.support.backends import BOTH
from tests.support.client_events import envelope

STORE_BACKENDS = BOTH
TOKEN = "a-daemon-token-long-enough-0123456789"


@asynccontextmanager
async def node(store_url: str, **settings) -> AsyncIterator:
    """One node over ``store_url``: a test client of its app, with the state serve builds."""
    url = normalize_store_url(store_url)
    config = ServeConfig(host="127.0.0.1", port=0, store_url=url, **settings)
    locks = await trio.to_thread.run_sync(open_locks, url, "test")
    try:
        async with open_store_access(url) as access, trio.open_nursery() as nursery:
            runtime = Runtime(access, ToolRegistry())
            drivers = DriverSet(runtime, nursery)
            state = await server_state(
                config,
                runtime,
                drivers,
                EventHub(),
                None,
                Credentials.for_daemon(),
                locks,
                DaemonMetrics(),
            )
            yield create_app(state).test_client()
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(locks.close)


def token_of(token: str) -> dict:
    return {"X-Drive-Token": token}


async def append(client, run_id: str, token: str, events: list[dict]):
    return await client.post(
        f"/v1/client-runs/{run_id}/events", json={"events": events}, headers=token_of(token)
    )


async def listed_driver(client, run_id: str) -> str:
    """The ``driver`` of the run's entry in ``GET /v1/runs``."""
    runs = (await (await client.get("/v1/runs")).get_json())["runs"]
    (entry,) = [entry for entry in runs if entry["run"] == run_id]
    return entry["driver"]


async def answer(response) -> tuple[int, dict]:
    return response.status_code, await response.get_json()


async def test_a_client_run_opened_through_one_node_is_driven_through_another(store_url) -> None:
    async with node(store_url) as one, node(store_url) as other:
        opened = await (await one.post("/v1/client-runs", json={})).get_json()
        run_id, token = opened["run"], opened["drive_token"]
        # The client switches nodes: its token drives the run there.
        status, body = await answer(await append(other, run_id, token, [head(run_id)]))
        assert (status, body) == (200, {"appended": [0]})
        sleep = envelope(run_id, 1, "SleepStarted", {"wake_at": "2026-11-29T09:00:00.000000Z"})
        assert (await append(one, run_id, token, [sleep])).status_code == 200
        # Either node sees the lease: nobody else opens the run, and it reads as attached.
        status, body = await answer(await other.post("/v1/client-runs", json={"run_id": run_id}))
        assert (status, body["error"]["code"]) == (409, "lease_held")
        assert 1 <= body["error"]["details"]["lapses_in_seconds"] <= 60
        assert (await (await other.get(f"/v1/runs/{run_id}")).get_json())["driver"] == "attached"
        assert await listed_driver(other, run_id) == "attached"
        heartbeat = await other.post(f"/v1/client-runs/{run_id}/heartbeat", headers=token_of(token))
        assert heartbeat.status_code == 200
        # The holder re-opens through the other node under its own token.
        reopened = await other.post(
            "/v1/client-runs", json={"run_id": run_id}, headers=token_of(token)
        )
        assert (await reopened.get_json())["drive_token"] == token
        # Released through one node, the run is free on both: a new open through the other takes
        # it with a fresh token, and the old token drives nowhere.
        released = await one.post(f"/v1/client-runs/{run_id}/release", headers=token_of(token))
        assert (await released.get_json()) == {"released": True}
        assert (await (await other.get(f"/v1/runs/{run_id}")).get_json())["driver"] == "none"
        assert await listed_driver(one, run_id) == "none"
        adopted = await (await other.post("/v1/client-runs", json={"run_id": run_id})).get_json()
        fresh = adopted["drive_token"]
        assert fresh != token
        woke = envelope(run_id, 2, "SleepCompleted", {})
        status, body = await answer(await append(one, run_id, token, [woke]))
        assert (status, body["error"]["code"]) == (403, "invalid_drive_token")
        assert (await append(one, run_id, fresh, [woke])).status_code == 200


async def test_a_lease_taken_through_one_node_lapses_for_every_node(store_url) -> None:
    async with node(store_url, lease_ttl=1.0) as one, node(store_url, lease_ttl=1.0) as other:
        opened = await (await one.post("/v1/client-runs", json={})).get_json()
        run_id, token = opened["run"], opened["drive_token"]
        assert (await append(one, run_id, token, [head(run_id)])).status_code == 200
        # The client goes quiet: within a bounded wait the other node lets a new driver in.
        with trio.fail_after(30):
            while True:
                response = await other.post("/v1/client-runs", json={"run_id": run_id})
                if response.status_code == 200:
                    break
                assert (await response.get_json())["error"]["code"] == "lease_held"
                await trio.sleep(0.1)
        fresh = (await response.get_json())["drive_token"]
        assert fresh != token
        status, body = await answer(
            await one.post(f"/v1/client-runs/{run_id}/heartbeat", headers=token_of(token))
        )
        assert (status, body["error"]["code"]) == (403, "invalid_drive_token")


async def test_a_session_cookie_from_one_node_works_on_another(store_url) -> None:
    async with node(store_url, auth_token=TOKEN) as one, node(store_url, auth_token=TOKEN) as other:
        login = await one.post("/v1/session", json={"token": TOKEN})
        assert login.status_code == 200
        cookie = login.headers["Set-Cookie"].split(";")[0]
        csrf = (await login.get_json())["csrf"]
        by_cookie = {"Cookie": cookie}
        # The other node honours it, answers the same csrf token, and takes a state change by it.
        assert (await other.get("/v1/runs", headers=by_cookie)).status_code == 200
        session = await (await other.get("/v1/session", headers=by_cookie)).get_json()
        assert session["csrf"] == csrf
        assert session["expires_at"] == (await login.get_json())["expires_at"]
        refused = await other.delete("/v1/session", headers=by_cookie)
        assert (await answer(refused))[0] == 403  # no csrf token: nothing ended
        ended = await other.delete("/v1/session", headers={**by_cookie, "X-Salvor-CSRF": csrf})
        assert (await ended.get_json()) == {"ended": True}
        # Logged out through the other node, the cookie is refused by the first too.
        status, body = await answer(await one.get("/v1/runs", headers=by_cookie))
        assert (status, body["error"]["code"]) == (401, "unauthorized")


async def test_a_real_daemon_and_a_node_beside_it_share_leases_and_sessions(
    store_url, tmp_path
) -> None:
    # One node is a real `salvor serve` process (it holds the store lock); the other is an
    # in-process node over the same store: a lease and a login cross the process boundary.
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.env[TOKEN_VAR] = TOKEN
    daemon.args += ["--auth-token", TOKEN_VAR]
    await trio.to_thread.run_sync(daemon.start)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with (
            httpx.AsyncClient(base_url=daemon.base_url, headers=bearer) as served,
            node(store_url, auth_token=TOKEN) as beside,
        ):
            opened = (await served.post("/v1/client-runs", json={})).json()
            run_id, token = opened["run"], opened["drive_token"]
            drive = {**bearer, **token_of(token)}
            events = {"events": [head(run_id)]}
            appended = await beside.post(
                f"/v1/client-runs/{run_id}/events", json=events, headers=drive
            )
            assert (await answer(appended)) == (200, {"appended": [0]})
            sleep = envelope(run_id, 1, "SleepStarted", {"wake_at": "2026-11-29T09:00:00.000000Z"})
            response = await served.post(
                f"/v1/client-runs/{run_id}/events", json={"events": [sleep]}, headers=drive
            )
            assert response.json() == {"appended": [1]}, response.text
            again = await beside.post("/v1/client-runs", json={"run_id": run_id}, headers=bearer)
            assert (await again.get_json())["error"]["code"] == "lease_held"
            # A person logged in to the real daemon's page is logged in beside it.
            login = await served.post("/v1/session", json={"token": TOKEN}, headers={})
            cookie = f"salvor_session={login.cookies['salvor_session']}"
            session = await beside.get("/v1/session", headers={"Cookie": cookie})
            assert (await session.get_json())["csrf"] == login.json()["csrf"]
    finally:
        await trio.to_thread.run_sync(daemon.kill)
