"""The built-in agent loop over a real store and the scripted provider.

Each test drives a real run in-process (trio), against a real SQLite file or
PostgreSQL, with the scripted provider as the only double, and checks the
recorded log, the derived state and what the provider and the demo tools
actually served.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from salvor.daemon.recording._run_context import DriveInterrupted
from salvor.daemon.runs import MISSING
from salvor.daemon.tools._registry import Tool, ToolFailed, ToolRegistry
from salvor.daemon.web._errors import OperationRefused
from salvor.protocol import (
    EMPTY_VIEW,
    TOOL_ERROR_KEY,
    TOOL_SLEEP_KEY,
    Effect,
    EventKind,
    RunState,
    ToolCallRequested,
    check_batch,
    encode_envelope,
    format_instant,
    sha256_hash,
)

from tests.support.runtime import ledger, with_registry
from tests.support.scripted_provider import ErrorReply, text_reply, tool_loop_script

REFUND_PLAN = [
    ("lookup_invoice", {"invoice_id": "INV-7"}),
    ("issue_refund", {"invoice_id": "INV-7", "amount_cents": 1250}),
    ("send_email", {"to": "a@example.com", "subject": "Refunded", "body": "Done"}),
]


def kinds(log) -> list[str]:
    return [envelope.event.KIND.value for envelope in log]


async def start_and_drive(runtime, agent, run_input=None, **kwargs):
    run_id = await runtime.starts.start_run(agent, run_input, **kwargs)
    view = await runtime.drive(run_id, agent=agent)
    return run_id, view


async def assert_log_is_sound(runtime, run_id):
    log = await runtime.reads.log(run_id)
    assert [e.seq for e in log] == list(range(len(log)))
    check_batch(EMPTY_VIEW, log)
    return log


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_loop_runs_to_completion_recording_every_call(
    runtime, providers, make_agent, effects_path, wire, stream
):
    provider = providers(tool_loop_script(REFUND_PLAN, final_text="refunded"))
    agent = make_agent(
        provider,
        tools=["lookup_invoice", "issue_refund", "send_email"],
        wire=wire,
        llm_extra=f"stream = {str(stream).lower()}",
    )
    run_id, view = await start_and_drive(
        runtime, agent, {"invoice_id": "INV-7"}, labels={"env": "test"}
    )

    assert view.status() == {"state": "completed", "output": "refunded"}
    log = await assert_log_is_sound(runtime, run_id)
    assert kinds(log) == [
        "RunStarted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "ToolCallRequested",
        "ToolCallCompleted",
        "ModelCallRequested",
        "ModelCallCompleted",
        "RunCompleted",
    ]
    assert provider.call_count == 4
    assert view.step_count == 4
    assert view.usage() == {"input_tokens": 10 + 20 + 30 + 40, "output_tokens": 20}
    assert view.labels == {"env": "test"}
    # The idempotency key is derived from the call's position (run, seq, tool),
    # so a retry of this position presents it again: no random draw recorded.
    assert log[11].event.idempotency_key == sha256_hash(
        {"run": run_id, "seq": 11, "tool": "send_email"}
    )
    assert [e.event.effect for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED] == [
        "read",
        "write",
        "idempotent",
    ]
    # The refund's request to the bank, then what the bank answered (the demo's probe reads both).
    assert [r["tool"] for r in ledger(effects_path)] == [
        "lookup_invoice",
        "issue_refund:sent",
        "issue_refund",
        "send_email",
    ]
    # The runs row is the fold of the log.
    assert await runtime.reads.view(run_id) == view


async def test_driving_a_finished_run_again_executes_nothing(
    runtime, providers, make_agent, effects_path
):
    provider = providers(tool_loop_script(REFUND_PLAN[:1]))
    agent = make_agent(provider, tools=["lookup_invoice"])
    run_id, first = await start_and_drive(runtime, agent)
    decision = await runtime.control.resume(run_id)
    assert decision.outcome == "finished"
    again = await runtime.drive(run_id, agent=agent)
    assert again == first
    assert provider.call_count == 2
    assert len(ledger(effects_path)) == 1


async def test_an_interrupted_run_recovers_without_repeating_completed_calls(
    runtime, providers, make_agent, effects_path
):
    plan = tool_loop_script(REFUND_PLAN[:1], final_text="ok")
    failing = {"on": True}

    def script(call):
        # The second model call fails while `failing` is set: a provider outage.
        if call.index == 1 and failing["on"]:
            return ErrorReply(503, "overloaded")
        return plan(call)

    provider = providers(script)
    agent = make_agent(provider, tools=["lookup_invoice"])
    run_id = await runtime.starts.start_run(agent, None)
    with pytest.raises(DriveInterrupted, match="issues it again"):
        await runtime.drive(run_id, agent=agent)
    view = await runtime.reads.view(run_id)
    assert view.state is RunState.AWAITING_MODEL
    assert view.pending.to_json()["kind"] == "model"

    failing["on"] = False
    decision = await runtime.control.resume(run_id)
    assert decision.outcome == "driving"
    view = await runtime.drive(run_id)
    assert view.status() == {"state": "completed", "output": "ok"}
    log = await assert_log_is_sound(runtime, run_id)
    # Calls: 0 ok, 1 failed, 1 again (the open intent re-issued), nothing else repeated.
    assert provider.call_count == 3
    assert sorted(provider.count_by_request_hash().values()) == [1, 2]
    assert len([e for e in log if e.event.KIND is EventKind.MODEL_CALL_REQUESTED]) == 2
    assert len(ledger(effects_path)) == 1


async def test_a_model_refusal_that_cannot_pass_fails_the_run(runtime, providers, make_agent):
    provider = providers([ErrorReply(400, "model not found")])
    agent = make_agent(provider)
    run_id, view = await start_and_drive(runtime, agent)
    assert view.state is RunState.FAILED
    assert "model not found" in view.detail["error"]
    await assert_log_is_sound(runtime, run_id)


async def test_a_gate_suspends_and_only_a_conforming_input_resumes_it(
    runtime, providers, make_agent
):
    provider = providers(
        tool_loop_script(
            [("request_approval", {"reason": "refund over limit"})], final_text="approved"
        )
    )
    agent = make_agent(provider, tools=["request_approval"])
    run_id, view = await start_and_drive(runtime, agent)
    assert view.state is RunState.SUSPENDED
    status = view.status()
    assert status["reason"] == "refund over limit"
    assert status["input_schema"]["required"] == ["approved"]
    assert "kind" not in status
    before = view.event_count

    for bad in (MISSING, None, 5, "yes", {"approved": "yes"}, {}):
        with pytest.raises(OperationRefused) as refused:
            await runtime.control.resume(run_id, bad)
        assert refused.value.code == "bad_request"
        assert (await runtime.reads.view(run_id)).event_count == before

    decision = await runtime.control.resume(run_id, {"approved": True, "note": "ok by finance"})
    assert decision.outcome == "driving"
    view = await runtime.drive(run_id)
    assert view.status() == {"state": "completed", "output": "approved"}
    log = await assert_log_is_sound(runtime, run_id)
    assert kinds(log)[4:7] == ["ToolCallCompleted", "Suspended", "Resumed"]
    # The model was told what the person answered.
    last_request = provider.calls[-1].request
    tool_result = last_request["messages"][-1]["content"][0]
    assert json.loads(tool_result["content"]) == {"approved": True, "note": "ok by finance"}


async def test_a_signal_wait_says_so(runtime, providers, make_agent):
    provider = providers(tool_loop_script([("request_approval", {"signal": True})]))
    agent = make_agent(provider, tools=["request_approval"])
    _, view = await start_and_drive(runtime, agent)
    assert view.status()["kind"] == "signal"


async def test_a_timer_parks_the_run_until_its_instant(runtime, providers, make_agent, clock):
    wake_at = format_instant(clock.now.replace(hour=10))
    provider = providers(
        tool_loop_script([("wait_until", {"wake_at": wake_at})], final_text="woke")
    )
    agent = make_agent(provider, tools=["wait_until"])
    run_id, view = await start_and_drive(runtime, agent)
    assert view.status() == {"state": "sleeping", "wake_at": wake_at}
    assert await runtime.reads.due_runs() == []

    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resume(run_id)
    assert refused.value.code == "still_sleeping"
    assert refused.value.details == {"wake_at": wake_at, "remaining_seconds": 3600}

    clock.advance(3600 + 30)
    assert view.status_at(clock.now) == {
        "state": "sleeping",
        "wake_at": wake_at,
        "overdue": True,
        "overdue_seconds": 30,
    }
    assert await runtime.reads.due_runs() == [run_id]
    assert (await runtime.control.resume(run_id)).outcome == "driving"
    view = await runtime.drive(run_id)
    assert view.status() == {"state": "completed", "output": "woke"}
    log = await assert_log_is_sound(runtime, run_id)
    completion = log[4].event
    assert completion.output == {TOOL_SLEEP_KEY: {"wake_at": wake_at}}
    # Nothing is recorded while it is not due; the reading that woke it is.
    assert kinds(log)[5:8] == ["SleepStarted", "NowObserved", "SleepCompleted"]
    assert await runtime.reads.due_runs() == []


async def test_a_timer_driven_early_records_nothing_and_stays_asleep(
    runtime, providers, make_agent, clock
):
    wake_at = format_instant(clock.now.replace(hour=10))
    provider = providers(
        tool_loop_script([("wait_until", {"wake_at": wake_at})], final_text="woke")
    )
    agent = make_agent(provider, tools=["wait_until"])
    run_id, _ = await start_and_drive(runtime, agent)
    clock.advance(60)
    asleep = await runtime.reads.view(run_id)
    view = await runtime.drive(
        run_id, agent=agent
    )  # early: the deadline is enforced inside the run
    assert view == asleep
    clock.advance(3600)
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED
    log = await assert_log_is_sound(runtime, run_id)
    assert kinds(log)[5:8] == ["SleepStarted", "NowObserved", "SleepCompleted"]
    assert provider.call_count == 2


async def test_a_step_budget_parks_the_run_and_an_extension_lifts_it(
    runtime, providers, make_agent
):
    plan = [("lookup_invoice", {"invoice_id": f"INV-{i}"}) for i in range(3)]
    provider = providers(tool_loop_script(plan, final_text="all looked up"))
    agent = make_agent(provider, tools=["lookup_invoice"], extra="[budgets]\nsteps = 2\n")
    run_id, view = await start_and_drive(runtime, agent)
    assert view.status() == {
        "state": "budget_exceeded",
        "budget": {"kind": "steps", "limit": 2},
        "observed": 2,
    }
    assert provider.call_count == 2
    before = view.event_count
    for bad in (MISSING, {}, {"extend_by": 0}, {"extend_by": -1}, {"extend_by": 1, "x": 1}, "more"):
        with pytest.raises(OperationRefused) as refused:
            await runtime.control.resume(run_id, bad)
        assert refused.value.code == "bad_request"
    assert (await runtime.reads.view(run_id)).event_count == before

    await runtime.control.resume(run_id, {"extend_by": 5})
    view = await runtime.drive(run_id)
    assert view.status() == {"state": "completed", "output": "all looked up"}
    assert view.budget_extensions == {"steps": 5}
    assert provider.call_count == 4
    await assert_log_is_sound(runtime, run_id)


async def test_a_token_budget_counts_recorded_usage(runtime, providers, make_agent):
    provider = providers(tool_loop_script([("lookup_invoice", {"invoice_id": "INV-1"})]))
    agent = make_agent(provider, tools=["lookup_invoice"], extra="[budgets]\ntokens = 15\n")
    run_id, view = await start_and_drive(runtime, agent)
    assert view.status() == {
        "state": "budget_exceeded",
        "budget": {"kind": "tokens", "limit": 15},
        "observed": 15,
    }
    await runtime.control.resume(run_id, {"extend_by": 100})
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED


async def test_output_schema_answers_are_validated_before_they_are_recorded(
    runtime, providers, make_agent
):
    def use(k, payload):
        return (
            {
                "model": "m",
                "content": [
                    {"type": "tool_use", "id": f"t{k}", "name": "submit_output", "input": payload}
                ],
                "stop_reason": "tool_use",
            },
            {"input_tokens": 1, "output_tokens": 1},
        )

    provider = providers([use(0, {"verdict": 5}), use(1, {"verdict": "refund"})])
    agent = make_agent(
        provider,
        extra=(
            '[output_schema]\ntype = "object"\nrequired = ["verdict"]\n'
            '[output_schema.properties.verdict]\ntype = "string"\n'
        ),
    )
    _, view = await start_and_drive(runtime, agent)
    assert view.status() == {"state": "completed", "output": {"verdict": "refund"}}
    second = provider.calls[1].request
    assert second["tools"][-1]["name"] == "submit_output"
    rejected = second["messages"][-1]["content"][0]
    assert rejected["is_error"] is True and "verdict" in rejected["content"]


async def test_failed_tools_are_recorded_as_the_error_sentinel(
    runtime, providers, make_agent, effects_path
):
    plan = [
        ("issue_refund", {"invoice_id": "INV-1", "amount_cents": 0}),  # the tool refuses
        ("lookup_invoice", {}),  # input its schema rejects: never executed
        ("no_such_tool", {}),  # not a tool of this agent: told so, nothing recorded
    ]
    provider = providers(tool_loop_script(plan, final_text="gave up"))
    agent = make_agent(provider, tools=["issue_refund", "lookup_invoice"])
    run_id, view = await start_and_drive(runtime, agent)
    assert view.state is RunState.COMPLETED
    log = await assert_log_is_sound(runtime, run_id)
    outputs = [e.event.output for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    assert outputs[0][TOOL_ERROR_KEY] == {
        "is_error": True,
        "kind": "handler",
        "message": "a refund must be for a positive amount",
        "attempts": 1,
    }
    assert outputs[1][TOOL_ERROR_KEY]["kind"] == "invalid_input"
    assert len(outputs) == 2
    assert ledger(effects_path) == []
    told = provider.calls[3].request["messages"][-1]["content"][0]
    assert told["is_error"] is True and "no_such_tool" in told["content"]


async def test_retries_follow_the_effect_class(runtime, providers, make_agent, store_url, clock):
    attempts = {"flaky_read": 0, "flaky_write": 0}

    def flaky(name):
        async def handler(args, call):
            attempts[name] += 1
            if attempts[name] < 3:
                raise ToolFailed(f"{name} hiccup {attempts[name]}")
            return {"ok": attempts[name]}

        return handler

    schema = {"type": "object"}
    registry = ToolRegistry(
        [
            Tool(
                name="flaky_read",
                description="",
                effect=Effect.READ,
                input_schema=schema,
                handler=flaky("flaky_read"),
            ),
            Tool(
                name="flaky_write",
                description="",
                effect=Effect.WRITE,
                input_schema=schema,
                handler=flaky("flaky_write"),
            ),
        ]
    )
    from salvor.daemon.agents._definition import parse_definition
    from salvor.daemon.runs._runtime import Runtime

    from tests.support.runtime import agent_toml

    provider = providers(tool_loop_script([("flaky_read", {}), ("flaky_write", {})]))
    agent = parse_definition(
        agent_toml(provider.base_url, tools=["flaky_read", "flaky_write"]),
        "toml",
        known_tools=registry.names(),
    )
    own = Runtime(runtime.access, registry, clock=clock)
    run_id, view = await start_and_drive(own, agent)
    assert view.state is RunState.COMPLETED
    log = await own.reads.log(run_id)
    outputs = [e.event.output for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    assert outputs[0] == {"ok": 3}  # a read is retried
    assert outputs[1][TOOL_ERROR_KEY]["attempts"] == 1  # a write is tried once
    assert attempts == {"flaky_read": 3, "flaky_write": 1}


async def test_an_open_write_parks_the_run_for_a_person(runtime, providers, make_agent):
    provider = providers(tool_loop_script(REFUND_PLAN[1:2], final_text="refunded"))
    agent = make_agent(provider, tools=["issue_refund"])
    # A write without a probe (the demo's has one: tests/daemon/agents/test_probes.py).
    unprobed = dataclasses.replace(runtime.kit.registry.get("issue_refund"), probe=None)
    runtime = with_registry(runtime, ToolRegistry([unprobed]))
    run_id = await runtime.starts.start_run(agent, None)
    # A crash between the write's intent and its completion leaves exactly this log.
    view = await runtime.reads.view(run_id)
    from salvor.protocol import ModelCallCompleted, ModelCallRequested, sha256_hash

    request = {
        "model": "scripted-model",
        "max_tokens": 1024,
        "system": "You settle refunds.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "null"}]}],
        "tools": [t.spec() for t in [runtime.kit.registry.get("issue_refund")]],
    }
    _, view = await runtime.access.append(
        run_id, [ModelCallRequested(request_hash=sha256_hash(request))], view
    )
    response = {
        "model": "m",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_0",
                "name": "issue_refund",
                "input": REFUND_PLAN[1][1],
            }
        ],
        "stop_reason": "tool_use",
    }
    _, view = await runtime.access.append(
        run_id,
        [
            ModelCallCompleted(
                seq=1, response=response, usage={"input_tokens": 1, "output_tokens": 1}
            ),
            ToolCallRequested(
                tool="issue_refund", input=REFUND_PLAN[1][1], effect="write", idempotency_key=None
            ),
        ],
        view,
    )
    assert view.state is RunState.NEEDS_RECONCILIATION

    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resume(run_id)
    assert refused.value.code == "needs_reconciliation"
    intent = refused.value.details["intent"]
    assert intent["seq"] == 3 and intent["tool"] == "issue_refund" and intent["effect"] == "write"
    assert "recorded_at" in intent
    # Driving anyway does nothing: the write is never guessed at.
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.NEEDS_RECONCILIATION

    view = await runtime.control.resolve(run_id, {"refund_id": "rf_checked_by_hand"}, {})
    assert view.state is RunState.RUNNING
    log = await runtime.reads.log(run_id)
    assert log[-1].event.settled_by == "operator"
    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resolve(run_id, {}, {})
    assert refused.value.code == "wrong_state"

    await runtime.control.resume(run_id)
    view = await runtime.drive(run_id)
    assert view.status() == {"state": "completed", "output": "refunded"}
    assert provider.call_count == 1  # only the call after the resolved write
    await assert_log_is_sound(runtime, run_id)


async def test_abandon_retires_any_unfinished_run_and_names_an_open_write(
    runtime, providers, make_agent
):
    provider = providers(tool_loop_script([("request_approval", {})]))
    agent = make_agent(provider, tools=["request_approval"])
    run_id, _ = await start_and_drive(runtime, agent)
    seq, view = await runtime.control.abandon(run_id, "customer withdrew")
    assert view.status() == {"state": "abandoned", "reason": "customer withdrew"}
    assert seq == view.next_seq - 1
    with pytest.raises(OperationRefused) as refused:
        await runtime.control.abandon(run_id)
    assert refused.value.code == "wrong_state"

    run_id = await runtime.starts.start_run(agent, None)
    view = await runtime.reads.view(run_id)
    _, view = await runtime.access.append(
        run_id,
        [ToolCallRequested(tool="issue_refund", input={}, effect="write", idempotency_key=None)],
        view,
    )
    _, view = await runtime.control.abandon(run_id)
    assert view.status() == {
        "state": "abandoned",
        "unresolved_write": {"seq": 1, "tool": "issue_refund"},
    }


async def test_refusals_record_nothing(runtime, providers, make_agent):
    provider = providers(tool_loop_script([]))
    agent = make_agent(provider)
    for bad_labels in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 257}):
        with pytest.raises(OperationRefused) as refused:
            await runtime.starts.start_run(agent, None, labels=bad_labels)
        assert refused.value.code == "bad_request"
    page, _ = await runtime.access.read(runtime.access.store.list_runs)
    assert page == []
    run_id = await runtime.starts.start_run(
        agent, None, run_id="6f0c8a52-0d6e-4c1b-9a56-3f2a1b7c9d10"
    )
    with pytest.raises(OperationRefused) as refused:
        await runtime.starts.start_run(agent, None, run_id=run_id)
    assert refused.value.code == "run_exists"
    nobody = "00000000-0000-4000-8000-000000000000"
    for attempt in (
        runtime.control.resume(nobody),
        runtime.control.resolve(nobody, {}, {}),
        runtime.control.abandon(nobody),
    ):
        with pytest.raises(OperationRefused) as refused:
            await attempt
        assert refused.value.code == "unknown_run"
    assert provider.call_count == 0


async def test_credentials_never_reach_the_log(runtime, providers, make_agent, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-do-not-record-4242")
    provider = providers(tool_loop_script([("lookup_invoice", {"invoice_id": "INV-1"})]))
    agent = make_agent(provider, tools=["lookup_invoice"], extra="record_prompts = true")
    run_id, view = await start_and_drive(runtime, agent)
    assert view.state is RunState.COMPLETED
    assert provider.calls[0].api_key == "sk-test-do-not-record-4242"
    log = await runtime.reads.log(run_id)
    text = "\n".join(encode_envelope(e) for e in log)
    assert "sk-test-do-not-record-4242" not in text
    # record_prompts keeps each request body, and it hashes to the recorded request_hash.
    from salvor.protocol import sha256_hash

    intents = [e.event for e in log if e.event.KIND is EventKind.MODEL_CALL_REQUESTED]
    assert all(sha256_hash(i.request_body) == i.request_hash for i in intents)
    assert intents[0].request_body == provider.calls[0].request


async def test_a_run_without_record_prompts_keeps_no_request_body(runtime, providers, make_agent):
    provider = providers([text_reply("hi")])
    agent = make_agent(provider)
    run_id, _ = await start_and_drive(runtime, agent)
    log = await runtime.reads.log(run_id)
    assert "request_body" not in log[1].event.to_payload()
