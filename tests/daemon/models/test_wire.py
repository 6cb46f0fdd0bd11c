"""Edge cases of the wire codecs that the scripted provider never sends."""

from __future__ import annotations

import json

import pytest
from salvor.daemon.models._wire import (
    AnthropicStream,
    OpenAIStream,
    StreamedError,
    WireError,
    anthropic_decode,
    openai_decode,
)


def test_anthropic_stream_error_event_is_raised():
    stream = AnthropicStream(fallback_model="m")
    stream.feed("message_start", json.dumps({"message": {"model": "m", "usage": {}}}))
    with pytest.raises(StreamedError) as caught:
        stream.feed(
            "error",
            json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
        )
    assert (caught.value.kind, caught.value.message) == ("overloaded_error", "busy")


def test_anthropic_cached_input_tokens_count_as_input():
    body = {
        "model": "m",
        "content": [],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 3,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 20,
            "output_tokens": 2,
        },
    }
    assert anthropic_decode(body, fallback_model="m")[1] == {
        "input_tokens": 123,
        "output_tokens": 2,
    }


def test_anthropic_drops_provider_only_blocks_and_maps_stop_sequence():
    body = {
        "model": "m",
        "stop_reason": "stop_sequence",
        "usage": {},
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "x"},
            {"type": "text", "text": "hi", "citations": None},
        ],
    }
    response, _ = anthropic_decode(body, fallback_model="m")
    assert response == {
        "model": "m",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
    }


def test_openai_stream_without_usage_chunk_reports_zero_usage():
    stream = OpenAIStream(fallback_model="fallback")
    stream.feed(None, json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}))
    stream.feed(None, json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    stream.feed(None, "[DONE]")
    assert stream.finish() == (
        {
            "model": "fallback",
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
        },
        {"input_tokens": 0, "output_tokens": 0},
    )


def test_openai_tool_calls_beside_stop_still_mean_tool_use():
    body = {
        "model": "m",
        "choices": [
            {
                "finish_reason": "stop",
                "message": {
                    "content": None,
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": ""}}],
                },
            }
        ],
    }
    response, _ = openai_decode(body, fallback_model="m")
    assert response["stop_reason"] == "tool_use"
    assert response["content"] == [{"type": "tool_use", "id": "c1", "name": "f", "input": {}}]


@pytest.mark.parametrize("arguments", ["[1, 2]", "{not json"])
def test_openai_bad_tool_arguments_are_a_wire_error(arguments):
    body = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": arguments}}]
                },
            }
        ]
    }
    with pytest.raises(WireError):
        openai_decode(body, fallback_model="m")
