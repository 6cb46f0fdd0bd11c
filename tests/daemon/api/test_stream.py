"""``GET /v1/runs/{id}/events`` against the real daemon, over real HTTP.

The daemon is ``serve`` itself on a loopback port (the ``server_factory``
fixture), over real SQLite and PostgreSQL. The stream is read two ways: with
httpx's async streaming client (frames parsed here, by hand, from the raw
text) and with ``curl -N`` in a subprocess. The scripted provider is the only
double; its ``on_call`` hook holds a run mid-flight while a stream is open.

What every test checks in the end is the same thing: the frames a client
saw are the run's log, each seq exactly once and in order, and every frame's
``data`` is byte-for-byte the pinned envelope JSON ``encode_envelope`` makes
of the store's rows.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
from salvor.daemon.api._run_events_routes import _frames
from salvor.daemon.tools._demo import demo_registry
from salvor.daemon.tools._registry import Tool, ToolRegistry
from salvor.protocol import EMPTY_VIEW, Effect, RunStarted, encode_envelope
from salvor.store import EventStore

from tests.support.api_server import Server, agent_toml
from tests.support.event_hub import subscriber_count
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, tool_loop_script
from tests.support.spawn import run_salvor

REPO = Path(__file__).resolve().parents[3]
PLAN = [
    ("lookup_invoice", {"invoice_id": "INV-1"}),
    ("lookup_invoice", {"invoice_id": "INV-2"}),
    ("lookup_invoice", {"invoice_id": "INV-3"}),
]
# Bounds on every wait: generous, because a failure is a hang, never a slow pass.
WAIT = 30


# -- SSE parsing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One server-sent event block: an event (with id/data/name) or a bare comment."""

    id: str | None = None
    event: str | None = None
    data: str | None = None
    comment: str | None = None

    @property
    def seq(self) -> int:
        return int(self.id)

    def json(self):
        return json.loads(self.data)


def parse_block(block: str) -> Frame:
    fields: dict[str, list[str]] = {}
    comments = []
    for line in block.split("\n"):
        if line.startswith(":"):
            comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name, []).append(value.removeprefix(" "))
    data = "\n".join(fields["data"]) if "data" in fields else None
    if data is None and not fields and comments:
        return Frame(comment="\n".join(comments))
    return Frame(id=fields.get("id", [None])[-1], event=fields.get("event", [None])[-1], data=data)


def parse_sse(text: str) -> list[Frame]:
    return [
        parse_block(block) for block in text.replace("\r\n", "\n").split("\n\n") if block.strip()
    ]


async def frames_of(response: httpx.Response) -> AsyncIterator[Frame]:
    """Frames as they arrive on an open streaming response."""
    buffer = ""
    async for chunk in response.aiter_text():
        buffer += chunk.replace("\r\n", "\n")
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            if block.strip():
                yield parse_block(block)


@dataclass
class Reading:
    """What one stream delivered: envelope frames, the end frame, and keep-alive comments."""

    events: list[Frame]
    end: dict | None
    comments: list[str]

    @property
    def seqs(self) -> list[int]:
        return [frame.seq for frame in self.events]


async def read_stream(
    response: httpx.Response, *, stop_after: int | None = None, comments: int | None = None
) -> Reading:
    """Read frames until the ``end`` frame (or ``stop_after`` envelope
    frames, or ``comments`` comments)."""
    reading = Reading([], None, [])
    # One frame iterator per response, so a stream can be read in several goes.
    frames = getattr(response, "sse_frames", None)
    if frames is None:
        frames = response.sse_frames = frames_of(response)
    async for frame in frames:
        if frame.comment is not None:
            reading.comments.append(frame.comment)
            if comments is not None and len(reading.comments) >= comments:
                break
        elif frame.event == "end":
            reading.end = frame.json()
            break
        else:
            assert frame.event is None, "envelope frames carry no event: field"
            reading.events.append(frame)
            if stop_after is not None and len(reading.events) >= stop_after:
                break
    return reading


def check_against_log(frames: list[Frame], log) -> None:
    """Every seq of the log exactly once, in order, each frame the pinned envelope JSON."""
    assert (
        [frame.seq for frame in frames]
        == [envelope.seq for envelope in log]
        == list(range(len(log)))
    )
    for frame, envelope in zip(frames, log):
        assert frame.data == encode_envelope(envelope)


# -- a provider the test can hold mid-call ---------------------------------------------------------


class Holds:
    """``on_call`` hook: calls with an index in ``at`` wait until the test releases them."""

    def __init__(self, *at: int) -> None:
        self.reached = {index: threading.Event() for index in at}
        self.released = {index: threading.Event() for index in at}

    def __call__(self, call: ProviderCall) -> None:
        if call.index in self.released:
            self.reached[call.index].set()
            self.released[call.index].wait(WAIT)

    async def wait_reached(self, index: int) -> None:
        assert await trio.to_thread.run_sync(self.reached[index].wait, WAIT), (
            f"call {index} never arrived"
        )

    def release(self, index: int) -> None:
        self.released[index].set()

    def release_all(self) -> None:
        for event in self.released.values():
            event.set()


@pytest.fixture
def holds():
    made: list[Holds] = []

    def make(*at: int) -> Holds:
        hold = Holds(*at)
        made.append(hold)
        return hold

    yield make
    for hold in made:
        hold.release_all()


@pytest.fixture
async def daemon(server_factory, tmp_path):
    """The daemon with demo tools acting on a ledger in tmp."""
    return await server_factory(
        registry=demo_registry(str(tmp_path / "effects.jsonl")),
        detach_grace_seconds=WAIT,
    )


async def lookup_agent(server: Server, provider: ScriptedProvider) -> str:
    return await server.register_agent(agent_toml(provider.base_url, tools=["lookup_invoice"]))


async def store_log(server: Server, run_id: str):
    return await server.state.runtime.reads.log(run_id)


async def wait_subscribers(server: Server, run_id: str, count: int) -> None:
    with trio.fail_after(WAIT):
        while subscriber_count(server.state.hub, run_id) < count:
            await trio.sleep(0.01)


def curl_command(url: str, *headers: str) -> list[str]:
    command = ["curl", "-N", "-sS", "--fail-with-body", "--max-time", str(WAIT), url]
    for header in headers:
        command += ["-H", header]
    return command


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


# -- replay of a finished run ----------------------------------------------------------------------


async def test_a_finished_run_replays_in_full_then_ends_with_its_status(daemon, providers):
    provider = providers(tool_loop_script(PLAN, final_text="all looked up"))
    run_id = await daemon.start_run(await lookup_agent(daemon, provider), {"customer": "c-1"})
    await daemon.wait_resting(run_id)
    log = await store_log(daemon, run_id)

    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-store"
        # Read until the server closes the stream: the end frame is the last thing sent.
        frames = [frame async for frame in frames_of(response)]

    check_against_log(frames[:-1], log)
    assert frames[-1].event == "end" and frames[-1].id is None
    assert frames[-1].json() == {"status": {"state": "completed", "output": "all looked up"}}
    assert log[-1].event.KIND.value == "RunCompleted"


@needs_curl
async def test_curl_reads_the_same_bytes(daemon, providers):
    provider = providers(tool_loop_script(PLAN[:1]))
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await daemon.wait_resting(run_id)
    log = await store_log(daemon, run_id)

    url = f"{daemon.url}/v1/runs/{run_id}/events"
    result = await trio.run_process(curl_command(url), capture_stdout=True, capture_stderr=True)
    frames = parse_sse(result.stdout.decode())
    check_against_log(frames[:-1], log)
    assert frames[-1].event == "end"
    assert frames[-1].json() == {"status": {"state": "completed", "output": "done"}}

    # The cursor works the same from curl: Last-Event-ID: 2 resumes at seq 3.
    result = await trio.run_process(curl_command(url, "Last-Event-ID: 2"), capture_stdout=True)
    frames = parse_sse(result.stdout.decode())
    assert [frame.seq for frame in frames[:-1]] == list(range(3, len(log)))
    assert [frame.data for frame in frames[:-1]] == [encode_envelope(e) for e in log[3:]]


# -- a live run ------------------------------------------------------------------------------------


async def test_a_live_run_streams_as_it_happens(daemon, providers, holds):
    hold = holds(1)
    provider = providers(tool_loop_script(PLAN[:2]), on_call=hold)
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await hold.wait_reached(1)
    # The run is held inside its second model call: its intent is durable, the rest is to come.
    held_at = len(await store_log(daemon, run_id))

    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        before = await read_stream(response, stop_after=held_at)
        assert before.seqs == list(range(held_at))
        assert before.events[-1].json()["event"]["kind"] == "ModelCallRequested"
        status = (await daemon.client.get(f"/v1/runs/{run_id}")).json()
        assert status["status"]["state"] == "awaiting_model" and status["driver"] == "attached"
        hold.release(1)
        after = await read_stream(response)

    log = await store_log(daemon, run_id)
    check_against_log(before.events + after.events, log)
    assert len(log) > held_at
    assert after.end == {"status": {"state": "completed", "output": "done"}}


@needs_curl
async def test_curl_follows_a_live_run_to_its_end(daemon, providers, holds):
    hold = holds(0)
    provider = providers(tool_loop_script(PLAN[:1]), on_call=hold)
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await hold.wait_reached(0)
    url = f"{daemon.url}/v1/runs/{run_id}/events"
    results = []

    async def curl() -> None:
        results.append(
            await trio.run_process(curl_command(url), capture_stdout=True, capture_stderr=True)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(curl)
        await wait_subscribers(daemon, run_id, 1)
        hold.release(0)

    frames = parse_sse(results[0].stdout.decode())
    check_against_log(frames[:-1], await store_log(daemon, run_id))
    assert frames[-1].json()["status"]["state"] == "completed"


@pytest.mark.parametrize("cursor", ["last_event_id", "from_seq"])
async def test_a_dropped_stream_resumes_with_no_gap_and_no_duplicate(
    daemon, providers, holds, cursor
):
    hold = holds(1, 2)
    provider = providers(tool_loop_script(PLAN[:2]), on_call=hold)
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await hold.wait_reached(1)

    # First connection: take two frames, then drop it while the run is mid-flight.
    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        first = await read_stream(response, stop_after=2)
    assert first.seqs == [0, 1]
    await wait_subscribers(daemon, run_id, 0)

    # Events land while nobody listens; the run is then held again in its third model call.
    hold.release(1)
    await hold.wait_reached(2)

    last = first.events[-1].id
    if cursor == "last_event_id":
        request = {"headers": {"Last-Event-ID": last}}
    else:
        request = {"params": {"from_seq": int(last) + 1}}
    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events", **request) as response:
        backlog_size = len(await store_log(daemon, run_id)) - 2
        second = await read_stream(response, stop_after=backlog_size)
        hold.release(2)  # the rest is live
        third = await read_stream(response)

    frames = first.events + second.events + third.events
    check_against_log(frames, await store_log(daemon, run_id))
    assert third.events, "some events arrived live on the resumed stream"
    assert third.end["status"]["state"] == "completed"


async def test_last_event_id_wins_over_from_seq(daemon, providers):
    provider = providers(tool_loop_script(PLAN[:1]))
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await daemon.wait_resting(run_id)
    log = await store_log(daemon, run_id)

    async with daemon.client.stream(
        "GET", f"/v1/runs/{run_id}/events", params={"from_seq": 1}, headers={"Last-Event-ID": "3"}
    ) as response:
        reading = await read_stream(response)
    assert reading.seqs == list(range(4, len(log)))

    # from_seq alone starts at that seq; a cursor past the end sends only the end frame.
    async with daemon.client.stream(
        "GET", f"/v1/runs/{run_id}/events", params={"from_seq": 1}
    ) as response:
        assert (await read_stream(response)).seqs == list(range(1, len(log)))
    async with daemon.client.stream(
        "GET", f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": str(len(log) + 5)}
    ) as response:
        reading = await read_stream(response)
    assert reading.events == [] and reading.end["status"]["state"] == "completed"


@pytest.mark.parametrize(
    ("params", "headers"),
    [
        ({"from_seq": "x"}, {}),
        ({"from_seq": "-1"}, {}),
        ({"from_seq": "1.5"}, {}),
        ({}, {"Last-Event-ID": "abc"}),
        ({}, {"Last-Event-ID": "-2"}),
        # A bad Last-Event-ID is refused even when from_seq is fine: the header wins.
        ({"from_seq": "0"}, {"Last-Event-ID": ""}),
    ],
)
async def test_a_bad_cursor_is_a_400_envelope(daemon, providers, params, headers):
    provider = providers(tool_loop_script([]))
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await daemon.wait_resting(run_id)
    response = await daemon.client.get(f"/v1/runs/{run_id}/events", params=params, headers=headers)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "bad_request" and error["message"]
    assert subscriber_count(daemon.state.hub, run_id) == 0


async def test_an_unknown_run_is_404_and_a_malformed_id_400(daemon):
    response = await daemon.client.get("/v1/runs/6f1c1d1e-0000-4000-8000-000000000000/events")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_run"
    response = await daemon.client.get("/v1/runs/not-a-uuid/events")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"
    assert subscriber_count(daemon.state.hub, "6f1c1d1e-0000-4000-8000-000000000000") == 0


# -- resting points that are not the end of the run ------------------------------------------------


async def test_the_end_frame_of_a_sleeping_run_carries_wake_at(daemon, providers):
    provider = providers(tool_loop_script([("wait_until", {"seconds": 3600})]))
    agent = await daemon.register_agent(agent_toml(provider.base_url, tools=["wait_until"]))
    run_id = await daemon.start_run(agent)
    body = await daemon.wait_resting(run_id)
    assert body["status"]["state"] == "sleeping"

    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        reading = await read_stream(response)
    log = await store_log(daemon, run_id)
    check_against_log(reading.events, log)
    assert log[-1].event.KIND.value == "SleepStarted"
    assert reading.end == {"status": {"state": "sleeping", "wake_at": log[-1].event.wake_at}}
    assert "detached" not in reading.end


async def test_a_run_nothing_drives_ends_detached_with_keep_alives_meanwhile(
    server_factory, store_url
):
    daemon = await server_factory(
        detach_grace_seconds=1.0, heartbeat_seconds=0.1, stream_poll_seconds=0.05
    )
    # Recorded straight into the store, as another process would: a head, then nothing.
    run_id = "0b0e6a3c-5d7e-4c1a-9f00-00000000d7ac"
    store = await trio.to_thread.run_sync(EventStore.open, store_url)
    try:
        await trio.to_thread.run_sync(
            lambda: store.append(
                run_id, [RunStarted(agent_def_hash="sha256:" + "a" * 64, input=None)], EMPTY_VIEW
            )
        )
    finally:
        store.close()

    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        reading = await read_stream(response)
    check_against_log(reading.events, await store_log(daemon, run_id))
    assert reading.end == {"status": {"state": "running"}, "detached": True}
    assert reading.comments and set(reading.comments) == {"keep-alive"}


async def test_keep_alive_comments_while_a_driven_run_is_quiet(
    server_factory, providers, holds, tmp_path
):
    daemon = await server_factory(
        registry=demo_registry(str(tmp_path / "effects.jsonl")),
        heartbeat_seconds=0.05,
        stream_poll_seconds=0.05,
        detach_grace_seconds=0.05,
    )
    hold = holds(0)
    provider = providers(tool_loop_script([]), on_call=hold)
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await hold.wait_reached(0)
    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        quiet = await read_stream(response, comments=3)
        # The run is driven here, so the short detach grace never ended the stream.
        hold.release(0)
        rest = await read_stream(response)
    assert quiet.comments == ["keep-alive"] * 3 and quiet.seqs == [0, 1]
    check_against_log(quiet.events + rest.events, await store_log(daemon, run_id))
    assert rest.end == {"status": {"state": "completed", "output": "done"}}
    assert "detached" not in rest.end


# -- writers in another process --------------------------------------------------------------------


# `salvor run` is the one command line writer that drives beside a live
# daemon: `salvor resume` there is refused (one daemon per store).
@pytest.mark.parametrize("verb", ["run"])
async def test_events_written_by_another_process_arrive_live(
    daemon, providers, holds, tmp_path, verb
):
    hold = holds(0)
    provider = providers(tool_loop_script(PLAN[:2], final_text="from the cli"), on_call=hold)
    definition = agent_toml(provider.base_url, tools=["lookup_invoice"])
    run_id = "5a1f0000-0000-4000-8000-00000000c11e"
    env = {
        **os.environ,
        "SALVOR_DEMO_EFFECTS": str(tmp_path / "cli-effects.jsonl"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    agent_file = tmp_path / "agent.toml"
    agent_file.write_text(definition)
    command = [verb, str(agent_file), "--store", daemon.store_url, "--run-id", run_id, "--json"]

    results = []

    async def run_cli() -> None:
        run = functools.partial(run_salvor, command, env=env, capture_output=True, timeout=120)
        results.append(await trio.to_thread.run_sync(run))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_cli)
        # The other process is inside its first model call: its intent is in the store.
        await hold.wait_reached(0)
        assert not daemon.state.drivers.driving(run_id)
        async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
            held_at = len(await store_log(daemon, run_id))
            before = await read_stream(response, stop_after=held_at)
            hold.release(0)
            after = await read_stream(response)

    assert results[0].returncode == 0, results[0].stderr.decode()
    log = await store_log(daemon, run_id)
    check_against_log(before.events + after.events, log)
    assert after.events, "the other process's events reached the open stream"
    assert after.end == {"status": {"state": "completed", "output": "from the cli"}}


# -- fan-out ---------------------------------------------------------------------------------------


async def test_many_subscribers_on_one_run_each_get_every_seq_once(daemon, providers, holds):
    subscribers = 25
    hold = holds(1)
    provider = providers(tool_loop_script(PLAN), on_call=hold)
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await hold.wait_reached(1)
    readings: list[Reading] = []

    async def subscribe(task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with (
            daemon.new_client() as client,
            client.stream("GET", f"/v1/runs/{run_id}/events") as response,
        ):
            assert response.status_code == 200
            task_status.started()
            readings.append(await read_stream(response))

    async with trio.open_nursery() as nursery:
        for _ in range(subscribers):
            await nursery.start(subscribe)
        await wait_subscribers(daemon, run_id, subscribers)
        hold.release(1)

    log = await store_log(daemon, run_id)
    assert len(readings) == subscribers
    for reading in readings:
        check_against_log(reading.events, log)
        assert reading.end == {"status": {"state": "completed", "output": "done"}}
    assert subscriber_count(daemon.state.hub, run_id) == 0


async def test_a_tool_that_takes_long_is_seen_requested_while_it_runs(server_factory, providers):
    # The daemon holds a run's events while its driver goes on (the tool's result comes next,
    # most often at once), but no longer than the hold's limit: a tool still running well
    # past it has been seen requested, live, on the stream.
    reached, release = trio.Event(), trio.Event()

    async def look(args: dict, call) -> dict:
        reached.set()
        await release.wait()
        return {"found": True}

    tool = Tool(
        name="look",
        description="Look it up.",
        effect=Effect.READ,
        input_schema={"type": "object"},
        handler=look,
    )
    daemon = await server_factory(registry=ToolRegistry([tool]))
    provider = providers(tool_loop_script([("look", {})]))
    run_id = await daemon.start_run(
        await daemon.register_agent(agent_toml(provider.base_url, tools=["look"]))
    )
    async with daemon.client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        with trio.fail_after(WAIT):
            await reached.wait()
            seen = []
            while "ToolCallRequested" not in [frame.json()["event"]["kind"] for frame in seen]:
                seen += (await read_stream(response, stop_after=1)).events
        assert not release.is_set()
        release.set()
        rest = await read_stream(response)
    check_against_log(seen + rest.events, await store_log(daemon, run_id))
    assert rest.end == {"status": {"state": "completed", "output": "done"}}


async def test_a_write_finished_between_a_read_and_the_rest_check_is_not_the_end(
    server_factory, providers
):
    # The stream folds a write's intent (needs_reconciliation, not a resting point while a driver
    # here executes it); before it asks the driving set, the driver finishes the write and the
    # run. Driving the stream's frames by hand holds it exactly there: it must read on to where
    # the run ended, not end on the intent (as once in CI's walkthrough, on a graph's publish).
    reached, release = trio.Event(), trio.Event()

    async def post(args: dict, call) -> dict:
        reached.set()
        await release.wait()
        return {"posted": True}

    tool = Tool(
        name="post",
        description="Post it.",
        effect=Effect.WRITE,
        input_schema={"type": "object"},
        handler=post,
    )
    daemon = await server_factory(registry=ToolRegistry([tool]))
    provider = providers(tool_loop_script([("post", {})]))
    run_id = await daemon.start_run(
        await daemon.register_agent(agent_toml(provider.base_url, tools=["post"]))
    )
    with trio.fail_after(WAIT):
        await reached.wait()
    state = daemon.state
    subscription = state.hub.subscribe(run_id)
    frames = _frames(state, run_id, subscription, await state.runtime.reads.read_log(run_id, 0), 0)
    first = parse_sse((await frames.__anext__()).decode())
    assert json.loads(first[-1].data)["event"]["kind"] == "ToolCallRequested"

    release.set()
    with trio.fail_after(WAIT):
        while state.drivers.driving(run_id):
            await trio.sleep(0.01)
    rest = parse_sse(b"".join([chunk async for chunk in frames]).decode())

    check_against_log(first + rest[:-1], await store_log(daemon, run_id))
    assert rest[-1].event == "end"
    assert rest[-1].json() == {"status": {"state": "completed", "output": "done"}}


async def test_graceful_stop_ends_open_streams(server_factory, providers, holds, store_url):
    daemon = await server_factory(stream_poll_seconds=0.05)
    hold = holds(0)
    provider = providers(tool_loop_script([]), on_call=hold)
    run_id = await daemon.start_run(await lookup_agent(daemon, provider))
    await hold.wait_reached(0)
    # A client of its own: the fixture's stop closes the clients it made.
    async with (
        trio.open_nursery() as nursery,
        httpx.AsyncClient(base_url=daemon.url, timeout=WAIT) as client,
        client.stream("GET", f"/v1/runs/{run_id}/events") as response,
    ):
        first = await read_stream(response, stop_after=2)
        nursery.start_soon(daemon.stop)
        # The stream ends with its end frame, not a cut connection.
        rest = await read_stream(response)
    assert first.seqs + rest.seqs == [0, 1]
    assert rest.end == {"status": {"state": "awaiting_model"}, "detached": True}
