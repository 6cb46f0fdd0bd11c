"""The two model wire formats, translated to and from salvor's neutral shape.

Rules of this module:

* It is pure and synchronous: no IO, no trio, no httpx. The gateway owns the
  network; this module owns the shapes.
* Internally salvor speaks one provider-neutral, Anthropic-shaped request and
  response. Those dicts are hashed and recorded in the run's log, so every
  function here returns plain JSON values built in a fixed key order and
  never copies provider-only fields (ids, cache hints, logprobs) into them.
* A streamed answer is assembled into the provider's own non-streaming body
  and then decoded by the same function as a non-streamed one, so the two
  paths cannot drift apart.

A malformed provider answer raises :class:`WireError`; nothing is kept of
the partial answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

JSON = dict[str, Any]

ANTHROPIC_VERSION = "2023-06-01"


class WireError(ValueError):
    """The provider's answer does not have the shape its wire format promises."""


class StreamedError(Exception):
    """An error event inside an otherwise successful stream."""

    def __init__(self, message: str, kind: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class StreamAssembler(Protocol):
    def feed(self, event: str | None, data: str) -> None: ...

    def finish(self) -> tuple[JSON, JSON]: ...


def _loads(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise WireError(f"provider sent invalid JSON: {data[:200]!r}") from None


def _usage(input_tokens: Any, output_tokens: Any) -> JSON:
    return {"input_tokens": int(input_tokens or 0), "output_tokens": int(output_tokens or 0)}


def error_message(body: Any) -> str | None:
    """The human message of a provider error body, in either wire format."""
    # Both providers nest it the same way: {"error": {"message": ...}}.
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if isinstance(body.get("message"), str):
            return body["message"]
    return None


# --------------------------------------------------------------------------
# Anthropic Messages
# --------------------------------------------------------------------------

_ANTHROPIC_STOP = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    # No neutral equivalent: the model ended its turn for its own reason.
    "stop_sequence": "end_turn",
    "pause_turn": "end_turn",
    "refusal": "end_turn",
}


def anthropic_headers(api_key: str | None) -> dict[str, str]:
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if api_key:
        headers["x-api-key"] = api_key
    return headers


def anthropic_body(request: JSON, *, stream: bool) -> JSON:
    """The Messages API body for a neutral request (already Anthropic-shaped)."""
    body: JSON = {"model": request["model"], "max_tokens": request["max_tokens"]}
    if "system" in request:
        body["system"] = request["system"]
    body["messages"] = request["messages"]
    if "tools" in request:
        body["tools"] = request["tools"]
    if stream:
        body["stream"] = True
    return body


def anthropic_decode(body: Any, *, fallback_model: str) -> tuple[JSON, JSON]:
    """Neutral (response, usage) from a Messages API response body."""
    if not isinstance(body, dict) or not isinstance(body.get("content"), list):
        raise WireError("Anthropic response has no content list")
    content: list[JSON] = []
    for block in body["content"]:
        kind = block.get("type")
        if kind == "text":
            content.append({"type": "text", "text": block.get("text", "")})
        elif kind == "tool_use":
            if not isinstance(block.get("input"), dict):
                raise WireError("Anthropic tool_use block has no input object")
            content.append(
                {
                    "type": "tool_use",
                    "id": block["id"],
                    "name": block["name"],
                    "input": block["input"],
                }
            )
        # Thinking and other provider-only blocks are not part of the neutral
        # shape; dropping them keeps recorded hashes provider-independent.
    stop = _ANTHROPIC_STOP.get(body.get("stop_reason") or "end_turn", "end_turn")
    usage = body.get("usage") or {}
    # Cached prompt tokens are still billed input, so budgets count them.
    input_tokens = (
        int(usage.get("input_tokens") or 0)
        + int(usage.get("cache_creation_input_tokens") or 0)
        + int(usage.get("cache_read_input_tokens") or 0)
    )
    response = {
        "model": body.get("model") or fallback_model,
        "content": content,
        "stop_reason": stop,
    }
    return response, _usage(input_tokens, usage.get("output_tokens"))


class AnthropicStream:
    """Rebuilds a Messages API response body from its server-sent events."""

    def __init__(self, *, fallback_model: str) -> None:
        self._fallback_model = fallback_model
        self._message: JSON = {}
        self._blocks: dict[int, JSON] = {}
        self._partial_json: dict[int, list[str]] = {}
        self._usage: JSON = {}
        self._stop_reason: str | None = None

    def feed(self, event: str | None, data: str) -> None:
        payload = _loads(data)
        kind = event or payload.get("type")
        if kind == "message_start":
            self._message = dict(payload.get("message") or {})
            self._usage.update(self._message.get("usage") or {})
        elif kind == "content_block_start":
            index = int(payload["index"])
            self._blocks[index] = dict(payload["content_block"])
            self._partial_json[index] = []
        elif kind == "content_block_delta":
            index = int(payload["index"])
            if index not in self._blocks:
                raise WireError(f"Anthropic stream sent a delta for unknown block {index}")
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta":
                block = self._blocks[index]
                block["text"] = block.get("text", "") + delta.get("text", "")
            elif delta.get("type") == "input_json_delta":
                self._partial_json[index].append(delta.get("partial_json", ""))
        elif kind == "message_delta":
            delta = payload.get("delta") or {}
            if delta.get("stop_reason") is not None:
                self._stop_reason = delta["stop_reason"]
            # message_delta usage is cumulative: it supersedes message_start's.
            self._usage.update(payload.get("usage") or {})
        elif kind == "error":
            raise StreamedError(
                error_message(payload) or "stream error", (payload.get("error") or {}).get("type")
            )
        # ping, content_block_stop and message_stop carry nothing to keep.

    def finish(self) -> tuple[JSON, JSON]:
        if not self._message:
            raise WireError("Anthropic stream ended without message_start")
        content = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if block.get("type") == "tool_use":
                text = "".join(self._partial_json[index])
                block["input"] = _loads(text) if text else (block.get("input") or {})
            content.append(block)
        body = dict(
            self._message, content=content, stop_reason=self._stop_reason, usage=self._usage
        )
        return anthropic_decode(body, fallback_model=self._fallback_model)


# --------------------------------------------------------------------------
# OpenAI Chat Completions
# --------------------------------------------------------------------------

_OPENAI_STOP = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "end_turn",
}


def openai_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _arguments(tool_input: JSON) -> str:
    return json.dumps(tool_input, ensure_ascii=False, separators=(",", ":"))


def _openai_messages(request: JSON) -> list[JSON]:
    messages: list[JSON] = []
    if "system" in request:
        messages.append({"role": "system", "content": request["system"]})
    for message in request["messages"]:
        if message["role"] == "assistant":
            messages.append(_openai_assistant(message["content"]))
            continue
        # A user turn may carry tool results and text; OpenAI wants each
        # result as its own "tool" message, in the order they were given.
        texts: list[str] = []
        for block in message["content"]:
            if block["type"] == "tool_result":
                if texts:
                    messages.append(_openai_user(texts))
                    texts = []
                # OpenAI has no error flag on a tool message; the content
                # itself must say what went wrong.
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": block["tool_use_id"],
                        "content": block["content"],
                    }
                )
            elif block["type"] == "text":
                texts.append(block["text"])
        if texts:
            messages.append(_openai_user(texts))
    return messages


def _openai_user(texts: list[str]) -> JSON:
    if len(texts) == 1:
        return {"role": "user", "content": texts[0]}
    return {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}


def _openai_assistant(blocks: list[JSON]) -> JSON:
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": _arguments(b["input"])},
        }
        for b in blocks
        if b["type"] == "tool_use"
    ]
    message: JSON = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def openai_body(request: JSON, *, stream: bool) -> JSON:
    """The Chat Completions body for a neutral request."""
    body: JSON = {
        "model": request["model"],
        "max_tokens": request["max_tokens"],
        "messages": _openai_messages(request),
    }
    if "tools" in request:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t["input_schema"],
                },
            }
            for t in request["tools"]
        ]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def openai_decode(body: Any, *, fallback_model: str) -> tuple[JSON, JSON]:
    """Neutral (response, usage) from a Chat Completions response body."""
    if not isinstance(body, dict) or not body.get("choices"):
        raise WireError("OpenAI response has no choices")
    choice = body["choices"][0]
    message = choice.get("message") or {}
    content: list[JSON] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        tool_input = _loads(arguments) if arguments else {}
        if not isinstance(tool_input, dict):
            raise WireError(f"OpenAI tool call {function.get('name')!r} has non-object arguments")
        content.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": tool_input}
        )
    stop = _OPENAI_STOP.get(choice.get("finish_reason") or "stop", "end_turn")
    # Some OpenAI-compatible servers report "stop" beside tool calls; the
    # calls are what the agent loop must act on.
    if stop == "end_turn" and any(b["type"] == "tool_use" for b in content):
        stop = "tool_use"
    usage = body.get("usage") or {}
    response = {
        "model": body.get("model") or fallback_model,
        "content": content,
        "stop_reason": stop,
    }
    return response, _usage(usage.get("prompt_tokens"), usage.get("completion_tokens"))


class OpenAIStream:
    """Rebuilds a Chat Completions response body from its streamed chunks."""

    def __init__(self, *, fallback_model: str) -> None:
        self._fallback_model = fallback_model
        self._model: str | None = None
        self._text: list[str] = []
        self._calls: dict[int, JSON] = {}
        self._finish_reason: str | None = None
        self._usage: JSON | None = None
        self._seen_chunk = False

    def feed(self, event: str | None, data: str) -> None:
        if data.strip() == "[DONE]":
            return
        chunk = _loads(data)
        if "error" in chunk:
            error = chunk.get("error") or {}
            raise StreamedError(
                error_message(chunk) or "stream error",
                error.get("type") if isinstance(error, dict) else None,
            )
        self._seen_chunk = True
        self._model = chunk.get("model") or self._model
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            for part in delta.get("tool_calls") or []:
                call = self._calls.setdefault(
                    int(part.get("index", 0)), {"id": None, "name": "", "arguments": []}
                )
                if part.get("id"):
                    call["id"] = part["id"]
                function = part.get("function") or {}
                if function.get("name"):
                    call["name"] += function["name"]
                if function.get("arguments"):
                    call["arguments"].append(function["arguments"])
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]

    def finish(self) -> tuple[JSON, JSON]:
        if not self._seen_chunk:
            raise WireError("OpenAI stream ended without a chunk")
        message: JSON = {"role": "assistant", "content": "".join(self._text) or None}
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
                }
                for _, c in sorted(self._calls.items())
            ]
        body = {
            "model": self._model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason}],
            "usage": self._usage,
        }
        return openai_decode(body, fallback_model=self._fallback_model)


# --------------------------------------------------------------------------
# One table for both wires, so the gateway has a single code path.
# --------------------------------------------------------------------------


def ticker(provider: str, event: str | None, data: str) -> JSON | None:
    """The live-ticker part of one streamed provider event: text, thinking,
    or usage; None for the rest."""
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    if provider == "anthropic":
        kind = event or payload.get("type")
        delta = payload.get("delta") or {}
        if kind == "content_block_delta" and delta.get("type") == "text_delta":
            return {
                "type": "text_delta",
                "index": payload.get("index", 0),
                "text": delta.get("text", ""),
            }
        if kind == "content_block_delta" and delta.get("type") == "thinking_delta":
            return {
                "type": "thinking_delta",
                "index": payload.get("index", 0),
                "thinking": delta.get("thinking", ""),
            }
        if kind == "message_delta" and isinstance(payload.get("usage"), dict):
            return {"type": "usage", "usage": payload["usage"]}
        return None
    choice = (payload.get("choices") or [{}])[0] or {}
    text = (choice.get("delta") or {}).get("content")
    if isinstance(text, str) and text:
        return {"type": "text_delta", "index": 0, "text": text}
    if isinstance(payload.get("usage"), dict):
        return {"type": "usage", "usage": payload["usage"]}
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Wire:
    """What the gateway needs to know about one provider's wire format."""

    path: str
    headers: Callable[[str | None], dict[str, str]]
    body: Callable[..., JSON]
    decode: Callable[..., tuple[JSON, JSON]]
    stream: Callable[..., StreamAssembler]


WIRES: dict[str, Wire] = {
    "anthropic": Wire(
        path="messages",
        headers=anthropic_headers,
        body=anthropic_body,
        decode=anthropic_decode,
        stream=AnthropicStream,
    ),
    "openai": Wire(
        path="chat/completions",
        headers=openai_headers,
        body=openai_body,
        decode=openai_decode,
        stream=OpenAIStream,
    ),
}
