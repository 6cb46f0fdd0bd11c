"""The flow tools in the built-in loop: what each session is offered, a question parking the
run until a person answers it, finish ending a child's conversation (and its refusals), a
subagent's child run started once and counted toward its parent's budgets, and the edit mode
re-read before every model call of a main session.

Real runs over a real store, the scripted provider as the only double.
"""

from __future__ import annotations

import json
import uuid

import pytest
from salvor.daemon.agents import FINISH_REMINDER, FINISH_REMINDERS, parse_definition
from salvor.daemon.flows import AUTONOMOUS_LABEL, PARENT_LABEL, child_run_id
from salvor.daemon.recording import DriveInterrupted
from salvor.daemon.web import OperationRefused
from salvor.protocol import TOOL_ERROR_KEY, EventKind, RunStarted, RunState

from tests.support.flows import offered_tools, tool_results, tool_use, tool_uses, with_flows
from tests.support.runtime import agent_toml, ledger
from tests.support.scripted_provider import ErrorReply, text_reply

EVERY = ("ask_user", "subagent", "finish", "flow_results", "flow_agents", "flow_write")
QUESTION = {"question": "Which size?", "type": "select", "options": ["S", "M", "L"]}
VERDICT = [{"name": "verdict"}, {"name": "amount", "type": "number"}]


def kinds(log) -> list[str]:
    return [envelope.event.KIND.value for envelope in log]


async def start(runtime, agent, labels=None, run_input="the task") -> str:
    """A run of ``agent`` under ``labels`` (the daemon's own labels too: written as a head)."""
    await runtime.definitions.register_agent(agent)
    run_id = str(uuid.uuid4())
    head = RunStarted(agent_def_hash=agent.agent_def_hash, input=run_input, labels=labels)
    await runtime.starts.open_log(run_id, [head])
    return run_id


def child_labels(**more) -> dict:
    return {PARENT_LABEL: str(uuid.uuid4()), **more}


def named_agent(runtime, provider, name: str, extra: str = ""):
    text = f'name = "{name}"\n' + agent_toml(provider.base_url, extra=extra)
    return parse_definition(text, "toml", known_tools=runtime.kit.registry.names())


async def test_a_main_session_sees_its_opt_in_and_never_finish(runtime, providers, make_agent):
    provider = providers([text_reply("hello")])
    agent = with_flows(make_agent(provider), flow_tools=EVERY)
    run_id = await start(runtime, agent)
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "hello"}
    # Authoring waits for edit mode (off); finish is a child's.
    assert offered_tools(provider.calls[0]) == ["ask_user", "subagent", "flow_results"]


async def test_a_child_session_sees_finish_and_never_subagent(runtime, providers, make_agent):
    provider = providers([tool_use("finish", {"status": "complete", "summary": "ok"})])
    agent = with_flows(make_agent(provider), flow_tools=EVERY)
    run_id = await start(runtime, agent, child_labels())
    view = await runtime.drive(run_id, agent=agent)
    assert offered_tools(provider.calls[0]) == ["ask_user", "finish"]
    assert view.status() == {
        "state": "completed",
        "output": {"status": "complete", "summary": "ok", "outputs": {}},
    }


async def test_declared_outputs_offer_a_child_finish_without_the_opt_in(
    runtime, providers, make_agent
):
    provider = providers(lambda call: text_reply("x"))
    plain = make_agent(provider)
    agent = with_flows(plain, outputs=[{"name": "note", "required": False}])
    main = await start(runtime, agent)
    assert (await runtime.drive(main, agent=agent)).status()["output"] == "x"
    child = await start(runtime, agent, child_labels())
    await runtime.drive(child, agent=agent)
    # A definition without flow fields sees no flow tool in either session.
    other = await start(runtime, plain, child_labels())
    assert (await runtime.drive(other, agent=plain)).status()["output"] == "x"
    assert [offered_tools(call) for call in provider.calls] == [[], ["finish"], []]


async def test_ask_user_parks_until_a_fitting_answer_which_is_the_calls_result(
    runtime, providers, make_agent
):
    provider = providers([tool_use("ask_user", QUESTION), text_reply("size noted")])
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    run_id = await start(runtime, agent)
    view = await runtime.drive(run_id, agent=agent)
    status = view.status()
    assert status["state"] == "suspended"
    assert status["reason"] == "Which size?"
    assert status["input_schema"]["properties"]["answer"]["enum"] == ["S", "M", "L"]
    before = view.event_count
    for wrong in ({"answer": "XL"}, {"answer": ["M"]}, {"size": "M"}, "M"):
        with pytest.raises(OperationRefused) as refused:
            await runtime.control.resume(run_id, wrong)
        assert refused.value.code == "bad_request"
        assert (await runtime.reads.view(run_id)).event_count == before
    await runtime.control.resume(run_id, {"answer": "M"})
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "size noted"}
    assert json.loads(tool_results(provider.calls[1])[0]["content"]) == {"answer": "M"}
    log = await runtime.reads.log(run_id)
    completed = [e for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    assert "Resumed" in kinds(log) and len(completed) == 1


async def test_an_autonomous_child_is_told_nobody_answers_and_never_parks(
    runtime, providers, make_agent
):
    provider = providers(
        [
            tool_use("ask_user", {"question": "Go?", "type": "confirm"}),
            tool_use("finish", {"status": "complete", "summary": "went on my own"}),
        ]
    )
    agent = with_flows(make_agent(provider), flow_tools=["ask_user", "finish"])
    run_id = await start(runtime, agent, child_labels(**{AUTONOMOUS_LABEL: "true"}))
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED
    told = tool_results(provider.calls[1])[0]
    assert told["is_error"] is True and "autonomous" in told["content"]
    log = await runtime.reads.log(run_id)
    assert "Suspended" not in kinds(log)
    (completion,) = [e for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    assert TOOL_ERROR_KEY in completion.event.output


async def test_finish_is_refused_until_it_is_complete_and_ends_the_response_there(
    runtime, providers, make_agent, effects_path
):
    good = {"status": "complete", "summary": "refund due", "verdict": "refund", "amount": 12.5}
    provider = providers(
        [
            tool_use("finish", {"status": "complete", "summary": "s", "amount": 1}),
            tool_use(
                "finish", {"status": "complete", "summary": "s", "verdict": "x", "amount": "ten"}
            ),
            tool_uses([("finish", good), ("lookup_invoice", {"invoice_id": "INV-7"})]),
        ]
    )
    agent = with_flows(make_agent(provider, tools=["lookup_invoice"]), outputs=VERDICT)
    run_id = await start(runtime, agent, child_labels())
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {
        "state": "completed",
        "output": {
            "status": "complete",
            "summary": "refund due",
            "outputs": {"verdict": "refund", "amount": 12.5},
        },
    }
    missing, wrong_type = (tool_results(call)[-1] for call in provider.calls[1:3])
    assert missing["is_error"] and "`verdict`" in missing["content"]
    assert wrong_type["is_error"] and "amount" in wrong_type["content"]
    # The refusals were told, never recorded; the call after the good finish never ran.
    log = await runtime.reads.log(run_id)
    assert "ToolCallRequested" not in kinds(log)
    assert ledger(effects_path) == []
    assert provider.call_count == 3


async def test_a_child_that_must_finish_is_reminded_a_bounded_number_of_times(
    runtime, providers, make_agent
):
    provider = providers([text_reply("all done")] * (FINISH_REMINDERS + 2))
    agent = with_flows(make_agent(provider), outputs=VERDICT)
    run_id = await start(runtime, agent, child_labels())
    view = await runtime.drive(run_id, agent=agent)
    assert view.state is RunState.FAILED
    assert "without calling finish" in view.detail["error"]
    assert provider.call_count == FINISH_REMINDERS + 1
    last = provider.calls[-1].request["messages"][-1]
    assert last == {"role": "user", "content": [{"type": "text", "text": FINISH_REMINDER}]}


async def test_a_child_without_required_outputs_may_answer_in_text(runtime, providers, make_agent):
    provider = providers([text_reply("short answer")])
    optional = [{"name": "note", "required": False}]
    agent = with_flows(make_agent(provider), outputs=optional)
    run_id = await start(runtime, agent, child_labels())
    view = await runtime.drive(run_id, agent=agent)
    assert view.status()["output"] == {
        "status": "complete",
        "summary": "short answer",
        "outputs": {},
    }


async def _children(runtime, parent: str) -> list[str]:
    page, _ = await runtime.reads.list_runs(label=(PARENT_LABEL, parent))
    return [summary.run_id for summary in page]


async def test_a_subagent_call_runs_one_child_and_completes_with_its_result(
    runtime, providers, make_agent
):
    child_provider = providers([text_reply("child answer", input_tokens=7, output_tokens=3)])
    helper = named_agent(runtime, child_provider, "helper")
    await runtime.definitions.register_agent(helper)
    call = {"agent": "helper", "task": "look it up", "inputs": {"id": "7"}}
    provider = providers([tool_use("subagent", call), text_reply("parent done")])
    parent = with_flows(make_agent(provider), flow_tools=["subagent"])
    run_id = await start(runtime, parent, {AUTONOMOUS_LABEL: "true"})
    view = await runtime.drive(run_id, agent=parent)
    assert view.status() == {"state": "completed", "output": "parent done"}

    child = child_run_id(run_id, 3)
    assert await _children(runtime, run_id) == [child]
    child_view = await runtime.reads.view(child)
    assert child_view.labels == {PARENT_LABEL: run_id, AUTONOMOUS_LABEL: "true"}
    assert child_view.input == {"task": "look it up", "inputs": {"id": "7"}}
    result = {"status": "complete", "summary": "child answer", "outputs": {}}
    (completion,) = [
        e for e in await runtime.reads.log(run_id) if e.event.KIND is EventKind.TOOL_CALL_COMPLETED
    ]
    assert completion.event.output == {
        **result,
        "usage": {"input_tokens": 7, "output_tokens": 3, "steps": 1},
    }
    # The model is told the result; the usage is the loop's to count.
    assert json.loads(tool_results(provider.calls[1])[0]["content"]) == result


async def test_a_subagent_call_completes_with_its_childs_typed_outputs(
    runtime, providers, make_agent
):
    finish = {"status": "complete", "summary": "checked", "verdict": "refund", "amount": 3}
    child_provider = providers([tool_use("finish", finish)])
    outputs = 'outputs = [{ name = "verdict" }, { name = "amount", type = "number" }]'
    await runtime.definitions.register_agent(
        named_agent(runtime, child_provider, "checker", outputs)
    )
    provider = providers(
        [tool_use("subagent", {"agent": "checker", "task": "t"}), text_reply("parent done")]
    )
    parent = make_agent(provider, extra='flow_tools = ["subagent"]')
    run_id = await start(runtime, parent)
    assert (await runtime.drive(run_id, agent=parent)).state is RunState.COMPLETED
    assert json.loads(tool_results(provider.calls[1])[0]["content"]) == {
        "status": "complete",
        "summary": "checked",
        "outputs": {"verdict": "refund", "amount": 3},
    }
    assert offered_tools(child_provider.calls[0]) == ["finish"]


async def test_a_subagent_call_found_open_after_a_crash_continues_its_one_child(
    runtime, providers, make_agent
):
    failing = {"on": True}

    def child_script(call):
        if failing["on"]:
            return ErrorReply(503, "overloaded")
        return text_reply("recovered")

    child_provider = providers(child_script)
    helper = named_agent(runtime, child_provider, "helper")
    await runtime.definitions.register_agent(helper)
    provider = providers(
        [tool_use("subagent", {"agent": "helper", "task": "t"}), text_reply("parent done")]
    )
    parent = with_flows(make_agent(provider), flow_tools=["subagent"])
    run_id = await start(runtime, parent)
    with pytest.raises(DriveInterrupted, match="child run"):
        await runtime.drive(run_id, agent=parent)
    view = await runtime.reads.view(run_id)
    assert view.state is RunState.AWAITING_TOOL and view.pending.tool == "subagent"

    failing["on"] = False
    view = await runtime.drive(run_id, agent=parent)
    assert view.status() == {"state": "completed", "output": "parent done"}
    (child,) = await _children(runtime, run_id)
    assert (await runtime.reads.view(child)).status()["output"] == "recovered"
    # The child's head was written once; its open model call was issued again, once.
    assert kinds(await runtime.reads.log(child)).count("RunStarted") == 1
    assert child_provider.call_count == 2
    assert provider.call_count == 2


async def test_a_childs_usage_counts_toward_its_parents_budget(runtime, providers, make_agent):
    child_provider = providers([text_reply("big", input_tokens=100, output_tokens=5)])
    await runtime.definitions.register_agent(named_agent(runtime, child_provider, "helper"))
    provider = providers(
        [tool_use("subagent", {"agent": "helper", "task": "t"}), text_reply("parent done")]
    )
    budgeted = make_agent(provider, extra="[budgets]\ntokens = 40\n")
    parent = with_flows(budgeted, flow_tools=["subagent"])
    run_id = await start(runtime, parent)
    view = await runtime.drive(run_id, agent=parent)
    # 15 of its own and 105 of the child's: the budget is crossed before a second model call.
    assert view.state is RunState.BUDGET_EXCEEDED
    assert view.detail["observed"] == 120
    assert provider.call_count == 1


async def test_an_unknown_agent_is_the_calls_error_naming_the_known_ones(
    runtime, providers, make_agent
):
    await runtime.definitions.register_agent(named_agent(runtime, providers([]), "helper"))
    provider = providers(
        [tool_use("subagent", {"agent": "helpr", "task": "t"}), text_reply("gave up")]
    )
    parent = with_flows(make_agent(provider), flow_tools=["subagent"])
    run_id = await start(runtime, parent)
    view = await runtime.drive(run_id, agent=parent)
    assert view.state is RunState.COMPLETED
    told = tool_results(provider.calls[1])[0]
    assert told["is_error"] and "'helper'" in told["content"] and "did you mean" in told["content"]
    assert await _children(runtime, run_id) == []


async def test_edit_mode_is_read_before_each_model_call_and_replays_as_recorded(
    runtime, providers, make_agent
):
    mode = {"on": False, "reads": 0}

    async def edit_mode() -> bool:
        mode["reads"] += 1
        return mode["on"]

    runtime.kit.flows.edit_mode = edit_mode
    failing = {"on": False}
    plan = [
        tool_use("ask_user", {"question": "Ready?", "type": "confirm"}),
        text_reply("done"),
    ]

    def script(call):
        if failing["on"]:
            return ErrorReply(503, "overloaded")
        return plan[min(len(tool_results(call)), 1)]

    provider = providers(script)
    agent = with_flows(make_agent(provider), flow_tools=["ask_user", "flow_agents"])
    run_id = await start(runtime, agent)
    await runtime.drive(run_id, agent=agent)
    assert offered_tools(provider.calls[0]) == ["ask_user"]

    # Turned on while the run waits: the next call offers authoring, without a restart.
    mode["on"] = True
    failing["on"] = True
    await runtime.control.resume(run_id, {"answer": True})
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=agent)
    assert offered_tools(provider.calls[1]) == ["ask_user", "flow_agents"]

    # Off again: the replayed first call (recorded with it off) and the open second (with it
    # on) are matched as recorded; the call issued now is asked with the mode read now.
    mode["on"] = False
    failing["on"] = False
    reads = mode["reads"]
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "done"}
    assert offered_tools(provider.calls[-1]) == ["ask_user", "flow_agents"]
    assert mode["reads"] == reads  # the open call is replayed, not read afresh
