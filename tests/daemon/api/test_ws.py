"""``/v1/ws`` against the real daemon, over a real WebSocket (trio-websocket).

The runs are client-driven: the test appends their events itself, so it decides when each event
is committed and what it carries. What every test checks in the end is the same thing: the
``event`` messages a connection got for a run are its log, each seq exactly once and in order,
each envelope byte for byte ``encode_envelope`` of the store's rows (the SSE frame's data).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from salvor.protocol import EMPTY_VIEW, RandomObserved, RunStarted, encode_envelope, fold
from salvor.store import EventStore
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from tests.support.api import assert_error
from tests.support.api_server import TOKEN, Server
from tests.support.client_events import envelope

SDK = Path(__file__).resolve().parents[3] / "contrib" / "sdk"
sys.path.insert(0, str(SDK))

from salvor_client import SalvorError, open_live

AGENT = "sha256:" + "cd" * 32
# Bounds on every wait: a failure is a hang, never a slow pass.
WAIT = 20


def head(run_id: str) -> dict:
    return envelope(run_id, 0, "RunStarted", {"agent_def_hash": AGENT, "input": {"task": "t"}})


def observed(run_id: str, seq: int, value: str = "ab12") -> dict:
    return envelope(run_id, seq, "RandomObserved", {"value": value})


class ClientRun:
    """A client-driven run the test appends to."""

    def __init__(self, server: Server, run_id: str, token: str) -> None:
        self.server, self.run_id, self.token, self.next_seq = server, run_id, token, 0

    @classmethod
    async def open(cls, server: Server) -> ClientRun:
        response = await server.client.post("/v1/client-runs", json={})
        assert response.status_code == 201, response.text
        body = response.json()
        return cls(server, body["run"], body["drive_token"])

    async def append(self, *events: dict) -> None:
        response = await self.server.client.post(
            f"/v1/client-runs/{self.run_id}/events",
            json={"events": list(events)},
            headers={"X-Drive-Token": self.token},
        )
        assert response.status_code == 200, response.text
        self.next_seq += len(events)

    async def observe(self, count: int = 1, value: str = "ab12") -> None:
        await self.append(*(observed(self.run_id, self.next_seq + i, value) for i in range(count)))


async def open_runs(server: Server, count: int) -> list[ClientRun]:
    runs: list[ClientRun] = []

    async def one(_: int, __: None) -> None:
        runs.append(await ClientRun.open(server))

    await each(one, [None] * count)
    return runs


async def each(act, items: list) -> None:
    """``act(index, item)`` for every item, 16 at a time (httpx's pool slows down past that)."""
    limiter = trio.CapacityLimiter(16)

    async def one(index: int, item) -> None:
        async with limiter:
            await act(index, item)

    async with trio.open_nursery() as nursery:
        for index, item in enumerate(items):
            nursery.start_soon(one, index, item)


def ws_url(server: Server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/ws"


def bearer() -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {TOKEN}".encode())]


async def send(ws, **body) -> None:
    await ws.send_message(json.dumps(body))


async def receive(ws) -> tuple[dict, str]:
    with trio.fail_after(WAIT):
        text = await ws.get_message()
    return json.loads(text), text


async def assert_logs_delivered(server: Server, got: dict[str, list[str]]) -> None:
    """``got[run]`` are the run's ``event`` messages: its whole log, in order, byte for byte as
    the store's rows encode (read through a store handle of the test's own)."""

    def read() -> dict[str, list]:
        with EventStore.open(server.store_url) as store:
            return {run_id: store.read_log(run_id) for run_id in got}

    logs = await trio.to_thread.run_sync(read)
    for run_id, texts in got.items():
        assert texts == [
            f'{{"type":"event","run":"{run_id}","event":{encode_envelope(e)}}}'
            for e in logs[run_id]
        ]


async def test_two_hundred_runs_on_one_connection_each_event_once_in_order(
    server: Server,
) -> None:
    runs = await open_runs(server, 200)

    async def history(index: int, run: ClientRun) -> None:
        # Half have history before the subscription; the other half are attached, not started.
        if index % 2 == 0:
            await run.append(head(run.run_id), observed(run.run_id, 1))

    await each(history, runs)
    got: dict[str, list[str]] = {run.run_id: [] for run in runs}
    statuses: dict[str, list[str]] = {run.run_id: [] for run in runs}
    async with open_websocket_url(ws_url(server)) as ws:
        for run in runs:
            await send(ws, op="subscribe", run=run.run_id)
        # Every run's catch-up ends with its status: then the rest is live.
        caught_up = 0
        while caught_up < len(runs):
            message, text = await receive(ws)
            if message["type"] == "event":
                got[message["run"]].append(text)
            else:
                assert message["type"] == "status", message
                statuses[message["run"]].append(message["status"]["state"])
                caught_up += 1

        async def live(index: int, run: ClientRun) -> None:
            # One commit each: its events arrive in order, each status change after its event.
            first = [head(run.run_id)] if index % 2 == 1 else []
            seq = run.next_seq + len(first)
            await run.append(
                *first,
                observed(run.run_id, seq),
                observed(run.run_id, seq + 1),
                envelope(run.run_id, seq + 2, "RunCompleted", {"output": 1}),
            )

        # Concurrently: commits of many runs share a transaction, as they do in a busy daemon.
        await each(live, runs)
        # Until every event is in and every run's completion has been reported.
        while sum(len(texts) for texts in got.values()) < sum(run.next_seq for run in runs) or any(
            states[-1] != "completed" for states in statuses.values()
        ):
            message, text = await receive(ws)
            if message["type"] == "event":
                got[message["run"]].append(text)
            else:
                statuses[message["run"]].append(message["status"]["state"])
    await assert_logs_delivered(server, got)
    for index, run in enumerate(runs):
        # The catch-up's status, then one per change (an event that changes none sends none).
        expected = ["running"] if index % 2 == 0 else ["not_started", "running"]
        assert statuses[run.run_id] == [*expected, "completed"]


async def test_the_sdk_resumes_a_dropped_connection_from_its_cursors(server: Server) -> None:
    runs = [await ClientRun.open(server) for _ in range(3)]
    for run in runs:
        await run.append(head(run.run_id))
    seen: dict[str, list[int]] = {run.run_id: [] for run in runs}
    async with open_live(server.url, backoff=0.01) as live:
        for run in runs:
            await live.subscribe(run.run_id)

        async def commit() -> None:
            for step in range(8):
                for run in runs:
                    await run.observe()
                if step == 3:
                    # The socket closes under the client mid-stream (no close frame): the
                    # daemon keeps committing while the SDK reconnects.
                    await live._socket._stream.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit)
            with trio.fail_after(WAIT):
                async for message in live:
                    if message["type"] == "event":
                        seen[message["run"]].append(message["event"]["seq"])
                    if all(len(seqs) >= 9 for seqs in seen.values()):
                        break
        assert live.connections == 2
        assert live.cursors == {run.run_id: 8 for run in runs}
    for run in runs:
        assert seen[run.run_id] == list(range(9))


async def test_watch_runs_sees_each_change_of_state(server: Server) -> None:
    async with open_websocket_url(ws_url(server)) as ws:
        await send(ws, op="watch_runs")
        run = await ClientRun.open(server)
        await run.append(head(run.run_id))
        await run.observe(2)  # no change of status: no row
        schema = {"type": "object", "required": ["ok"]}
        await run.append(
            envelope(run.run_id, 3, "Suspended", {"reason": "ok?", "input_schema": schema})
        )
        await run.append(
            envelope(run.run_id, 4, "Resumed", {"input": {"ok": True}}),
            envelope(run.run_id, 5, "RunCompleted", {"output": {"answer": 42}}),
        )
        rows = []
        while len(rows) < 4:
            message, _ = await receive(ws)
            assert message["type"] == "run" and message["run"] == run.run_id, message
            rows.append(message["row"])
    assert [row["status"]["state"] for row in rows] == [
        "running",
        "suspended",
        "running",
        "completed",
    ]
    assert [row["event_count"] for row in rows] == [1, 4, 5, 6]
    # The last row is the run list's entry, field for field.
    listed = (await server.client.get("/v1/runs")).json()["runs"]
    assert rows[-1] == next(entry for entry in listed if entry["run"] == run.run_id)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_row_the_change_feed_sent_first_is_not_followed_by_an_older_one(
    server: Server,
) -> None:
    # On SQLite the change feed hears this daemon's own commits too, and a client-driven run is
    # driven by nothing here, so one commit reaches the run list by its publish and by the
    # feed's view of the run. Here the publish of the commit that resumes and completes the run
    # is held until the feed's row has gone out (the order CI once saw by chance).
    hub, access = server.state.hub, server.state.runtime.access
    held: list[tuple] = []

    def publish_unless_held(envelopes, view_before) -> None:
        if envelopes[0].seq == 4:
            held.append((envelopes, view_before))
        else:
            hub.publish(envelopes, view_before)

    access.on_commit[access.on_commit.index(hub.publish)] = publish_unless_held
    async with open_websocket_url(ws_url(server)) as ws:
        await send(ws, op="watch_runs")
        run = await ClientRun.open(server)
        await run.append(head(run.run_id))
        await run.observe(2)
        schema = {"type": "object", "required": ["ok"]}
        await run.append(
            envelope(run.run_id, 3, "Suspended", {"reason": "ok?", "input_schema": schema})
        )
        await run.append(
            envelope(run.run_id, 4, "Resumed", {"input": {"ok": True}}),
            envelope(run.run_id, 5, "RunCompleted", {"output": {"answer": 42}}),
        )
        rows = []
        while not rows or rows[-1]["status"]["state"] != "completed":
            message, _ = await receive(ws)
            assert message["type"] == "run" and message["run"] == run.run_id, message
            rows.append(message["row"])
        assert [(row["status"]["state"], row["event_count"]) for row in rows] == [
            ("running", 1),
            ("suspended", 4),
            ("completed", 6),
        ]
        # The held publish goes out late: it has nothing newer to tell, so the next row is
        # another run's.
        assert len(held) == 1
        hub.publish(*held[0])
        other = await ClientRun.open(server)
        await other.append(head(other.run_id))
        message, _ = await receive(ws)
        assert (message["run"], message["row"]["event_count"]) == (other.run_id, 1), message


async def test_a_slow_consumer_is_closed_and_nobody_else_waits(server: Server) -> None:
    server.state.stream_buffer_bytes = 16 * 60_000
    run = await ClientRun.open(server)
    await run.append(head(run.run_id))
    big = "x" * 60_000
    async with (
        open_websocket_url(ws_url(server)) as slow,
        open_websocket_url(ws_url(server)) as fast,
    ):
        for ws in (slow, fast):
            await send(ws, op="subscribe", run=run.run_id)
            assert (await receive(ws))[0]["type"] == "event"
            assert (await receive(ws))[0]["type"] == "status"
        hub = server.state.hub
        assert hub.subscriber_counts() == {"sse": 0, "ws": 2}
        fast_got = 1
        # The slow one reads nothing more; the daemon commits on until it has let it go.
        with trio.fail_after(WAIT):
            while hub.subscriber_counts()["ws"] == 2:
                await run.observe(5, big)
                while fast_got < run.next_seq:
                    message, _ = await receive(fast)
                    assert message["event"]["seq"] == fast_got
                    fast_got += 1
        await run.observe(3)
        while fast_got < run.next_seq:
            message, _ = await receive(fast)
            assert message["event"]["seq"] == fast_got
            fast_got += 1
        # It reads again: what was on the wire, then the close naming the cause.
        seqs = []
        with pytest.raises(ConnectionClosed) as closed, trio.fail_after(WAIT):
            while True:
                message, _ = await receive(slow)
                seqs.append(message["event"]["seq"])
        assert closed.value.reason.code == 1013
        assert "outgoing buffer full" in closed.value.reason.reason
        assert seqs == list(range(1, 1 + len(seqs))) and len(seqs) < run.next_seq - 1


async def test_bad_requests_are_answered_and_bad_messages_close(server: Server) -> None:
    run = await ClientRun.open(server)
    await run.append(head(run.run_id))
    nobody = "00000000-0000-4000-8000-000000000000"
    async with open_websocket_url(ws_url(server)) as ws:
        refusals = [
            ({"op": "dance"}, "bad_request"),
            ({"run": run.run_id}, "bad_request"),
            ({"op": "subscribe"}, "bad_request"),
            ({"op": "subscribe", "run": "not-a-uuid"}, "bad_request"),
            ({"op": "subscribe", "run": run.run_id, "from_seq": -1}, "bad_request"),
            ({"op": "subscribe", "run": run.run_id, "from_seq": "1"}, "bad_request"),
            ({"op": "subscribe", "run": run.run_id, "from_seq": True}, "bad_request"),
            ({"op": "subscribe", "run": run.run_id, "since": 1}, "bad_request"),
            ({"op": "subscribe", "run": nobody}, "unknown_run"),
        ]
        for body, code in refusals:
            await ws.send_message(json.dumps(body))
            message, _ = await receive(ws)
            assert message["type"] == "error" and message["error"]["code"] == code, message
            assert message["error"]["message"]
            assert message.get("op") == body.get("op") if isinstance(body.get("op"), str) else True
        # None of them subscribed anything: the next event is the one subscription's own.
        assert server.state.hub.subscriber_counts() == {"sse": 0, "ws": 0}
        await send(ws, op="subscribe", run=run.run_id, from_seq=1)
        # Caught up (nothing from seq 1 in the store yet) before seq 1 is appended: appended
        # sooner, the catch-up could read it and send it ahead of the status.
        message, _ = await receive(ws)
        assert message["type"] == "status"
        await run.observe()
        message, _ = await receive(ws)
        assert message["event"]["seq"] == 1
        # An unsubscribed run sends nothing more: the answer to a bad op sent after the next
        # append is the next message (an event of the run would be queued ahead of it).
        await send(ws, op="unsubscribe", run=run.run_id)
        await send(ws, op="dance")
        assert (await receive(ws))[0]["type"] == "error"
        await run.observe()
        await send(ws, op="dance")
        assert (await receive(ws))[0]["type"] == "error"
        await ws.send_message("[1, 2]")
        with pytest.raises(ConnectionClosed) as closed:
            await receive(ws)
        assert closed.value.reason.code == 1008
    # A message over the 64 KiB frame limit is closed by the listener itself: 1009, too big.
    async with open_websocket_url(ws_url(server), max_message_size=2**20) as ws:
        await ws.send_message(json.dumps({"op": "watch_runs", "pad": "x" * 70_000}))
        with pytest.raises(ConnectionClosed) as closed:
            await receive(ws)
        assert closed.value.reason.code == 1009
    assert server.state.hub.subscriber_counts() == {"sse": 0, "ws": 0}


async def test_a_plain_request_of_the_socket_is_the_400_envelope(server: Server) -> None:
    response = await server.client.get("/v1/ws")
    assert_error(response, 400, "bad_request")


async def test_the_handshake_needs_the_token(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    with pytest.raises(ConnectionRejected) as rejected:
        async with open_websocket_url(ws_url(server)):
            pass
    assert rejected.value.status_code == 401
    assert json.loads(rejected.value.body)["error"]["code"] == "unauthorized"
    with pytest.raises(SalvorError) as refused:
        async with open_live(server.url) as live:
            async for _ in live:
                pass
    assert refused.value.status == 401
    run = await ClientRun.open(server)
    await run.append(head(run.run_id))
    async with open_websocket_url(ws_url(server), extra_headers=bearer()) as ws:
        await send(ws, op="subscribe", run=run.run_id)
        assert (await receive(ws))[0]["event"]["seq"] == 0


async def test_a_socket_that_answers_no_ping_is_closed_after_its_idle_deadline(
    server_factory,
) -> None:
    server = await server_factory(ws_idle_seconds=1.0)
    run = await ClientRun.open(server)
    await run.append(head(run.run_id))
    host, port = server.url.removeprefix("http://").split(":")
    # A peer that upgrades and then neither sends nor answers anything: the daemon's pings go
    # unanswered, and at the deadline it lets the socket go (the client reads its end).
    silent = trio.socket.socket()
    await silent.connect((host, int(port)))
    await silent.send(
        f"GET /v1/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    # A client whose library answers the pings stays, past several deadlines, quiet as it is.
    async with open_websocket_url(ws_url(server)) as lively:
        received = b""
        with trio.fail_after(WAIT):
            while chunk := await silent.recv(65536):
                received += chunk
        silent.close()
        assert received.startswith(b"HTTP/1.1 101"), received[:200]
        # The server pinged it (opcode 0x9) before it gave up on it.
        assert b"\x89" in received.partition(b"\r\n\r\n")[2]
        await trio.sleep(3.0)
        await send(lively, op="subscribe", run=run.run_id)
        assert (await receive(lively))[0]["event"]["seq"] == 0


async def test_a_client_over_its_cap_of_streams_is_refused_before_anything_opens(
    server_factory,
) -> None:
    server = await server_factory(max_streams_per_client=2)
    run = await ClientRun.open(server)
    await run.append(head(run.run_id))
    events = f"/v1/runs/{run.run_id}/events"
    async with open_websocket_url(ws_url(server)) as first:
        async with server.client.stream("GET", events) as second:
            assert second.status_code == 200
            # A third, of either kind, is the 429 envelope with a Retry-After, and never upgrades.
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(ws_url(server)):
                    pass
            assert rejected.value.status_code == 429
            assert json.loads(rejected.value.body)["error"]["code"] == "too_many_requests"
            assert dict(rejected.value.headers)[b"retry-after"] == b"5"
            response = await server.client.get(events)
            assert_error(response, 429, "too_many_requests")
            assert response.headers["Retry-After"] == "5"
            assert "--max-streams-per-client" in response.json()["error"]["message"]
            assert server.state.hub.subscriber_counts() == {"sse": 1, "ws": 0}
        # The stream closed: its place is free again (once the daemon has seen it go).
        with trio.fail_after(WAIT):
            while server.state.stream_slots.open_count("127.0.0.1") > 1:
                await trio.sleep(0.01)
        async with open_websocket_url(ws_url(server)) as third:
            for ws in (first, third):
                await send(ws, op="subscribe", run=run.run_id)
                assert (await receive(ws))[0]["event"]["seq"] == 0


async def test_the_daemon_stopping_closes_with_going_away(server: Server) -> None:
    run = await ClientRun.open(server)
    await run.append(head(run.run_id))
    async with open_websocket_url(ws_url(server)) as ws:
        await send(ws, op="subscribe", run=run.run_id)
        assert (await receive(ws))[0]["type"] == "event"
        assert (await receive(ws))[0]["type"] == "status"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.stop)
            with pytest.raises(ConnectionClosed) as closed:
                await receive(ws)
    assert closed.value.reason.code == 1001


async def test_what_another_process_writes_is_read_once_per_run_for_every_stream(
    server_factory,
) -> None:
    server = await server_factory(detach_grace_seconds=WAIT)
    run_id = "0b0e6a3c-5d7e-4c1a-9f00-0000000000a1"
    store = await trio.to_thread.run_sync(EventStore.open, server.store_url)
    try:
        # Recorded straight into the store, as a `salvor run` beside the daemon would.
        await trio.to_thread.run_sync(
            lambda: store.append(run_id, [RunStarted(agent_def_hash=AGENT, input=None)], EMPTY_VIEW)
        )
        streams, access = 10, server.state.runtime.access
        # Every read of the run's log once the streams were live, whoever made it (the hub's
        # change feed, on its thread or a reader's, or a stream for itself).
        reads: list[int] = []
        read_log = access.store.read_log

        def counted(run_id: str, from_seq: int = 0, **kwargs):
            reads.append(from_seq)
            return read_log(run_id, from_seq, **kwargs)

        async with trio.open_nursery() as nursery, open_websocket_url(ws_url(server)) as ws:
            seen = trio.Semaphore(0)

            async def stream(task_status=trio.TASK_STATUS_IGNORED) -> None:
                async with server.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
                    task_status.started()
                    async for line in response.aiter_lines():
                        if line == "id: 1":
                            seen.release()
                            return

            for _ in range(streams):
                await nursery.start(stream)
            await send(ws, op="subscribe", run=run_id)
            assert (await receive(ws))[0]["event"]["seq"] == 0
            assert (await receive(ws))[0]["type"] == "status"
            with trio.fail_after(WAIT):
                while server.state.hub.subscriber_counts() != {"sse": streams, "ws": 1}:
                    await trio.sleep(0.01)
            view = fold(await server.state.runtime.reads.log(run_id))
            access.store.read_log = counted
            try:
                await trio.to_thread.run_sync(
                    lambda: store.append(run_id, [RandomObserved(value="ab")], view)
                )
                message, _ = await receive(ws)
                assert message["event"]["seq"] == 1
                with trio.fail_after(WAIT):
                    for _ in range(streams):
                        await seen.acquire()
            finally:
                del access.store.read_log
    finally:
        store.close()
    # At most one read, the hub's, from the seq it had delivered, for all eleven subscribers
    # (none on PostgreSQL: the notice carried the small event).
    assert reads == ([] if server.store_url.startswith("postgresql") else [1]), reads
