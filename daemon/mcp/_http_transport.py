"""The streamable-HTTP transport of an MCP session.

Each message is a POST to the server's endpoint; a request is answered with
one JSON body or a ``text/event-stream`` whose events may carry the server's
own requests and notifications before the response. The session id the
server hands out on ``initialize`` and the negotiated protocol version ride on
every later request; closing sends ``DELETE`` as a courtesy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx
import trio
from salvor.protocol import SSEDecoder

from ..web import UnfillableHeader, fill_headers, tls_context
from ._definition import McpServerSpec
from ._session import (
    MAX_MESSAGE_BYTES,
    McpNoAnswer,
    McpRemoteError,
    McpSession,
    McpUnavailable,
    Reply,
    Transport,
    encode,
    log,
)


def resolve_headers(spec: McpServerSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """The server's headers (and its ``bearer_token_env`` as ``Authorization``) with each
    ``${NAME}`` read from the daemon's environment now (``web.fill_headers``).

    Raises:
        McpUnavailable: a named variable is unset or holds a line break; the
            message names the variable, never its value.
    """
    headers = dict(spec.headers)
    if spec.bearer_token_env is not None:
        headers["Authorization"] = "Bearer ${" + spec.bearer_token_env + "}"
    try:
        return fill_headers(headers, environ)
    except UnfillableHeader as exc:
        raise McpUnavailable(spec.name, str(exc)) from None


class HttpTransport(Transport):
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

    def pass_through(self, headers: Mapping[str, str]) -> None:
        if "authorization" in headers:
            self.headers["Authorization"] = headers["authorization"]

    def _request_headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **self.headers,
        }
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        if self.protocol_version is not None:
            headers["MCP-Protocol-Version"] = self.protocol_version
        return headers

    async def send(self, session: McpSession, message: dict, reply: Reply | None) -> None:
        method = message["method"]
        data = encode(message)
        if len(data) > MAX_MESSAGE_BYTES:
            raise McpUnavailable(
                self.name,
                f"was not sent a {len(data)}-byte message: the cap is {MAX_MESSAGE_BYTES} bytes",
            )
        try:
            async with self.client.stream(
                "POST", self.url, content=data, headers=self._request_headers()
            ) as response:
                if method == "initialize" and "mcp-session-id" in response.headers:
                    self.session_id = response.headers["mcp-session-id"]
                await self._read_answer(session, method, response, reply)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise McpUnavailable(self.name, f"could not be reached at {self.url}: {exc}") from None
        except httpx.HTTPError as exc:
            raise McpNoAnswer(
                self.name, f"broke off its answer to {method}: {type(exc).__name__}: {exc}"
            ) from None
        if reply is not None and not reply.done.is_set():
            raise McpNoAnswer(self.name, f"ended its answer to {method} without the response")

    async def _read_answer(
        self, session: McpSession, method: str, response: httpx.Response, reply: Reply | None
    ) -> None:
        status = response.status_code
        if status == 404 and self.session_id is not None:
            session.fail(McpUnavailable(self.name, "no longer knows this session (HTTP 404)"))
            raise McpUnavailable(
                self.name,
                f"no longer knows this session (HTTP 404 to {method}); it was not performed",
            )
        if 400 <= status < 500:
            # The body is the remote's own text: never quoted, so a refusal
            # cannot reflect it to whoever asked.
            raise McpRemoteError(self.name, f"refused {method} with HTTP {status}")
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
                raise McpNoAnswer(
                    self.name,
                    f"answered {method} with a body that is not JSON, so not a valid MCP "
                    f"{method} result",
                ) from None
            await session.deliver(message)
        elif content_type == "text/event-stream":
            await self._read_events(session, response, reply)
        else:
            raise McpNoAnswer(
                self.name, f"answered {method} with Content-Type {content_type or 'none'}"
            )

    async def _read_capped(self, response: httpx.Response, limit: int) -> bytes:
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > limit:
                raise McpNoAnswer(
                    self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"
                )
        return bytes(data)

    async def _read_events(
        self, session: McpSession, response: httpx.Response, reply: Reply
    ) -> None:
        """Deliver each ``data:`` event of the stream until ``reply`` is answered."""
        decoder = SSEDecoder()
        async for chunk in response.aiter_bytes():
            # An event's name, id and retry carry nothing a session needs: its data is the message.
            for event in decoder.feed(chunk):
                if len(event.data.encode()) > MAX_MESSAGE_BYTES:
                    raise McpNoAnswer(
                        self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"
                    )
                try:
                    message = json.loads(event.data)
                except (ValueError, RecursionError):
                    raise McpNoAnswer(
                        self.name, "sent an event that is not JSON, so not a valid MCP message"
                    ) from None
                await session.deliver(message)
                if reply.done.is_set():
                    return
            if decoder.pending > MAX_MESSAGE_BYTES:
                raise McpNoAnswer(
                    self.name, f"sent a message over the {MAX_MESSAGE_BYTES}-byte cap"
                )

    async def answer(self, session: McpSession, message: dict) -> None:
        try:
            async with self.client.stream(
                "POST", self.url, content=encode(message), headers=self._request_headers()
            ):
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
