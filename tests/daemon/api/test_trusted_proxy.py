"""A TLS-terminating proxy the operator trusts: the session cookie is ``Secure`` when the browser
spoke https to it, and only then.

A real daemon with ``--auth-token`` on a loopback port, over real HTTP. The proxy is whoever
connects from the address the operator listed (``trusted_proxies``, ``--trusted-proxy``); a
stranger connects from 127.0.0.2, which Linux routes over loopback. What is pinned: the login's
cookie follows ``X-Forwarded-Proto`` from the trusted proxy, and that header is ignored from any
other peer and on a daemon that trusts no proxy (the default), so nobody else can make the daemon
believe a request came over TLS.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.api_server import TOKEN
from tests.support.backends import SQLITE_ONLY

STORE_BACKENDS = SQLITE_ONLY

SESSION = "/v1/session"


def cookie_attributes(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    (header,) = [h for h in response.headers.get_list("set-cookie") if "salvor_session" in h]
    return [part.strip() for part in header.split(";")][1:]


async def log_in(client: httpx.AsyncClient, **headers: str) -> list[str]:
    return cookie_attributes(await client.post(SESSION, json={"token": TOKEN}, headers=headers))


@pytest.fixture
async def behind_proxy(server_factory):
    return await server_factory(auth_token=TOKEN, trusted_proxies=("127.0.0.1",))


async def test_the_trusted_proxys_https_makes_the_cookie_secure(behind_proxy) -> None:
    proxy = behind_proxy.new_client()
    assert "Secure" in await log_in(proxy, **{"X-Forwarded-Proto": "https"})
    # The proxy's own value is the last one: what a client wrote before it is not read.
    assert "Secure" in await log_in(proxy, **{"X-Forwarded-Proto": "http, https"})
    assert "Secure" not in await log_in(proxy, **{"X-Forwarded-Proto": "https, http"})
    assert "Secure" not in await log_in(proxy, **{"X-Forwarded-Proto": "http"})
    assert "Secure" not in await log_in(proxy)
    assert "Secure" not in await log_in(proxy, **{"X-Forwarded-Proto": "gopher"})


async def test_another_peer_cannot_claim_https(behind_proxy) -> None:
    stranger = behind_proxy.new_client(
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    )
    assert "Secure" not in await log_in(stranger, **{"X-Forwarded-Proto": "https"})


async def test_without_a_trusted_proxy_the_header_is_ignored(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    client = server.new_client()
    assert "Secure" not in await log_in(client, **{"X-Forwarded-Proto": "https"})
