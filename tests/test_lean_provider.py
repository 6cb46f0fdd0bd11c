"""The benchmarks' lean provider (``tests/bench/lean_provider.py``), spoken to by the real
anthropic SDK: its cached answers follow the script call by call, plain and streamed, each with
its own message id, and only the calls it answered are counted."""

from __future__ import annotations

import httpx

from tests.bench.lean_provider import LeanProviders

PLAN = [("lookup_invoice", {"invoice_id": "INV-1"})]
TOOL = {
    "name": "lookup_invoice",
    "description": "One invoice.",
    "input_schema": {"type": "object", "properties": {"invoice_id": {"type": "string"}}},
}
ASK = {"role": "user", "content": "Look up INV-1."}


def _client(base_url: str):
    import anthropic

    return anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0)


def test_answers_follow_the_script_plain_and_streamed() -> None:
    with LeanProviders(PLAN, 1) as providers:
        client = _client(providers.base_urls[0])
        first = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=[ASK], tools=[TOOL]
        )
        assert first.stop_reason == "tool_use"
        assert first.content[0].type == "tool_use"
        assert (first.content[0].name, first.content[0].input) == PLAN[0]
        answered = [
            ASK,
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "paid"}],
            },
        ]
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=64, messages=answered, tools=[TOOL]
        ) as stream:
            last = stream.get_final_message()
        assert last.stop_reason == "end_turn"
        assert [block.text for block in last.content] == ["done"]
        again = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=[ASK], tools=[TOOL]
        )
        assert again.content[0].type == "tool_use"
        assert [first.id, last.id, again.id] == [f"msg_scripted_{i}" for i in range(3)]
        assert providers.stop() == 3


def test_what_it_does_not_read_is_refused_and_not_counted() -> None:
    with LeanProviders([], 1) as providers, httpx.Client(base_url=providers.base_urls[0]) as http:
        missing = http.get("/v1/models")
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "not_found_error"
        malformed = http.post("/v1/messages", content=b"{not json")
        assert malformed.status_code == 400
        assert malformed.json()["type"] == "error"
        chunked = http.post("/v1/messages", content=iter([b'{"model": "m"}']))
        assert chunked.status_code == 400
        assert "chunked" in chunked.json()["error"]["message"]
        assert providers.stop() == 0
