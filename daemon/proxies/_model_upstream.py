"""One live model call sent upstream, and the agent's answer relayed as it comes.

The agent gets the upstream's answer as it was sent: a JSON body whole, a stream frame by frame
as the frames arrive. What is recorded is the response once it is complete; an upstream error,
a body that is not JSON or a stream that ends short of its final answer is relayed (redacted:
the upstream's credential never reaches the agent) and leaves nothing to record, so the call's
intent stays open and a later drive issues it again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import httpx
from salvor.protocol import SSEDecoder

from ..models import endpoint_url
from ._upstream import Upstream
from ._wire import UPSTREAM_PATH, body_complete, error_body, stream_complete

log = logging.getLogger("salvor.proxy")


class Reply:
    """How a session answers one HTTP request (implemented over ASGI ``send``)."""

    async def json(self, status: int, body: Any) -> None:
        raise NotImplementedError

    async def start_stream(self, status: int) -> None:
        raise NotImplementedError

    async def chunk(self, data: bytes) -> None:
        raise NotImplementedError

    async def end(self) -> None:
        raise NotImplementedError


async def forward(
    client: httpx.AsyncClient,
    upstream: Upstream,
    wire: str,
    body: dict,
    stream: bool,
    headers: Mapping[str, str],
    reply: Reply,
    *,
    run_id: str,
) -> dict | None:
    """Send the call upstream; the recorded response, or None when it did not
    complete (the agent got the error)."""
    url = endpoint_url(upstream.base_url, UPSTREAM_PATH[wire])
    out_headers = upstream.headers(wire, headers)
    content = json.dumps(body, ensure_ascii=False).encode()
    try:
        if not stream:
            return await _post(client, upstream, wire, url, content, out_headers, reply)
        out_headers["accept"] = "text/event-stream"
        return await _relay_stream(client, upstream, wire, url, content, out_headers, reply, run_id)
    except httpx.TimeoutException:
        await reply.json(504, error_body(wire, 504, f"the upstream model call to {url} timed out"))
    except httpx.TransportError as exc:
        await reply.json(
            502,
            error_body(
                wire,
                502,
                f"the upstream model call to {url} failed: {upstream.redact(str(exc))}",
            ),
        )
    return None


async def _post(
    client: httpx.AsyncClient,
    upstream: Upstream,
    wire: str,
    url: str,
    content: bytes,
    out_headers: dict,
    reply: Reply,
) -> dict | None:
    """A call without streaming: its body, answered by the caller once recorded."""
    answer = await client.post(url, content=content, headers=out_headers, timeout=upstream.timeout)
    if answer.status_code >= 400:
        await _pass_error(upstream, wire, answer, reply)
        return None
    try:
        parsed = answer.json()
    except ValueError:
        await reply.json(
            502,
            error_body(wire, 502, "the upstream answered with a body that is not JSON"),
        )
        return None
    if not body_complete(wire, parsed):
        # The agent sees the failure as the upstream sent it; the call stays open.
        await reply.json(answer.status_code, json.loads(upstream.redact(json.dumps(parsed))))
        return None
    return {"wire": wire, "body": parsed}


async def _relay_stream(
    client: httpx.AsyncClient,
    upstream: Upstream,
    wire: str,
    url: str,
    content: bytes,
    out_headers: dict,
    reply: Reply,
    run_id: str,
) -> dict | None:
    """A streamed call: relayed to the agent as it comes, its frames kept in order."""
    async with client.stream(
        "POST", url, content=content, headers=out_headers, timeout=upstream.timeout
    ) as answer:
        if answer.status_code >= 400:
            await answer.aread()
            await _pass_error(upstream, wire, answer, reply)
            return None
        await reply.start_stream(answer.status_code)
        decoder = SSEDecoder()
        frames: list[list] = []
        async for text in answer.aiter_text():
            await reply.chunk(text.encode())
            frames.extend([event.event, event.data] for event in decoder.feed(text))
        frames.extend([event.event, event.data] for event in decoder.close())
        await reply.end()
        if not stream_complete(wire, frames):
            log.warning(
                "run %s: the upstream stream ended without a final answer; the call stays open",
                run_id,
                extra={"run": run_id},
            )
            return None
        return {"wire": wire, "frames": frames}


async def _pass_error(upstream: Upstream, wire: str, answer: httpx.Response, reply: Reply) -> None:
    try:
        parsed = answer.json()
    except ValueError:
        parsed = error_body(
            wire,
            answer.status_code,
            upstream.redact(answer.text[:500]) or "upstream error",
        )
    await reply.json(answer.status_code, json.loads(upstream.redact(json.dumps(parsed))))
