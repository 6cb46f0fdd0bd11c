"""One MCP session: JSON-RPC 2.0 requests, answers and server messages, over any transport.

The session speaks the lifecycle (``initialize``, then the
``notifications/initialized`` notification) and the two calls a built-in
agent needs, ``tools/list`` (following ``nextCursor``) and ``tools/call``.
Every request has a deadline; a request given up on is cancelled with
``notifications/cancelled``. How bytes move is a transport's business
(``_mcp_stdio``, ``_mcp_http``).

The server may send requests of its own (sampling, elicitation, roots):
a built-in agent has no one to ask, so each is answered at once with the
JSON-RPC "method not found" error, and the server is never left waiting.
``ping`` is answered as the specification requires.

Error handling: every failure is one of three ``McpError`` kinds, split by
what the caller may conclude about a request it sent:

* ``McpUnavailable``: the request never reached the server (it could not be
  started or reached, or the session had already ended). Nothing happened.
* ``McpNoAnswer``: the request went out and no usable answer came back (a
  crash, a deadline, garbage, an oversized message). It may have happened.
* ``McpRemoteError``: the server answered with a JSON-RPC error, or its HTTP
  endpoint refused the request. It is settled: trying again reaches the same.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

import trio
from salvor import __version__

from ..metrics import current_metrics
from ._definition import McpServerSpec

log = logging.getLogger("salvor.mcp")

PROTOCOL_VERSION = "2025-06-18"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_LIST_PAGES = 1000
METHOD_NOT_FOUND = -32601


class McpError(Exception):
    """A failure talking to one MCP server; subclasses say what became of the request."""

    def __init__(self, server: str, detail: str) -> None:
        super().__init__(f"MCP server {server!r} {detail}")
        self.server = server
        # What went wrong, as the rest of a sentence that starts with the server.
        self.detail = detail
        self.message = f"MCP server {server!r} {detail}"


class McpUnavailable(McpError):
    """The request never reached the server; nothing happened."""


class McpNoAnswer(McpError):
    """The request was sent and no usable answer came; it may or may not have happened."""


class McpRemoteError(McpError):
    """The server answered the request with an error (JSON-RPC, or an HTTP refusal)."""

    def __init__(
        self, server: str, detail: str, *, code: int | None = None, error: dict | None = None
    ) -> None:
        super().__init__(server, detail)
        self.code = code
        # The JSON-RPC error object as the server sent it (a stand-in hands it on unchanged).
        self.error = error


def encode(message: dict) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def excerpt(data: bytes | str, limit: int = 200) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


class Reply:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.message: dict | None = None
        self.failure: McpError | None = None


class McpSession:
    """One initialised session with one server.

    Cancellation: cancelling a request abandons it (a late answer is
    dropped); the session stays usable.
    """

    def __init__(self, spec: McpServerSpec, transport: Transport) -> None:
        self.spec = spec
        self.name = spec.name
        self._transport = transport
        self._next_id = 0
        self._pending: dict[int, Reply] = {}
        # Why the session can carry no more requests, once it cannot.
        self.broken: str | None = None
        self.protocol_version: str | None = None
        self.server_info: dict | None = None
        # The server's answer to ``initialize``.
        self.initialized: dict | None = None
        # Called with each notification the server sends (a stand-in records them).
        self.on_notification: Callable[[dict], None] | None = None
        # Asked each request the server sends but ``ping`` (a stand-in relays them to its agent);
        # its answer goes back to the server. None: "method not found".
        self.on_request: Callable[[dict], Awaitable[dict]] | None = None
        # The id of each request in flight that its caller sent under a key of its own.
        self._keyed: dict[Hashable, int] = {}

    @property
    def transport(self) -> str:
        """How the server is reached: ``stdio`` (a child process) or ``http``."""
        return "stdio" if self.spec.command is not None else "http"

    @property
    def remote_session_id(self) -> str | None:
        """The ``Mcp-Session-Id`` a streamable-HTTP server handed out (None over stdio)."""
        return getattr(self._transport, "session_id", None)

    def pass_through(self, headers: Mapping[str, str]) -> None:
        """Carry a client's own ``Authorization`` on later requests (a stand-in's
        pass-through; kept in memory only)."""
        self._transport.pass_through(headers)

    # -- requests -------------------------------------------------------------

    async def request(self, method: str, params: dict, *, key: Hashable | None = None) -> dict:
        """Send a request and wait (up to the server's ``timeout``) for its result.

        ``key``: the caller's own name for the request (a stand-in passes its
        agent's request id), by which ``cancel`` can name it while it is in flight.

        Raises:
            McpUnavailable: the session had ended, or the request could not be delivered.
            McpNoAnswer: no usable answer within the deadline.
            McpRemoteError: the server answered with an error.
        """
        if self.broken is not None:
            raise McpUnavailable(self.name, f"is no longer connected: {self.broken}")
        self._next_id += 1
        request_id = self._next_id
        reply = Reply()
        self._pending[request_id] = reply
        if key is not None:
            self._keyed[key] = request_id
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        # A tool call's seconds count into the daemon this task belongs to (none outside one):
        # a built-in agent's call and a stand-in's relayed one alike.
        metrics = current_metrics() if method == "tools/call" else None
        began = time.perf_counter()
        try:
            with trio.move_on_after(self.spec.timeout) as deadline:
                await self._transport.send(self, message, reply)
                await reply.done.wait()
        finally:
            self._pending.pop(request_id, None)
            if key is not None and self._keyed.get(key) == request_id:
                del self._keyed[key]
            if metrics is not None:
                metrics.observe_mcp_call(self.transport, time.perf_counter() - began)
        if deadline.cancelled_caught:
            await self._cancel(request_id, f"no answer within {self.spec.timeout:g}s")
            raise McpNoAnswer(self.name, f"did not answer {method} within {self.spec.timeout:g}s")
        if reply.failure is not None:
            raise reply.failure
        answer = reply.message
        if "error" in answer:
            error = answer["error"]
            if not isinstance(error, dict):
                raise McpNoAnswer(
                    self.name, f"answered {method} with an error that is not an object"
                )
            code = error.get("code") if type(error.get("code")) is int else None
            raise McpRemoteError(
                self.name,
                f"answered {method} with error {code}: {error.get('message', '')}",
                code=code,
                error=error,
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise McpNoAnswer(self.name, f"answered {method} with a result that is not an object")
        return result

    async def cancel(self, key: Hashable, reason: str | None) -> bool:
        """Tell the server the request sent under ``key`` was given up
        on; False when none is in flight.

        The request itself still waits for its answer (or its deadline): a
        server may finish it anyway, and what it answered is what happened.
        """
        request_id = self._keyed.get(key)
        if request_id is None:
            return False
        await self._cancel(request_id, reason)
        return True

    async def _cancel(self, request_id: int, reason: str | None) -> None:
        """Tell the server a request was given up on (best effort: it may be past listening)."""
        if self.broken is not None:
            return
        params: dict[str, Any] = {"requestId": request_id}
        if reason is not None:
            params["reason"] = reason
        message = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        with trio.move_on_after(1.0):
            try:
                await self._transport.send(self, message, None)
            except McpError:
                pass

    async def notify(self, method: str, params: dict | None = None) -> None:
        """Send a notification, within the server's ``timeout`` (past it, it is given up silently).

        Raises:
            McpError: it was not delivered, or the server's endpoint refused it.
        """
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        with trio.move_on_after(self.spec.timeout):
            await self._transport.send(self, message, None)

    async def initialize(self, params: dict | None = None) -> dict:
        """Open the session (``params``: another client's, for a stand-in; salvor's
        own by default); its result."""
        result = await self.request(
            "initialize",
            params
            if params is not None
            else {
                "protocolVersion": PROTOCOL_VERSION,
                # No sampling, elicitation or roots: a built-in agent has no one to ask.
                "capabilities": {},
                "clientInfo": {"name": "salvor", "version": __version__},
            },
        )
        version = result.get("protocolVersion")
        if not isinstance(version, str) or not version:
            raise McpNoAnswer(self.name, "answered initialize without a protocolVersion")
        self.protocol_version = version
        self.server_info = (
            result.get("serverInfo") if isinstance(result.get("serverInfo"), dict) else None
        )
        self._transport.negotiated(version)
        await self.notify("notifications/initialized")
        return result

    async def list_tools(self) -> list[dict]:
        """Every tool the server lists, across all pages, in the server's order."""
        tools: list[dict] = []
        cursor = None
        seen: set[str] = set()
        for _ in range(MAX_LIST_PAGES):
            page = await self.request("tools/list", {} if cursor is None else {"cursor": cursor})
            entries = page.get("tools")
            if not isinstance(entries, list) or not all(isinstance(t, dict) for t in entries):
                raise McpNoAnswer(
                    self.name, "answered tools/list without a `tools` array of objects"
                )
            tools.extend(entries)
            cursor = page.get("nextCursor")
            if cursor is None:
                return tools
            if not isinstance(cursor, str) or cursor in seen:
                raise McpNoAnswer(
                    self.name, "answered tools/list with a nextCursor that is not a new string"
                )
            seen.add(cursor)
        raise McpNoAnswer(self.name, f"listed tools over more than {MAX_LIST_PAGES} pages")

    async def call_tool(self, tool: str, arguments: Any, meta: dict | None = None) -> dict:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        return await self.request("tools/call", params)

    # -- what the server sends ------------------------------------------------

    async def deliver(self, message: Any) -> None:
        """Route one message the server sent (never raises: a bad one ends the session)."""
        if isinstance(message, list):
            for item in message:
                await self.deliver(item)
            return
        if not isinstance(message, dict):
            self.fail(
                McpNoAnswer(
                    self.name,
                    "sent a JSON-RPC message that is not an object: "
                    f"{excerpt(json.dumps(message))}",
                )
            )
            return
        request_id = message.get("id")
        if isinstance(message.get("method"), str):
            if "id" in message:
                await self._answer_server_request(message)
            elif self.on_notification is not None:
                self.on_notification(message)
            # Otherwise a notification (progress, logging, list_changed):
            # nothing a built-in agent acts on.
            return
        if ("result" in message or "error" in message) and type(request_id) in (int, str):
            reply = self._pending.get(request_id) if type(request_id) is int else None
            if reply is not None and not reply.done.is_set():
                reply.message = message
                reply.done.set()
            # Otherwise the answer to a request given up on (its deadline passed).
            return
        self.fail(
            McpNoAnswer(
                self.name,
                f"sent a message that is no JSON-RPC request, notification or answer: "
                f"{excerpt(json.dumps(message))}",
            )
        )

    async def _answer_server_request(self, message: dict) -> None:
        method = message["method"]
        if method == "ping":
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
        elif self.on_request is not None:
            answer = await self.on_request(message)
        else:
            answer = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "error": {
                    "code": METHOD_NOT_FOUND,
                    "message": f"salvor does not answer {method} for a built-in agent's MCP server",
                },
            }
            log.info("MCP server %r asked %s; answered method-not-found", self.name, method)
        await self._transport.answer(self, answer)

    def fail(self, failure: McpError) -> None:
        """End the session: every request still waiting gets ``failure``."""
        if self.broken is None:
            self.broken = f"it {failure.detail}"
        for reply in self._pending.values():
            if not reply.done.is_set():
                reply.failure = failure
                reply.done.set()

    async def aclose(self) -> None:
        """Close the session (a stdio server's process group is killed). Shielded and bounded."""
        if self.broken is None:
            self.broken = "the session was closed"
        with trio.CancelScope(shield=True):
            await self._transport.aclose()


class Transport:
    """How a session's messages reach one server and its messages come
    back (``session.deliver``)."""

    async def send(self, session: McpSession, message: dict, reply: Reply | None) -> None:
        """Send a request (``reply`` is where its answer lands) or a notification (``reply`` None).

        Raises:
            McpUnavailable: it was not delivered. McpNoAnswer, McpRemoteError:
                what the exchange that carries its answer ended in.
        """
        raise NotImplementedError

    async def answer(self, session: McpSession, message: dict) -> None:
        """Send the answer to a request of the server's; a failure is only logged."""
        raise NotImplementedError

    def negotiated(self, version: str) -> None:
        pass

    def pass_through(self, headers: Mapping[str, str]) -> None:
        pass

    async def aclose(self) -> None:
        raise NotImplementedError
