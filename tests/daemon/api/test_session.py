"""The page's login: the session cookie, its CSRF token and the Origin check, beside the bearer.

A real daemon with ``--auth-token`` on a loopback port, spoken to over real HTTP (and a real
WebSocket handshake, ``trio-websocket``). What is pinned:

* ``POST /v1/session``: the right token answers a csrf token and the cookie (HttpOnly,
  SameSite=Strict, Path=/, Max-Age of 12 hours, Secure only over TLS); a wrong token is 401 and no
  cookie; a malformed body, or any query string, is 400; a page of another origin is 403. Every
  status the document gives the three session routes is answered here, each body validated.
* The cookie opens a GET; a state-changing request by cookie without its session's
  ``X-Salvor-CSRF`` (or from another origin) is 403 and records nothing; with it, it changes
  state. The bearer token works alone and needs neither. The append front and the WebSocket
  handshake follow the same rules.
* An expired session (an injected clock) is 401; a logout ends the session and clears the cookie.
* The token is in no log line, no answer and nothing the store holds.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import trio
from salvor.daemon.api._app import create_app
from salvor.daemon.web import Sessions
from salvor.protocol import parse_instant
from salvor.store import normalize_store_url
from sqlalchemy import create_engine, text
from trio_websocket import ConnectionRejected, open_websocket_url

from tests.daemon.client_runs.test_client_runs import head, open_run
from tests.store.test_store import execute_sql
from tests.support.api import assert_error, snapshot
from tests.support.api_server import TOKEN
from tests.support.backends import BOTH, SQLITE_ONLY
from tests.support.contract import OVERSIZED, SESSION_PATHS, Contract

# SQLite unless a test reads the store (those parametrize both backends themselves).
STORE_BACKENDS = SQLITE_ONLY

SESSION = "/v1/session"
AGENT = 'model = "demo-planner"\nsystem_prompt = "Nap."\n[llm]\nprovider = "demo"\n'
TOML = {"Content-Type": "application/toml"}
JSON_TYPE = {"Content-Type": "application/json"}


async def log_in(server) -> tuple[str, str]:
    """A fresh login with the right token: (the cookie's value, the csrf token)."""
    response = await server.new_client().post(SESSION, json={"token": TOKEN})
    assert response.status_code == 200, response.text
    return response.cookies["salvor_session"], response.json()["csrf"]


def page(server, cookie: str, **headers: str) -> httpx.AsyncClient:
    """A client that sends the session cookie (and ``headers``), never the bearer token."""
    return server.new_client(headers={"Cookie": f"salvor_session={cookie}", **headers})


def set_cookie(response: httpx.Response) -> dict[str, str]:
    """The ``salvor_session`` Set-Cookie's attributes (lower-case names; the value as ``value``)."""
    (header,) = [h for h in response.headers.get_list("set-cookie") if "salvor_session" in h]
    pair, *attributes = [part.strip() for part in header.split(";")]
    fields = {"value": pair.partition("=")[2]}
    for attribute in attributes:
        name, _, value = attribute.partition("=")
        fields[name.lower()] = value
    return fields


@pytest.fixture
async def guarded(server_factory):
    return await server_factory(auth_token=TOKEN)


# -- the login ---------------------------------------------------------------------------------


async def test_every_status_of_the_session_routes_is_answered_as_documented(guarded) -> None:
    contract = await Contract.served(guarded.client)
    anonymous = guarded.new_client()
    call = contract.call
    body = await call(anonymous, "POST", SESSION, expect=200, json={"token": TOKEN})
    assert set(body) == {"csrf", "expires_at"} and body["csrf"]
    cookie = anonymous.cookies["salvor_session"]
    anonymous.cookies.clear()
    await call(anonymous, "POST", SESSION, expect=401, json={"token": "not-it"})
    await call(anonymous, "POST", SESSION, expect=400, content=b"{nope", headers=JSON_TYPE)
    await call(
        anonymous,
        "POST",
        SESSION,
        expect=413,
        content=OVERSIZED,
        headers={"Content-Type": "application/json"},
    )
    await call(
        anonymous,
        "POST",
        SESSION,
        expect=403,
        json={"token": TOKEN},
        headers={"Origin": "http://evil.example"},
    )
    await call(anonymous, "GET", SESSION, expect=401)
    await call(anonymous, "DELETE", SESSION, expect=401)
    browser = page(guarded, cookie)
    assert await call(browser, "GET", SESSION, expect=200) == body
    await call(browser, "GET", SESSION, expect=403, headers={"Origin": "http://evil.example"})
    await call(browser, "DELETE", SESSION, expect=403)
    await call(guarded.client, "GET", SESSION, expect=200)
    # Every guarded route documents the cookie's 403, a drive-token route beside its own code.
    await call(browser, "POST", "/v1/agents", expect=403, content=AGENT, headers=TOML)
    await call(browser, "GET", "/v1/runs", expect=403, headers={"Origin": "http://evil.example"})
    opened = await open_run(guarded.client)
    await call(
        browser,
        "POST",
        "/v1/client-runs/{run_id}/events",
        expect=403,
        run_id=opened["run"],
        json={"events": [head(opened["run"])]},
        headers={"X-Drive-Token": opened["drive_token"]},
    )
    assert (
        await call(browser, "DELETE", SESSION, expect=200, headers={"X-Salvor-CSRF": body["csrf"]})
    ) == {"ended": True}
    unreached = {seen for seen in contract.unreached() if seen[0] in SESSION_PATHS}
    assert not unreached, f"documented but never answered: {sorted(unreached)}"


async def test_the_right_token_answers_a_csrf_token_and_a_strict_http_only_cookie(guarded) -> None:
    response = await guarded.new_client().post(SESSION, json={"token": TOKEN})
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    cookie = set_cookie(response)
    assert len(cookie["value"]) >= 43  # 32 random bytes, URL-safe base64
    assert {"httponly", "path", "samesite", "max-age"} <= set(cookie)
    assert (cookie["path"], cookie["samesite"], cookie["max-age"]) == ("/", "Strict", "43200")
    assert "secure" not in cookie  # plain HTTP: a Secure cookie would never come back
    body = response.json()
    assert body["csrf"] != cookie["value"] and len(body["csrf"]) >= 43
    # A second login is another session: nothing is shared between them.
    again = await guarded.new_client().post(SESSION, json={"token": TOKEN})
    assert set_cookie(again)["value"] != cookie["value"]
    assert again.json()["csrf"] != body["csrf"]
    assert await guarded.state.sessions.count() == 2
    # A login from a browser that still holds a session ends that one: they do not pile up.
    relogin = await page(guarded, cookie["value"]).post(SESSION, json={"token": TOKEN})
    assert relogin.status_code == 200
    assert_error(await page(guarded, cookie["value"]).get(SESSION), 401, "unauthorized")
    assert await guarded.state.sessions.count() == 2


async def test_the_cookie_is_secure_when_the_request_came_over_tls(guarded) -> None:
    # The listener is plain HTTP; a TLS listener (or terminator speaking ASGI) says https in the
    # request's scheme, which is what Secure follows.
    client = create_app(guarded.state).test_client()
    secure = await client.post(SESSION, json={"token": TOKEN}, scheme="https")
    plain = await client.post(SESSION, json={"token": TOKEN}, scheme="http")
    assert "Secure" in secure.headers["Set-Cookie"].split("; ")
    assert "Secure" not in plain.headers["Set-Cookie"].split("; ")


# Each refused login: what is sent, and the status and code it is answered.
REFUSED_LOGINS = [
    ({"json": {"token": "wrong-token"}}, 401, "unauthorized"),
    ({"json": {"token": TOKEN[:-1]}}, 401, "unauthorized"),
    ({"json": {"token": ""}}, 401, "unauthorized"),
    ({"content": b""}, 400, "bad_request"),
    ({"content": b"{nope", "headers": JSON_TYPE}, 400, "bad_request"),
    ({"content": b"{nope"}, 415, "unsupported_media_type"),
    ({"json": [TOKEN]}, 400, "bad_request"),
    ({"json": {"token": 12}}, 400, "bad_request"),
    ({"json": {}}, 400, "bad_request"),
    ({"json": {"token": TOKEN, "remember": True}}, 400, "bad_request"),
    (
        {"content": TOKEN.encode(), "headers": {"Content-Type": "text/plain"}},
        415,
        "unsupported_media_type",
    ),
    # The token belongs in the body: one in the URL is refused, even when it is right.
    ({"json": {"token": TOKEN}, "params": {"token": TOKEN}}, 400, "bad_request"),
    ({"json": {"token": TOKEN}, "headers": {"Origin": "http://127.0.0.1:1"}}, 403, "forbidden"),
    ({"json": {"token": TOKEN}, "headers": {"Origin": "null"}}, 403, "forbidden"),
    ({"json": {"token": TOKEN}, "headers": {"Origin": "file://"}}, 403, "forbidden"),
]


async def test_a_refused_login_opens_no_session_and_sets_no_cookie(guarded) -> None:
    for request_kwargs, status, code in REFUSED_LOGINS:
        response = await guarded.new_client().post(SESSION, **request_kwargs)
        error = assert_error(response, status, code)
        assert "set-cookie" not in response.headers, request_kwargs
        assert TOKEN not in error["message"]
    assert await guarded.state.sessions.count() == 0
    # From the daemon's own page, the Origin check passes; so it does from the same host's https
    # page, as behind a proxy that ends TLS and passes the Host on (contrib/nginx).
    for origin in (guarded.url, guarded.url.replace("http://", "https://")):
        response = await guarded.new_client().post(
            SESSION, json={"token": TOKEN}, headers={"Origin": origin}
        )
        assert response.status_code == 200, (origin, response.text)


# -- the cookie on the API ---------------------------------------------------------------------


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_a_state_change_by_cookie_needs_its_csrf_token_and_records_nothing_without(
    guarded,
) -> None:
    cookie, csrf = await log_in(guarded)
    other_cookie, other_csrf = await log_in(guarded)
    browser = page(guarded, cookie)
    assert (await browser.get("/v1/runs")).json() == {"runs": []}
    before = await snapshot(guarded)
    for headers in (
        {},
        {"X-Salvor-CSRF": ""},
        {"X-Salvor-CSRF": csrf[:-1]},
        {"X-Salvor-CSRF": other_csrf},  # another session's token is not this one's
        {"X-Salvor-CSRF": cookie},
        # The right token from a page of another origin.
        {"X-Salvor-CSRF": csrf, "Origin": "http://evil.example"},
        {"X-Salvor-CSRF": csrf, "Origin": guarded.url.replace("127.0.0.1", "localhost")},
    ):
        response = await browser.post("/v1/agents", content=AGENT, headers={**TOML, **headers})
        assert_error(response, 403, "forbidden")
        assert csrf not in response.text
    assert await snapshot(guarded) == before
    registered = await browser.post(
        "/v1/agents", content=AGENT, headers={**TOML, "X-Salvor-CSRF": csrf, "Origin": guarded.url}
    )
    assert registered.status_code == 201, registered.text
    assert (await snapshot(guarded))[1] == [registered.json()["agent"]]
    assert other_cookie != cookie


async def test_the_bearer_token_works_alone_and_needs_no_csrf_but_no_other_origin(guarded) -> None:
    bearer = guarded.new_client(headers={"Authorization": f"Bearer {TOKEN}"})
    # A page of another origin is refused even holding the token (issue 29): nothing registered.
    foreign = {**TOML, "Origin": "http://evil.example"}
    assert_error(await bearer.post("/v1/agents", content=AGENT, headers=foreign), 403, "forbidden")
    assert (await bearer.get("/v1/agents")).json() == {"agents": []}
    assert (await bearer.post("/v1/agents", content=AGENT, headers=TOML)).status_code == 201
    # It needs no session: the session route answers it nulls.
    assert (await bearer.get(SESSION)).json() == {"csrf": None, "expires_at": None}
    # A wrong bearer token is wrong even beside a live session cookie.
    cookie, _ = await log_in(guarded)
    mixed = page(guarded, cookie, Authorization="Bearer not-it")
    assert_error(await mixed.get("/v1/runs"), 401, "unauthorized")


async def test_an_expired_session_is_401(guarded) -> None:
    cookie, _ = await log_in(guarded)
    browser = page(guarded, cookie)
    body = (await browser.get(SESSION)).json()
    # The session lives in the store, timed by the store's clock: 12 h from its login.
    ((created, expires),) = rows(guarded, "SELECT created_at, expires_at FROM sessions")
    assert body["expires_at"] == expires
    assert parse_instant(expires) - parse_instant(created) == timedelta(hours=12)
    # Its end is moved to a moment ago: the store's clock is past it.
    execute_sql(guarded.store_url, "UPDATE sessions SET expires_at = created_at")
    assert_error(await browser.get("/v1/runs"), 401, "unauthorized")
    assert await guarded.state.sessions.count() == 0


def rows(server, statement: str) -> list[tuple]:
    engine = create_engine(normalize_store_url(server.store_url))
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(statement))]
    finally:
        engine.dispose()


async def test_a_logout_ends_the_session_and_clears_the_cookie(guarded) -> None:
    cookie, csrf = await log_in(guarded)
    browser = page(guarded, cookie)
    assert_error(await browser.delete(SESSION), 403, "forbidden")
    assert (await browser.get(SESSION)).status_code == 200  # a refused logout changed nothing
    response = await browser.delete(SESSION, headers={"X-Salvor-CSRF": csrf})
    assert response.json() == {"ended": True}
    cleared = set_cookie(response)
    assert (cleared["value"], cleared["max-age"], cleared["path"]) == ("", "0", "/")
    assert_error(await browser.get(SESSION), 401, "unauthorized")
    assert_error(await browser.get("/v1/runs"), 401, "unauthorized")
    # The bearer caller had no session to end.
    assert (await guarded.client.delete(SESSION)).json() == {"ended": False}


async def test_the_metrics_path_is_guarded_and_the_pages_paths_are_left_alone(guarded) -> None:
    anonymous = guarded.new_client()
    for path in ("/metrics", "/v1", "/v1/nowhere"):
        assert_error(await anonymous.get(path), 401, "unauthorized")
    cookie, _ = await log_in(guarded)
    # Past the check, an unrouted path is the router's 404.
    assert_error(await page(guarded, cookie).get("/v1/nowhere"), 404, "not_found")
    # Outside /v1 and /metrics the routes decide (the page's shell needs no login).
    assert_error(await anonymous.get("/ui/nowhere.js"), 404, "not_found")


async def test_without_a_token_there_is_no_session_and_nothing_to_send(server) -> None:
    anonymous = server.new_client()
    nulls = {"csrf": None, "expires_at": None}
    response = await anonymous.post(SESSION, json={"token": "anything"})
    assert (response.status_code, response.json()) == (200, nulls)
    assert "set-cookie" not in response.headers
    assert_error(await anonymous.post(SESSION, json={"tok": 1}), 400, "bad_request")
    assert (await anonymous.get(SESSION)).json() == nulls
    assert (await anonymous.delete(SESSION)).json() == {"ended": False}
    assert (await anonymous.post("/v1/agents", content=AGENT, headers=TOML)).status_code == 201
    assert await server.state.sessions.count() == 0


# -- the append front --------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_the_append_front_follows_the_same_rules(guarded) -> None:
    opened = await open_run(guarded.client)
    run_id, drive = opened["run"], opened["drive_token"]
    path = f"/v1/client-runs/{run_id}/events"
    cookie, csrf = await log_in(guarded)
    browser = page(guarded, cookie, **{"X-Drive-Token": drive})
    body = {"events": [head(run_id)]}
    anonymous = guarded.new_client(headers={"X-Drive-Token": drive})
    assert_error(await anonymous.post(path, json=body), 401, "unauthorized")
    # The route behind the front (Quart's test client on the same state) answers the same.
    route = create_app(guarded.state).test_client()
    # (Another origin is the listener's refusal, before the front or the app: test_browsers.)
    foreign = {"X-Salvor-CSRF": csrf, "Origin": "http://evil.example"}
    assert_error(await browser.post(path, json=body, headers=foreign), 403, "forbidden")
    for headers in ({}, {"X-Salvor-CSRF": "nope"}):
        front = await browser.post(path, json=body, headers=headers)
        assert_error(front, 403, "forbidden")
        behind = await route.post(
            path,
            json=body,
            headers={"Cookie": f"salvor_session={cookie}", "X-Drive-Token": drive, **headers},
        )
        assert (behind.status_code, await behind.get_json()) == (403, front.json())
    assert (await guarded.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"] == []
    response = await browser.post(
        path, json=body, headers={"X-Salvor-CSRF": csrf, "Origin": guarded.url}
    )
    assert response.json() == {"appended": [0]}, response.text


# -- the WebSocket handshake -------------------------------------------------------------------


async def handshake(server, headers: dict[str, str]) -> tuple[int, dict]:
    """Open ``/v1/ws`` with ``headers``: (101, the answer to an unknown op) when it upgrades, else
    (the status, the refusal's body)."""
    url = server.url.replace("http://", "ws://", 1) + "/v1/ws"
    try:
        with trio.fail_after(10):
            async with open_websocket_url(url, extra_headers=list(headers.items())) as socket:
                await socket.send_message(json.dumps({"op": "ping"}))
                return 101, json.loads(await socket.get_message())
    except ConnectionRejected as rejected:
        return rejected.status_code, json.loads(rejected.body)


async def test_a_cookie_handshake_upgrades_only_from_the_daemons_own_origin(guarded) -> None:
    cookie, _ = await log_in(guarded)
    jar = {"Cookie": f"salvor_session={cookie}"}
    upgraded, answer = await handshake(guarded, {**jar, "Origin": guarded.url})
    assert (upgraded, answer["type"], answer["op"]) == (101, "error", "ping")
    for headers, status, code in (
        ({**jar, "Origin": "http://evil.example"}, 403, "forbidden"),
        (jar, 403, "forbidden"),  # a browser always sends one: a cookie without it is not a page
        ({"Origin": guarded.url}, 401, "unauthorized"),
        ({"Cookie": "salvor_session=forged", "Origin": guarded.url}, 401, "unauthorized"),
    ):
        answered, body = await handshake(guarded, headers)
        assert (answered, body["error"]["code"]) == (status, code), body
    # The bearer token needs no Origin (a header is not ambient).
    assert (await handshake(guarded, {"Authorization": f"Bearer {TOKEN}"}))[0] == 101


# -- the token kept out of everything ----------------------------------------------------------


def _store_text(store_url: str, tmp_path: Path) -> bytes:
    """Everything the store holds, as bytes: the SQLite files, or every row of every table."""
    if store_url.startswith("sqlite"):
        return b"".join(path.read_bytes() for path in tmp_path.glob("salvor.db*"))
    import psycopg
    from salvor.store import normalize_store_url

    conninfo = normalize_store_url(store_url).replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, connect_timeout=5) as connection:
        tables = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        assert tables
        return "\n".join(
            str(row)
            for (table,) in tables
            for row in connection.execute(f'SELECT t::text FROM "{table}" t').fetchall()
        ).encode()


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_the_token_reaches_no_log_line_no_answer_and_not_the_store(
    server_factory, store_url, tmp_path, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "tok-9f1c27d4e8b3a6f0"
    near_miss = "tok-9f1c27d4e8b3a6f1"
    server = await server_factory(auth_token=secret)
    anonymous = server.new_client()
    answers = [
        await anonymous.post(SESSION, json={"token": near_miss}),
        await anonymous.post(SESSION, json={"token": [near_miss]}),
        await anonymous.post(SESSION, json={"token": secret, "extra": near_miss}),
        await anonymous.post(SESSION, json={"token": secret}),
    ]
    assert [a.status_code for a in answers] == [401, 400, 400, 200]
    csrf = answers[-1].json()["csrf"]
    browser = page(server, anonymous.cookies["salvor_session"])
    registered = await browser.post(
        "/v1/agents", content=AGENT, headers={**TOML, "X-Salvor-CSRF": csrf}
    )
    assert registered.status_code == 201
    run = await browser.post(
        "/v1/runs", json={"agent": registered.json()["agent"]}, headers={"X-Salvor-CSRF": csrf}
    )
    assert run.status_code == 201, run.text
    await server.wait_resting(run.json()["run"])
    await server.stop()
    logged = caplog.text + "".join(str(record.args) for record in caplog.records)
    assert "salvor serving on" in logged  # the capture did see the daemon's log
    stored = _store_text(store_url, tmp_path)
    assert registered.json()["agent"].encode() in stored  # and this is the store's content
    for token in (secret, near_miss):
        assert token not in logged
        assert token.encode() not in stored
        for answer in answers:
            assert token not in answer.text
            assert token not in str(answer.headers)


# -- the sessions themselves -------------------------------------------------------------------


async def test_sessions_past_capacity_end_the_expired_then_the_oldest() -> None:
    now = [0.0]
    sessions = Sessions(seconds=10, capacity=3, clock=lambda: now[0])
    first, second = await sessions.open(), await sessions.open()
    now[0] = 5
    third = await sessions.open()
    fourth = await sessions.open()  # full: the oldest (first) goes
    assert await sessions.find(first.id) is None
    assert [await sessions.find(s.id) for s in (second, third, fourth)] == [second, third, fourth]
    now[0] = 10  # second has expired: it goes before any live one
    fifth = await sessions.open()
    assert await sessions.find(second.id) is None
    assert [await sessions.find(s.id) for s in (third, fourth, fifth)] == [third, fourth, fifth]
    assert len(sessions) == 3
    assert await sessions.find(third.id[:-1] + "x") is None
    assert await sessions.find("") is None
    assert await sessions.end(third.id)
    assert not await sessions.end(third.id)
    assert fifth.csrf_matches(fifth.csrf) and not fifth.csrf_matches(fourth.csrf)
    assert not fifth.csrf_matches(None)
