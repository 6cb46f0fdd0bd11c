"""A process agent's run parked by its MCP server: ``_meta.salvor`` on a
``tools/call`` result relayed by a stand-in.

The agent is the stand-in suite's (the scripted provider in the OpenAI chat
format, the ``mcp`` SDK client); the server is the fixture server, whose
``park`` tool answers with the ``_meta.salvor`` it is given and whose ledger
counts every execution. A parked run stops its agent process; a resume (or
the timer) starts it again, and the recorded prefix, the parking call
included, is answered from the log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from salvor.daemon.web._errors import OperationRefused
from salvor.protocol import parse_instant

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import FixtureServer
from tests.support.mcp_standin_agents import EFFECTS, standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is a stand-in call parking and resuming
# its run.
STORE_BACKENDS = SQLITE_ONLY

APPROVAL = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}
SUSPEND = {"suspend": {"reason": "approve the refund", "input_schema": APPROVAL}}


def kinds(log) -> list[str]:
    return [env.kind for env in log]


def last_tool_result(provider) -> str:
    """What the agent told the model its last tool call returned (the neutral
    request's last tool_result)."""
    blocks = [
        b
        for m in provider.calls[-1].request["messages"]
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    content = blocks[-1]["content"]
    return content if isinstance(content, str) else json.dumps(content)


def parking_agent(
    tmp_path: Path, fx: FixtureServer, transport: str = "stdio", effects: str = EFFECTS
):
    return standin_agent(
        tmp_path, f"command = {fx.toml_command()}\n", transport=transport, effects=effects
    )


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_suspend_parks_the_process_run_and_a_resume_answers_the_call_from_the_log(
    runtime, providers, upstream_env, tmp_path, fx, transport
):
    provider = providers(tool_loop_script([("park", {"salvor": SUSPEND})], final_text="refunded"))
    upstream_env(provider)
    agent = parking_agent(tmp_path, fx, transport)
    run_id = await runtime.starts.start_run(agent, "refund it")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "suspended", view.detail
    assert view.detail == {"reason": "approve the refund", "input_schema": APPROVAL}
    log = await runtime.reads.log(run_id)
    assert kinds(log)[-3:] == ["ToolCallRequested", "ToolCallCompleted", "Suspended"]
    # The server's own result is kept beside the wait it asked for.
    assert log[-2].event.output["result"]["_meta"]["salvor"] == SUSPEND
    served = provider.call_count

    # A drive before the resume starts nothing.
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "suspended" and provider.call_count == served
    with pytest.raises(OperationRefused, match="approved"):
        await runtime.control.resume(run_id, {"approved": "yes"})

    assert (await runtime.control.resume(run_id, {"approved": True})).outcome == "driving"
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"]["reply"] == "refunded"
    # The agent's call was answered with the resume input; the tool ran
    # once, on the one server started.
    assert json.loads(last_tool_result(provider)) == {"approved": True}
    assert [c["tool"] for c in fx.ledger] == ["park"] and len(fx.starts) == 1
    assert kinds(await runtime.reads.log(run_id))[-5:] == [
        "Suspended",
        "Resumed",
        "ModelCallRequested",
        "ModelCallCompleted",
        "RunCompleted",
    ]

    # A re-run reproduces the wait without waiting, and starts no server.
    rerun = await runtime.starts.start_run(agent, None, replay_of=run_id)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert ["Suspended", "Resumed"] == [
        k for k in kinds(await runtime.reads.log(rerun)) if k in ("Suspended", "Resumed")
    ]
    assert len(fx.ledger) == 1 and len(fx.starts) == 1


async def test_a_sleep_until_parks_the_process_run_until_its_timer_is_due(
    runtime, providers, upstream_env, tmp_path, fx, clock
):
    wake_at = "2026-11-29T10:00:00Z"  # an hour after the test clock's start
    provider = providers(
        tool_loop_script([("park", {"salvor": {"sleep_until": wake_at}})], final_text="woke")
    )
    upstream_env(provider)
    agent = parking_agent(tmp_path, fx)
    run_id = await runtime.starts.start_run(agent, "wait an hour")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "sleeping", view.detail
    assert parse_instant(view.wake_at()) == parse_instant(wake_at)
    recorded = len(await runtime.reads.log(run_id))
    served = provider.call_count

    with pytest.raises(OperationRefused, match="sleeping until"):
        await runtime.control.resume(run_id)
    clock.advance(3599)
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "sleeping"
    assert len(await runtime.reads.log(run_id)) == recorded and provider.call_count == served

    clock.advance(1)
    assert (await runtime.control.resume(run_id)).outcome == "driving"
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    log = await runtime.reads.log(run_id)
    assert kinds(log)[recorded - 1 : recorded + 2] == [
        "SleepStarted",
        "NowObserved",
        "SleepCompleted",
    ]
    slept = json.loads(last_tool_result(provider))["slept_until"]
    assert parse_instant(slept) == parse_instant(wake_at)
    assert [c["tool"] for c in fx.ledger] == ["park"] and len(fx.starts) == 1


async def test_a_sleep_until_already_past_continues_without_stopping_the_agent(
    runtime, providers, upstream_env, tmp_path, fx
):
    past = "2026-11-29T08:00:00Z"
    provider = providers(
        tool_loop_script([("park", {"salvor": {"sleep_until": past}})], final_text="on time")
    )
    upstream_env(provider)
    agent = parking_agent(tmp_path, fx)
    run_id = await runtime.starts.start_run(agent, "no wait")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    waited = [
        k
        for k in kinds(await runtime.reads.log(run_id))
        if k.startswith("Sleep") or k == "NowObserved"
    ]
    assert waited == ["SleepStarted", "NowObserved", "SleepCompleted"]
    assert parse_instant(json.loads(last_tool_result(provider))["slept_until"]) == parse_instant(
        past
    )


@pytest.mark.parametrize(
    ("request_", "is_error", "problem"),
    [
        (
            {**SUSPEND, "sleep_until": "2026-11-29T10:00:00Z"},
            False,
            "names both suspend and sleep_until",
        ),
        ({"nap": 5}, False, "uses the key 'nap', which salvor does not know"),
        ({"sleep_until": "tomorrow"}, False, "has a sleep_until that is not an RFC 3339 instant"),
        ({"suspend": {"reason": "why"}}, False, "has a suspend without an `input_schema`"),
        (SUSPEND, True, "sits on a result flagged isError"),
    ],
)
async def test_a_bad_salvor_request_fails_the_call_once_and_parks_nothing(
    runtime, providers, upstream_env, tmp_path, fx, request_, is_error, problem
):
    provider = providers(
        tool_loop_script(
            [("park", {"salvor": request_, "is_error": is_error})], final_text="went on"
        )
    )
    upstream_env(provider)
    # Declared a read, so only the refusal itself keeps it from being tried again.
    agent = parking_agent(
        tmp_path, fx, effects='effects = { lookup = "read", write_note = "write", park = "read" }\n'
    )
    run_id = await runtime.starts.start_run(agent, "park badly")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    log = await runtime.reads.log(run_id)
    assert not {"Suspended", "SleepStarted"} & set(kinds(log))
    (output,) = [
        e.event.output
        for e in log
        if e.kind == "ToolCallCompleted" and "__salvor_error" in e.event.output
    ]
    assert (
        "`_meta.salvor`" in output["__salvor_error"]["message"]
        and problem in output["__salvor_error"]["message"]
    )
    # The agent got a JSON-RPC error naming it; the server ran the tool exactly once.
    (error,) = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert "_meta.salvor" in error and problem in error
    assert [c["tool"] for c in fx.ledger] == ["park"]
