"""The model proxy's listener: one loopback ASGI app over hypercorn serving every process run of
the daemon, each mounted under an unguessable capability path (``/r/<capability>/...``), its
model calls handed to the run's ``ProxySession`` and its MCP paths to the run's lanes.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio
from salvor.protocol import (
    MalformedJson,
    parse_strict,
)

from ..metrics import DaemonMetrics
from ..web import (
    BODY_TIMEOUT_SECONDS,
    JSON_PORTS,
    Disconnected,
    OperationRefused,
    answer_lifespan,
    asgi_chunks,
    guarded,
    listener_config,
    read_body,
    tls_context,
)
from ..web import serve as serve_asgi
from ._mcp_endpoint import INVALID_REQUEST, serve_mcp
from ._model_proxy import ProxySession
from ._model_upstream import Reply
from ._wire import (
    OPENAI_CHAT,
    ROUTES,
    error_body,
)

MAX_BODY_BYTES = 32 * 1024 * 1024


class _AsgiReply(Reply):
    def __init__(self, send) -> None:
        self._send = send
        self.started = False
        self.gone = False

    async def _out(self, message: dict) -> None:
        if self.gone:
            return
        try:
            await self._send(message)
        except Exception:  # noqa: BLE001 -- the client went away; the call still finishes and records
            self.gone = True

    async def json(self, status: int, body: Any) -> None:
        if self.started:
            await self.end()
            return
        payload = json.dumps(body, ensure_ascii=False).encode()
        self.started = True
        await self._out(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await self._out({"type": "http.response.body", "body": payload, "more_body": False})

    async def start_stream(self, status: int) -> None:
        self.started = True
        await self._out(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )

    async def chunk(self, data: bytes) -> None:
        await self._out({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self) -> None:
        await self._out({"type": "http.response.body", "body": b"", "more_body": False})


class ModelProxy:
    """The ASGI app and the session table of one loopback listener."""

    def __init__(self, client: httpx.AsyncClient, metrics: DaemonMetrics | None = None) -> None:
        self.client = client
        # Where each model call's seconds are counted, by wire (None: not counted).
        self.metrics = metrics
        if metrics is not None:
            metrics.proxy_wires(frozenset(ROUTES.values()))
        self.url = ""
        # The live calls' upstream key when the daemon read one from a file (``resolve_upstream``).
        self.upstream_key: str | None = None
        self._sessions: dict[str, ProxySession] = {}
        # How long an agent's request body (model or MCP) may take to arrive whole.
        self.body_timeout_seconds = BODY_TIMEOUT_SECONDS

    def attach(self, session: ProxySession) -> str:
        """Mount a session; returns its capability (the path segment after ``/r/``)."""
        capability = secrets.token_urlsafe(24)
        self._sessions[capability] = session
        return capability

    def detach(self, capability: str) -> None:
        self._sessions.pop(capability, None)

    def base(self, capability: str) -> str:
        return f"{self.url}/r/{capability}"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        reply = _AsgiReply(send)
        parts = scope["path"].split("/", 3)  # "", "r", capability, rest
        rest = parts[3].strip("/") if len(parts) == 4 else ""
        wire = ROUTES.get(rest, OPENAI_CHAT)
        session = self._sessions.get(parts[2]) if len(parts) >= 3 and parts[1] == "r" else None
        if session is None:
            await _unmounted(reply, rest, wire)
            return
        if rest.startswith("mcp/"):
            await serve_mcp(
                session.mcp_lanes,
                rest[4:],
                scope,
                receive,
                send,
                deadline=self.body_timeout_seconds,
            )
            return
        if rest in ("v1/models", "models") and scope["method"] == "GET":
            await reply.json(200, {"object": "list", "data": []})
            return
        if rest not in ROUTES or scope["method"] != "POST":
            await reply.json(
                404,
                error_body(wire, 404, f"the salvor proxy does not serve {scope['method']} /{rest}"),
            )
            return
        body = await self._call_body(receive, reply, wire)
        if body is None:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        began = time.perf_counter()
        try:
            await session.handle(wire, body, headers, reply)
        finally:
            # Every call the run's session took, answered from the log, upstream, or refused.
            if self.metrics is not None:
                self.metrics.observe_proxy_call(wire, time.perf_counter() - began)

    async def _call_body(self, receive, reply: _AsgiReply, wire: str) -> dict | None:
        """A model call's body as a JSON object; None once the agent has been answered instead.

        A body that stalls, is over ``MAX_BODY_BYTES``, is not strict JSON or is not an object is
        refused in the wire's own error shape; an agent that went away is not answered. Nothing
        reaches the run's session either way.
        """
        try:
            raw = await read_body(
                asgi_chunks(receive),
                self.body_timeout_seconds,
                cap=MAX_BODY_BYTES,
                payload_limit=False,
            )
        except Disconnected:
            return None
        except OperationRefused as refused:  # a stalled body (408) or one over the cap (413)
            await reply.json(refused.status, error_body(wire, refused.status, refused.message))
            return None
        try:
            # The agent relays what its model and tools said (an id past 2**53, say): refusing
            # it would fail the run; its hash only meets the run's own log, which is exact.
            body = parse_strict(raw, "the request body", big_integers=True)
        except MalformedJson as exc:
            await reply.json(400, error_body(wire, 400, exc.message))
            return None
        if not isinstance(body, dict):
            await reply.json(400, error_body(wire, 400, "the request body is not a JSON object"))
            return None
        return body


async def _unmounted(reply: _AsgiReply, rest: str, wire: str) -> None:
    """The 404 of a path no run is mounted at, in the shape of the lane it names."""
    # A capability lasts as long as the drive it was issued to: a process that outlived
    # its run's drive (one that left its process group) is told so, in its lane's shape.
    gone = (
        "no run is mounted at this path: the drive it was issued to has ended (a run's "
        "proxy path lasts as long as one drive of it)"
    )
    if rest.startswith("mcp/"):
        await reply.json(
            404,
            {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": gone}},
        )
    else:
        await reply.json(404, error_body(wire, 404, gone))


@asynccontextmanager
async def open_model_proxy(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    wrap: Callable[[ModelProxy], Any] | None = None,
    metrics: DaemonMetrics | None = None,
) -> AsyncIterator[ModelProxy]:
    """Run a loopback proxy listener for the body of the ``async with``.

    ``wrap`` turns the proxy into the ASGI app actually served, for a caller
    that watches every request (``salvor doctor`` names the paths it refused).
    ``metrics``: the daemon's instruments, which count each model call's seconds by wire.
    """
    timeout = httpx.Timeout(connect=30.0, read=600.0, write=60.0, pool=60.0)
    async with httpx.AsyncClient(timeout=timeout, verify=tls_context()) as client:
        proxy = ModelProxy(client, metrics)
        stop = trio.Event()
        # The body's own exception leaves as itself, not wrapped in the nursery's group.
        failure: BaseException | None = None
        config = listener_config(f"{host}:{port}", "salvor.proxy.http", graceful_timeout=1.0)
        async with trio.open_nursery() as nursery:

            async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
                # The rules inside the watcher: ``salvor doctor`` names a page's refusal too.
                app = guarded(proxy, JSON_PORTS)
                await serve_asgi(
                    wrap(app) if wrap is not None else app,
                    config,
                    browsers=None,
                    shutdown_trigger=stop.wait,
                    task_status=task_status,
                )

            binds = await nursery.start(run)
            proxy.url = binds[0].rstrip("/")
            try:
                yield proxy
            except trio.Cancelled:
                raise
            except BaseException as exc:  # noqa: BLE001 -- re-raised below, unwrapped by the nursery
                failure = exc
            finally:
                stop.set()
                nursery.cancel_scope.cancel(reason="the model proxy is closing")
        if failure is not None:
            raise failure
