"""The canned answers ``salvor doctor`` gives a model call, one per wire format.

Doctor calls no model: whatever the agent asks, it gets one short final
assistant text, shaped exactly as its client's SDK expects it, so a real
client parses it and the agent ends its turn. A wire has two shapes, a JSON
body and the SSE frames of a stream; both are built from the same text.

A wire the proxy routes but this table lacks is answered with an error by
the caller; adding a wire is one more entry in ``CANNED``. The OpenAI
Responses entry is keyed by the wire name the proxy gives ``v1/responses``,
so it answers as soon as the proxy routes that path.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..proxies import ANTHROPIC_MESSAGES, OPENAI_CHAT

JSON = dict[str, Any]
Frames = list[tuple[str | None, str]]

REPLY_TEXT = (
    "salvor doctor: your model call reached the salvor proxy (a canned reply; no model was called)."
)
_ZERO_OPENAI_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
_ZERO_ANTHROPIC_USAGE = {"input_tokens": 0, "output_tokens": 0}


@dataclass(frozen=True, slots=True)
class Canned:
    """How to answer one wire: a function of the request body to a JSON body, and to SSE frames."""

    label: str
    body: Callable[[JSON], JSON]
    frames: Callable[[JSON], Frames]


def _model(request: JSON) -> str:
    model = request.get("model")
    return model if isinstance(model, str) and model else "salvor-doctor"


def _data(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- OpenAI Chat Completions --------------------------------------------------


def _openai_body(request: JSON) -> JSON:
    return {
        "id": "chatcmpl-salvor-doctor",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": _model(request),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": REPLY_TEXT},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": dict(_ZERO_OPENAI_USAGE),
    }


def _openai_frames(request: JSON) -> Frames:
    head = {
        "id": "chatcmpl-salvor-doctor",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": _model(request),
    }

    def chunk(delta: JSON, finish: str | None) -> str:
        return _data(
            {
                **head,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }
        )

    frames: Frames = [
        (None, chunk({"role": "assistant", "content": REPLY_TEXT}, None)),
        (None, chunk({}, "stop")),
    ]
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        # The client asked for the usage chunk: one with no choices, last.
        frames.append((None, _data({**head, "choices": [], "usage": dict(_ZERO_OPENAI_USAGE)})))
    frames.append((None, "[DONE]"))
    return frames


# -- Anthropic Messages -------------------------------------------------------


def _anthropic_message(request: JSON, content: list, stop: str | None) -> JSON:
    return {
        "id": "msg_salvor_doctor",
        "type": "message",
        "role": "assistant",
        "model": _model(request),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": dict(_ZERO_ANTHROPIC_USAGE),
    }


def _anthropic_body(request: JSON) -> JSON:
    return _anthropic_message(request, [{"type": "text", "text": REPLY_TEXT}], "end_turn")


def _anthropic_frames(request: JSON) -> Frames:
    events = [
        {"type": "message_start", "message": _anthropic_message(request, [], None)},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": REPLY_TEXT},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 0},
        },
        {"type": "message_stop"},
    ]
    return [(event["type"], _data(event)) for event in events]


# -- OpenAI Responses ---------------------------------------------------------

OPENAI_RESPONSES = "openai.responses"  # the proxy's name for the v1/responses wire


def _responses_message(done: bool) -> JSON:
    content = (
        [{"type": "output_text", "text": REPLY_TEXT, "annotations": [], "logprobs": []}]
        if done
        else []
    )
    return {
        "type": "message",
        "id": "msg_salvor_doctor",
        "role": "assistant",
        "status": "completed" if done else "in_progress",
        "content": content,
    }


def _responses_object(request: JSON, done: bool) -> JSON:
    return {
        "id": "resp_salvor_doctor",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if done else "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "model": _model(request),
        "output": [_responses_message(True)] if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "metadata": {},
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        }
        if done
        else None,
    }


def _responses_body(request: JSON) -> JSON:
    return _responses_object(request, True)


def _responses_frames(request: JSON) -> Frames:
    at = {"item_id": "msg_salvor_doctor", "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": REPLY_TEXT, "annotations": [], "logprobs": []}
    events = [
        {"type": "response.created", "response": _responses_object(request, False)},
        {"type": "response.in_progress", "response": _responses_object(request, False)},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": _responses_message(False),
        },
        {**at, "type": "response.content_part.added", "part": {**part, "text": ""}},
        {**at, "type": "response.output_text.delta", "delta": REPLY_TEXT, "logprobs": []},
        {**at, "type": "response.output_text.done", "text": REPLY_TEXT, "logprobs": []},
        {**at, "type": "response.content_part.done", "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": _responses_message(True)},
        {"type": "response.completed", "response": _responses_object(request, True)},
    ]
    return [(e["type"], _data({**e, "sequence_number": n})) for n, e in enumerate(events)]


CANNED: dict[str, Canned] = {
    OPENAI_CHAT: Canned("OpenAI chat completions", _openai_body, _openai_frames),
    OPENAI_RESPONSES: Canned("OpenAI responses", _responses_body, _responses_frames),
    ANTHROPIC_MESSAGES: Canned("Anthropic messages", _anthropic_body, _anthropic_frames),
}
