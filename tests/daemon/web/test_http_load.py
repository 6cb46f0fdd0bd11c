"""Under load on a saturated machine, the daemon's listener drops no request its clients sent.

A keep-alive connection that the server closes as the client reuses it
loses the request the client had already sent ("Server disconnected
without sending a response"); a POST cannot be safely retried, so that is
lost work. The race is between the server's keep-alive timeout and the
client's pool expiry; it is won by the server outlasting the client, so the
client, which knows when it is about to send, is the one that retires a
connection.

The test makes that race fast: every timeout is scaled by ``SCALE`` (httpx's
5 s pool expiry becomes 0.2 s, the server's keep-alive its configured value
times the same factor), and clients reuse their connections at ages close
to their own expiry, thousands of times, through several pooled httpx
clients, while busy loops hold every core. With the server's timeout equal
to httpx's (hypercorn's 5 s, what ``listener_config`` set before) requests
are dropped; with the daemon's own it must be none.

Marked ``load`` (``pytest -m load``); bounded in requests and in time.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

import httpx
import pytest
import trio
from salvor.daemon.serve import _listening

pytestmark = pytest.mark.load

HTTPX_EXPIRY = 5.0  # httpx's default keepalive_expiry
SCALE = 0.2 / HTTPX_EXPIRY
REQUESTS = 2000
BURST = 16  # concurrent requests per client, so each client keeps that many connections


@pytest.fixture
def store_url(tmp_path) -> str:
    """SQLite only: the requests below are answered before any route reads the store."""
    return f"sqlite:///{tmp_path / 'salvor.db'}"


@pytest.fixture
def saturated():
    """A busy loop per core for the test's duration."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


@pytest.fixture
async def scaled_daemon(monkeypatch, server_factory):
    """The daemon, its listener's keep-alive timeout scaled by ``SCALE``;
    returns (server, that timeout)."""
    configured: list[float] = []

    def scaled(*args, **kwargs):
        config = listener_config(*args, **kwargs)
        config.keep_alive_timeout *= SCALE
        configured.append(config.keep_alive_timeout)
        return config

    listener_config = _listening.listener_config
    monkeypatch.setattr(_listening, "listener_config", scaled)
    server = await server_factory()
    return server, configured[0]


async def drive(url: str, expiry: float, requests: int, drops: Counter, statuses: Counter) -> None:
    """``requests`` requests in bursts of ``BURST``, each burst after an idle
    spell just short of ``expiry``."""
    limits = httpx.Limits(
        max_connections=BURST, max_keepalive_connections=BURST, keepalive_expiry=expiry
    )
    rng = random.Random(expiry)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one(index: int) -> None:
            try:
                if index % 2:
                    response = await client.post(
                        "/v1/runs/not-a-uuid/resume", json={"input": {"n": index}}
                    )
                else:
                    response = await client.get("/v1/runs/not-a-uuid")
            except (
                httpx.TransportError
            ) as error:  # the server closed under a request it had been sent
                drops[type(error).__name__] += 1
            else:
                statuses[response.status_code] += 1

        sent = 0
        while sent < requests:
            async with trio.open_nursery() as nursery:
                for index in range(sent, min(sent + BURST, requests)):
                    nursery.start_soon(one, index)
            sent += BURST
            await trio.sleep(expiry * rng.uniform(0.8, 1.0))


async def test_thousands_of_pooled_requests_on_a_saturated_machine_lose_none(
    saturated, scaled_daemon
) -> None:
    server, keep_alive = scaled_daemon
    drops: Counter = Counter()
    statuses: Counter = Counter()
    # Most clients at httpx's default expiry; two at an expiry near the
    # server's timeout (Go's 90 s, scaled), reusing connections idle that long.
    near = 90.0 * SCALE
    clients = [(HTTPX_EXPIRY * SCALE, 336)] * 6 + [(near, 2 * BURST)] * 2
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            for expiry, count in clients:
                nursery.start_soon(drive, server.url, expiry, count, drops, statuses)
    assert sum(count for _, count in clients) >= REQUESTS
    assert not drops, (
        f"{sum(drops.values())} requests dropped ({dict(drops)}) with the server's keep-alive "
        f"at {keep_alive:.2f} s and clients' expiry at {HTTPX_EXPIRY * SCALE:.2f} s"
    )
    assert statuses == {400: sum(count for _, count in clients)}
