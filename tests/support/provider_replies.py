"""The scripted provider's answers: a neutral reply written as each wire's body or event stream
(Anthropic Messages, OpenAI Chat Completions, OpenAI Responses), and each wire's error body.

Written independently of ``salvor.daemon.models._wire`` on purpose (see ``scripted_provider``).
"""

from __future__ import annotations

import json
from typing import Any

JSON = dict[str, Any]


def _pieces(text: str, parts: int = 3) -> list[str]:
    """Split text in a few pieces, so clients must really concatenate deltas."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def anthropic_message(index: int, response: JSON, usage: JSON, model: str) -> JSON:
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


def anthropic_events(index: int, response: JSON, usage: JSON, model: str) -> list[tuple]:
    start = anthropic_message(index, response, usage, model)
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


def openai_completion(index: int, response: JSON, usage: JSON, model: str) -> JSON:
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


def openai_chunks(
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


def anthropic_error(status: int, message: str) -> JSON:
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


def openai_error(status: int, message: str) -> JSON:
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


def responses_object(
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


def responses_events(index: int, response: JSON, usage: JSON, body: JSON) -> list[tuple]:
    """The SSE events of a streamed Response, each with its type and sequence number."""
    pending = responses_object(index, response, usage, body, done=False)
    final = responses_object(index, response, usage, body)
    events = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for out, item in enumerate(final["output"]):
        events += _responses_item_events(item, out)
    last = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append({"type": last, "response": final})
    return numbered(events)


def numbered(events: list[JSON]) -> list[tuple]:
    """Named SSE events, numbered in order as the Responses stream numbers them."""
    return [(e["type"], dict(e, sequence_number=n)) for n, e in enumerate(events)]


def json_bytes(value: Any) -> bytes:
    """A JSON body as the provider sends it."""
    return json.dumps(value, ensure_ascii=False).encode()


def sse(events: list[tuple], *, named: bool) -> bytes:
    """Server-sent events: (name, data) pairs, named or bare."""
    # Anthropic and OpenAI Responses name every event; Chat Completions sends bare data lines.
    out = []
    for name, data in events:
        prefix = f"event: {name}\n" if named and name else ""
        out.append(f"{prefix}data: {json.dumps(data, ensure_ascii=False)}\n\n")
    return "".join(out).encode()
