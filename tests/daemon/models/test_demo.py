"""The demo model: a deterministic scripted planner, driven turn by turn."""

from __future__ import annotations

import copy
import json

from salvor.daemon.models._demo import demo_complete


def tool(name, properties, required=None):
    return {
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {
            "type": "object",
            "properties": properties,
            "required": list(properties) if required is None else required,
        },
    }


LOOKUP = tool("lookup_invoice", {"invoice_id": {"type": "string"}})
REFUND = tool(
    "issue_refund",
    {
        "invoice_id": {"type": "string"},
        "amount": {"type": "number"},
        "customer": {"type": "string"},
    },
)
SUBMIT = tool(
    "submit_output",
    {
        "verdict": {"type": "string", "enum": ["refund", "deny"]},
        "amount": {"type": "number"},
        "notes": {"type": "array"},
        "final": {"type": "boolean"},
    },
)


def request_for(run_input, tools, messages=()):
    return {
        "model": "demo-1",
        "max_tokens": 512,
        "system": "You settle refunds.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": run_input}]}, *messages],
        "tools": tools,
    }


def run_to_end(request, results):
    """Answer every tool call with ``results[name]`` until the model stops."""
    request = copy.deepcopy(request)
    responses = []
    for _ in range(10):
        response, usage = demo_complete(request)
        assert usage["input_tokens"] >= 1 and usage["output_tokens"] >= 1
        responses.append(response)
        if response["stop_reason"] != "tool_use":
            return responses
        (use,) = response["content"]
        content, is_error = results[use["name"]]
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": content}
        if is_error:
            result["is_error"] = True
        request["messages"] += [
            {"role": "assistant", "content": response["content"]},
            {"role": "user", "content": [result]},
        ]
    raise AssertionError("the demo model did not stop")


def test_same_request_same_answer():
    request = request_for('{"invoice_id": "inv-7"}', [LOOKUP, REFUND])
    before = copy.deepcopy(request)
    assert demo_complete(request) == demo_complete(request)
    assert request == before  # the request is not touched


def test_calls_each_tool_once_in_order_then_submits():
    request = request_for('{"invoice_id": "inv-7"}', [SUBMIT, LOOKUP, REFUND])
    results = {
        "lookup_invoice": ('{"amount": 12.5, "customer": "ada"}', False),
        "issue_refund": ('{"refund_id": "rf-1"}', False),
        "submit_output": ("accepted", False),
    }
    responses = run_to_end(request, results)
    uses = [r["content"][0] for r in responses if r["stop_reason"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        ("toolu_demo_0", "lookup_invoice", {"invoice_id": "inv-7"}),
        # invoice_id from the run input; amount and customer from the lookup.
        (
            "toolu_demo_1",
            "issue_refund",
            {"invoice_id": "inv-7", "amount": 12.5, "customer": "ada"},
        ),
        # submit_output last; an enum takes its first value, others placeholders.
        (
            "toolu_demo_2",
            "submit_output",
            {"verdict": "refund", "amount": 12.5, "notes": [], "final": True},
        ),
    ]
    assert responses[-1]["stop_reason"] == "end_turn"
    assert all(r["model"] == "demo-1" for r in responses)


def test_without_submit_output_it_summarises_what_tools_returned():
    request = request_for("please help", [LOOKUP])
    responses = run_to_end(request, {"lookup_invoice": ('{"amount": 3}', False)})
    assert [r["stop_reason"] for r in responses] == ["tool_use", "end_turn"]
    assert responses[0]["content"][0]["input"] == {"invoice_id": "demo"}  # not JSON input
    (text,) = responses[-1]["content"]
    assert text["type"] == "text"
    assert text["text"] == 'Demo model: called 1 tool(s).\n- lookup_invoice returned {"amount":3}'
    assert run_to_end(request, {"lookup_invoice": ('{"amount": 3}', False)}) == responses


def test_a_failed_tool_is_not_retried():
    request = request_for('{"invoice_id": "inv-7"}', [LOOKUP, REFUND])
    results = {
        "lookup_invoice": ("invoice service down", True),
        "issue_refund": ('{"ok": true}', False),
    }
    responses = run_to_end(request, results)
    names = [r["content"][0]["name"] for r in responses if r["stop_reason"] == "tool_use"]
    assert names == ["lookup_invoice", "issue_refund"]
    # The failed lookup supplied nothing, so the refund uses placeholders.
    assert responses[1]["content"][0]["input"] == {
        "invoice_id": "inv-7",
        "amount": 1,
        "customer": "demo",
    }
    assert "lookup_invoice failed with invoice service down" in responses[-1]["content"][0]["text"]


def test_no_tools_answers_at_once():
    response, usage = demo_complete(
        {
            "model": "demo-1",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        }
    )
    assert response == {
        "model": "demo-1",
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "Demo model: no tools to call. The input was: hello"}],
    }
    assert usage == {
        "input_tokens": len(
            json.dumps(
                {
                    "max_tokens": 10,
                    "messages": [{"content": [{"text": "hello", "type": "text"}], "role": "user"}],
                    "model": "demo-1",
                },
                separators=(",", ":"),
            )
        )
        // 4,
        "output_tokens": usage["output_tokens"],
    }


def test_later_tool_results_win_over_earlier_ones():
    a = tool("first", {})
    b = tool("second", {})
    c = tool("third", {"token": {"type": "string"}})
    results = {
        "first": ('{"token": "old"}', False),
        "second": ('{"token": "new"}', False),
        "third": ("{}", False),
    }
    responses = run_to_end(request_for("{}", [a, b, c]), results)
    assert responses[2]["content"][0]["input"] == {"token": "new"}


def test_output_is_plain_json():
    request = request_for('{"invoice_id": "inv-7"}', [LOOKUP, SUBMIT])
    response, usage = demo_complete(request)
    assert json.loads(json.dumps([response, usage])) == [response, usage]


FINISH = tool(
    "finish",
    {
        "status": {"enum": ["complete", "error"]},
        "summary": {"type": "string"},
        "score": {"type": "number"},
    },
    required=["status", "summary"],
)


def test_finish_comes_last_with_the_summary_of_what_the_tools_returned():
    responses = run_to_end(
        request_for('{"invoice_id": "INV-1"}', [FINISH, LOOKUP]),
        {"lookup_invoice": ('{"amount": 5}', False), "finish": ("done", False)},
    )
    calls = [r["content"][0] for r in responses if r["stop_reason"] == "tool_use"]
    assert [c["name"] for c in calls] == ["lookup_invoice", "finish"]
    assert calls[1]["input"]["status"] == "complete"
    assert calls[1]["input"]["summary"].startswith("Demo model: called 1 tool(s).")
    assert calls[1]["input"]["score"] == 1  # a declared output, filled though not required


def test_an_optional_field_is_filled_only_when_the_run_input_names_it():
    ask = tool(
        "ask_user",
        {"question": {"type": "string"}, "type": {"type": "string"}, "options": {"type": "array"}},
        required=["question", "type"],
    )
    given = {"question": "Which plan?", "type": "select", "options": ["basic", "pro"]}
    with_options, _ = demo_complete(request_for(json.dumps(given), [ask]))
    assert with_options["content"][0]["input"] == given
    bare, _ = demo_complete(request_for('{"question": "Ok?"}', [ask]))
    assert bare["content"][0]["input"] == {"question": "Ok?", "type": "demo"}
