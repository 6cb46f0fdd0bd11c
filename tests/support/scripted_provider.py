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
# Wire body -> neutral request
# --------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def _neutral_block(block: JSON) -> JSON | None:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "tool_use":
        return {
            "type": "tool_use",
            "id": block["id"],
            "name": block["name"],
            "input": block.get("input", {}),
        }
    if kind == "tool_result":
        out = {
            "type": "tool_result",
            "tool_use_id": block["tool_use_id"],
            "content": _text_of(block.get("content", "")),
        }
        if block.get("is_error"):
            out["is_error"] = True
        return out
    return None


def anthropic_to_neutral(body: JSON) -> JSON:
    request: JSON = {"model": body.get("model"), "max_tokens": body.get("max_tokens")}
    if body.get("system"):
        request["system"] = _text_of(body["system"])
    messages = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        blocks = [b for b in map(_neutral_block, content) if b is not None]
        messages.append({"role": message["role"], "content": blocks})
    request["messages"] = messages
    if body.get("tools"):
        request["tools"] = [
            {
                "name": t["name"],
                "description": t.get("description", ""),
                "input_schema": t.get("input_schema", {}),
            }
            for t in body["tools"]
        ]
    return request


def _turn_adder(messages: list[JSON]) -> Callable[[str, list[JSON]], None]:
    def add(role: str, blocks: list[JSON]) -> None:
        # Tool results and the user text after them are one neutral user turn.
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    return add


_NEUTRAL_ORDER = ("model", "max_tokens", "system", "messages", "tools")


def openai_to_neutral(body: JSON) -> JSON:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    request: JSON = {"model": body.get("model"), "max_tokens": max_tokens}
    systems: list[str] = []
    messages: list[JSON] = []
    add = _turn_adder(messages)

    for message in body.get("messages", []):
        role = message.get("role")
        if role in ("system", "developer"):
            systems.append(_text_of(message.get("content")))
        elif role == "user":
            content = message.get("content")
            if isinstance(content, str):
                add("user", [{"type": "text", "text": content}])
            else:
                add(
                    "user",
                    [
                        {"type": "text", "text": p["text"]}
                        for p in content
                        if p.get("type") == "text"
                    ],
                )
        elif role == "tool":
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": message["tool_call_id"],
                        "content": _text_of(message.get("content")),
                    }
                ],
            )
        elif role == "assistant":
            blocks: list[JSON] = []
            text = _text_of(message.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for call in message.get("tool_calls") or []:
                arguments = call["function"].get("arguments") or "{}"
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": json.loads(arguments),
                    }
                )
            add("assistant", blocks)
    if systems:
        request["system"] = "\n\n".join(systems)
    request["messages"] = messages
    if body.get("tools"):
        request["tools"] = [
            {
                "name": t["function"]["name"],
                "description": t["function"].get("description", ""),
                "input_schema": t["function"].get("parameters", {}),
            }
            for t in body["tools"]
        ]
    return {k: request[k] for k in _NEUTRAL_ORDER if k in request}


def _responses_turn(item: JSON, systems: list[str], add: Callable) -> None:
    """One Responses input item into the neutral conversation."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item["role"]
        text = _text_of(item.get("content"))
        if role in ("system", "developer"):
            systems.append(text)
        elif text:
            add("assistant" if role == "assistant" else "user", [{"type": "text", "text": text}])
    elif kind == "function_call":
        arguments = item.get("arguments") or "{}"
        add(
            "assistant",
            [
                {
                    "type": "tool_use",
                    "id": item["call_id"],
                    "name": item["name"],
                    "input": json.loads(arguments),
                }
            ],
        )
    elif kind == "function_call_output":
        add(
            "user",
            [
                {
                    "type": "tool_result",
                    "tool_use_id": item["call_id"],
                    "content": _text_of(item.get("output")),
                }
            ],
        )
    elif kind != "reasoning":
        # Reasoning items carry nothing a script answers from; anything else
        # (hosted tool calls, images, files) this provider cannot stand in for.
        raise ValueError(f"input item of type {kind!r} is not supported")


def responses_to_neutral(body: JSON) -> JSON:
    # A script answers from the conversation in the request; one kept on the
    # server would make its answer depend on more than the request.
    for kept in ("previous_response_id", "conversation"):
        if body.get(kept):
            raise ValueError(f"{kept} is not supported: send the whole conversation as input")
    request: JSON = {"model": body.get("model"), "max_tokens": body.get("max_output_tokens")}
    systems = [_text_of(body["instructions"])] if body.get("instructions") else []
    messages: list[JSON] = []
    add = _turn_adder(messages)
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items:
        _responses_turn(item, systems, add)
    if systems:
        request["system"] = "\n\n".join(systems)
    request["messages"] = messages
    if body.get("tools"):
        for tool in body["tools"]:
            if tool.get("type") != "function":
                raise ValueError(f"tool of type {tool.get('type')!r} is not supported")
        request["tools"] = [
            {
                "name": t["name"],
                "description": t.get("description") or "",
                "input_schema": t.get("parameters") or {},
            }
            for t in body["tools"]
        ]
    return {k: request[k] for k in _NEUTRAL_ORDER if k in request}


# --------------------------------------------------------------------------
# Neutral reply -> wire bodies and event streams
# --------------------------------------------------------------------------


def _pieces(text: str, parts: int = 3) -> list[str]:
    """Split text in a few pieces, so clients must really concatenate deltas."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _anthropic_message(index: int, response: JSON, usage: JSON, model: str) -> JSON:
    return {
        "id": f"msg_scripted_{index}",
        "type": "message",
        "role": "assistant",
        "model": response.get("model") or model,
        "content": response["content"],
        "stop_reason": response["stop_reason"],
        "stop_sequence": None,
        "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]},
    }


def _anthropic_events(index: int, response: JSON, usage: JSON, model: str) -> list[tuple]:
    start = _anthropic_message(index, response, usage, model)
    start.update(
        content=[],
        stop_reason=None,
        usage={"input_tokens": usage["input_tokens"], "output_tokens": 1},
    )
    events: list[tuple] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(response["content"]):
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": t} for t in _pieces(block["text"])]
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            arguments = json.dumps(block["input"], ensure_ascii=False)
            deltas = [
                {"type": "input_json_delta", "partial_json": t} for t in [""] + _pieces(arguments)
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": first},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": response["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


_FINISH = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length"}


def _openai_parts(response: JSON) -> tuple[str | None, list[JSON]]:
    text = "".join(b["text"] for b in response["content"] if b["type"] == "text")
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {
                "name": b["name"],
                "arguments": json.dumps(b["input"], ensure_ascii=False),
            },
        }
        for b in response["content"]
        if b["type"] == "tool_use"
    ]
    return text or None, calls


def _openai_usage(usage: JSON) -> JSON:
    return {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["input_tokens"] + usage["output_tokens"],
    }


def _openai_completion(index: int, response: JSON, usage: JSON, model: str) -> JSON:
    text, calls = _openai_parts(response)
    message: JSON = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-scripted-{index}",
        "object": "chat.completion",
        "created": 0,
        "model": response.get("model") or model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _FINISH[response["stop_reason"]],
            }
        ],
        "usage": _openai_usage(usage),
    }


def _openai_chunks(
    index: int, response: JSON, usage: JSON, model: str, include_usage: bool
) -> list[tuple]:
    text, calls = _openai_parts(response)
    base = {
        "id": f"chatcmpl-scripted-{index}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": response.get("model") or model,
    }

    def chunk(delta: JSON, finish: str | None = None) -> tuple:
        return (
            None,
            dict(
                base,
                choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            ),
        )

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": t}) for t in _pieces(text or "")]
    for i, call in enumerate(calls):
        chunks.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        chunks += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": t}}]})
            for t in _pieces(call["function"]["arguments"])
        ]
    chunks.append(chunk({}, _FINISH[response["stop_reason"]]))
    if include_usage:
        chunks.append((None, dict(base, choices=[], usage=_openai_usage(usage))))
    return chunks


def _anthropic_error(status: int, message: str) -> JSON:
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": message}}


def _openai_error(status: int, message: str) -> JSON:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# -- OpenAI Responses -------------------------------------------------------------


def _reasoning_item(index: int, body: JSON) -> JSON | None:
    """The reasoning item a reasoning request gets first (it carries no text a script wrote)."""
    effort = (body.get("reasoning") or {}).get("effort")
    if effort in (None, "none"):
        return None
    item: JSON = {"type": "reasoning", "id": f"rs_scripted_{index}", "summary": []}
    # A stateless caller (store false) asks for the reasoning back, opaque, to send it again.
    if "reasoning.encrypted_content" in (body.get("include") or []):
        item["encrypted_content"] = f"scripted-opaque-reasoning-{index}"
    return item


def _responses_items(index: int, response: JSON, body: JSON) -> list[JSON]:
    """The output items of a reply: reasoning if asked, a message for its
    text, one item per tool call."""
    reasoning = _reasoning_item(index, body)
    items: list[JSON] = [reasoning] if reasoning else []
    texts = [b["text"] for b in response["content"] if b["type"] == "text"]
    if texts:
        items.append(
            {
                "type": "message",
                "id": f"msg_scripted_{index}",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": t, "annotations": [], "logprobs": []}
                    for t in texts
                ],
            }
        )
    for i, block in enumerate(b for b in response["content"] if b["type"] == "tool_use"):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_scripted_{index}_{i}",
                "call_id": block["id"],
                "name": block["name"],
                "status": "completed",
                "arguments": json.dumps(block["input"], ensure_ascii=False),
            }
        )
    return items


def _responses_object(
    index: int, response: JSON, usage: JSON, body: JSON, *, done: bool = True
) -> JSON:
    """A Response object; while streaming (``done`` false) it has no output or usage yet."""
    truncated = response["stop_reason"] == "max_tokens"
    status = ("incomplete" if truncated else "completed") if done else "in_progress"
    return {
        "id": f"resp_scripted_{index}",
        "object": "response",
        "created_at": 0,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if done and truncated else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": response.get("model") or body.get("model", ""),
        "output": _responses_items(index, response, body) if done else [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": body.get("reasoning"),
        "store": body.get("store", True),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": usage["input_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["output_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["input_tokens"] + usage["output_tokens"],
        }
        if done
        else None,
    }


def _responses_item_events(item: JSON, out: int) -> list[JSON]:
    """The events that build one output item, from added to done."""
    base = {"item_id": item["id"], "output_index": out}
    empty = dict(item, status="in_progress")
    if item["type"] == "reasoning":
        return [
            {"type": "response.output_item.added", "output_index": out, "item": item},
            {"type": "response.output_item.done", "output_index": out, "item": item},
        ]
    if item["type"] == "function_call":
        empty["arguments"] = ""
        return (
            [{"type": "response.output_item.added", "output_index": out, "item": empty}]
            + [
                dict(base, type="response.function_call_arguments.delta", delta=t)
                for t in _pieces(item["arguments"])
            ]
            + [
                dict(
                    base,
                    type="response.function_call_arguments.done",
                    name=item["name"],
                    arguments=item["arguments"],
                ),
                {"type": "response.output_item.done", "output_index": out, "item": item},
            ]
        )
    events = [
        {"type": "response.output_item.added", "output_index": out, "item": dict(empty, content=[])}
    ]
    for c, part in enumerate(item["content"]):
        at = dict(base, content_index=c)
        events.append(dict(at, type="response.content_part.added", part=dict(part, text="")))
        events += [
            dict(at, type="response.output_text.delta", delta=t, logprobs=[])
            for t in _pieces(part["text"])
        ]
        events += [
            dict(at, type="response.output_text.done", text=part["text"], logprobs=[]),
            dict(at, type="response.content_part.done", part=part),
        ]
    events.append({"type": "response.output_item.done", "output_index": out, "item": item})
    return events


def _responses_events(index: int, response: JSON, usage: JSON, body: JSON) -> list[tuple]:
    """The SSE events of a streamed Response, each with its type and sequence number."""
    pending = _responses_object(index, response, usage, body, done=False)
    final = _responses_object(index, response, usage, body)
    events = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for out, item in enumerate(final["output"]):
        events += _responses_item_events(item, out)
    last = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append({"type": last, "response": final})
    return _numbered(events)


def _numbered(events: list[JSON]) -> list[tuple]:
    """Named SSE events, numbered in order as the Responses stream numbers them."""
    return [(e["type"], dict(e, sequence_number=n)) for n, e in enumerate(events)]


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
        error = _anthropic_error if call.wire == "anthropic" else _openai_error
        if isinstance(reply, ErrorReply):
            return reply.status, "application/json", _json_bytes(error(reply.status, reply.message))
        if isinstance(reply, FailedResponse):
            return self._failed(call, reply.message)
        response, usage = reply
        model = call.body.get("model", "")
        if call.wire == "responses":
            if call.stream:
                return (
                    200,
                    "text/event-stream",
                    _sse(_responses_events(call.index, response, usage, call.body), named=True),
                )
            return (
                200,
                "application/json",
                _json_bytes(_responses_object(call.index, response, usage, call.body)),
            )
        if call.wire == "anthropic":
            if call.stream:
                return (
                    200,
                    "text/event-stream",
                    _sse(_anthropic_events(call.index, response, usage, model), named=True),
                )
            return (
                200,
                "application/json",
                _json_bytes(_anthropic_message(call.index, response, usage, model)),
            )
        if call.stream:
            include_usage = bool((call.body.get("stream_options") or {}).get("include_usage"))
            chunks = _openai_chunks(call.index, response, usage, model, include_usage)
            return 200, "text/event-stream", _sse(chunks, named=False) + b"data: [DONE]\n\n"
        return (
            200,
            "application/json",
            _json_bytes(_openai_completion(call.index, response, usage, model)),
        )

    def _failed(self, call: ProviderCall, message: str) -> tuple[int, str, bytes]:
        if call.wire != "responses":
            error = _anthropic_error if call.wire == "anthropic" else _openai_error
            return 500, "application/json", _json_bytes(error(500, message))
        empty = (
            {"content": [], "stop_reason": "end_turn"},
            {"input_tokens": 0, "output_tokens": 0},
        )
        failed = _responses_object(call.index, *empty, call.body)
        failed.update(
            status="failed",
            output=[],
            usage=None,
            error={"code": "server_error", "message": message},
        )
        if not call.stream:
            return 200, "application/json", _json_bytes(failed)
        pending = _responses_object(call.index, *empty, call.body, done=False)
        events = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
            {"type": "response.failed", "response": failed},
        ]
        return 200, "text/event-stream", _sse(_numbered(events), named=True)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _sse(events: list[tuple], *, named: bool) -> bytes:
    # Anthropic and OpenAI Responses name every event; Chat Completions sends bare data lines.
    out = []
    for name, data in events:
        prefix = f"event: {name}\n" if named and name else ""
        out.append(f"{prefix}data: {json.dumps(data, ensure_ascii=False)}\n\n")
    return "".join(out).encode()


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
                _json_bytes(
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
            error = _anthropic_error if wire == "anthropic" else _openai_error
            try:
                body = json.loads(raw)
                request = to_neutral(body)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._send(
                    400,
                    "application/json",
                    _json_bytes(error(400, f"scripted provider: bad request: {exc!r}")),
                )
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            call = provider._record(wire, body, request, headers, tuple(self.client_address[:2]))
            try:
                status, content_type, payload = provider._answer(call)
            except Exception as exc:  # noqa: BLE001 - a failing script must surface in the test
                status, content_type = 500, "application/json"
                payload = _json_bytes(
                    error(500, f"scripted provider: script failed on call {call.index}: {exc!r}")
                )
            try:
                self._send(status, content_type, payload)
            except OSError:
                pass  # the client went away (e.g. it was killed); the call still counts

    return Handler
