"""The proxy's per-wire pure helpers, for the OpenAI Responses wire.

Synchronous and table-driven: recorded responses are written out by hand
here (plain bodies and SSE frames as ``[event, data]``), so these tests pin
what salvor reads from the Responses wire without any socket.
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.proxies._wire import (
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    ROUTES,
    UPSTREAM_PATH,
    body_complete,
    divergence_report,
    envelope,
    error_body,
    final_text,
    hashed_request,
    stream_complete,
    usage_of,
)

TOOLS = [
    {
        "type": "function",
        "name": "lookup_invoice",
        "parameters": {"type": "object"},
        "strict": True,
    },
    {"type": "web_search"},
]
INPUT = [
    {"role": "developer", "content": "Be brief."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "settle A-1"}]},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call", "call_id": "call_1", "name": "lookup_invoice", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": '{"amount": 42}'},
]
MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [
        {"type": "output_text", "text": "refund ", "annotations": []},
        {"type": "output_text", "text": "settled", "annotations": []},
    ],
}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_2",
    "name": "lookup_invoice",
    "arguments": '{"invoice": "B-2"}',
    "status": "completed",
}
USAGE = {
    "input_tokens": 30,
    "output_tokens": 7,
    "total_tokens": 37,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 2},
}


def response(*output: dict, status: str = "completed") -> dict:
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "model": "gpt-test",
        "output": list(output),
        "usage": USAGE,
    }


def frames(*output: dict, last: str | None = "response.completed") -> list[list]:
    """A streamed response as the proxy records it: named events, JSON data."""
    events = [{"type": "response.created", "response": dict(response(), output=[], usage=None)}]
    for i, item in enumerate(output):
        events.append({"type": "response.output_item.added", "output_index": i, "item": item})
        if item["type"] == "message":
            events += [
                {
                    "type": "response.output_text.delta",
                    "output_index": i,
                    "content_index": c,
                    "item_id": item["id"],
                    "delta": part["text"],
                }
                for c, part in enumerate(item["content"])
            ]
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    if last == "error":
        events.append({"type": "error", "code": "server_error", "message": "boom", "param": None})
    elif last is not None:
        events.append({"type": last, "response": response(*output, status=last.split(".")[1])})
    return [[e["type"], json.dumps(dict(e, sequence_number=n))] for n, e in enumerate(events)]


def test_the_route_and_upstream_path():
    assert ROUTES["v1/responses"] == OPENAI_RESPONSES
    assert UPSTREAM_PATH[OPENAI_RESPONSES] == "responses"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"model": "gpt-test", "input": "hello"},
            {"model": "gpt-test", "tools": [], "roles": ["user"]},
        ),
        (
            {"model": "gpt-test", "input": INPUT, "tools": TOOLS, "instructions": "x"},
            {
                "model": "gpt-test",
                "tools": ["lookup_invoice", "web_search"],
                "roles": [
                    "developer",
                    "user",
                    "reasoning",
                    "function_call",
                    "function_call_output",
                ],
            },
        ),
        ({"model": "gpt-test"}, {"model": "gpt-test", "tools": [], "roles": []}),
    ],
)
def test_envelope_of_a_responses_request(body, expected):
    assert envelope(hashed_request(OPENAI_RESPONSES, body)) == expected


def test_the_stream_knobs_are_not_hashed():
    body = {"model": "m", "input": "x"}
    assert hashed_request(OPENAI_RESPONSES, dict(body, stream=True)) == hashed_request(
        OPENAI_RESPONSES, body
    )
    assert hashed_request(OPENAI_RESPONSES, body) != hashed_request(OPENAI_CHAT, body)


@pytest.mark.parametrize(
    ("recorded", "usage", "text"),
    [
        ({"body": response(MESSAGE)}, (30, 7), "refund settled"),
        ({"body": response(MESSAGE, CALL)}, (30, 7), None),
        ({"body": response(CALL)}, (30, 7), None),
        ({"body": dict(response(MESSAGE), usage=None)}, (0, 0), "refund settled"),
        ({"frames": frames(MESSAGE)}, (30, 7), "refund settled"),
        ({"frames": frames(CALL)}, (30, 7), None),
        ({"frames": frames(MESSAGE, last="response.incomplete")}, (30, 7), "refund settled"),
        (
            {"frames": [["response.created", "not json"], *frames(MESSAGE)]},
            (30, 7),
            "refund settled",
        ),
    ],
)
def test_usage_and_final_text_of_a_recorded_response(recorded, usage, text):
    recorded = {"wire": OPENAI_RESPONSES, **recorded}
    got = usage_of(OPENAI_RESPONSES, recorded)
    assert (got["input_tokens"], got["output_tokens"]) == usage
    assert final_text(OPENAI_RESPONSES, recorded) == text


@pytest.mark.parametrize(
    ("stream", "complete"),
    [
        (frames(MESSAGE), True),
        (frames(CALL), True),
        (frames(MESSAGE, last="response.incomplete"), True),  # stopped at its limit: an answer
        (frames(MESSAGE, last="response.failed"), False),
        (frames(MESSAGE, last="error"), False),
        (frames(MESSAGE, last=None), False),  # cut before its terminal event
        ([], False),
    ],
)
def test_when_a_responses_stream_is_complete(stream, complete):
    assert stream_complete(OPENAI_RESPONSES, stream) is complete


def test_a_failed_plain_response_is_not_recorded():
    assert body_complete(OPENAI_RESPONSES, response(MESSAGE))
    assert body_complete(OPENAI_RESPONSES, response(MESSAGE, status="incomplete"))
    assert not body_complete(OPENAI_RESPONSES, response(status="failed"))
    assert body_complete(OPENAI_CHAT, {"status": "failed"})  # a chat body has no such status


def test_divergence_names_the_item_roles_and_tools():
    was = hashed_request(
        OPENAI_RESPONSES, {"model": "gpt-test", "input": INPUT[:2], "tools": TOOLS[:1]}
    )
    now = hashed_request(
        OPENAI_RESPONSES, {"model": "gpt-test", "input": INPUT[1:], "tools": TOOLS[:1]}
    )
    report = divergence_report(now, was, None)
    assert (
        "message roles ['user', 'reasoning', 'function_call', 'function_call_output'] "
        "where the recording has ['developer', 'user']" in report
    )
    same_roles = hashed_request(
        OPENAI_RESPONSES, {"model": "gpt-test", "input": "hello", "tools": TOOLS[:1]}
    )
    other_text = hashed_request(
        OPENAI_RESPONSES, {"model": "gpt-test", "input": "bye", "tools": TOOLS[:1]}
    )
    assert divergence_report(other_text, same_roles, None).endswith(
        "the body differs at body.input"
    )
    unrecorded = divergence_report(now, None, "gpt-other")
    assert "'gpt-test' where the recorded call was answered by 'gpt-other'" in unrecorded
    assert "'function_call_output'" in unrecorded


def test_errors_on_the_responses_wire_are_in_the_openai_shape():
    body = error_body(OPENAI_RESPONSES, 409, "diverged")
    assert body == {
        "error": {"message": "diverged", "type": "salvor_proxy_error", "param": None, "code": 409}
    }
