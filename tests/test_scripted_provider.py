"""The scripted provider, spoken to by the real openai and anthropic SDKs.

The openai SDK speaks to it over both Chat Completions and Responses.

If the SDKs accept its answers and send it requests it understands, the
provider speaks the real wire formats, and the gateway tests that rely on it
mean something.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from tests.support.scripted_provider import (
    ErrorReply,
    FailedResponse,
    ScriptedProvider,
    text_reply,
    tool_loop_script,
)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PLAN = [("get_weather", {"city": "Zürich", "units": ["c"]})]
NEUTRAL_TOOL = {"name": "get_weather", "description": "Weather now.", "input_schema": SCHEMA}

# The SDKs are imported by the tests that speak through them, not at collection: anthropic's and
# openai's imports take about 2.5 CPU-seconds, paid by every xdist worker that collects this file.
if TYPE_CHECKING:
    import anthropic
    import openai


def anthropic_client(provider: ScriptedProvider, key: str = "sk-ant-test") -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(base_url=provider.base_url, api_key=key, max_retries=0)


def openai_client(provider: ScriptedProvider, key: str = "sk-oai-test") -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=provider.base_url + "/v1", api_key=key, max_retries=0)


ANTHROPIC_TOOLS = [NEUTRAL_TOOL]
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now.", "parameters": SCHEMA},
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather now.",
        "parameters": SCHEMA,
        "strict": False,
    }
]


# -- anthropic SDK --------------------------------------------------------------


def test_anthropic_sdk_tool_call_then_text():
    with ScriptedProvider(tool_loop_script(PLAN, final_text="It is sunny.")) as provider:
        client = anthropic_client(provider)
        messages = [{"role": "user", "content": "Weather in Zürich?"}]
        first = client.messages.create(
            model="claude-test",
            max_tokens=100,
            system="Be brief.",
            messages=messages,
            tools=ANTHROPIC_TOOLS,
        )
        assert first.stop_reason == "tool_use"
        (use,) = first.content
        assert (use.type, use.id, use.name, use.input) == (
            "tool_use",
            "toolu_0",
            "get_weather",
            {"city": "Zürich", "units": ["c"]},
        )
        assert (first.usage.input_tokens, first.usage.output_tokens) == (10, 5)

        messages += [
            {
                "role": "assistant",
                "content": [use.model_dump(include={"type", "id", "name", "input"})],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": '{"sky": "clear"}'}
                ],
            },
        ]
        second = client.messages.create(
            model="claude-test",
            max_tokens=100,
            system="Be brief.",
            messages=messages,
            tools=ANTHROPIC_TOOLS,
        )
        assert second.stop_reason == "end_turn"
        assert second.content[0].text == "It is sunny."

    call = provider.calls[1]
    assert call.wire == "anthropic" and call.api_key == "sk-ant-test"
    assert call.request == {
        "model": "claude-test",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Zürich?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_0",
                        "name": "get_weather",
                        "input": {"city": "Zürich", "units": ["c"]},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_0", "content": '{"sky": "clear"}'}
                ],
            },
        ],
        "tools": [NEUTRAL_TOOL],
    }


def test_anthropic_sdk_streaming_matches_plain():
    with ScriptedProvider(tool_loop_script(PLAN)) as provider:
        client = anthropic_client(provider)
        kwargs = {
            "model": "claude-test",
            "max_tokens": 100,
            "tools": ANTHROPIC_TOOLS,
            "messages": [{"role": "user", "content": "Weather?"}],
        }
        plain = client.messages.create(**kwargs)
        with client.messages.stream(**kwargs) as stream:
            deltas = [e for e in stream if e.type == "input_json"]
            streamed = stream.get_final_message()
    assert len(deltas) > 1  # the arguments really arrived in pieces
    assert streamed.content[0].input == plain.content[0].input == PLAN[0][1]
    assert streamed.stop_reason == plain.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == plain.usage.output_tokens
    assert provider.calls[1].stream and not provider.calls[0].stream
    assert provider.calls[0].request == provider.calls[1].request


def test_anthropic_sdk_streams_text():
    with ScriptedProvider([text_reply("Streaming, piece by piece.")]) as provider:
        client = anthropic_client(provider)
        with client.messages.stream(
            model="claude-test", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            pieces = list(stream.text_stream)
    assert len(pieces) > 1 and "".join(pieces) == "Streaming, piece by piece."


def test_anthropic_sdk_sees_error_replies():
    import anthropic

    with ScriptedProvider([ErrorReply(429, "slow down"), ErrorReply(400, "bad input")]) as p:
        client = anthropic_client(p)
        kwargs = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        with pytest.raises(anthropic.RateLimitError, match="slow down"):
            client.messages.create(**kwargs)
        with pytest.raises(anthropic.BadRequestError, match="bad input"):
            client.messages.create(**kwargs)


# -- openai SDK -------------------------------------------------------------------


def test_openai_sdk_tool_call_then_text():
    with ScriptedProvider(tool_loop_script(PLAN, final_text="It is sunny.")) as provider:
        client = openai_client(provider)
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Zürich?"},
        ]
        first = client.chat.completions.create(
            model="gpt-test", max_tokens=100, messages=messages, tools=OPENAI_TOOLS
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (tool_call,) = choice.message.tool_calls
        assert tool_call.id == "toolu_0" and tool_call.function.name == "get_weather"
        assert json.loads(tool_call.function.arguments) == PLAN[0][1]
        assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (10, 5)

        messages += [
            choice.message.model_dump(include={"role", "content", "tool_calls"}),
            {"role": "tool", "tool_call_id": tool_call.id, "content": '{"sky": "clear"}'},
        ]
        second = client.chat.completions.create(
            model="gpt-test", max_tokens=100, messages=messages, tools=OPENAI_TOOLS
        )
        assert second.choices[0].finish_reason == "stop"
        assert second.choices[0].message.content == "It is sunny."

    call = provider.calls[1]
    assert call.wire == "openai" and call.auth == {"authorization": "Bearer sk-oai-test"}
    assert call.request["system"] == "Be brief."
    assert call.request["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_0", "name": "get_weather", "input": PLAN[0][1]}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0", "content": '{"sky": "clear"}'}
            ],
        },
    ]
    assert call.request["tools"] == [NEUTRAL_TOOL]


def test_openai_sdk_streaming_matches_plain():
    with ScriptedProvider(tool_loop_script(PLAN)) as provider:
        client = openai_client(provider)
        kwargs = {
            "model": "gpt-test",
            "max_tokens": 100,
            "tools": OPENAI_TOOLS,
            "messages": [{"role": "user", "content": "Weather?"}],
        }
        plain = client.chat.completions.create(**kwargs)
        arguments, finish, usage, call_id = [], None, None, None
        for chunk in client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        ):
            usage = chunk.usage or usage
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for part in choice.delta.tool_calls or []:
                    call_id = part.id or call_id
                    arguments.append(part.function.arguments or "")
    plain_call = plain.choices[0].message.tool_calls[0]
    assert call_id == plain_call.id
    assert json.loads("".join(arguments)) == json.loads(plain_call.function.arguments)
    assert finish == plain.choices[0].finish_reason == "tool_calls"
    assert usage.completion_tokens == plain.usage.completion_tokens
    assert provider.calls[1].body["stream_options"] == {"include_usage": True}


def test_openai_sdk_streams_text():
    with ScriptedProvider([text_reply("Streaming, piece by piece.")]) as provider:
        client = openai_client(provider)
        stream = client.chat.completions.create(
            model="gpt-test",
            max_tokens=50,
            stream=True,
            messages=[{"role": "user", "content": "hi"}],
        )
        pieces = [c.choices[0].delta.content for c in stream if c.choices]
    text = "".join(p for p in pieces if p)
    assert text == "Streaming, piece by piece." and len([p for p in pieces if p]) > 1


def test_openai_sdk_sees_error_replies():
    import openai

    with ScriptedProvider([ErrorReply(500, "melted")]) as provider:
        client = openai_client(provider)
        with pytest.raises(openai.InternalServerError, match="melted"):
            client.chat.completions.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )


# -- openai SDK, Responses ----------------------------------------------------------


def test_responses_tool_call_then_text():
    with ScriptedProvider(tool_loop_script(PLAN, final_text="It is sunny.")) as provider:
        client = openai_client(provider)
        first = client.responses.create(
            model="gpt-test",
            instructions="Be brief.",
            input="Weather in Zürich?",
            tools=RESPONSES_TOOLS,
        )
        (tool_call,) = first.output
        assert (first.status, tool_call.type, tool_call.call_id, tool_call.name) == (
            "completed",
            "function_call",
            "toolu_0",
            "get_weather",
        )
        assert json.loads(tool_call.arguments) == PLAN[0][1]
        assert (first.usage.input_tokens, first.usage.output_tokens) == (10, 5)
        assert first.output_text == ""

        items = [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Zürich?"}]},
            tool_call.model_dump(exclude_none=True),
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call_output",
                "call_id": tool_call.call_id,
                "output": '{"sky": "clear"}',
            },
        ]
        second = client.responses.create(
            model="gpt-test",
            instructions="Be brief.",
            input=items,
            tools=RESPONSES_TOOLS,
            store=False,
            include=["reasoning.encrypted_content"],
        )
        assert second.output_text == "It is sunny." and second.output[0].role == "assistant"

    first_call, call = provider.calls
    assert call.wire == "responses" and call.auth == {"authorization": "Bearer sk-oai-test"}
    assert first_call.request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Zürich?"}]}
    ]
    assert call.request == {
        "model": "gpt-test",
        "max_tokens": None,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Zürich?"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_0",
                        "name": "get_weather",
                        "input": PLAN[0][1],
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_0", "content": '{"sky": "clear"}'}
                ],
            },
        ],
        "tools": [NEUTRAL_TOOL],
    }


def test_responses_streaming_matches_plain():
    with ScriptedProvider(tool_loop_script(PLAN)) as provider:
        client = openai_client(provider)
        kwargs = {"model": "gpt-test", "input": "Weather?", "tools": RESPONSES_TOOLS}
        plain = client.responses.create(**kwargs)
        events = list(client.responses.create(**kwargs, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == PLAN[0][1]
    final = events[-1].response
    assert final.output[0].call_id == plain.output[0].call_id == "toolu_0"
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_responses_stream_helper_accumulates_text():
    with ScriptedProvider([text_reply("Streaming, piece by piece.")]) as provider:
        client = openai_client(provider)
        with client.responses.stream(model="gpt-test", input="hi") as stream:
            pieces = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(pieces) == final.output_text == "Streaming, piece by piece."
    assert len(pieces) > 1


def test_responses_reasoning_items_come_first_and_are_ignored_on_the_way_back():
    with ScriptedProvider(tool_loop_script(PLAN, final_text="Sunny.")) as provider:
        client = openai_client(provider)
        kwargs = {
            "model": "gpt-test",
            "tools": RESPONSES_TOOLS,
            "reasoning": {"effort": "low"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        first = client.responses.create(input="Weather?", **kwargs)
        reasoning, tool_call = first.output
        assert reasoning.type == "reasoning" and reasoning.encrypted_content
        streamed = [
            e.item.type
            for e in client.responses.create(input="Weather?", stream=True, **kwargs)
            if e.type == "response.output_item.done"
        ]
        assert streamed == ["reasoning", "function_call"]
        items = [
            {"role": "user", "content": "Weather?"},
            *(item.model_dump(exclude_none=True) for item in first.output),
            {"type": "function_call_output", "call_id": tool_call.call_id, "output": "clear"},
        ]
        second = client.responses.create(input=items, **kwargs)
        plain = client.responses.create(input="Weather?", tools=RESPONSES_TOOLS)
    assert [item.type for item in second.output] == ["reasoning", "message"]
    assert second.output_text == "Sunny."
    assert [item.type for item in plain.output] == [
        "function_call"
    ]  # no reasoning asked, none given
    assert [m["role"] for m in provider.calls[2].request["messages"]] == [
        "user",
        "assistant",
        "user",
    ]


def test_a_failed_response_is_a_200_with_status_failed_and_ends_a_stream():
    import openai

    failed = FailedResponse("the model crashed")
    with ScriptedProvider([failed, failed, failed]) as provider:
        client = openai_client(provider)
        plain = client.responses.create(model="m", input="x")
        events = list(client.responses.create(model="m", input="x", stream=True))
        with pytest.raises(openai.InternalServerError, match="the model crashed"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert (plain.status, plain.error.message, plain.output) == ("failed", "the model crashed", [])
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.failed",
    ]
    assert events[-1].response.error.code == "server_error"


def test_responses_max_tokens_is_an_incomplete_response():
    reply = text_reply("cut sh", stop_reason="max_tokens")
    with ScriptedProvider([reply, reply]) as provider:
        client = openai_client(provider)
        plain = client.responses.create(model="m", input="x", max_output_tokens=3)
        last = list(
            client.responses.create(model="m", input="x", max_output_tokens=3, stream=True)
        )[-1]
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert last.type == "response.incomplete" and last.response.output_text == "cut sh"


def test_responses_sees_error_replies_and_refuses_what_it_cannot_script():
    import openai

    with ScriptedProvider([ErrorReply(429, "slow down")]) as provider:
        client = openai_client(provider)
        with pytest.raises(openai.RateLimitError, match="slow down"):
            client.responses.create(model="m", input="x")
        with pytest.raises(openai.BadRequestError, match="web_search"):
            client.responses.create(model="m", input="x", tools=[{"type": "web_search"}])
        with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
            client.responses.create(model="m", input="x", previous_response_id="resp_1")
    assert provider.call_count == 1


# -- the provider's own contract ------------------------------------------------


def test_list_script_past_its_end_answers_500():
    import anthropic

    with ScriptedProvider([text_reply("only one")]) as provider:
        client = anthropic_client(provider)
        kwargs = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        client.messages.create(**kwargs)
        with pytest.raises(anthropic.InternalServerError, match="no reply scripted for call 1"):
            client.messages.create(**kwargs)


def test_a_failing_script_answers_500_naming_the_call():
    def script(call):
        raise RuntimeError("script bug")

    with ScriptedProvider(script) as provider:
        reply = httpx.post(
            provider.base_url + "/v1/chat/completions", json={"model": "m", "messages": []}
        )
    assert reply.status_code == 500
    assert "script failed on call 0" in reply.json()["error"]["message"]


@pytest.mark.parametrize(
    "path", ["/messages", "/chat/completions", "/responses", "/v2/messages", "/"]
)
def test_paths_without_v1_are_not_found(path):
    with ScriptedProvider([text_reply("x")]) as provider:
        reply = httpx.post(provider.base_url + path, json={"model": "m", "messages": []})
    assert reply.status_code == 404
    assert "no route" in reply.json()["error"]["message"]
    assert provider.call_count == 0


@pytest.mark.parametrize("keep_alive", [False, True])
def test_keep_alive_serves_a_client_on_one_connection_and_records_its_peer(keep_alive):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    with (
        ScriptedProvider([text_reply("a"), text_reply("b")], keep_alive=keep_alive) as provider,
        httpx.Client(base_url=provider.base_url) as client,
    ):
        for _ in range(2):
            client.post("/v1/messages", json=body).raise_for_status()
        first, second = provider.calls
    assert first.peer[0] == "127.0.0.1"
    assert (first.peer == second.peer) is keep_alive


def test_no_key_sends_no_auth_header():
    with ScriptedProvider([text_reply("a"), text_reply("b")]) as provider:
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        httpx.post(provider.base_url + "/v1/messages", json=body)
        openai_client(provider, key="k").chat.completions.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert provider.auth_headers == [{}, {"authorization": "Bearer k"}]


def test_tool_loop_script_is_a_pure_function_of_the_request():
    with ScriptedProvider(tool_loop_script(PLAN)) as provider:
        client = anthropic_client(provider)
        kwargs = {
            "model": "m",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
            "tools": ANTHROPIC_TOOLS,
        }
        first = client.messages.create(**kwargs)
        again = client.messages.create(**kwargs)  # e.g. re-issued after a crash
    assert first.content == again.content
    assert list(provider.count_by_request_hash().values()) == [2]
    assert [c.index for c in provider.calls] == [0, 1]


def test_on_call_runs_before_the_answer_and_wait_for_calls_sees_it():
    arrived, release = threading.Event(), threading.Event()

    def hold(call):
        arrived.set()
        release.wait(10)

    with ScriptedProvider([text_reply("held")], on_call=hold) as provider:
        answers = []
        client = openai_client(provider)
        worker = threading.Thread(
            target=lambda: answers.append(
                client.chat.completions.create(
                    model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
                )
            )
        )
        worker.start()
        provider.wait_for_calls(1, timeout=10)
        assert arrived.wait(10)
        assert provider.call_count == 1 and answers == []  # counted, not yet answered
        release.set()
        worker.join(10)
    assert answers[0].choices[0].message.content == "held"


def test_wait_for_calls_times_out_with_a_clear_message():
    with ScriptedProvider([]) as provider, pytest.raises(TimeoutError, match="0 of 1 calls"):
        provider.wait_for_calls(1, timeout=0.05)


async def test_serves_sdk_calls_from_trio_threads():
    with ScriptedProvider(tool_loop_script([], final_text="hi from trio")) as provider:
        client = anthropic_client(provider)

        def call():
            return client.messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )

        message = await trio.to_thread.run_sync(call)
        await trio.to_thread.run_sync(provider.wait_for_calls, 1, 5)
    assert message.content[0].text == "hi from trio"
