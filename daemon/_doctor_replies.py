"""The canned answers ``salvor doctor`` gives a model call, one per wire format.

Doctor calls no model: whatever the agent asks, it gets one short final
assistant text, shaped exactly as its client's SDK expects it, so a real
client parses it and the agent ends its turn. A wire has two shapes, a JSON
body and the SSE frames of a stream; both are built from the same text.

A wire the proxy routes but this table lacks is answered with an error by
the caller; adding a wire (the OpenAI Responses API, say) is one more entry
in ``CANNED``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._model_proxy import ANTHROPIC_MESSAGES, OPENAI_CHAT

JSON = dict[str, Any]
Frames = list[tuple[str | None, str]]

REPLY_TEXT = "salvor doctor: your model call reached the salvor proxy (a canned reply; no model was called)."
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
        "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY_TEXT},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": dict(_ZERO_OPENAI_USAGE),
    }


def _openai_frames(request: JSON) -> Frames:
    head = {"id": "chatcmpl-salvor-doctor", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": _model(request)}

    def chunk(delta: JSON, finish: str | None) -> str:
        return _data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

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
    return {"id": "msg_salvor_doctor", "type": "message", "role": "assistant", "model": _model(request),
            "content": content, "stop_reason": stop, "stop_sequence": None, "usage": dict(_ZERO_ANTHROPIC_USAGE)}


def _anthropic_body(request: JSON) -> JSON:
    return _anthropic_message(request, [{"type": "text", "text": REPLY_TEXT}], "end_turn")


def _anthropic_frames(request: JSON) -> Frames:
    events = [
        {"type": "message_start", "message": _anthropic_message(request, [], None)},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": REPLY_TEXT}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
         "usage": {"output_tokens": 0}},
        {"type": "message_stop"},
    ]
    return [(event["type"], _data(event)) for event in events]


CANNED: dict[str, Canned] = {
    OPENAI_CHAT: Canned("OpenAI chat completions", _openai_body, _openai_frames),
    ANTHROPIC_MESSAGES: Canned("Anthropic messages", _anthropic_body, _anthropic_frames),
}
