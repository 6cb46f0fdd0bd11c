"""An MCP client on trio: one JSON-RPC 2.0 session with a server, over stdio or streamable HTTP.

The session speaks the lifecycle (``initialize``, then the
``notifications/initialized`` notification) and the two calls a built-in
agent needs, ``tools/list`` (following ``nextCursor``) and ``tools/call``.
Every request has a deadline. A stdio server is spawned in a process group of
its own, its messages are newline-delimited JSON on stdin/stdout, and its
stderr is drained (the tail is quoted when it dies). A streamable-HTTP server
gets each message as a POST and may answer with one JSON body or a
``text/event-stream``; the session id it hands out on ``initialize`` rides on
every later request.

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
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

import httpx
import trio
from salvor import __version__

from ._http_values import header_placeholders
from ._mcp_def import McpServerSpec
from ._model_gateway import tls_context

log = logging.getLogger("salvor.mcp")

PROTOCOL_VERSION = "2025-06-18"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
STDERR_TAIL_BYTES = 2000
# How long a stdio server has to exit after its stdin closes before its group is killed.
CLOSE_GRACE_SECONDS = 1.0
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

    def __init__(self, server: str, detail: str, *, code: int | None = None) -> None:
        super().__init__(server, detail)
        self.code = code


def _encode(message: dict) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _excerpt(data: bytes | str, limit: int = 200) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")


class _Reply:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.message: dict | None = None
        self.failure: McpError | None = None


class McpSession:
    """One initialised session with one server.

    Cancellation: cancelling a request abandons it (a late answer is
    dropped); the session stays usable.
    """

    def __init__(self, spec: McpServerSpec, transport: _Transport) -> None:
        self.spec = spec
        self.name = spec.name
        self._transport = transport
        self._next_id = 0
        self._pending: dict[int, _Reply] = {}
        # Why the session can carry no more requests, once it cannot.
        self.broken: str | None = None
        self.protocol_version: str | None = None
        self.server_info: dict | None = None

    # -- requests -------------------------------------------------------------

    async def request(self, method: str, params: dict) -> dict:
        """Send a request and wait (up to the server's ``timeout``) for its result.

        Raises:
            McpUnavailable: the session had ended, or the request could not be delivered.
            McpNoAnswer: no usable answer within the deadline.
            McpRemoteError: the server answered with an error.
        """
        if self.broken is not None:
            raise McpUnavailable(self.name, f"is no longer connected: {self.broken}")
        self._next_id += 1
        request_id = self._next_id
        reply = _Reply()
        self._pending[request_id] = reply
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            with trio.move_on_after(self.spec.timeout) as deadline:
                await self._transport.send(self, message, reply)
                await reply.done.wait()
        finally:
            self._pending.pop(request_id, None)
        if deadline.cancelled_caught:
            await self._cancel(request_id, f"no answer within {self.spec.timeout:g}s")
            raise McpNoAnswer(self.name, f"did not answer {method} within {self.spec.timeout:g}s")
        if reply.failure is not None:
            raise reply.failure
        answer = reply.message
        if "error" in answer:
            error = answer["error"]
            if not isinstance(error, dict):
                raise McpNoAnswer(self.name, f"answered {method} with an error that is not an object")
            code = error.get("code") if type(error.get("code")) is int else None
            raise McpRemoteError(
                self.name, f"answered {method} with error {code}: {error.get('message', '')}", code=code
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise McpNoAnswer(self.name, f"answered {method} with a result that is not an object")
        return result

    async def _cancel(self, request_id: int, reason: str) -> None:
        """Tell the server a request was given up on (best effort: it may be past listening)."""
        if self.broken is not None:
            return
        message = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                   "params": {"requestId": request_id, "reason": reason}}
        with trio.move_on_after(1.0):
            try:
                await self._transport.send(self, message, None)
            except McpError:
                pass

    async def notify(self, method: str, params: dict | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        with trio.move_on_after(self.spec.timeout):
            await self._transport.send(self, message, None)

    async def initialize(self) -> None:
        result = await self.request(
            "initialize",
            {
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
        self.server_info = result.get("serverInfo") if isinstance(result.get("serverInfo"), dict) else None
        self._transport.negotiated(version)
        await self.notify("notifications/initialized")

    async def list_tools(self) -> list[dict]:
        """Every tool the server lists, across all pages, in the server's order."""
        tools: list[dict] = []
        cursor = None
        seen: set[str] = set()
        for _ in range(MAX_LIST_PAGES):
            page = await self.request("tools/list", {} if cursor is None else {"cursor": cursor})
            entries = page.get("tools")
            if not isinstance(entries, list) or not all(isinstance(t, dict) for t in entries):
                raise McpNoAnswer(self.name, "answered tools/list without a `tools` array of objects")
            tools.extend(entries)
            cursor = page.get("nextCursor")
            if cursor is None:
                return tools
            if not isinstance(cursor, str) or cursor in seen:
                raise McpNoAnswer(self.name, "answered tools/list with a nextCursor that is not a new string")
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
            self.fail(McpNoAnswer(self.name, f"sent a JSON-RPC message that is not an object: {_excerpt(json.dumps(message))}"))
            return
        request_id = message.get("id")
        if isinstance(message.get("method"), str):
            if "id" in message:
                await self._answer_server_request(message)
            # A notification (progress, logging, list_changed): nothing a built-in agent acts on.
            return
        if ("result" in message or "error" in message) and type(request_id) in (int, str):
            reply = self._pending.get(request_id) if type(request_id) is int else None
            if reply is not None and not reply.done.is_set():
                reply.message = message
                reply.done.set()
            # Otherwise the answer to a request given up on (its deadline passed).
            return
        self.fail(McpNoAnswer(self.name, f"sent a message that is no JSON-RPC request, notification or answer: "
                                         f"{_excerpt(json.dumps(message))}"))

    async def _answer_server_request(self, message: dict) -> None:
        method = message["method"]
        if method == "ping":
            answer = {"jsonrpc": "2.0", "id": message["id"], "result": {}}
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


class _Transport:
    async def send(self, session: McpSession, message: dict, reply: _Reply | None) -> None:
        raise NotImplementedError

    async def answer(self, session: McpSession, message: dict) -> None:
        raise NotImplementedError

    def negotiated(self, version: str) -> None:
        pass

    async def aclose(self) -> None:
        raise NotImplementedError


# -- stdio ----------------------------------------------------------------------


def _kill_group(process: trio.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _StdioTransport(_Transport):
    def __init__(self, name: str, process: trio.Process, nursery: trio.Nursery) -> None:
        self.name = name
        self.process = process
        self._nursery = nursery
        self._write_lock = trio.Lock()
        self.stderr_tail = b""

    async def _write(self, message: dict) -> None:
        data = _encode(message)
        if len(data) > MAX_MESSAGE_BYTES:
            raise McpUnavailable(self.name, f"was not sent a {len(data)}-byte message: the cap is {MAX_MESSAGE_BYTES} bytes")
        async with self._write_lock:
            try:
                await self.process.stdin.send_all(data + b"\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise McpUnavailable(self.name, "has closed its stdin (its process has exited)") from None

    async def send(self, session: McpSession, message: dict, reply: _Reply | None) -> None:
        await self._write(message)

    async def answer(self, session: McpSession, message: dict) -> None:
        # Written by a task of its own, so the reader never waits on a server that is not reading.
        async def write() -> None:
            try:
                await self._write(message)
            except McpError:
                pass

        self._nursery.start_soon(write)

    async def read_messages(self, session: McpSession) -> None:
        buffer = bytearray()
        stream = self.process.stdout
        try:
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if len(line) > MAX_MESSAGE_BYTES:
                        session.fail(McpNoAnswer(self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"))
                        return
                    if not line.strip():
                        continue
                    try:
                        message = json.loads(line)
                    except (ValueError, RecursionError):
                        session.fail(McpNoAnswer(self.name, f"wrote a line to stdout that is not JSON: {_excerpt(line)}"))
                        return
                    await session.deliver(message)
                if len(buffer) > MAX_MESSAGE_BYTES:
                    session.fail(McpNoAnswer(self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"))
                    return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        if session.broken is not None:
            return
        with trio.move_on_after(1.0):
            await self.process.wait()
        code = self.process.returncode
        how = "closed its stdout" if code is None else f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        tail = self.stderr_tail.decode("utf-8", errors="replace").strip()
        said = f"; its stderr ended with: {tail[-500:]}" if tail else ""
        session.fail(McpNoAnswer(self.name, f"{how}{said}"))

    async def drain_stderr(self) -> None:
        try:
            while chunk := await self.process.stderr.receive_some(65536):
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL_BYTES:]
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    async def aclose(self) -> None:
        process = self.process
        try:
            await process.stdin.aclose()  # end of input asks a stdio server to exit
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        with trio.move_on_after(CLOSE_GRACE_SECONDS):
            await process.wait()
        # Whatever is left of its group (the server, or children it started) goes with it.
        _kill_group(process)
        await process.wait()
        await process.stdout.aclose()
        await process.stderr.aclose()


def server_environment(spec: McpServerSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """A stdio server's environment: the daemon's, minus its own SALVOR_* settings, plus the definition's ``env``."""
    env = {k: v for k, v in environ.items() if not k.startswith("SALVOR_")}
    env.update(spec.env)
    return env


async def _open_stdio(spec: McpServerSpec, nursery: trio.Nursery, environ: Mapping[str, str]) -> McpSession:
    try:
        process = await trio.lowlevel.open_process(
            list(spec.command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=spec.cwd, env=server_environment(spec, environ), start_new_session=True,
        )
    except OSError as exc:
        raise McpUnavailable(spec.name, f"could not be started ({spec.command[0]}): {exc.strerror or exc}") from None
    transport = _StdioTransport(spec.name, process, nursery)
    session = McpSession(spec, transport)
    nursery.start_soon(transport.drain_stderr)
    nursery.start_soon(transport.read_messages, session)
    return session


# -- streamable HTTP --------------------------------------------------------------


def resolve_headers(spec: McpServerSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's headers with each ``${NAME}`` read from the daemon's environment now.

    Raises:
        McpUnavailable: a named variable is unset or holds a line break; the
            message names the variable, never its value.
    """
    def read(header: str, name: str) -> str:
        if name not in environ:
            raise McpUnavailable(spec.name, f"header {header} names ${{{name}}}, which the daemon's environment does not set")
        if any(c in environ[name] for c in "\r\n\0"):
            raise McpUnavailable(spec.name, f"header {header} names ${{{name}}}, which holds a line break or NUL")
        return environ[name]

    resolved = {}
    for header, value in spec.headers.items():
        for name in header_placeholders(value):
            value = value.replace("${" + name + "}", read(header, name))
        resolved[header] = value
    if spec.bearer_token_env is not None:
        resolved["Authorization"] = "Bearer " + read("Authorization", spec.bearer_token_env)
    return resolved


class _HttpTransport(_Transport):
    def __init__(self, spec: McpServerSpec, headers: dict[str, str]) -> None:
        self.name = spec.name
        self.url = spec.url
        self.headers = headers
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(spec.timeout), verify=tls_context(), follow_redirects=False
        )

    def negotiated(self, version: str) -> None:
        self.protocol_version = version

    def _request_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **self.headers}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        if self.protocol_version is not None:
            headers["MCP-Protocol-Version"] = self.protocol_version
        return headers

    async def send(self, session: McpSession, message: dict, reply: _Reply | None) -> None:
        method = message["method"]
        data = _encode(message)
        if len(data) > MAX_MESSAGE_BYTES:
            raise McpUnavailable(self.name, f"was not sent a {len(data)}-byte message: the cap is {MAX_MESSAGE_BYTES} bytes")
        try:
            async with self.client.stream("POST", self.url, content=data, headers=self._request_headers()) as response:
                if method == "initialize" and "mcp-session-id" in response.headers:
                    self.session_id = response.headers["mcp-session-id"]
                await self._read_answer(session, method, response, reply)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise McpUnavailable(self.name, f"could not be reached at {self.url}: {exc}") from None
        except httpx.HTTPError as exc:
            raise McpNoAnswer(self.name, f"broke off its answer to {method}: {type(exc).__name__}: {exc}") from None
        if reply is not None and not reply.done.is_set():
            raise McpNoAnswer(self.name, f"ended its answer to {method} without the response")

    async def _read_answer(self, session: McpSession, method: str, response: httpx.Response, reply: _Reply | None) -> None:
        status = response.status_code
        if status == 404 and self.session_id is not None:
            session.fail(McpUnavailable(self.name, "no longer knows this session (HTTP 404)"))
            raise McpUnavailable(self.name, f"no longer knows this session (HTTP 404 to {method}); it was not performed")
        if 400 <= status < 500:
            body = await self._read_capped(response, 2000, truncate=True)
            raise McpRemoteError(self.name, f"refused {method} with HTTP {status}: {_excerpt(body)}")
        if status >= 300:
            raise McpNoAnswer(self.name, f"answered {method} with HTTP {status}")
        if reply is None:
            return  # a notification or an answer: 202 Accepted, and any body is not ours to read
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            body = await self._read_capped(response, MAX_MESSAGE_BYTES)
            try:
                message = json.loads(body)
            except (ValueError, RecursionError):
                raise McpNoAnswer(self.name, f"answered {method} with a body that is not JSON: {_excerpt(body)}") from None
            await session.deliver(message)
        elif content_type == "text/event-stream":
            await self._read_events(session, response, reply)
        else:
            raise McpNoAnswer(self.name, f"answered {method} with Content-Type {content_type or 'none'}")

    async def _read_capped(self, response: httpx.Response, limit: int, *, truncate: bool = False) -> bytes:
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > limit:
                if truncate:
                    return bytes(data[:limit])
                raise McpNoAnswer(self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap")
        return bytes(data)

    async def _read_events(self, session: McpSession, response: httpx.Response, reply: _Reply) -> None:
        """Deliver each ``data:`` event of the stream until ``reply`` is answered."""
        buffer = bytearray()
        data: list[bytes] = []
        async for chunk in response.aiter_bytes():
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end]).rstrip(b"\r")
                del buffer[: end + 1]
                if line == b"":
                    if data:
                        payload = b"\n".join(data)
                        data = []
                        try:
                            message = json.loads(payload)
                        except (ValueError, RecursionError):
                            raise McpNoAnswer(self.name, f"sent an event that is not JSON: {_excerpt(payload)}") from None
                        await session.deliver(message)
                        if reply.done.is_set():
                            return
                elif line.startswith(b"data:"):
                    value = line[5:]
                    data.append(value[1:] if value.startswith(b" ") else value)
                    if sum(len(d) for d in data) > MAX_MESSAGE_BYTES:
                        raise McpNoAnswer(self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap")
                # Comments, `event:`, `id:` and `retry:` lines carry nothing a session needs.
            if len(buffer) + sum(len(d) for d in data) > MAX_MESSAGE_BYTES:
                raise McpNoAnswer(self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap")

    async def answer(self, session: McpSession, message: dict) -> None:
        try:
            async with self.client.stream("POST", self.url, content=_encode(message), headers=self._request_headers()):
                pass
        except httpx.HTTPError as exc:
            log.info("MCP server %r: could not send an answer: %s", self.name, exc)

    async def aclose(self) -> None:
        if self.session_id is not None:
            # Ending the session is a courtesy; a server may refuse it (405).
            with trio.move_on_after(2.0):
                try:
                    await self.client.delete(self.url, headers=self._request_headers())
                except httpx.HTTPError:
                    pass
        await self.client.aclose()


async def open_session(spec: McpServerSpec, nursery: trio.Nursery, environ: Mapping[str, str] = os.environ) -> McpSession:
    """Start or reach the server and initialise a session with it.

    Its background tasks (a stdio server's readers) run in ``nursery``; the
    caller closes the session with ``aclose``.

    Raises:
        McpUnavailable: the server could not be started, reached or
            initialised; nothing is left running.
    """
    if spec.command is not None:
        session = await _open_stdio(spec, nursery, environ)
    else:
        session = McpSession(spec, _HttpTransport(spec, resolve_headers(spec, environ)))
    try:
        await session.initialize()
    except McpUnavailable:
        await session.aclose()
        raise
    except McpError as exc:
        await session.aclose()
        raise McpUnavailable(spec.name, f"did not start a session: it {exc.detail}") from None
    except BaseException:
        await session.aclose()
        raise
    return session
