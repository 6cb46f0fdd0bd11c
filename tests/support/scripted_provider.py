"""The scripted model provider: the one test double salvor's tests use.

No real model is reachable from a test, so this module stands in for one:
a real HTTP server on a loopback port that speaks the Anthropic Messages,
OpenAI Chat Completions and OpenAI Responses wire formats (plain JSON and
server-sent events) and answers from a script. Because it is a real server
on its own thread, it serves in-process trio code, the real provider SDKs and
a salvor subprocess alike.

It is written independently of ``salvor.daemon.models._wire`` on purpose: a
shared translation bug would otherwise cancel itself out. The real SDKs keep
this module honest (tests/test_scripted_provider.py).

Every call is recorded before it is answered, so a test can count what the
provider served (in total, or per distinct request) and can act while a call
is in flight (``on_call``): block it, or kill the process that made it. A
call whose client has gone away is still counted.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from tests.support.provider_replies import (
    anthropic_error,
    anthropic_events,
    anthropic_message,
    json_bytes,
    numbered,
    openai_chunks,
    openai_completion,
    openai_error,
    responses_events,
    responses_object,
    sse,
)
from tests.support.provider_requests import (
    anthropic_to_neutral,
    openai_to_neutral,
    responses_to_neutral,
)

JSON = dict[str, Any]

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderCall:
    """One request the provider received.

    ``body`` is the parsed JSON as sent; ``request`` is the same request in
    salvor's neutral shape, so one script serves every wire. ``headers`` has
    lower-cased names.
    """

    index: int
    wire: str
    body: JSON
    request: JSON
    headers: dict[str, str]
    # The caller's (host, port): equal ports mean one kept-alive connection.
    peer: tuple[str, int] | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def auth(self) -> dict[str, str]:
        """The credential headers that came with the call (may be empty)."""
        return {k: v for k, v in self.headers.items() if k in ("authorization", "x-api-key")}

    @property
    def api_key(self) -> str | None:
        """The key the caller sent, from whichever header carried it."""
        # Anthropic accepts x-api-key and (in newer SDKs) a Bearer token.
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        scheme, _, token = self.headers.get("authorization", "").partition(" ")
        return token if scheme.lower() == "bearer" and token else None

    @property
    def request_hash(self) -> str:
        return request_hash(self.request)


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Answer with an HTTP error in the caller's wire format."""

    status: int
    message: str


@dataclass(frozen=True, slots=True)
class FailedResponse:
    """A Responses answer the model failed to produce, on HTTP 200.

    Plain, a Response with status ``failed``; streamed, ``response.created``
    and ``response.in_progress`` then ``response.failed``. The other wires
    have no such answer and get HTTP 500.
    """

    message: str


Reply = tuple[JSON, JSON] | ErrorReply | FailedResponse
Script = Callable[[ProviderCall], Reply]


def request_hash(request: JSON) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --------------------------------------------------------------------------
# Ready-made scripts
# --------------------------------------------------------------------------


def text_reply(
    text: str,
    *,
    model: str = "scripted-model",
    input_tokens: int = 10,
    output_tokens: int = 5,
    stop_reason: str = "end_turn",
) -> tuple[JSON, JSON]:
    """A neutral text answer, for scripts given as a list."""
    return (
        {"model": model, "content": [{"type": "text", "text": text}], "stop_reason": stop_reason},
        {"input_tokens": input_tokens, "output_tokens": output_tokens},
    )


def tool_loop_script(plan: Sequence[tuple[str, JSON]], *, final_text: str = "done") -> Script:
    """A script that walks ``plan``, one tool call per model call, then answers.

    The answer depends only on the request: with k tool results already in
    the conversation it calls ``plan[k]`` (id ``toolu_<k>``), and once every
    planned call has a result it answers ``final_text``. A request re-issued
    after a crash therefore gets the same answer as the first time.
    """
    plan = list(plan)

    def script(call: ProviderCall) -> Reply:
        request = call.request
        k = sum(
            1
            for message in request["messages"]
            for block in message["content"]
            if block["type"] == "tool_result"
        )
        if k < len(plan):
            name, tool_input = plan[k]
            content = [{"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": tool_input}]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": final_text}]
            stop = "end_turn"
        usage = {"input_tokens": 10 + 10 * k, "output_tokens": 5}
        return {"model": request["model"], "content": content, "stop_reason": stop}, usage

    return script


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


@dataclass
class _State:
    calls: list[ProviderCall] = field(default_factory=list)
    condition: threading.Condition = field(default_factory=threading.Condition)


class _ProviderServer(ThreadingHTTPServer):
    # Dozens of drivers call at once in the load tests, one connection per call: socketserver's
    # listen backlog of 5 overflowed on a loaded machine and a call's connection was reset, which
    # stops its run's drive with the intent open (a test then waits for a run that never ends).
    request_queue_size = 128
    daemon_threads = True


class ScriptedProvider:
    """A model provider on a loopback port, answering from a script.

    Args:
      script: a function of the call, or a list of replies served in order
        (past its end the provider answers HTTP 500 saying so).
      host: interface to bind; the port is chosen by the OS.
      on_call: run in the server thread after a call is recorded and before
        it is answered. An exception there answers HTTP 500.
      keep_alive: keep connections open between calls, as a real provider
        does. Off by default: a stopped provider's handler threads would go
        on answering on connections a client pooled earlier.

    The server starts when the object is built and stops on ``stop()`` or
    when its ``with`` block ends.
    """

    def __init__(
        self,
        script: Script | Sequence[Reply],
        *,
        host: str = "127.0.0.1",
        on_call: Callable[[ProviderCall], None] | None = None,
        keep_alive: bool = False,
    ) -> None:
        self.keep_alive = keep_alive
        if callable(script):
            self._script: Script = script
        else:
            replies = list(script)

            def from_list(call: ProviderCall) -> Reply:
                if call.index >= len(replies):
                    return ErrorReply(
                        500,
                        f"scripted provider: no reply scripted for call "
                        f"{call.index} (the script has {len(replies)})",
                    )
                return replies[call.index]

            self._script = from_list
        self.on_call = on_call
        self._state = _State()
        self._server = _ProviderServer((host, 0), _handler_for(self))
        # serve_forever notices shutdown() only between polls; a short poll
        # keeps each test's teardown from costing half a second.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="scripted-provider", daemon=True
        )
        self._thread.start()
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        """Stop accepting calls and close the listening socket (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- counting ----------------------------------------------------------

    @property
    def calls(self) -> list[ProviderCall]:
        """A snapshot of the calls received so far, in arrival order."""
        with self._state.condition:
            return list(self._state.calls)

    @property
    def call_count(self) -> int:
        with self._state.condition:
            return len(self._state.calls)

    @property
    def auth_headers(self) -> list[dict[str, str]]:
        """The credential headers of each call, in arrival order."""
        return [call.auth for call in self.calls]

    def count_by_request_hash(self) -> Counter[str]:
        """How often each distinct neutral request was served (sha256 hex keys)."""
        return Counter(call.request_hash for call in self.calls)

    def wait_for_calls(self, n: int, timeout: float) -> None:
        """Block until at least ``n`` calls have arrived.

        Blocks the calling thread: from trio, run it in
        ``trio.to_thread.run_sync``.

        Raises:
          TimeoutError: fewer than ``n`` calls arrived within ``timeout``.
        """
        with self._state.condition:
            if not self._state.condition.wait_for(
                lambda: len(self._state.calls) >= n, timeout=timeout
            ):
                raise TimeoutError(
                    f"scripted provider: {len(self._state.calls)} of {n} calls "
                    f"arrived within {timeout}s"
                )

    # -- serving (server threads) --------------------------------------------

    def _record(
        self,
        wire: str,
        body: JSON,
        request: JSON,
        headers: dict[str, str],
        peer: tuple[str, int] | None = None,
    ) -> ProviderCall:
        with self._state.condition:
            call = ProviderCall(
                index=len(self._state.calls),
                wire=wire,
                body=body,
                request=request,
                headers=headers,
                peer=peer,
            )
            self._state.calls.append(call)
            self._state.condition.notify_all()
        return call

    def _answer(self, call: ProviderCall) -> tuple[int, str, bytes]:
        """(status, content type, body bytes) for a recorded call."""
        if self.on_call is not None:
            self.on_call(call)
        reply = self._script(call)
        error = anthropic_error if call.wire == "anthropic" else openai_error
        if isinstance(reply, ErrorReply):
            return reply.status, "application/json", json_bytes(error(reply.status, reply.message))
        if isinstance(reply, FailedResponse):
            return self._failed(call, reply.message)
        response, usage = reply
        model = call.body.get("model", "")
        if call.wire == "responses":
            if call.stream:
                return (
                    200,
                    "text/event-stream",
                    sse(responses_events(call.index, response, usage, call.body), named=True),
                )
            return (
                200,
                "application/json",
                json_bytes(responses_object(call.index, response, usage, call.body)),
            )
        if call.wire == "anthropic":
            if call.stream:
                return (
                    200,
                    "text/event-stream",
                    sse(anthropic_events(call.index, response, usage, model), named=True),
                )
            return (
                200,
                "application/json",
                json_bytes(anthropic_message(call.index, response, usage, model)),
            )
        if call.stream:
            include_usage = bool((call.body.get("stream_options") or {}).get("include_usage"))
            chunks = openai_chunks(call.index, response, usage, model, include_usage)
            return 200, "text/event-stream", sse(chunks, named=False) + b"data: [DONE]\n\n"
        return (
            200,
            "application/json",
            json_bytes(openai_completion(call.index, response, usage, model)),
        )

    def _failed(self, call: ProviderCall, message: str) -> tuple[int, str, bytes]:
        if call.wire != "responses":
            error = anthropic_error if call.wire == "anthropic" else openai_error
            return 500, "application/json", json_bytes(error(500, message))
        empty = (
            {"content": [], "stop_reason": "end_turn"},
            {"input_tokens": 0, "output_tokens": 0},
        )
        failed = responses_object(call.index, *empty, call.body)
        failed.update(
            status="failed",
            output=[],
            usage=None,
            error={"code": "server_error", "message": message},
        )
        if not call.stream:
            return 200, "application/json", json_bytes(failed)
        pending = responses_object(call.index, *empty, call.body, done=False)
        events = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
            {"type": "response.failed", "response": failed},
        ]
        return 200, "text/event-stream", sse(numbered(events), named=True)


def _handler_for(provider: ScriptedProvider) -> type[BaseHTTPRequestHandler]:
    routes = {
        ANTHROPIC_PATH: ("anthropic", anthropic_to_neutral),
        OPENAI_PATH: ("openai", openai_to_neutral),
        RESPONSES_PATH: ("responses", responses_to_neutral),
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Head and body go out in separate writes; with Nagle on, a kept-alive
        # connection waits for the client's delayed ACK between them.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def handle(self) -> None:
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):
                # The caller went away mid-answer (a daemon SIGKILLed in the kill runs): its
                # call stays counted, and the traceback would only bury the runs' own output.
                self.close_connection = True

        def _send(self, status: int, content_type: str, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            if not provider.keep_alive:
                # One call per connection (see ``keep_alive``).
                self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = not provider.keep_alive

        def _not_found(self) -> None:
            message = f"scripted provider: no route for {self.command} {self.path}"
            self._send(
                404,
                "application/json",
                json_bytes(
                    {"type": "error", "error": {"type": "not_found_error", "message": message}}
                ),
            )

        def do_GET(self) -> None:
            self._not_found()

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in routes:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                self._not_found()
                return
            wire, to_neutral = routes[path]
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            error = anthropic_error if wire == "anthropic" else openai_error
            try:
                body = json.loads(raw)
                request = to_neutral(body)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._send(
                    400,
                    "application/json",
                    json_bytes(error(400, f"scripted provider: bad request: {exc!r}")),
                )
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            call = provider._record(wire, body, request, headers, tuple(self.client_address[:2]))
            try:
                status, content_type, payload = provider._answer(call)
            except Exception as exc:  # noqa: BLE001 - a failing script must surface in the test
                status, content_type = 500, "application/json"
                payload = json_bytes(
                    error(500, f"scripted provider: script failed on call {call.index}: {exc!r}")
                )
            try:
                self._send(status, content_type, payload)
            except OSError:
                pass  # the client went away (e.g. it was killed); the call still counts

    return Handler
