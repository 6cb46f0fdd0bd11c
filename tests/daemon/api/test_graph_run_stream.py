"""The ndjson answer of ``POST /v1/graph-runs`` while a node is slow: keepalive lines through the
quiet spell (the heartbeat shortened here), the node's lines and the result once it answers; and a
daemon that stops mid-stream ends it with no result line (the run is not at rest)."""

from __future__ import annotations

import json
import threading

from tests.support.api import register
from tests.support.api_server import Server

NDJSON = {"Accept": "application/x-ndjson"}
HOLD_SECONDS = 30


async def _held_graph(server: Server, providers) -> tuple[str, threading.Event]:
    """A graph of one agent node whose model call is held until the event is set."""
    release = threading.Event()
    agent, _ = await register(server, providers, on_call=lambda call: release.wait(HOLD_SECONDS))
    document = {"schema_version": 1, "nodes": [{"id": "ask", "kind": "agent", "agent": agent}]}
    stored = await server.client.post("/v1/graphs", json={**document, "edges": []})
    assert stored.status_code == 201, stored.text
    return stored.json()["graph"], release


async def test_a_quiet_node_gets_keepalive_lines_then_its_lines_and_the_result(
    server_factory, providers
) -> None:
    server = await server_factory(
        heartbeat_seconds=0.05, stream_poll_seconds=0.05, detach_grace_seconds=0.05
    )
    graph, release = await _held_graph(server, providers)
    body = {"graph_hash": graph, "input": "hi"}
    try:
        async with server.client.stream(
            "POST", "/v1/graph-runs", json=body, headers=NDJSON
        ) as response:
            assert response.status_code == 200
            lines = []
            texts = response.aiter_lines()
            async for text in texts:
                lines.append(json.loads(text))
                kinds = [line["type"] for line in lines]
                if "node" in kinds and kinds[kinds.index("node") :].count("keepalive") == 3:
                    break
            release.set()
            lines += [json.loads(text) async for text in texts if text]
    finally:
        release.set()
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "started" and kinds[-1] == "result"
    nodes = [(line["node"], line["status"]) for line in lines if line["type"] == "node"]
    assert nodes == [("ask", "entered"), ("ask", "finished")]
    # Keepalives came while the node was held, between its entry and its end.
    entered, finished = kinds.index("node"), len(kinds) - 2
    assert kinds[finished] == "node"
    assert set(kinds[entered + 1 : finished]) == {"keepalive"}, kinds
    assert finished - entered > 3
    assert lines[-1]["status"] == "completed" and lines[-1]["output"] == {"ask": "done"}


async def test_a_daemon_stopping_mid_stream_ends_it_without_a_result(
    server_factory, providers
) -> None:
    server = await server_factory(stream_poll_seconds=0.05)
    graph, release = await _held_graph(server, providers)
    body = {"graph_hash": graph, "input": "hi"}
    try:
        async with server.client.stream(
            "POST", "/v1/graph-runs", json=body, headers=NDJSON
        ) as response:
            lines = []
            async for text in response.aiter_lines():
                lines.append(json.loads(text))
                if lines[-1]["type"] == "node":
                    server.state.stopping.set()
    finally:
        release.set()
    assert [line["type"] for line in lines] == ["started", "node"]


async def test_the_run_goes_on_when_the_caller_goes_away(server_factory, providers) -> None:
    server = await server_factory(stream_poll_seconds=0.05)
    graph, release = await _held_graph(server, providers)
    body = {"graph_hash": graph, "input": "hi"}
    try:
        async with server.client.stream(
            "POST", "/v1/graph-runs", json=body, headers=NDJSON
        ) as response:
            texts = response.aiter_lines()
            started = json.loads(await anext(texts))
            assert started["type"] == "started"
            await texts.aclose()
        # The caller has gone; the held call answers now.
        release.set()
        rested = await server.wait_resting(started["run"])
    finally:
        release.set()
    assert rested["status"] == {"state": "completed", "output": {"ask": "done"}}
    # Its stream let go of its slot and its subscription.
    assert server.state.stream_slots.open_count("127.0.0.1") == 0
    assert server.state.hub.subscriber_counts()["sse"] == 0
