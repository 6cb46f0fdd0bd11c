"""What the loopback model proxy knows about each wire format, as pure functions.

Three wires are spoken: OpenAI Chat Completions (``openai.chat``), OpenAI
Responses (``openai.responses``) and Anthropic Messages
(``anthropic.messages``). A recorded response is ``{"wire", "body"}`` for a
plain call or ``{"wire", "frames": [[event, data], ...]}`` for a streamed one,
the frames exactly as the upstream cut them. Everything here reads requests
and recorded responses; nothing does I/O, so the proxy's record-or-replay
decisions can be tested without a socket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from salvor.protocol import sse_frame

OPENAI_CHAT = "openai.chat"
OPENAI_RESPONSES = "openai.responses"
ANTHROPIC_MESSAGES = "anthropic.messages"
ROUTES = {
    "v1/chat/completions": OPENAI_CHAT,
    "v1/responses": OPENAI_RESPONSES,
    "v1/messages": ANTHROPIC_MESSAGES,
}
UPSTREAM_PATH = {
    OPENAI_CHAT: "chat/completions",
    OPENAI_RESPONSES: "responses",
    ANTHROPIC_MESSAGES: "messages",
}

# The Responses stream events that end a response, and the one of them that
# means it was not produced at all.
_RESPONSES_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_RESPONSES_BROKEN = ("response.failed", "error")


# --------------------------------------------------------------------------
# Requests: what is hashed, and how two requests differ
# --------------------------------------------------------------------------


def hashed_request(wire: str, body: dict) -> dict:
    """What a call's ``request_hash`` covers: the wire and the body minus stream knobs."""
    return {
        "wire": wire,
        "body": {k: v for k, v in body.items() if k not in ("stream", "stream_options")},
    }


def _roles(wire: str | None, body: dict) -> list:
    if wire != OPENAI_RESPONSES:
        return [m.get("role") for m in body.get("messages") or [] if isinstance(m, dict)]
    items = body.get("input")
    if isinstance(items, str):
        return ["user"]
    # An input item without a role (a tool call, its output, reasoning) is named by its type.
    return [item.get("role") or item.get("type") for item in items or [] if isinstance(item, dict)]


def envelope(request: dict) -> dict:
    """The envelope of a hashed request: model, tool names, message roles."""
    body = request.get("body") or {}
    tools = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            # Chat nests the name under "function"; a hosted Responses tool has only a type.
            tools.append(
                tool.get("name") or (tool.get("function") or {}).get("name") or tool.get("type")
            )
    return {"model": body.get("model"), "tools": tools, "roles": _roles(request.get("wire"), body)}


def divergence_report(asked: dict, recorded: dict | None, recorded_model: str | None) -> str:
    """How a model request differs from the recorded one, for the
    replay lane's divergence report."""
    now = envelope(asked)
    if recorded is None:
        detail = (
            "the recording kept no request body (record_prompts is off), so only its hash is "
            f"compared; the call now asks for model {now['model']!r} with tools {now['tools']} "
            f"and message roles {now['roles']}"
        )
        if recorded_model is not None and recorded_model != now["model"]:
            detail = (
                f"model {now['model']!r} where the recorded call was "
                f"answered by {recorded_model!r}; " + detail
            )
        return detail
    was = envelope(recorded)
    diffs = []
    if recorded.get("wire") != asked.get("wire"):
        diffs.append(f"wire {asked.get('wire')!r} where the recording has {recorded.get('wire')!r}")
    for key, what in (("model", "model"), ("tools", "tool names"), ("roles", "message roles")):
        if now[key] != was[key]:
            diffs.append(f"{what} {now[key]!r} where the recording has {was[key]!r}")
    if not diffs:
        diffs.append(
            "same model, tool names and message roles; the body differs at "
            f"{_first_diff(asked, recorded)}"
        )
    return "; ".join(diffs)


# Recursion: one frame per level; an agent's model request is at most MAX_NESTING (128) levels deep
# (the proxy parses it strictly), far under Python's limit of 1000.
def _first_diff(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or a[key] != b[key]:
                return _first_diff(a.get(key), b.get(key), f"{path}.{key}" if path else key)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path or '<root>'} (length {len(a)} vs recorded {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_diff(x, y, f"{path}[{i}]")
    return path or "<root>"


# --------------------------------------------------------------------------
# Recorded responses: usage, final text, completeness
# --------------------------------------------------------------------------


def _tokens(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def _body_usage(wire: str, raw: Any) -> dict:
    if not isinstance(raw, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    if wire == OPENAI_CHAT:
        return {
            "input_tokens": _tokens(raw.get("prompt_tokens")),
            "output_tokens": _tokens(raw.get("completion_tokens")),
        }
    return {
        "input_tokens": _tokens(raw.get("input_tokens")),
        "output_tokens": _tokens(raw.get("output_tokens")),
    }


def frame_values(response: dict) -> Iterator[tuple[str | None, dict]]:
    """The recorded frames whose data is a JSON object, decoded."""
    for event, data in response.get("frames") or []:
        try:
            value = json.loads(data)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield event, value


def _final_response(response: dict) -> dict | None:
    """The Response object a Responses stream ended with, if it got that far."""
    for _, data in frame_values(response):
        if data.get("type") in _RESPONSES_TERMINAL and isinstance(data.get("response"), dict):
            return data["response"]
    return None


def usage_of(wire: str, response: dict) -> dict:
    """Token usage from a recorded response (body or frames); zero when the provider sent none."""
    if "body" in response:
        body = response["body"]
        return _body_usage(wire, body.get("usage") if isinstance(body, dict) else None)
    if wire == OPENAI_RESPONSES:
        return _body_usage(wire, (_final_response(response) or {}).get("usage"))
    usage = {"input_tokens": 0, "output_tokens": 0}
    for _, data in frame_values(response):
        if wire == OPENAI_CHAT:
            if isinstance(data.get("usage"), dict):
                usage = _body_usage(wire, data["usage"])
        elif data.get("type") == "message_start":
            raw = (data.get("message") or {}).get("usage") or {}
            usage["input_tokens"] = _tokens(raw.get("input_tokens"))
            usage["output_tokens"] = max(usage["output_tokens"], _tokens(raw.get("output_tokens")))
        elif data.get("type") == "message_delta":
            raw = data.get("usage") or {}
            usage["output_tokens"] = _tokens(raw.get("output_tokens")) or usage["output_tokens"]
    return usage


def _chat_text(body: dict) -> str | None:
    message = ((body.get("choices") or [{}])[0] or {}).get("message") or {}
    if message.get("tool_calls"):
        return None
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _responses_text(body: dict) -> str | None:
    items = [item for item in body.get("output") or [] if isinstance(item, dict)]
    if any(item.get("type") == "function_call" for item in items):
        return None
    return "".join(
        part.get("text", "")
        for item in items
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    )


def _anthropic_text(body: dict) -> str | None:
    blocks = body.get("content") or []
    if any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks):
        return None
    return "".join(
        b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )


_BODY_TEXT = {
    OPENAI_CHAT: _chat_text,
    OPENAI_RESPONSES: _responses_text,
    ANTHROPIC_MESSAGES: _anthropic_text,
}


def final_text(wire: str, response: dict) -> str | None:
    """The assistant text of a recorded response; None when the turn called a tool."""
    if "body" in response:
        return _BODY_TEXT[wire](response["body"] if isinstance(response["body"], dict) else {})
    if wire == OPENAI_RESPONSES:
        return _responses_text(_final_response(response) or {})
    parts: list[str] = []
    for _, data in frame_values(response):
        if wire == OPENAI_CHAT:
            delta = ((data.get("choices") or [{}])[0] or {}).get("delta") or {}
            if delta.get("tool_calls"):
                return None
            if isinstance(delta.get("content"), str):
                parts.append(delta["content"])
        elif (
            data.get("type") == "content_block_start"
            and (data.get("content_block") or {}).get("type") == "tool_use"
        ):
            return None
        elif (
            data.get("type") == "content_block_delta"
            and (data.get("delta") or {}).get("type") == "text_delta"
        ):
            parts.append(data["delta"].get("text", ""))
    return "".join(parts)


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as the model meant them: the parsed object when they are JSON
    text (the OpenAI wires send a string), else as sent (a malformed string stays a string)."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _chat_calls(body: dict) -> list[dict]:
    message = ((body.get("choices") or [{}])[0] or {}).get("message") or {}
    return [
        {"name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))}
        for call in message.get("tool_calls") or []
        if isinstance(call, dict) and isinstance(fn := call.get("function"), dict)
    ]


def _responses_calls(body: dict) -> list[dict]:
    return [
        {"name": item.get("name"), "arguments": _arguments(item.get("arguments"))}
        for item in body.get("output") or []
        if isinstance(item, dict) and item.get("type") == "function_call"
    ]


def _anthropic_calls(body: dict) -> list[dict]:
    return [
        {"name": block.get("name"), "arguments": block.get("input")}
        for block in body.get("content") or []
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]


_BODY_CALLS = {
    OPENAI_CHAT: _chat_calls,
    OPENAI_RESPONSES: _responses_calls,
    ANTHROPIC_MESSAGES: _anthropic_calls,
}


def final_tool_calls(wire: str, response: dict) -> list[dict]:
    """The tool calls a recorded response made, in order, each ``{"name", "arguments"}``;
    empty when the turn called none. A stream's calls are put together from its deltas."""
    if "body" in response:
        body = response["body"]
        return _BODY_CALLS[wire](body if isinstance(body, dict) else {})
    if wire == OPENAI_RESPONSES:
        return _responses_calls(_final_response(response) or {})
    calls: dict[int, dict] = {}
    for _, data in frame_values(response):
        if wire == OPENAI_CHAT:
            delta = ((data.get("choices") or [{}])[0] or {}).get("delta") or {}
            for part in delta.get("tool_calls") or []:
                if not isinstance(part, dict):
                    continue
                call = calls.setdefault(part.get("index", 0), {"name": "", "arguments": ""})
                fn = part.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
        elif data.get("type") == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                calls[data.get("index", 0)] = {"name": block.get("name"), "arguments": ""}
        elif data.get("type") == "content_block_delta" and data.get("index", 0) in calls:
            delta = data.get("delta") or {}
            if delta.get("type") == "input_json_delta":
                calls[data.get("index", 0)]["arguments"] += delta.get("partial_json") or ""
    # An Anthropic tool call with no input deltas took no arguments.
    return [
        {"name": c["name"], "arguments": _arguments(c["arguments"] or "{}")}
        for _, c in sorted(calls.items())
    ]


def carries_text(value: Any, text: str) -> bool:
    """Whether some string inside a request body (a message, an instruction, a part) holds
    ``text``: the body is walked as JSON, so escaping on the wire does not hide it."""
    if isinstance(value, str):
        return text in value
    if isinstance(value, dict):
        return any(carries_text(v, text) for v in value.values())
    if isinstance(value, list):
        return any(carries_text(v, text) for v in value)
    return False


def stream_complete(wire: str, frames: list) -> bool:
    """Whether a stream reached the event that makes its answer final.

    A Responses stream cut short of a terminal event, or ending in
    ``response.failed`` or an ``error`` event, produced no answer: the call
    stays open and is issued again. ``response.incomplete`` is an answer
    (the model stopped at its output limit), as a plain body with that
    status is, and as a chat stream that stopped for ``length`` is.
    """
    if wire == OPENAI_CHAT:
        return any(data.strip() == "[DONE]" for _, data in frames)
    if wire == ANTHROPIC_MESSAGES:
        return any(event == "message_stop" for event, _ in frames)
    kinds = [event or data.get("type") for event, data in frame_values({"frames": frames})]
    return not any(kind in _RESPONSES_BROKEN for kind in kinds) and any(
        kind in _RESPONSES_TERMINAL for kind in kinds
    )


def body_complete(wire: str, body: Any) -> bool:
    """Whether a plain answer is one to record (a failed Response is not: it is retried)."""
    return not (
        wire == OPENAI_RESPONSES and isinstance(body, dict) and body.get("status") == "failed"
    )


def encode_frames(frames: Sequence[Sequence]) -> bytes:
    """SSE bytes re-emitting recorded frames exactly as they were cut."""
    return b"".join(sse_frame(data, event=event or None) for event, data in frames)


def error_body(wire: str, status: int, message: str) -> dict:
    """An error in the shape the agent's client expects."""
    if wire == ANTHROPIC_MESSAGES:
        kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    # Both OpenAI wires share one error shape.
    return {
        "error": {"message": message, "type": "salvor_proxy_error", "param": None, "code": status}
    }
