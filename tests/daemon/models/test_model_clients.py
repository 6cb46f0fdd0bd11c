"""Model HTTP clients kept between drives: a later run's call goes out on the connection an
earlier run opened, and nothing of one caller's rides along with another's."""

from __future__ import annotations

import httpx
from salvor.daemon.models import ModelClients, ModelEndpoint, ModelGateway

from tests.support.scripted_provider import ScriptedProvider, text_reply

ASKED = {
    "model": "test-model",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
}


async def _one_call(clients: ModelClients | None, base_url: str, key: str) -> None:
    endpoint = ModelEndpoint(provider="anthropic", base_url=base_url, api_key=key)
    gateway = ModelGateway(endpoint, clients=clients)
    try:
        await gateway.complete(ASKED)
    finally:
        await gateway.aclose()


async def test_a_later_gateway_reuses_the_connection_an_earlier_one_opened() -> None:
    clients = ModelClients()
    script = [text_reply("one"), text_reply("two"), text_reply("three")]
    with ScriptedProvider(script, keep_alive=True) as provider:  # as a real provider keeps them
        await _one_call(clients, provider.base_url, "sk-first")
        await _one_call(clients, provider.base_url, "sk-second")
        await _one_call(None, provider.base_url, "sk-third")  # a client of its own, as before
        await clients.aclose()
    first, second, third = provider.calls
    assert first.peer == second.peer  # one kept-alive connection across two gateways
    assert third.peer != first.peer
    # Each call carries its own gateway's key, never the one before it.
    assert [call.api_key for call in provider.calls] == ["sk-first", "sk-second", "sk-third"]


async def test_a_client_comes_back_with_no_cookies_and_a_closed_pool_closes_it() -> None:
    clients = ModelClients(idle_at_most=1)
    lent = clients.lend()
    lent.cookies.set("session", "of-the-first-agent", domain="provider.example")
    await clients.give_back(lent)
    again = clients.lend()
    assert again is lent and not again.cookies
    extra = clients.lend()  # none idle: a new one, closed when it comes back over the cap
    await clients.give_back(again)
    await clients.give_back(extra)
    assert extra.is_closed and not again.is_closed
    await clients.aclose()
    assert again.is_closed
    late = httpx.AsyncClient()
    await clients.give_back(late)  # given back after the pool closed: closed, not kept
    assert late.is_closed
