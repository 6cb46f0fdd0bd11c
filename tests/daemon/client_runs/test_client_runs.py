"""Client-driven runs over real HTTP: leases, the guarded append, adoption after a restart.

The client here is the test: it builds envelopes as a client's own cursor
would and appends them with its drive token. Every refusal is checked to
have written nothing.
"""

from __future__ import annotations

import uuid

import trio

from tests.support.client_events import envelope

AGENT = "sha256:" + "ab" * 32


def head(run_id: str, **payload) -> dict:
    return envelope(
        run_id, 0, "RunStarted", {"agent_def_hash": AGENT, "input": {"task": "t"}, **payload}
    )


async def open_run(
    client, run_id: str | None = None, token: str | None = None, expect: int = 201
) -> dict:
    body = {"run_id": run_id} if run_id else {}
    headers = {"X-Drive-Token": token} if token else {}
    response = await client.post("/v1/client-runs", json=body, headers=headers)
    assert response.status_code == expect, response.text
    return response.json()


async def append(client, run_id: str, token: str | None, events: list[dict]):
    headers = {"X-Drive-Token": token} if token is not None else {}
    return await client.post(
        f"/v1/client-runs/{run_id}/events", json={"events": events}, headers=headers
    )


async def log_of(client, run_id: str) -> list[dict]:
    response = await client.get(f"/v1/client-runs/{run_id}/log")
    assert response.status_code == 200, response.text
    return response.json()["log"]


def code(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_a_client_drives_a_run_through_the_guarded_append(server) -> None:
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    assert opened["log"] == [] and token.startswith("dt_")
    response = await append(client, run_id, token, [head(run_id, labels={"tab": "1"})])
    assert response.status_code == 200 and response.json() == {"appended": [0]}, response.text
    log = await log_of(client, run_id)
    assert log[0]["event"]["payload"]["driven_by"] == "client"  # stamped by the server
    assert log[0]["recorded_at"] != "1970-01-01T00:00:00.000000Z"
    body = (await client.get(f"/v1/runs/{run_id}")).json()
    assert body["status"] == {"state": "running"} and body["driver"] == "attached"
    assert body["driven_by"] == "client" and body["labels"] == {"tab": "1"}
    schema = {"type": "object", "required": ["ok"]}
    response = await append(
        client,
        run_id,
        token,
        [
            envelope(run_id, 1, "NowObserved", {"now": "2026-11-29T10:00:00.000000Z"}),
            envelope(run_id, 2, "Suspended", {"reason": "approve?", "input_schema": schema}),
        ],
    )
    assert response.json() == {"appended": [1, 2]}, response.text
    assert (await client.get(f"/v1/runs/{run_id}")).json()["status"]["state"] == "suspended"
    # The server-driven surface refuses to resume it: only its client drives it.
    assert code(await client.post(f"/v1/runs/{run_id}/resume", json={"input": {"ok": True}})) == (
        409,
        "client_driven_run",
    )
    response = await append(
        client,
        run_id,
        token,
        [
            envelope(run_id, 3, "Resumed", {"input": {"ok": True}}),
            envelope(run_id, 4, "RunCompleted", {"output": {"answer": 42}}),
        ],
    )
    assert response.json() == {"appended": [3, 4]}
    body = (await client.get(f"/v1/runs/{run_id}")).json()
    assert (
        body["status"] == {"state": "completed", "output": {"answer": 42}} and "driver" not in body
    )
    # A terminal run is never held: it re-opens at once, under a fresh token.
    reopened = await open_run(client, run_id, expect=200)
    assert reopened["drive_token"] != token and len(reopened["log"]) == 5


async def test_retries_are_no_ops_and_everything_else_at_a_recorded_seq_diverges(server) -> None:
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    first = [head(run_id), envelope(run_id, 1, "RandomObserved", {"value": "ab12"})]
    assert (await append(client, run_id, token, first)).json() == {"appended": [0, 1]}
    # The tab resends after a blip: same events (its recorded_at differs), nothing grows.
    retry = [{**event, "recorded_at": "2001-01-01T00:00:00.000000Z"} for event in first]
    assert (await append(client, run_id, token, retry)).json() == {"appended": [0, 1]}
    # A retry overlapping new events appends only the new ones.
    more = [first[1], envelope(run_id, 2, "NowObserved", {"now": "2026-11-29T10:00:00.000000Z"})]
    assert (await append(client, run_id, token, more)).json() == {"appended": [1, 2]}
    refusals = [
        [
            envelope(run_id, 1, "RandomObserved", {"value": "ffff"})
        ],  # different bytes at a recorded seq
        [envelope(run_id, 5, "NowObserved", {"now": "2026-11-29T10:00:01.000000Z"})],  # a gap
        [envelope(run_id, 3, "SleepCompleted", {})],  # closes a sleep the log never started
        [
            envelope(run_id, 3, "RunStarted", {"agent_def_hash": AGENT, "input": None})
        ],  # a second head
    ]
    for events in refusals:
        response = await append(client, run_id, token, events)
        assert code(response) == (409, "divergence"), response.text
    # A batch that turns illegal half-way writes nothing at all.
    response = await append(
        client,
        run_id,
        token,
        [
            envelope(run_id, 3, "RunCompleted", {"output": 1}),
            envelope(run_id, 4, "NowObserved", {"now": "2026-11-29T10:00:01.000000Z"}),
        ],
    )
    assert code(response) == (409, "divergence")
    assert len(await log_of(client, run_id)) == 3


async def test_append_refusals_write_nothing(server) -> None:
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    cases = [
        (None, [head(run_id)], (401, "missing_drive_token")),
        ("dt_not-the-lease", [head(run_id)], (403, "invalid_drive_token")),
        (
            token,
            [envelope(run_id, 0, "ModelCallRequested", {"request_hash": "sha256:" + "0" * 64})],
            (422, "unsupported_event_kind"),
        ),
        (
            token,
            [envelope(run_id, 0, "NowObserved", {"now": "2026-11-29T10:00:00.000000Z"})],
            (409, "divergence"),
        ),
        (token, [head(run_id, labels={f"k{i}": "v" for i in range(17)})], (400, "bad_request")),
        (token, [head(run_id, replay_of=str(uuid.uuid4()))], (400, "bad_request")),
        (token, [head(str(uuid.uuid4()))], (400, "bad_request")),
        (token, [{"seq": 0}], (400, "bad_request")),
        (token, [], (400, "bad_request")),
        (token, [head(run_id)] * 1025, (413, "payload_too_large")),
    ]
    for presented, events, expected in cases:
        response = await append(client, run_id, presented, events)
        assert code(response) == expected, (expected, response.text)
    response = await client.post(
        f"/v1/client-runs/{run_id}/events",
        json={"events": [head(run_id)], "extra": 1},
        headers={"X-Drive-Token": token},
    )
    assert code(response) == (400, "bad_request")
    assert await log_of(client, run_id) == []
    assert (await client.get(f"/v1/runs/{run_id}")).status_code == 404


async def test_labels_are_refused_in_the_same_sentence_as_when_a_run_is_started(server) -> None:
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    for labels in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"": "v"}, {"k": "v" * 257}):
        started = await client.post("/v1/runs", json={"agent": AGENT, "labels": labels})
        appended = await append(client, run_id, token, [head(run_id, labels=labels)])
        assert code(started) == code(appended) == (400, "bad_request")
        assert (
            appended.json()["error"]["message"]
            == "events[0]: " + started.json()["error"]["message"]
        )
    assert await log_of(client, run_id) == []


async def test_a_model_or_tool_event_is_422_whatever_its_payload_holds(server) -> None:
    # The kind is judged before the payload: a spec-written client learns
    # "not here", never "malformed".
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    assert (await append(client, run_id, token, [head(run_id)])).status_code == 200
    hash_ = "sha256:" + "0" * 64
    cases = [
        [
            envelope(run_id, 1, "ModelCallRequested", {"seq": 1, "request_hash": hash_})
        ],  # the spec's own shape
        [
            envelope(run_id, 1, "ModelCallRequested", {"seq": 9, "request_hash": hash_})
        ],  # seq not its position
        [envelope(run_id, 1, "ModelCallRequested", {})],
        [
            envelope(
                run_id,
                1,
                "ToolCallRequested",
                {"seq": 1, "tool": "t", "input": 1, "effect": "delete"},
            )
        ],
        [envelope(run_id, 1, "ToolCallCompleted", "not an object")],
        [envelope(run_id, 1, "ModelCallCompleted", {"seq": 0, "response": {}, "usage": {}})],
        [envelope(run_id, 1, "RunAbandoned", {"reason": 7})],
        [{"event": {"kind": "ToolCallRequested"}}],  # not even an envelope around it
        # A malformed neighbour ahead of it does not hide what the batch is.
        [{"seq": "one"}, envelope(run_id, 2, "ToolCallCompleted", {"seq": 1, "output": None})],
    ]
    for events in cases:
        response = await append(client, run_id, token, events)
        assert code(response) == (422, "unsupported_event_kind"), (events, response.text)
    message = (await append(client, run_id, token, cases[0])).json()["error"]["message"]
    assert message.startswith(
        "events[0] is a ModelCallRequested, which this endpoint never appends"
    )
    assert len(await log_of(client, run_id)) == 1


async def test_one_lease_per_run_release_and_heartbeat(server) -> None:
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    assert (await append(client, run_id, token, [head(run_id)])).status_code == 200
    # A second driver is refused at the door, and its appends never land.
    response = await client.post("/v1/client-runs", json={"run_id": run_id})
    assert code(response) == (409, "lease_held")
    assert 1 <= response.json()["error"]["details"]["lapses_in_seconds"] <= 60
    assert code(
        await append(client, run_id, "dt_guess", [envelope(run_id, 1, "RunFailed", {"error": "x"})])
    ) == (403, "invalid_drive_token")
    # The holder re-opens under its own token and keeps it.
    again = await open_run(client, run_id, token=token, expect=200)
    assert again["drive_token"] == token and len(again["log"]) == 1
    beat = await client.post(
        f"/v1/client-runs/{run_id}/heartbeat", headers={"X-Drive-Token": token}
    )
    assert beat.json() == {"lapses_in_seconds": 60}
    assert code(await client.post(f"/v1/client-runs/{run_id}/heartbeat")) == (
        401,
        "missing_drive_token",
    )
    assert code(
        await client.post(
            f"/v1/client-runs/{uuid.uuid4()}/heartbeat", headers={"X-Drive-Token": token}
        )
    ) == (404, "unknown_run")
    assert code(await client.post(f"/v1/client-runs/{run_id}/release")) == (
        403,
        "invalid_drive_token",
    )
    released = await client.post(
        f"/v1/client-runs/{run_id}/release", headers={"X-Drive-Token": token}
    )
    assert released.json() == {"released": True}
    released = await client.post(
        f"/v1/client-runs/{run_id}/release", headers={"X-Drive-Token": token}
    )
    assert released.json() == {"released": False}
    assert (await client.get(f"/v1/runs/{run_id}")).json()["driver"] == "none"
    # Free at once: the next open takes it, and the old token is dead.
    taken = await open_run(client, run_id, expect=200)
    assert taken["drive_token"] != token
    assert code(
        await append(client, run_id, token, [envelope(run_id, 1, "RunFailed", {"error": "x"})])
    ) == (403, "invalid_drive_token")
    assert len(await log_of(client, run_id)) == 1


async def test_a_quiet_driver_loses_its_lease_after_the_ttl(server_factory) -> None:
    server = await server_factory(lease_ttl=0.3)
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    assert (await append(client, run_id, token, [head(run_id)])).status_code == 200
    await trio.sleep(0.4)
    assert (await client.get(f"/v1/runs/{run_id}")).json()["driver"] == "none"
    taken = await open_run(client, run_id, expect=200)
    assert code(
        await append(client, run_id, token, [envelope(run_id, 1, "RunFailed", {"error": "x"})])
    ) == (403, "invalid_drive_token")
    response = await append(
        client, run_id, taken["drive_token"], [envelope(run_id, 1, "RunFailed", {"error": "x"})]
    )
    assert response.json() == {"appended": [1]}


async def test_a_headless_run_whose_lease_lapsed_opens_fresh_again(server_factory) -> None:
    """Opened, never given its head, left: the registry forgets it with its lease (memory stays
    bounded), its log is empty, so the next open is a fresh 201 and the old token is dead."""
    server = await server_factory(lease_ttl=1.0)
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    await trio.sleep(1.2)
    assert code(await append(client, run_id, token, [head(run_id)])) == (404, "unknown_run")
    again = await open_run(client, run_id, expect=201)
    assert again["log"] == [] and again["drive_token"] != token
    assert (await append(client, run_id, again["drive_token"], [head(run_id)])).json() == {
        "appended": [0]
    }


async def test_the_two_modes_never_share_a_run(server, providers) -> None:
    from tests.support.api_server import agent_toml
    from tests.support.scripted_provider import text_reply

    client = server.client
    provider = providers([text_reply("done")])
    agent = await server.register_agent(agent_toml(provider.base_url))
    served = await server.start_run(agent, "x")
    await server.wait_resting(served)
    assert code(await client.post("/v1/client-runs", json={"run_id": served})) == (
        409,
        "run_exists",
    )
    assert code(await client.get(f"/v1/client-runs/{served}/log")) == (404, "unknown_run")
    assert code(await client.get(f"/v1/client-runs/{uuid.uuid4()}/log")) == (404, "unknown_run")
    assert code(await append(client, served, "dt_x", [head(served)])) == (404, "unknown_run")
    assert code(await client.get(f"/v1/client-runs/{served}/log?from_seq=x")) == (
        400,
        "bad_request",
    )


async def sweeps_pass(server, count: int) -> None:
    """Return once the server's wake sweep has run ``count`` whole times more.

    Each sweep asks for the due runs.
    """
    runtime = server.state.runtime
    due_runs = runtime.reads.due_runs
    asked = 0
    # Set when the sweep after the count-th begins: the count-th went through every due run.
    passed = trio.Event()

    async def counted(*args, **kwargs):
        nonlocal asked
        asked += 1
        if asked > count:
            passed.set()
        return await due_runs(*args, **kwargs)

    runtime.reads.due_runs = counted
    try:
        with trio.fail_after(30):
            await passed.wait()
    finally:
        del runtime.reads.due_runs


async def test_a_restarted_daemon_lets_the_client_adopt_its_run(server_factory) -> None:
    first = await server_factory()
    opened = await open_run(first.client)
    run_id, token = opened["run"], opened["drive_token"]
    events = [
        head(run_id),
        envelope(run_id, 1, "SleepStarted", {"wake_at": "2026-11-29T09:00:00.000000Z"}),
    ]
    assert (await append(first.client, run_id, token, events)).status_code == 200
    await first.stop()
    second = await server_factory(wake_interval=0.05)
    client = second.client
    # Before the client is back, nothing else may drive the run: not a resume, not the wake sweep.
    assert code(await client.post(f"/v1/runs/{run_id}/resume")) == (409, "client_driven_run")
    await sweeps_pass(second, 2)
    assert (await client.get(f"/v1/runs/{run_id}")).json()["status"]["state"] == "sleeping"
    log = (await client.get(f"/v1/client-runs/{run_id}/log?from_seq=1")).json()["log"]
    assert [e["seq"] for e in log] == [1]
    # The lease lives in the store, not in the old process: the restarted daemon holds the run
    # for the client's token, and anyone else waits until the client lets it go.
    assert code(await client.post("/v1/client-runs", json={"run_id": run_id})) == (
        409,
        "lease_held",
    )
    released = await client.post(
        f"/v1/client-runs/{run_id}/release", headers={"X-Drive-Token": token}
    )
    assert released.json() == {"released": True}
    adopted = await open_run(client, run_id, expect=200)
    assert [e["event"]["kind"] for e in adopted["log"]] == ["RunStarted", "SleepStarted"]
    fresh = adopted["drive_token"]
    response = await append(
        client,
        run_id,
        fresh,
        [
            envelope(run_id, 2, "NowObserved", {"now": "2026-11-29T09:00:01.000000Z"}),
            envelope(run_id, 3, "SleepCompleted", {}),
            envelope(run_id, 4, "RunCompleted", {"output": "woke"}),
        ],
    )
    assert response.json() == {"appended": [2, 3, 4]}, response.text


async def test_appends_see_what_other_writers_recorded_in_between(server) -> None:
    """The route remembers each run's view after its own append; a commit by
    anything else in the daemon, or by another process over the same store,
    must never make it refuse a right append or take a wrong one."""
    from salvor.protocol import NowObserved
    from salvor.store import EventStore

    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    first = [
        head(run_id),
        envelope(run_id, 1, "NowObserved", {"now": "2026-11-29T10:00:00.000000Z"}),
    ]
    assert (await append(client, run_id, token, first)).json() == {"appended": [0, 1]}
    # Another writer inside the daemon (as a tool-step or a resolve is) takes seq 2.
    access = server.state.runtime.access
    view = await access.read(access.store.read_view, run_id)
    await access.append(run_id, [NowObserved(now="2026-11-29T10:00:02.000000Z")], view)
    taken = envelope(run_id, 2, "NowObserved", {"now": "2026-11-29T10:00:09.000000Z"})
    assert code(await append(client, run_id, token, [taken])) == (409, "divergence")
    nxt = envelope(run_id, 3, "NowObserved", {"now": "2026-11-29T10:00:03.000000Z"})
    assert (await append(client, run_id, token, [nxt])).json() == {"appended": [3]}
    # Another process over the same store (the CLI would be one) takes seq 4.
    with EventStore.open(server.store_url) as other:
        other.append(
            run_id, [NowObserved(now="2026-11-29T10:00:04.000000Z")], other.read_view(run_id)
        )
    # Seq 5 is the next one, though this daemon last saw 4 free.
    after_theirs = envelope(run_id, 5, "NowObserved", {"now": "2026-11-29T10:00:05.000000Z"})
    assert (await append(client, run_id, token, [after_theirs])).json() == {"appended": [5]}
    theirs = envelope(run_id, 4, "NowObserved", {"now": "2026-11-29T10:00:04.000000Z"})
    assert (await append(client, run_id, token, [theirs])).json() == {
        "appended": [4]
    }  # the same bytes: a no-op
    other_bytes = envelope(run_id, 4, "NowObserved", {"now": "2026-11-29T10:00:44.000000Z"})
    assert code(await append(client, run_id, token, [other_bytes])) == (409, "divergence")
    last = envelope(run_id, 6, "RunCompleted", {"output": "done"})
    assert (await append(client, run_id, token, [last])).json() == {"appended": [6]}
    log = await log_of(client, run_id)
    assert [e["seq"] for e in log] == [0, 1, 2, 3, 4, 5, 6]
    assert [e["event"]["payload"].get("now") for e in log[1:5]] == [
        "2026-11-29T10:00:00.000000Z",
        "2026-11-29T10:00:02.000000Z",
        "2026-11-29T10:00:03.000000Z",
        "2026-11-29T10:00:04.000000Z",
    ]


def stream_data(raw: bytes) -> list[bytes]:
    """The data bytes of each envelope frame of a finished event stream (not its ``end``)."""
    frames = [block for block in raw.replace(b"\r\n", b"\n").split(b"\n\n") if block.strip()]
    data = []
    for frame in frames:
        lines = frame.split(b"\n")
        if b"event: end" in lines:
            continue
        data.append(
            b"\n".join(line[len(b"data: ") :] for line in lines if line.startswith(b"data:"))
        )
    return data


async def test_every_log_the_api_returns_is_the_event_streams_bytes(server) -> None:
    client = server.client
    opened = await open_run(client)
    run_id, token = opened["run"], opened["drive_token"]
    schema = {"type": "object", "required": ["ok"]}
    events = [
        head(run_id, labels={"desk": "café"}),
        envelope(run_id, 1, "NowObserved", {"now": "2026-11-29T10:00:00.000000Z"}),
        envelope(run_id, 2, "Suspended", {"reason": "approve the refund?", "input_schema": schema}),
    ]
    assert (await append(client, run_id, token, events)).status_code == 200
    # The run rests (suspended), so its stream ends by itself after the last envelope.
    stream = await client.get(f"/v1/runs/{run_id}/events")
    frames = stream_data(stream.content)
    assert len(frames) == 3 and "café".encode() in frames[0]
    log = b"[" + b",".join(frames) + b"]"

    read = await client.get(f"/v1/client-runs/{run_id}/log")
    assert read.content == b'{"log":' + log + b"}"
    tail = await client.get(f"/v1/client-runs/{run_id}/log", params={"from_seq": "1"})
    assert tail.content == b'{"log":[' + b",".join(frames[1:]) + b"]}"
    assert (
        await client.post(f"/v1/client-runs/{run_id}/release", headers={"X-Drive-Token": token})
    ).json() == {"released": True}
    reopened = await client.post("/v1/client-runs", json={"run_id": run_id})
    assert reopened.status_code == 200, reopened.text
    again = reopened.json()
    assert reopened.content == (
        f'{{"run":"{run_id}","drive_token":"{again["drive_token"]}","log":'.encode() + log + b"}"
    )
