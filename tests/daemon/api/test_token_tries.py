"""Wrong tokens are counted per client, and a client that gave too many is slowed: 429.

A real daemon with ``--auth-token`` on a loopback port, over real HTTP. Clients are told apart by
the address they connect from (a second one binds 127.0.0.2, which Linux routes over loopback), or,
behind a proxy the operator trusts, by the address it forwards. What is pinned:

* The bearer check and the login each count a wrong token; past ``FAILED_TRIES`` in the window,
  every try of a token from that client is 429 ``too_many_requests`` with ``Retry-After``, the
  right one too (compared, it would tell the one right guess apart), as the document says.
* A right token counts nothing; a session cookie is no try of the token; another client is not
  slowed; the window's end lifts it (an injected clock).
* ``X-Forwarded-For`` picks the client only from a trusted proxy: from anyone else it is ignored,
  so a guesser cannot escape the count by writing a new one on each try.
* ``--token-tries`` sets the count (0: no limit); the table of clients stays bounded.
"""

from __future__ import annotations

import math

import httpx
import pytest
from salvor.daemon.web import FAILED_TRIES, WINDOW_SECONDS, FailedTries, TooManyTries

from tests.daemon.api.test_session import handshake
from tests.support.api import assert_error
from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY
from tests.support.contract import Contract

STORE_BACKENDS = SQLITE_ONLY

SESSION = "/v1/session"
WRONG = {"Authorization": "Bearer not-the-token-at-all"}
RIGHT = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def guarded(server_factory):
    server = await server_factory(auth_token=TOKEN)
    now = [1000.0]
    server.state.failed_tries.clock = lambda: now[0]
    server.clock = now
    return server


def from_address(server, address: str, **kwargs) -> httpx.AsyncClient:
    """A client whose connections come from ``address`` (a loopback one)."""
    return server.new_client(transport=httpx.AsyncHTTPTransport(local_address=address), **kwargs)


def assert_slowed(response: httpx.Response, seconds: float) -> None:
    assert_error(response, 429, "too_many_requests")
    assert response.headers["retry-after"] == str(math.ceil(seconds))


async def spend(client: httpx.AsyncClient, **headers: str) -> None:
    """``FAILED_TRIES`` wrong bearer tokens, each an ordinary 401."""
    for _ in range(FAILED_TRIES):
        assert_error(
            await client.get("/v1/runs", headers={**WRONG, **headers}), 401, "unauthorized"
        )


async def test_wrong_bearer_tokens_past_the_limit_are_429_until_the_window_ends(guarded) -> None:
    contract = await Contract.served(guarded.client)
    guesser = guarded.new_client()
    await spend(guesser)
    guarded.clock[0] += 12.5
    body = await contract.call(guesser, "GET", "/v1/runs", expect=429, headers=WRONG)
    assert (
        "Retry-After" in contract.document["components"]["responses"]["TooManyRequests"]["headers"]
    )
    assert body["error"]["code"] == "too_many_requests"
    # Uncompared: the right token from this client is slowed as well, on every kind of request.
    assert_slowed(await guesser.get("/v1/runs", headers=RIGHT), WINDOW_SECONDS - 12.5)
    assert_slowed(await guesser.post("/v1/runs", json={}, headers=WRONG), WINDOW_SECONDS - 12.5)
    front = await guesser.post(
        "/v1/client-runs/00000000-0000-4000-8000-000000000000/events",
        json={"events": []},
        headers=RIGHT,
    )
    assert_slowed(front, WINDOW_SECONDS - 12.5)
    # The WebSocket handshake too: refused before the upgrade.
    status, answer = await handshake(guarded, RIGHT)
    assert (status, answer["error"]["code"]) == (429, "too_many_requests")
    guarded.clock[0] += WINDOW_SECONDS - 12.5
    assert (await guesser.get("/v1/runs", headers=RIGHT)).status_code == 200
    assert_error(await guesser.get("/v1/runs", headers=WRONG), 401, "unauthorized")


async def test_a_right_token_is_never_counted_nor_slowed(guarded) -> None:
    for _ in range(FAILED_TRIES * 3):
        assert (await guarded.client.get("/v1/health")).status_code == 200
    assert len(guarded.state.failed_tries) == 0
    # Wrong tries short of the limit leave the right token alone.
    for _ in range(FAILED_TRIES - 1):
        assert_error(await guarded.new_client().get("/v1/runs", headers=WRONG), 401, "unauthorized")
    assert (await guarded.client.get("/v1/runs")).status_code == 200


async def test_wrong_logins_are_counted_and_a_spent_client_gets_no_session(guarded) -> None:
    contract = await Contract.served(guarded.client)
    guesser = guarded.new_client()
    for _ in range(FAILED_TRIES):
        response = await guesser.post(SESSION, json={"token": "a-wrong-guess-of-it"})
        assert_error(response, 401, "unauthorized")
    await contract.call(guesser, "POST", SESSION, expect=429, json={"token": "another-guess"})
    right = await guesser.post(SESSION, json={"token": TOKEN})
    assert_slowed(right, WINDOW_SECONDS)
    assert "set-cookie" not in right.headers
    assert await guarded.state.sessions.count() == 0


async def test_a_session_cookie_and_another_client_are_not_slowed(guarded) -> None:
    login = await from_address(guarded, "127.0.0.1").post(SESSION, json={"token": TOKEN})
    cookie = login.cookies["salvor_session"]
    guesser = from_address(guarded, "127.0.0.1")
    await spend(guesser)
    assert_slowed(await guesser.get("/v1/runs", headers=WRONG), WINDOW_SECONDS)
    # The page that logged in from the same address goes on: a cookie is no try of the token.
    page = from_address(guarded, "127.0.0.1", headers={"Cookie": f"salvor_session={cookie}"})
    assert (await page.get("/v1/runs")).status_code == 200
    # Another client has tries of its own.
    other = from_address(guarded, "127.0.0.2")
    assert_error(await other.get("/v1/runs", headers=WRONG), 401, "unauthorized")
    assert (await other.get("/v1/runs", headers=RIGHT)).status_code == 200


async def test_a_forwarded_address_is_ignored_from_an_untrusted_peer(server_factory) -> None:
    untrusting = await server_factory(auth_token=TOKEN)
    untrusting.state.failed_tries.clock = lambda: 1000.0
    guesser = untrusting.new_client()
    # A new X-Forwarded-For on each try does not make a new client: nobody is trusted to say so.
    for n in range(FAILED_TRIES):
        response = await guesser.get(
            "/v1/runs", headers={**WRONG, "X-Forwarded-For": f"198.51.100.{n}"}
        )
        assert_error(response, 401, "unauthorized")
    response = await guesser.get("/v1/runs", headers={**WRONG, "X-Forwarded-For": "198.51.100.99"})
    assert_slowed(response, WINDOW_SECONDS)


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_tries(
    server_factory,
) -> None:
    proxied = await server_factory(auth_token=TOKEN, trusted_proxies=("127.0.0.1",))
    proxied.state.failed_tries.clock = lambda: 1000.0
    proxy = proxied.new_client()
    await spend(proxy, **{"X-Forwarded-For": "203.0.113.7"})
    # What the client wrote further left is not read: the proxy's own entry is the last one.
    slowed = await proxy.get(
        "/v1/runs", headers={**WRONG, "X-Forwarded-For": "9.9.9.9, 203.0.113.7"}
    )
    assert slowed.status_code == 429
    # Another client behind the same proxy has its own tries.
    other = await proxy.get("/v1/runs", headers={**WRONG, "X-Forwarded-For": "203.0.113.8"})
    assert_error(other, 401, "unauthorized")
    # A peer that is not the trusted proxy is counted by its own address, whatever it forwards.
    stranger = from_address(proxied, "127.0.0.2")
    await spend(stranger, **{"X-Forwarded-For": "203.0.113.9"})
    response = await stranger.get("/v1/runs", headers={**WRONG, "X-Forwarded-For": "203.0.113.10"})
    assert_slowed(response, WINDOW_SECONDS)


@pytest.mark.parametrize("tries", [2, 0])
async def test_the_operator_sets_how_many_wrong_tokens_a_client_may_give(
    server_factory, tries
) -> None:
    server = await server_factory(auth_token=TOKEN, token_tries=tries)
    server.state.failed_tries.clock = lambda: 1000.0
    guesser = server.new_client()
    for _ in range(tries or FAILED_TRIES * 2):  # 0: no limit at all
        assert_error(await guesser.get("/v1/runs", headers=WRONG), 401, "unauthorized")
    if tries:
        assert_slowed(await guesser.get("/v1/runs", headers=WRONG), WINDOW_SECONDS)
    else:
        assert len(server.state.failed_tries) == 0


def test_the_table_of_clients_is_bounded_and_ipv6_counts_by_its_64() -> None:
    now = [0.0]
    tries = FailedTries(limit=2, seconds=10.0, capacity=3, clock=lambda: now[0])
    for client in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"):
        tries.failed(client)
    assert len(tries) == 3  # the oldest went
    tries.failed("2001:db8::1")
    tries.failed("2001:db8::ffff")  # the same /64: one client
    with pytest.raises(TooManyTries) as refused:
        tries.check("2001:db8::abcd")
    assert refused.value.retry_after == 10
    tries.check("2001:db8:0:1::1")  # another /64
    now[0] += 10.0
    tries.check("2001:db8::1")  # the window ended
    tries.failed("10.0.0.5")  # ended windows go first
    assert len(tries) <= 3
