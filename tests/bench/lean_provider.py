"""A lean scripted model provider for the benchmarks whose model calls must cost little: one
process of its own, one thread, a hand-written HTTP/1.1 keep-alive responder on loopback.

The stock scripted provider (``tests/support/scripted_provider.py``, a ``ThreadingHTTPServer``
with a thread per connection, the request parsed into its neutral form and the answer encoded
afresh) spent 0.6-0.9 ms of CPU per call in ``bench_workers``: a sixth of what salvor spent per
run, taken from the same two cores. This one answers the Anthropic Messages wire
(``POST /v1/messages``, plain JSON or a stream) from the same script (``tool_loop_script``): it
parses each request's JSON, counts the tool results in it (what the script's answer depends on)
and sends the script's answer for that count, encoded once per (count, model, stream) and
stamped with the call's own message id. It counts every call it answers (``stop`` returns the
count, which a bench checks). About 0.1 ms of CPU per call.

What it does not do: chunked request bodies (answered 400), the OpenAI wires (404), recording
the calls' bodies. A benchmark whose script needs those uses ``ProviderProcess``.
"""

from __future__ import annotations

import json
import multiprocessing
import selectors
import socket
from typing import Self

from tests.bench.serve_process import cpu_seconds
from tests.support.provider_replies import (
    anthropic_error,
    anthropic_events,
    anthropic_message,
    json_bytes,
    sse,
)
from tests.support.provider_requests import anthropic_to_neutral
from tests.support.scripted_provider import ANTHROPIC_PATH, ProviderCall, tool_loop_script

# The message id the cached answers carry, replaced by each call's own (``msg_scripted_<n>``).
_ID_MARK = b"msg_scripted_LEAN"
_HEAD_LIMIT = 65536


class _Answers:
    """The script's answers, encoded once per (tool results so far, model, stream)."""

    def __init__(self, plan) -> None:
        self._script = tool_loop_script(plan)
        self._encoded: dict[tuple[int, str, bool], tuple[str, bytes]] = {}
        self.calls = 0

    def answer(self, raw: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body) for one request body; counts the call."""
        try:
            body = json.loads(raw)
            results = sum(
                1
                for message in body["messages"]
                if isinstance(message.get("content"), list)
                for block in message["content"]
                if block.get("type") == "tool_result"
            )
            key = (results, body["model"], bool(body.get("stream")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            message = f"lean provider: bad request: {exc!r}"
            return 400, "application/json", json_bytes(anthropic_error(400, message))
        if key not in self._encoded:
            self._encoded[key] = self._encode(body)
        index = self.calls
        self.calls += 1
        content_type, template = self._encoded[key]
        return 200, content_type, template.replace(_ID_MARK, b"msg_scripted_%d" % index)

    def _encode(self, body: dict) -> tuple[str, bytes]:
        call = ProviderCall(
            index=0, wire="anthropic", body=body, request=anthropic_to_neutral(body), headers={}
        )
        response, usage = self._script(call)
        if body.get("stream"):
            events = anthropic_events(0, response, usage, body["model"])
            encoded = "text/event-stream", sse(events, named=True)
        else:
            encoded = (
                "application/json",
                json_bytes(anthropic_message(0, response, usage, body["model"])),
            )
        return encoded[0], encoded[1].replace(b"msg_scripted_0", _ID_MARK)


def _response(status: int, content_type: str, payload: bytes) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
        % (status, reason.encode(), content_type.encode(), len(payload))
    ) + payload


class _Connection:
    __slots__ = ("buffer", "closing", "outgoing", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.outgoing = b""
        self.closing = False


def _next_request(connection: _Connection, answers: _Answers) -> bytes | None:
    """The answer to the next whole request in ``connection``'s buffer (None: not whole yet)."""
    end = connection.buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(connection.buffer) > _HEAD_LIMIT:
            connection.closing = True
            return _response(400, "application/json", b"{}")
        return None
    head = connection.buffer[:end].split(b"\r\n")
    method, path = head[0].split(b" ", 2)[:2]
    length, close = 0, False
    for line in head[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            connection.closing = True
            message = "lean provider: chunked request bodies are not read"
            return _response(400, "application/json", json_bytes(anthropic_error(400, message)))
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    if len(connection.buffer) < end + 4 + length:
        return None
    connection.closing = close
    raw = connection.buffer[end + 4 : end + 4 + length]
    connection.buffer = connection.buffer[end + 4 + length :]
    if method != b"POST" or path.split(b"?", 1)[0] != ANTHROPIC_PATH.encode():
        message = f"lean provider: no route for {method.decode()} {path.decode()}"
        error = {"type": "error", "error": {"type": "not_found_error", "message": message}}
        return _response(404, "application/json", json_bytes(error))
    return _response(*answers.answer(raw))


def _serve(plan, control) -> None:
    """The provider's process: serve until ``control`` says stop, then send back the count."""
    answers = _Answers(plan)
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    selector.register(control, selectors.EVENT_READ, "control")
    control.send(f"http://127.0.0.1:{listener.getsockname()[1]}")
    while True:
        for key, _ in selector.select():
            if key.data == "control":
                control.recv()
                control.send(answers.calls)
                return
            if key.data is None:
                _accept(listener, selector)
            else:
                _serve_ready(key.data, selector, answers)


def _accept(listener: socket.socket, selector: selectors.BaseSelector) -> None:
    try:
        sock, _ = listener.accept()
    except BlockingIOError:
        return
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    selector.register(sock, selectors.EVENT_READ, _Connection(sock))


def _serve_ready(
    connection: _Connection, selector: selectors.BaseSelector, answers: _Answers
) -> None:
    try:
        data = connection.sock.recv(65536)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    if not data:
        selector.unregister(connection.sock)
        connection.sock.close()
        return
    connection.buffer += data
    # A refusal that closes the connection answers nothing after it.
    while not connection.closing and (answer := _next_request(connection, answers)) is not None:
        connection.outgoing += answer
    if connection.outgoing:
        try:
            # Answers are small: the socket's buffer takes them whole but for a slow reader.
            connection.sock.setblocking(True)
            connection.sock.sendall(connection.outgoing)
            connection.sock.setblocking(False)
        except OSError:
            connection.closing = True
        connection.outgoing = b""
    if connection.closing:
        selector.unregister(connection.sock)
        connection.sock.close()


class LeanProviders:
    """``count`` lean providers answering ``plan`` (``tool_loop_script``), for a with block, as
    ``ProviderProcesses`` offers them: ``base_urls``, ``cpu_seconds``, ``stop`` (the calls
    answered together). Leaving the block kills any still running."""

    def __init__(self, plan, count: int) -> None:
        self._plan = plan
        self._count = count
        self._started: list[tuple[multiprocessing.Process, object]] = []
        self._calls: int | None = None
        self.base_urls: list[str] = []

    def __enter__(self) -> Self:
        context = multiprocessing.get_context("fork")
        try:
            for _ in range(self._count):
                control, child = context.Pipe()
                process = context.Process(target=_serve, args=(self._plan, child), daemon=True)
                process.start()
                self._started.append((process, control))
                self.base_urls.append(control.recv())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the providers have used so far."""
        return sum(cpu_seconds(process.pid) for process, _ in self._started)

    def stop(self) -> int:
        """Stop every provider (once); the model calls they answered together."""
        if self._calls is None:
            calls = 0
            for process, control in self._started:
                control.send("stop")
                calls += control.recv()
                process.join(timeout=30)
            self._calls = calls
        return self._calls

    def __exit__(self, *exc_info) -> None:
        for process, _ in self._started:
            if process.is_alive():
                process.kill()
