"""The loopback streamable-HTTP endpoint of a process run's MCP stand-ins
(``.../r/<capability>/mcp/<server>``).

An agent's MCP client reaches it directly (``SALVOR_MCP_URL_<NAME>``), or
through the stdio relay it spawns (``SALVOR_MCP_SERVER_<NAME>``,
``_mcp_standin``): either way each JSON-RPC message is one POST, and the
answer is one ``application/json`` body (``202 Accepted`` and no body for a
notification); a POST answer is never an event stream. ``GET`` opens the
agent's server-push stream, where an HTTP agent gets the server's
notifications (one at a time: a second concurrent ``GET`` is ``409``).
A JSON-RPC batch (a top-level array) is refused with ``400`` and a JSON-RPC
error naming it; so are a body that is not JSON and an oversized one
(``413``). What a message means is the lane's business (``_mcp_lane``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import trio
from salvor.protocol import MalformedJson, parse_strict, sse_frame

from ..mcp import MAX_MESSAGE_BYTES
from ..web import (
    BODY_TIMEOUT_SECONDS,
    JSON_PORTS,
    Disconnected,
    OperationRefused,
    answer_lifespan,
    asgi_chunks,
    listener_config,
    read_body,
)
from ..web import serve as serve_asgi

log = logging.getLogger("salvor.mcp")
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
REPLAY_SESSION_ID = "salvor-replay"
# Sent by the stdio relay (``_mcp_standin``): it is answered with a JSON array of every message due.
RELAY_HEADER = "x-salvor-relay"
# What ``_read_message`` gives when it has already answered the request with a refusal.
_ANSWERED = object()


async def _respond(
    send, status: int, body: Any = None, headers: Mapping[str, str] | None = None
) -> None:
    payload = (
        b""
        if body is None
        else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    )
    head = [(b"content-length", str(len(payload)).encode())]
    if body is not None:
        head.append((b"content-type", b"application/json"))
    head += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    try:
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": payload, "more_body": False})
    except Exception as exc:  # noqa: BLE001 -- the client went away; what was recorded stays recorded
        log.debug("MCP stand-in: the client left before its answer: %s", exc)


def _refusal(code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}


async def serve_mcp(
    lanes: Mapping[str, Any],
    server: str,
    scope,
    receive,
    send,
    *,
    deadline: float | None = BODY_TIMEOUT_SECONDS,
) -> None:
    """Answer one HTTP request to the stand-in of ``server`` (never a 5xx: every failure is named).

    ``deadline`` bounds how long the request's body may take to arrive whole.
    """
    lane = lanes.get(server)
    if lane is None:
        declared = ", ".join(sorted(lanes)) or "none"
        await _respond(
            send,
            404,
            _refusal(
                INVALID_REQUEST,
                f"this run declares no MCP server {server!r} (it declares: {declared})",
            ),
        )
        return
    method = scope["method"]
    if method == "DELETE":
        # The client ending its session: the drive closes the real one when it ends.
        await _respond(send, 200)
        return
    if method == "GET":
        await _push_stream(lane, receive, send)
        return
    if method != "POST":
        await _respond(
            send,
            405,
            _refusal(
                INVALID_REQUEST, f"salvor's MCP stand-in answers POST, GET and DELETE, not {method}"
            ),
            {"allow": "POST, GET, DELETE"},
        )
        return
    message = await _read_message(server, receive, send, deadline)
    if message is not _ANSWERED:
        await _answer(lane, message, scope, send)


async def _read_message(server: str, receive, send, deadline: float | None) -> Any:
    """The one JSON-RPC message a POST carries, or ``_ANSWERED`` once the request was refused
    (a stalled, oversized or malformed body, or a batch) or the client left."""
    try:
        # The stand-in stops reading at its cap rather than take in
        # the rest of an oversized message.
        raw = await read_body(
            asgi_chunks(receive), deadline, cap=MAX_MESSAGE_BYTES, drain=False, payload_limit=False
        )
    except Disconnected:
        return _ANSWERED
    except OperationRefused as refused:  # a stalled body (408) or one over the cap (413)
        await _respond(send, refused.status, _refusal(INVALID_REQUEST, refused.message))
        return _ANSWERED
    try:
        # Tool arguments a model wrote, relayed by the agent: recorded exactly, never refused
        # for the size of an integer in them.
        message = parse_strict(raw, "the body", big_integers=True)
    except MalformedJson as exc:
        await _respond(send, 400, _refusal(PARSE_ERROR, exc.message))
        return _ANSWERED
    if isinstance(message, list):
        await _respond(
            send,
            400,
            _refusal(
                INVALID_REQUEST,
                f"salvor's MCP stand-in for {server!r} does not take JSON-RPC batches (a top-level "
                "array); send each message on its own",
            ),
        )
        return _ANSWERED
    return message


async def _answer(lane: Any, message: Any, scope, send) -> None:
    """Hand ``message`` to the lane and answer with what it says, and the notifications due."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    answer, notes = await lane.receive(message, headers)
    if answer is None:
        await _respond(send, 202)
        return
    session = {"mcp-session-id": lane.session_id or REPLAY_SESSION_ID}
    if headers.get(RELAY_HEADER) == "1":
        # salvor's own stdio relay takes every message due, in order, and writes each as a line.
        await _respond(send, 200, [*notes, answer], session)
        return
    # (A relay got them in its answer; its own push stream carries only the server's requests.)
    lane.agent.push(notes)
    await _respond(send, 200, answer, session)


async def _push_stream(lane: Any, receive, send) -> None:
    """The agent's server-push stream: the lane's notifications as SSE
    events, until either side ends it.

    A second stream while one is open is ``409``. It ends when the agent
    goes away or the drive ends (the lane closes it).
    """
    notes = lane.agent.open_push()
    if notes is None:
        await _respond(
            send,
            409,
            _refusal(INVALID_REQUEST, f"a server-push stream for {lane.name!r} is already open"),
        )
        return
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-store"),
                    (b"mcp-session-id", (lane.session_id or REPLAY_SESSION_ID).encode("latin-1")),
                ],
            }
        )
        async with trio.open_nursery() as nursery:

            async def until_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel(reason="the agent closed its MCP push stream")

            nursery.start_soon(until_gone)
            async for note in notes:
                data = json.dumps(note, ensure_ascii=False, separators=(",", ":"))
                await send(
                    {
                        "type": "http.response.body",
                        "body": sse_frame(data, event="message"),
                        "more_body": True,
                    }
                )
            nursery.cancel_scope.cancel(reason="the lane closed its MCP push stream")
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception as exc:  # noqa: BLE001 -- the agent went away; nothing recorded depends on the stream
        log.debug("MCP stand-in: the push stream of %r ended: %s", lane.name, exc)
    finally:
        lane.agent.close_push(notes)


class FixedPortApp:
    """The ASGI app of a stand-in on a fixed port (``port`` in the
    definition): one lane, at ``/mcp``.

    For an agent that dials a URL it was configured with and cannot be
    handed a variable. The path holds no capability, so any local process
    can reach it while the drive runs: the operator chose that by fixing it.
    """

    def __init__(self, lane: Any) -> None:
        self.lane = lane

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/mcp":
            await _respond(
                send,
                404,
                _refusal(
                    INVALID_REQUEST, f"salvor's MCP stand-in for {self.lane.name!r} is at /mcp"
                ),
            )
            return
        await serve_mcp({self.lane.name: self.lane}, self.lane.name, scope, receive, send)


async def serve_fixed_port(lane: Any, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``lane`` on 127.0.0.1:``port`` until cancelled; started once bound.

    Raises:
        OSError: the port could not be bound (another process holds it).
    """
    config = listener_config(f"127.0.0.1:{port}", "salvor.mcp.http", graceful_timeout=1.0)
    await serve_asgi(FixedPortApp(lane), config, browsers=JSON_PORTS, task_status=task_status)
