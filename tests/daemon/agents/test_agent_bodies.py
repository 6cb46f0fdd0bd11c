"""What an agent process sends the daemon's loopback proxies is parsed strictly and within bounds.

A model request or an MCP message nested past the limit (or with a duplicate
key, or a NUL) is refused in the caller's own wire format before anything
walks it or records it; a body that stalls is answered 408 in that format too.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import trio
from salvor.daemon.proxies import ProxySession, open_model_proxy
from salvor.daemon.recording._run_context import RunContext
from salvor.protocol import MAX_NESTING

from tests.daemon.agents.test_process_agent import kinds, process_agent

DEEP = b'{"model": "m", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}"
BAD = {
    "nested 1,000 deep": (DEEP, f"1001 levels deep; the limit is {MAX_NESTING}"),
    "a duplicate key": (
        b'{"model": "m", "model": "n", "messages": []}',
        "the key `model` appears twice",
    ),
    "a NUL": (b'{"model": "m\\u0000", "messages": []}', "NUL character"),
}


async def test_model_requests_and_mcp_messages_from_an_agent_are_parsed_strictly(
    runtime, upstream_env, tmp_path
):
    agent = process_agent(tmp_path, script="pass\n")
    run_id = await runtime.starts.start_run(agent, "x")
    log = await runtime.reads.log(run_id)
    async with open_model_proxy() as proxy, httpx.AsyncClient() as client:
        session = ProxySession(
            RunContext(runtime.access, run_id, log),
            log,
            record_prompts=False,
            upstream=None,
            client=proxy.client,
        )
        session.mcp_lanes = {"fs": object()}  # refused before the lane is ever asked
        base = proxy.base(proxy.attach(session))
        for case, (body, fragment) in BAD.items():
            answer = await client.post(
                f"{base}/v1/messages", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 400, (case, answer.text)
            assert answer.json()["type"] == "error" and fragment in answer.text, (case, answer.text)
            answer = await client.post(
                f"{base}/v1/chat/completions",
                content=body,
                headers={"content-type": "application/json; charset=utf-8"},
            )
            assert answer.status_code == 400 and fragment in answer.json()["error"]["message"], (
                case,
                answer.text,
            )
            answer = await client.post(
                f"{base}/mcp/fs", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 400, (case, answer.text)
            error = answer.json()["error"]
            assert error["code"] == -32700 and fragment in error["message"], (case, error)
    assert await kinds(runtime, run_id) == ["RunStarted"]


async def stalled(url: str) -> tuple[int, dict]:
    """POST half of a body to ``url`` over a raw socket and wait; the
    (status, JSON body) answered."""
    parts = urlsplit(url)
    body = b'{"model": "m", "messages": []}'
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    await stream.send_all(
        (
            f"POST {parts.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body[:10]
    )
    answer = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in answer:
            answer += await stream.receive_some(65536)
        head, _, rest = answer.partition(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":", 1)[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        while len(rest) < length:
            rest += await stream.receive_some(65536)
    await stream.aclose()
    return int(head.split(b" ")[1]), json.loads(rest)


async def test_a_stalled_body_to_the_proxy_or_a_stand_in_is_408_in_the_callers_format(
    runtime, upstream_env, tmp_path
):
    agent = process_agent(tmp_path, script="pass\n")
    run_id = await runtime.starts.start_run(agent, "x")
    log = await runtime.reads.log(run_id)
    async with open_model_proxy() as proxy:
        proxy.body_timeout_seconds = 0.3
        session = ProxySession(
            RunContext(runtime.access, run_id, log),
            log,
            record_prompts=False,
            upstream=None,
            client=proxy.client,
        )
        session.mcp_lanes = {"fs": object()}
        base = proxy.base(proxy.attach(session))
        status, body = await stalled(f"{base}/v1/messages")
        assert (
            status == 408 and body["type"] == "error" and "within 0.3 seconds" in json.dumps(body)
        ), body
        status, body = await stalled(f"{base}/v1/chat/completions")
        assert status == 408 and "within 0.3 seconds" in body["error"]["message"], body
        status, body = await stalled(f"{base}/mcp/fs")
        assert status == 408 and "within 0.3 seconds" in body["error"]["message"], body
    assert await kinds(runtime, run_id) == ["RunStarted"]
