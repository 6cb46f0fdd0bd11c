"""The model gateway against the scripted provider over real loopback HTTP."""

from __future__ import annotations

import ssl
import threading

import httpx
import pytest
import trio
from salvor.daemon.models._demo import demo_complete
from salvor.daemon.models._gateway import (
    ModelCallError,
    ModelEndpoint,
    ModelGateway,
    ModelResult,
    resolve_endpoint,
    retry_delay,
)
from salvor.daemon.web._tls import tls_context

from tests.support.scripted_provider import (
    ErrorReply,
    ScriptedProvider,
    text_reply,
    tool_loop_script,
)

WIRES = ["anthropic", "openai"]
MODES = [pytest.param(False, id="json"), pytest.param(True, id="sse")]

LOOKUP = {
    "name": "lookup_invoice",
    "description": "Find an invoice by id.",
    "input_schema": {
        "type": "object",
        "properties": {"invoice_id": {"type": "string"}},
        "required": ["invoice_id"],
    },
}
REFUND = {
    "name": "issue_refund",
    "description": "Refund an invoice.",
    "input_schema": {
        "type": "object",
        "properties": {"amount": {"type": "number"}},
        "required": ["amount"],
    },
}

# A conversation in the middle of a tool loop: everything the neutral shape
# can carry except is_error, which OpenAI's wire cannot express.
MID_LOOP = {
    "model": "test-model",
    "max_tokens": 256,
    "system": "You settle refunds.",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": '{"invoice_id": "inv-7"}'}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking it up."},
                {
                    "type": "tool_use",
                    "id": "toolu_0",
                    "name": "lookup_invoice",
                    "input": {"invoice_id": "inv-7", "note": "naïve ✓"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0", "content": '{"amount": 12.5}'},
                {"type": "text", "text": "Carry on."},
            ],
        },
    ],
    "tools": [LOOKUP, REFUND],
}
FIRST_TURN = {
    "model": "test-model",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
}

TOOL_ANSWER = (
    {
        "model": "test-model",
        "content": [
            {"type": "text", "text": "Refunding now."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "issue_refund",
                "input": {"amount": 12.5, "reason": {"code": "dup", "tags": ["a", "b"]}},
            },
            {"type": "tool_use", "id": "toolu_2", "name": "lookup_invoice", "input": {}},
        ],
        "stop_reason": "tool_use",
    },
    {"input_tokens": 321, "output_tokens": 45},
)


def gateway(
    provider: ScriptedProvider,
    wire: str,
    *,
    stream: bool = False,
    api_key: str | None = "test-key",
    suffix: str = "",
    **options,
) -> ModelGateway:
    endpoint = ModelEndpoint(provider=wire, base_url=provider.base_url + suffix, api_key=api_key)
    options.setdefault("retry_backoff_seconds", 0.0)
    return ModelGateway(endpoint, stream=stream, **options)


async def complete_once(
    provider: ScriptedProvider, wire: str, request: dict, **options
) -> ModelResult:
    model = gateway(provider, wire, **options)
    try:
        return await model.complete(request)
    finally:
        await model.aclose()


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize(
    "request_, reply",
    [
        pytest.param(
            FIRST_TURN,
            text_reply("Hi there, ünïcode ✓", model="test-model", input_tokens=7, output_tokens=3),
            id="text",
        ),
        pytest.param(MID_LOOP, TOOL_ANSWER, id="tool_use"),
        pytest.param(
            FIRST_TURN,
            text_reply("cut", model="test-model", stop_reason="max_tokens"),
            id="max_tokens",
        ),
    ],
)
async def test_round_trip_is_exact(wire, stream, request_, reply):
    with ScriptedProvider([reply]) as provider:
        result = await complete_once(provider, wire, request_, stream=stream)
    response, usage = reply
    assert result == ModelResult(response=response, usage=usage)
    # The provider translated what it received back to the neutral request:
    # the gateway's encoding lost nothing.
    assert provider.calls[0].request == request_
    assert provider.calls[0].wire == wire
    assert provider.calls[0].stream is stream


@pytest.mark.parametrize("wire", WIRES)
async def test_streaming_equals_non_streaming(wire):
    plan = [("lookup_invoice", {"invoice_id": "inv-7", "lines": [1, 2.5, None]})]
    with ScriptedProvider(tool_loop_script(plan, final_text="All settled.")) as provider:
        for request in (FIRST_TURN, MID_LOOP):
            plain = await complete_once(provider, wire, request, stream=False)
            streamed = await complete_once(provider, wire, request, stream=True)
            assert streamed == plain
    # Both requests were served once per mode, nothing more.
    assert sorted(provider.count_by_request_hash().values()) == [2, 2]


async def test_tool_result_error_flag_reaches_anthropic():
    request = {
        **MID_LOOP,
        "messages": [
            *MID_LOOP["messages"][:2],
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_0",
                        "content": "no such invoice",
                        "is_error": True,
                    }
                ],
            },
        ],
    }
    with ScriptedProvider([text_reply("ok")]) as provider:
        await complete_once(provider, "anthropic", request)
    assert provider.calls[0].request == request


@pytest.mark.parametrize("stream", MODES)
async def test_openai_body_uses_chat_completions_shapes(stream):
    with ScriptedProvider([text_reply("ok")]) as provider:
        await complete_once(provider, "openai", MID_LOOP, stream=stream)
    body = provider.calls[0].body
    assert body["max_tokens"] == 256
    assert body["messages"][0] == {"role": "system", "content": "You settle refunds."}
    assert body["messages"][2]["tool_calls"][0]["function"] == {
        "name": "lookup_invoice",
        "arguments": '{"invoice_id":"inv-7","note":"naïve ✓"}',
    }
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "toolu_0",
        "content": '{"amount": 12.5}',
    }
    assert body["messages"][4] == {"role": "user", "content": "Carry on."}
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "lookup_invoice",
            "description": "Find an invoice by id.",
            "parameters": LOOKUP["input_schema"],
        },
    }
    if stream:
        assert body["stream_options"] == {"include_usage": True}
    else:
        assert "stream" not in body


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_base_url_with_or_without_v1(wire, suffix):
    with ScriptedProvider([text_reply("ok")]) as provider:
        result = await complete_once(provider, wire, FIRST_TURN, suffix=suffix)
    assert result.response["content"] == [{"type": "text", "text": "ok"}]
    assert provider.call_count == 1


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize(
    "wire, expected",
    [
        ("anthropic", {"x-api-key": "sk-test-123"}),
        ("openai", {"authorization": "Bearer sk-test-123"}),
    ],
)
async def test_key_is_sent_in_the_providers_header(wire, expected, stream):
    with ScriptedProvider([text_reply("ok")]) as provider:
        await complete_once(provider, wire, FIRST_TURN, stream=stream, api_key="sk-test-123")
    assert provider.auth_headers == [expected]
    if wire == "anthropic":
        assert provider.calls[0].headers["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize("wire", WIRES)
async def test_no_key_means_no_auth_header(wire):
    with ScriptedProvider([text_reply("ok")]) as provider:
        await complete_once(provider, wire, FIRST_TURN, api_key=None)
    assert provider.auth_headers == [{}]


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize("wire", WIRES)
async def test_retries_5xx_and_429_then_succeeds(wire, stream):
    replies = [ErrorReply(500, "boom"), ErrorReply(429, "slow down"), text_reply("finally")]
    with ScriptedProvider(replies) as provider:
        result = await complete_once(provider, wire, FIRST_TURN, stream=stream, max_retries=2)
    assert result.response["content"] == [{"type": "text", "text": "finally"}]
    assert provider.call_count == 3
    # Every attempt was the same request.
    assert list(provider.count_by_request_hash().values()) == [3]


def test_backoff_doubles_and_is_bounded():
    assert [retry_delay(n, 0.5) for n in range(7)] == [0.5, 1, 2, 4, 8, 8, 8]


@pytest.mark.parametrize("wire", WIRES)
async def test_exhausted_retries_raise_with_the_providers_message(wire):
    replies = [ErrorReply(503, "overloaded, try later")] * 5
    with ScriptedProvider(replies) as provider, pytest.raises(ModelCallError) as caught:
        await complete_once(provider, wire, FIRST_TURN, max_retries=2)
    assert provider.call_count == 3
    error = caught.value
    assert error.status == 503 and error.retryable
    assert "HTTP 503" in error.message and "overloaded, try later" in error.message
    assert "3 attempts" in error.message


@pytest.mark.parametrize("status", [400, 401, 404])
@pytest.mark.parametrize("wire", WIRES)
async def test_other_4xx_fail_at_once(wire, status):
    replies = [ErrorReply(status, "bad field: messages"), text_reply("no")]
    with ScriptedProvider(replies) as p, pytest.raises(ModelCallError) as caught:
        await complete_once(p, wire, FIRST_TURN, max_retries=3)
    assert p.call_count == 1
    assert caught.value.status == status and not caught.value.retryable
    assert "bad field: messages" in caught.value.message


@pytest.mark.parametrize("wire", WIRES)
async def test_the_key_never_appears_in_errors(wire):
    key = "sk-secret-do-not-print"
    with ScriptedProvider([ErrorReply(401, f"invalid x-api-key {key}")]) as provider:
        endpoint = ModelEndpoint(provider=wire, base_url=provider.base_url, api_key=key)
        model = ModelGateway(endpoint)
        with pytest.raises(ModelCallError) as caught:
            await model.complete(FIRST_TURN)
        await model.aclose()
    assert key not in str(caught.value) and key not in caught.value.message
    assert key not in repr(endpoint)


async def test_connection_refused_is_retried_then_reported():
    stopped = ScriptedProvider([])
    stopped.stop()  # its port is now closed
    with pytest.raises(ModelCallError) as caught:
        await complete_once(stopped, "anthropic", FIRST_TURN, max_retries=1)
    assert caught.value.status is None and caught.value.retryable
    assert "2 attempts" in caught.value.message


async def test_a_stalled_provider_times_out():
    release = threading.Event()
    with ScriptedProvider(
        [text_reply("late")] * 2, on_call=lambda call: release.wait(10)
    ) as provider:
        try:
            with pytest.raises(ModelCallError) as caught:
                await complete_once(
                    provider, "openai", FIRST_TURN, max_retries=1, timeout_seconds=0.2
                )
        finally:
            release.set()
    assert "timed out" in caught.value.message and caught.value.retryable
    assert provider.call_count == 2


async def test_a_shared_client_is_left_open():
    with ScriptedProvider([text_reply("one"), text_reply("two")]) as provider:
        async with httpx.AsyncClient() as client:
            model = gateway(provider, "anthropic", http_client=client)
            await model.complete(FIRST_TURN)
            await model.aclose()
            assert not client.is_closed
            await gateway(provider, "anthropic", http_client=client).complete(FIRST_TURN)


async def test_gateways_share_one_verifying_tls_context():
    # A gateway is built per drive; loading the CA bundle for each one cost
    # ~20 ms of the trio thread (a thousand recovering runs: twenty seconds).
    endpoint = resolve_endpoint(
        provider="anthropic", base_url="https://api.example.com", environ={}
    )
    first, second = ModelGateway(endpoint), ModelGateway(endpoint)
    try:
        for model in (first, second):
            assert model._client._transport._pool._ssl_context is tls_context()
        assert tls_context().verify_mode == ssl.CERT_REQUIRED and tls_context().check_hostname
    finally:
        await first.aclose()
        await second.aclose()


async def test_demo_provider_makes_no_http_call():
    request = {**MID_LOOP, "messages": MID_LOOP["messages"][:1]}
    model = ModelGateway(resolve_endpoint(provider="demo", environ={}))
    result = await model.complete(request)
    await model.aclose()
    response, usage = demo_complete(request)
    assert result == ModelResult(response=response, usage=usage)


async def test_gateway_runs_concurrent_calls_under_trio():
    with ScriptedProvider(tool_loop_script([])) as provider:
        model = gateway(provider, "openai", stream=True)
        results = []

        async def call() -> None:
            results.append(await model.complete(FIRST_TURN))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(call)
        await model.aclose()
    assert provider.call_count == 5 and len({repr(r) for r in results}) == 1


# -- endpoint resolution ------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, environ, expected_url",
    [
        ({}, {}, "https://api.anthropic.com"),
        ({"provider": "openai"}, {}, "https://api.openai.com"),
        ({}, {"SALVOR_MODEL_BASE_URL": "http://daemon-wide"}, "http://daemon-wide"),
        (
            {"base_url": "http://agent"},
            {"SALVOR_MODEL_BASE_URL": "http://daemon-wide"},
            "http://agent",
        ),
        (
            {"base_url": "http://agent", "base_url_env": "DEMO_URL"},
            {"DEMO_URL": "http://from-env", "SALVOR_MODEL_BASE_URL": "http://daemon-wide"},
            "http://from-env",
        ),
        ({"base_url": "http://agent", "base_url_env": "DEMO_URL"}, {}, "http://agent"),
        (
            {"base_url": "http://agent", "base_url_env": "DEMO_URL"},
            {"DEMO_URL": ""},
            "http://agent",
        ),
        (
            {"base_url_env": "DEMO_URL"},
            {"SALVOR_MODEL_BASE_URL": "http://daemon-wide"},
            "http://daemon-wide",
        ),
    ],
)
def test_resolve_base_url_precedence(kwargs, environ, expected_url):
    assert resolve_endpoint(**kwargs, environ=environ).base_url == expected_url


@pytest.mark.parametrize(
    "kwargs, environ, expected_key",
    [
        ({}, {"ANTHROPIC_API_KEY": "a-key", "OPENAI_API_KEY": "o-key"}, "a-key"),
        (
            {"provider": "openai"},
            {"ANTHROPIC_API_KEY": "a-key", "OPENAI_API_KEY": "o-key"},
            "o-key",
        ),
        ({"api_key_env": "MY_KEY"}, {"ANTHROPIC_API_KEY": "a-key", "MY_KEY": "mine"}, "mine"),
        ({"api_key_env": "MY_KEY"}, {"ANTHROPIC_API_KEY": "a-key"}, None),
        ({}, {"ANTHROPIC_API_KEY": ""}, None),
        ({}, {}, None),
    ],
)
def test_resolve_api_key(kwargs, environ, expected_key):
    assert resolve_endpoint(**kwargs, environ=environ).api_key == expected_key


def test_resolve_demo_and_unknown_providers():
    demo = resolve_endpoint(provider="demo", environ={"ANTHROPIC_API_KEY": "k"})
    assert demo == ModelEndpoint(provider="demo", base_url=None, api_key=None)
    with pytest.raises(ValueError, match="unknown model provider"):
        resolve_endpoint(provider="bedrock", environ={})
