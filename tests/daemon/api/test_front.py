"""The ASGI front answers the client-driven append exactly as the Quart route does.

`salvor serve` answers ``POST /v1/client-runs/{id}/events`` ahead of Quart
(for speed); the route stays in the app. Every answer is compared: the same
request through the real daemon (the front) and through the app alone
(Quart's test client on ``create_app`` over the same state) must give the
same status and the same body, and a refusal must write nothing either way.
"""

from __future__ import annotations

import json

import pytest
import trio
from salvor.daemon.api._app import create_app
from salvor.daemon.web._request_body import MAX_BODY_BYTES

from tests.daemon.client_runs.test_client_runs import envelope, head, open_run
from tests.support.api import NOBODY, snapshot
from tests.support.api_server import TOKEN


async def both(server, app_client, run_id: str, body: bytes, headers: dict[str, str]) -> tuple:
    """(status, body) through the front, then through the route alone."""
    path = f"/v1/client-runs/{run_id}/events"
    front = await server.client.post(path, content=body, headers=headers)
    route = await app_client.post(path, data=body, headers=headers)
    return (front.status_code, front.json()), (
        route.status_code,
        json.loads(await route.get_data()),
    )


@pytest.fixture
def app_client(server):
    return create_app(server.state).test_client()


async def test_every_refusal_is_the_same_through_the_front_and_the_route(
    server, app_client
) -> None:
    opened = await open_run(server.client)
    run_id, token = opened["run"], opened["drive_token"]
    json_type = {"content-type": "application/json", "X-Drive-Token": token}
    assert (
        await server.client.post(
            f"/v1/client-runs/{run_id}/events",
            json={"events": [head(run_id)]},
            headers={"X-Drive-Token": token},
        )
    ).status_code == 200
    before = await snapshot(server)
    later = json.dumps(
        {"events": [envelope(run_id, 5, "NowObserved", {"now": "2026-11-29T10:00:00Z"})]}
    ).encode()
    cases = {
        "no drive token": (run_id, later, {"content-type": "application/json"}, 401),
        "someone else's token": (run_id, later, {**json_type, "X-Drive-Token": "dt_nope"}, 403),
        "not a run id": ("not-a-uuid", later, json_type, 400),
        "no such run": (NOBODY, later, json_type, 404),
        "empty body": (run_id, b"", json_type, 400),
        "not JSON": (run_id, b"{nope", json_type, 400),
        "a JSON array": (run_id, b"[]", json_type, 400),
        "text/plain": (run_id, later, {**json_type, "content-type": "text/plain"}, 415),
        "an unknown field": (run_id, json.dumps({"events": [], "x": 1}).encode(), json_type, 400),
        "no events": (run_id, b"{}", json_type, 400),
        "a gap": (run_id, later, json_type, 409),
        "a model event": (
            run_id,
            json.dumps(
                {
                    "events": [
                        envelope(
                            run_id, 1, "ModelCallRequested", {"request_hash": "sha256:" + "0" * 64}
                        )
                    ]
                }
            ).encode(),
            json_type,
            422,
        ),
        "over 8 MB": (run_id, b'{"events": "' + b"x" * MAX_BODY_BYTES + b'"}', json_type, 413),
    }
    for name, (target, body, headers, status) in cases.items():
        through_front, through_route = await both(server, app_client, target, body, headers)
        assert through_front == through_route, name
        assert through_front[0] == status, (name, through_front)
        assert set(through_front[1]) == {"error"}, name
    assert await snapshot(server) == before


async def test_appends_and_retries_are_the_same_through_the_front_and_the_route(
    server, app_client
) -> None:
    opened = await open_run(server.client)
    run_id, token = opened["run"], opened["drive_token"]
    headers = {"content-type": "application/json; charset=utf-8", "X-Drive-Token": token}
    first = json.dumps({"events": [head(run_id)]}).encode()
    response = await server.client.post(
        f"/v1/client-runs/{run_id}/events", content=first, headers=headers
    )
    assert (response.status_code, response.json()) == (200, {"appended": [0]})
    # The route sees what the front appended: the same batch is a no-op there, and back.
    assert await both(server, app_client, run_id, first, headers) == ((200, {"appended": [0]}),) * 2
    second = json.dumps(
        {"events": [envelope(run_id, 1, "NowObserved", {"now": "2026-11-29T10:00:00Z"})]}
    ).encode()
    route = await app_client.post(f"/v1/client-runs/{run_id}/events", data=second, headers=headers)
    assert json.loads(await route.get_data()) == {"appended": [1]}
    assert (
        await both(server, app_client, run_id, second, headers) == ((200, {"appended": [1]}),) * 2
    )
    log = (await server.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"]
    assert [e["seq"] for e in log] == [0, 1]


async def test_the_front_checks_the_bearer_token_first(server_factory) -> None:
    server = await server_factory(auth_token=TOKEN)
    opened = await open_run(server.client)
    run_id, token = opened["run"], opened["drive_token"]
    bare = server.new_client()
    response = await bare.post(
        f"/v1/client-runs/{run_id}/events",
        json={"events": [head(run_id)]},
        headers={"X-Drive-Token": token},
    )
    assert (response.status_code, response.json()["error"]["code"]) == (401, "unauthorized")
    assert (await server.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"] == []
    # Other methods on the path are the app's: a 405 in the envelope.
    response = await server.client.put(f"/v1/client-runs/{run_id}/events", json={})
    assert (response.status_code, response.json()["error"]["code"]) == (405, "method_not_allowed")


async def test_a_bug_behind_the_front_is_the_500_envelope_and_the_daemon_goes_on(
    server, monkeypatch, caplog
) -> None:
    opened = await open_run(server.client)
    run_id, token = opened["run"], opened["drive_token"]

    async def broken(run_id: str, body: dict) -> dict:
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.state.client_runs, "append", broken)
    response = await server.client.post(
        f"/v1/client-runs/{run_id}/events",
        json={"events": [head(run_id)]},
        headers={"X-Drive-Token": token},
    )
    assert response.status_code == 500
    assert response.json() == {
        "error": {"code": "internal", "message": "the server hit an unexpected error; see its log"}
    }
    assert "RuntimeError: a bug" not in response.text
    assert any("unexpected error on POST" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    response = await server.client.post(
        f"/v1/client-runs/{run_id}/events",
        json={"events": [head(run_id)]},
        headers={"X-Drive-Token": token},
    )
    assert response.json() == {"appended": [0]}


async def _raw_request(url: str, head_and_partial_body: bytes) -> trio.SocketStream:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(head_and_partial_body)
    return stream


async def test_a_body_that_stops_arriving_is_a_408_and_one_cut_off_records_nothing(
    server_factory,
) -> None:
    server = await server_factory(body_timeout_seconds=0.3)
    opened = await open_run(server.client)
    run_id, token = opened["run"], opened["drive_token"]
    body = json.dumps({"events": [head(run_id)]}).encode()
    request_head = (
        f"POST /v1/client-runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nX-Drive-Token: {token}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    # Half the body, then silence: the front gives up and says so.
    stream = await _raw_request(server.url, request_head + body[: len(body) // 2])
    answer = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            answer += await stream.receive_some(65536)
    await stream.aclose()
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 408 " in status_line
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    # Half the body, then the connection closes: nobody to answer, nothing recorded.
    stream = await _raw_request(server.url, request_head + body[: len(body) // 2])
    await stream.aclose()
    await trio.sleep(0.5)
    assert (await server.client.get(f"/v1/client-runs/{run_id}/log")).json()["log"] == []
    response = await server.client.post(
        f"/v1/client-runs/{run_id}/events",
        content=body,
        headers={"content-type": "application/json", "X-Drive-Token": token},
    )
    assert response.json() == {"appended": [0]}
