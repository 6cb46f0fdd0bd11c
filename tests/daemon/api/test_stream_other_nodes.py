"""A stream on this daemon carries a run live when another process commits its events (issue 30:
any node streams every run, whoever drives it), on SQLite and on PostgreSQL.

The other process is a plain writer (``tests/support/store_writer.py``) that opens the store with
``EventStore.open`` and appends, as another node's driver does. The daemon's streams hear of it
through the change feed alone: each daemon here is started with a stream wake-up far longer than
the waits, so nothing arrives by a timer. Every test checks the same thing in the end: the
frames (or ``event`` messages) are the run's log, each seq exactly once and in order, byte for
byte the store's envelopes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import psycopg
import pytest
import trio
from salvor.protocol import encode_envelope
from salvor.store import EventStore, normalize_store_url
from salvor.store._change_signal import LISTENER_NAME
from trio_websocket import open_websocket_url

from tests.daemon.api.test_stream import check_against_log, read_stream
from tests.support.api_server import Server
from tests.support.store_writer import StoreWriter

RUN = "7c0de000-0000-4000-8000-0000000000a1"
# Bounds on every wait: a failure is a hang, never a slow pass.
WAIT = 30
# Longer than any wait: a stream that relied on a timer to read the store would hang.
NEVER = 3600.0


@pytest.fixture
def writer(store_url: str) -> Iterator[StoreWriter]:
    writer = StoreWriter.start(store_url)
    try:
        yield writer
    finally:
        writer.close()


async def quiet_daemon(server_factory) -> Server:
    return await server_factory(
        stream_poll_seconds=NEVER, heartbeat_seconds=NEVER, detach_grace_seconds=NEVER
    )


async def store_log(server: Server, run_id: str) -> list:
    def read() -> list:
        with EventStore.open(server.store_url) as store:
            return store.read_log(run_id)

    return await trio.to_thread.run_sync(read)


def ws_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/ws"


async def test_an_sse_stream_gets_another_processs_commits_live(server_factory, writer) -> None:
    daemon = await quiet_daemon(server_factory)
    await writer.ask("head", RUN)
    async with daemon.client.stream("GET", f"/v1/runs/{RUN}/events") as response:
        assert response.status_code == 200
        frames = (await read_stream(response, stop_after=1)).events
        for round_ in range(3):
            # One commit at a time, then a burst: each reaches the open stream.
            await writer.ask("observe", RUN, 1 + 4 * round_)
            last = (await store_log(daemon, RUN))[-1].seq
            with trio.fail_after(WAIT):
                while frames[-1].seq < last:
                    frames += (await read_stream(response, stop_after=1)).events
    check_against_log(frames, await store_log(daemon, RUN))
    assert len(frames) == 1 + 1 + 5 + 9


async def test_a_websocket_gets_another_processs_commits_live(server_factory, writer) -> None:
    daemon = await quiet_daemon(server_factory)
    await writer.ask("head", RUN)
    got: list[str] = []
    async with open_websocket_url(ws_url(daemon)) as ws:
        await ws.send_message(json.dumps({"op": "subscribe", "run": RUN}))
        last = 0
        for count in (1, 3, 6):
            last = await writer.ask("observe", RUN, count)
            with trio.fail_after(WAIT):
                while not got or json.loads(got[-1])["seq"] < last:
                    message = json.loads(await ws.get_message())
                    if message["type"] == "event":
                        got.append(json.dumps(message["event"], separators=(",", ":")))
    log = await store_log(daemon, RUN)
    assert [json.loads(text)["seq"] for text in got] == list(range(len(log))) == list(range(11))
    assert [json.loads(text) for text in got] == [
        json.loads(encode_envelope(envelope)) for envelope in log
    ]


# -- PostgreSQL: the listener's session is lost, and comes back ------------------------------------


def _conninfo(store_url: str) -> str:
    return normalize_store_url(store_url).replace("postgresql+psycopg://", "postgresql://", 1)


def listener_backends(store_url: str) -> list[int]:
    """The backends of this process's change listeners (the daemon runs in the test's process)."""
    with psycopg.connect(_conninfo(store_url), autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
            "AND datname = current_database()",
            (f"{LISTENER_NAME} {os.getpid()}",),
        ).fetchall()
    return [pid for (pid,) in rows]


def terminate(store_url: str, pid: int) -> None:
    with psycopg.connect(_conninfo(store_url), autocommit=True) as connection:
        assert connection.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_a_lost_listener_is_reopened_and_what_it_missed_still_arrives(
    server_factory, writer, store_url
) -> None:
    daemon = await quiet_daemon(server_factory)
    await writer.ask("head", RUN)
    async with daemon.client.stream("GET", f"/v1/runs/{RUN}/events") as response:
        frames = (await read_stream(response, stop_after=1)).events
        for _ in range(2):
            [listener] = await trio.to_thread.run_sync(listener_backends, store_url)
            await trio.to_thread.run_sync(terminate, store_url, listener)
            # Committed while the daemon may not listen: its notice may be lost to it.
            last = await writer.ask("observe", RUN, 3)
            with trio.fail_after(WAIT):
                while frames[-1].seq < last:
                    frames += (await read_stream(response, stop_after=1)).events
            # A new session listens in its place, and what comes next arrives through it.
            with trio.fail_after(WAIT):
                while await trio.to_thread.run_sync(listener_backends, store_url) in (
                    [],
                    [listener],
                ):
                    await trio.sleep(0.05)
            last = await writer.ask("observe", RUN, 2)
            with trio.fail_after(WAIT):
                while frames[-1].seq < last:
                    frames += (await read_stream(response, stop_after=1)).events
    check_against_log(frames, await store_log(daemon, RUN))
    assert len(frames) == 1 + 2 * (3 + 2)
