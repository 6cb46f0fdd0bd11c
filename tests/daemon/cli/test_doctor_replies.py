"""Doctor's canned replies, parsed by the real SDKs, for every wire in the table.

A plain HTTP server in a thread serves each wire's canned body or stream at
its path, so the check does not depend on which wires the proxy routes yet
(the OpenAI Responses entry waits for the proxy's v1/responses route). Each test imports its
SDK itself: at collection every xdist worker would pay for both (about 2.5 CPU-seconds).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from salvor.daemon.cli._doctor_replies import CANNED, OPENAI_RESPONSES, REPLY_TEXT
from salvor.daemon.proxies import ANTHROPIC_MESSAGES, OPENAI_CHAT, encode_frames

PATHS = {
    "/v1/chat/completions": OPENAI_CHAT,
    "/v1/responses": OPENAI_RESPONSES,
    "/v1/messages": ANTHROPIC_MESSAGES,
}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        canned = CANNED[PATHS[self.path]]
        if body.get("stream"):
            payload, kind = encode_frames(canned.frames(body)), "text/event-stream"
        else:
            payload, kind = json.dumps(canned.body(body)).encode(), "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_every_wire_the_proxy_may_route_has_a_canned_reply():
    assert set(CANNED) == set(PATHS.values())


def test_openai_chat(base):
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}])
    assert (reply.choices[0].message.content, reply.model) == (REPLY_TEXT, "m1")
    chunks = list(
        client.chat.completions.create(
            model="m1",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLY_TEXT
    assert chunks[-1].usage is not None and not chunks[-1].choices


def test_openai_responses(base):
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    reply = client.responses.create(model="m2", input="hi")
    assert (reply.output_text, reply.model, reply.status) == (REPLY_TEXT, "m2", "completed")
    with client.responses.stream(model="m2", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == REPLY_TEXT


def test_anthropic_messages(base):
    import anthropic

    client = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    reply = client.messages.create(
        model="m3", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    assert ([b.text for b in reply.content], reply.stop_reason) == ([REPLY_TEXT], "end_turn")
    with client.messages.stream(
        model="m3", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert [b.text for b in final.content] == [REPLY_TEXT]
