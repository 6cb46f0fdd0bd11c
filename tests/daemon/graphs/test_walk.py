"""Graph runs walked through the Runtime over a real store, the scripted provider as the model and
the demo tools as the world: each test checks the recorded log, the derived state, and what the
provider and the tools really served."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from salvor.daemon.graphs import map_child_id
from salvor.daemon.recording import DriveInterrupted
from salvor.daemon.tools import graph_call_key
from salvor.daemon.web import OperationRefused
from salvor.protocol import (
    EMPTY_VIEW,
    ErrorCode,
    EventKind,
    RunState,
    check_batch,
    graph_from_value,
)
from salvor.store import StoreUnavailable

from tests.support.backends import BOTH, SQLITE_ONLY
from tests.support.graph_runs import approval_graph
from tests.support.runtime import ledger
from tests.support.scripted_provider import ErrorReply, text_reply, tool_loop_script

# The walk reaches the store through the same RunContext calls an agent run does; the map's
# concurrent children (several runs appending at once) keep both backends, as does the HTTP
# module (tests/daemon/api/test_graph_runs.py).
STORE_BACKENDS = SQLITE_ONLY


def kinds(log) -> list[str]:
    return [envelope.event.KIND.value for envelope in log]


def task_of(call) -> str:
    return call.request["messages"][0]["content"][0]["text"]


def echo(call):
    return text_reply(f"seen {task_of(call)}")


async def stored(runtime, document: dict):
    graph = graph_from_value(document)
    await runtime.definitions.register_graph(graph)
    return graph


async def map_graph(runtime, agent: str, *, concurrency: int) -> str:
    """A stored graph of one map node, ``each``, running ``agent`` over the run input's items
    (each child's input ``{"t": item}``), ``concurrency`` at a time."""
    return await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input",
                    "concurrency": concurrency,
                    "body": {"kind": "agent", "agent": agent, "input": {"t": "$item"}},
                },
            ],
            "edges": [],
        },
    )


async def agent_hash(runtime, make_agent, provider) -> str:
    agent = make_agent(provider)
    await runtime.definitions.register_agent(agent)
    return agent.agent_def_hash


async def sound_log(runtime, run_id):
    log = await runtime.reads.log(run_id)
    check_batch(EMPTY_VIEW, log)
    return log


async def test_an_agent_a_gate_a_branch_and_a_tool_walk_to_completion(
    runtime, providers, make_agent, effects_path
):
    provider = providers(echo)
    graph = await stored(runtime, approval_graph(await agent_hash(runtime, make_agent, provider)))
    run_id = await runtime.starts.start_graph_run(
        graph, {"topic": "tides", "to": "a@example.com"}, labels={"env": "test"}
    )
    view = await runtime.drive(run_id)
    assert view.state is RunState.SUSPENDED and view.open_node == "approve"
    assert view.detail["reason"] == "Send it?"

    # A refused approval is answered before anything is recorded.
    before = await runtime.reads.log(run_id)
    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resume(run_id, {"approved": "yes"})
    assert refused.value.code is ErrorCode.APPROVAL_SCHEMA_VIOLATION
    assert refused.value.details["node"] == "approve"
    assert [v["path"] for v in refused.value.details["violations"]] == ["$.approved"]
    assert await runtime.reads.log(run_id) == before

    await runtime.control.resume(run_id, {"approved": True})
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED
    send = {"message_id": view.detail["output"]["send"]["message_id"], "to": "a@example.com"}
    assert view.detail["output"] == {"send": send}  # the skipped terminal is absent
    log = await sound_log(runtime, run_id)
    assert kinds(log) == [
        "GraphRunStarted",
        "NodeEntered",
        "ModelCallRequested",
        "ModelCallCompleted",
        "NodeExited",
        "NodeEntered",
        "Suspended",
        "Resumed",
        "NodeExited",
        "NodeEntered",
        "NodeExited",
        "NodeEntered",
        "ToolCallRequested",
        "ToolCallCompleted",
        "NodeExited",
        "NodeSkipped",
        "RunCompleted",
    ]
    assert log[1].event.input == {"topic": "tides"}
    assert log[4].event.output == 'seen {"topic": "tides"}'
    assert log[10].event.branch_case == "true"
    assert log[12].event.input["body"] == 'seen {"topic": "tides"}'
    assert log[12].event.idempotency_key == graph_call_key(
        run_id, graph.hash, "send", 0, "send_email"
    )
    assert log[15].event.reason == (
        "no live inbound edge: branch `route` took case `true`, not `false`"
    )
    assert provider.call_count == 1
    assert [r["tool"] for r in ledger(effects_path)] == ["send_email"]

    # Driving it again replays nothing new: the log is the walk.
    assert (await runtime.drive(run_id)).state is RunState.COMPLETED
    assert provider.call_count == 1 and len(ledger(effects_path)) == 1


async def test_a_recovered_walk_repeats_no_completed_call(
    runtime, providers, make_agent, effects_path
):
    # The second agent node's first call fails in a way that may pass: the drive stops there.
    answered = []

    def script(call):
        answered.append(task_of(call))
        if task_of(call).startswith("seen") and answered.count(task_of(call)) == 1:
            return ErrorReply(503, "busy")
        return echo(call)

    provider = providers(script)
    agent = await agent_hash(runtime, make_agent, provider)
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "first", "kind": "agent", "agent": agent},
                {
                    "id": "mail",
                    "kind": "tool",
                    "tool": "send_email",
                    "input": {"to": "b@example.com", "subject": "s", "body": "$nodes.first"},
                },
                {"id": "second", "kind": "agent", "agent": agent, "input": "$nodes.first"},
            ],
            "edges": [{"from": "first", "to": "mail"}, {"from": "mail", "to": "second"}],
        },
    )
    run_id = await runtime.starts.start_graph_run(graph, "go")
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id)
    view = await runtime.reads.view(run_id)
    assert view.state is RunState.AWAITING_MODEL and view.open_node == "second"
    assert run_id in await runtime.reads.interrupted_runs()

    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED
    assert view.detail["output"] == {"second": "seen seen go"}
    # first answered once, second's call twice (the failed one re-issued), the mail sent once.
    assert answered == ["go", "seen go", "seen go"]
    assert len(ledger(effects_path)) == 1
    await sound_log(runtime, run_id)


async def test_a_delay_sleeps_until_its_instant_and_the_wake_path_walks_on(runtime, clock):
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "cool_off", "kind": "delay", "seconds": 30},
                {"id": "count", "kind": "fold", "over": "$input", "reducer": "sum"},
            ],
            "edges": [{"from": "cool_off", "to": "count"}],
        },
    )
    run_id = await runtime.starts.start_graph_run(graph, [1, 2, 3])
    view = await runtime.drive(run_id)
    assert view.state is RunState.SLEEPING
    assert view.detail["wake_at"] == "2026-11-29T09:00:30.000000Z"
    assert await runtime.reads.due_runs() == []
    with pytest.raises(OperationRefused) as early:
        await runtime.control.resume(run_id)
    assert early.value.code is ErrorCode.STILL_SLEEPING

    clock.advance(31)
    assert await runtime.reads.due_runs() == [run_id]
    await runtime.control.resume(run_id)  # what the wake sweeper does with a due run
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED
    assert view.detail["output"] == {"count": 6}
    log = await sound_log(runtime, run_id)
    assert kinds(log)[:7] == [
        "GraphRunStarted",
        "NodeEntered",
        "NowObserved",
        "SleepStarted",
        "NowObserved",
        "SleepCompleted",
        "NodeExited",
    ]


async def test_a_missing_reference_fails_the_run_naming_node_and_reference(runtime):
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "mail",
                    "kind": "tool",
                    "tool": "lookup_invoice",
                    "input": {"invoice_id": "$input.invoice"},
                }
            ],
            "edges": [],
        },
    )
    run_id = await runtime.starts.start_graph_run(graph, {"invoce": "INV-1"})
    view = await runtime.drive(run_id)
    assert view.state is RunState.FAILED
    assert view.detail["error"].startswith("node 'mail': $input.invoice: 'invoice' is not in")
    assert kinds(await sound_log(runtime, run_id)) == ["GraphRunStarted", "RunFailed"]


@pytest.mark.parametrize("store_url", BOTH, indirect=True)
async def test_a_map_drives_its_items_as_child_runs_and_a_rewalk_drives_only_the_rest(
    runtime, providers, make_agent
):
    # Item 1's child fails once in a way that may pass.
    answered = []

    def script(call):
        answered.append(task_of(call))
        if task_of(call) == '{"n": 1, "ticket": "b"}' and answered.count(task_of(call)) == 1:
            return ErrorReply(503, "busy")
        return echo(call)

    provider = providers(script)
    agent = await agent_hash(runtime, make_agent, provider)
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input.tickets",
                    "concurrency": 2,
                    "body": {
                        "kind": "agent",
                        "agent": agent,
                        "input": {"ticket": "$item", "n": "$index"},
                    },
                },
                {"id": "tally", "kind": "fold", "over": "$nodes.each", "reducer": "count"},
            ],
            "edges": [{"from": "each", "to": "tally"}],
        },
    )
    run_id = await runtime.starts.start_graph_run(graph, {"tickets": ["a", "b", "c"]})
    with pytest.raises(DriveInterrupted, match="item 1"):
        await runtime.drive(run_id)
    log = await runtime.reads.log(run_id)
    recorded = [e.event for e in log if e.event.KIND is EventKind.MAP_ITEM_COMPLETED]
    assert sorted(item.index for item in recorded) == [0, 2]
    assert {item.run_id for item in recorded} == {
        map_child_id(run_id, "each", 0),
        map_child_id(run_id, "each", 2),
    }

    # Recovery drives the graph run, whose walk drives the interrupted child (not a second driver).
    child = map_child_id(run_id, "each", 1)
    assert (await runtime.reads.view(child)).state is RunState.AWAITING_MODEL
    assert await runtime.reads.interrupted_runs() == [run_id]

    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED
    outputs = [f'seen {{"n": {n}, "ticket": "{t}"}}' for n, t in enumerate("abc")]
    assert view.detail["output"] == {"tally": 3}
    assert log[-1].event.KIND is EventKind.MAP_ITEM_COMPLETED
    log = await sound_log(runtime, run_id)
    exited = [e.event for e in log if e.event.KIND is EventKind.NODE_EXITED]
    assert exited[0].output == outputs  # item order, whatever order they finished in
    # Items 0 and 2 were answered once; item 1 twice (its failed call re-issued).
    tasks = [f'{{"n": {n}, "ticket": "{t}"}}' for n, t in enumerate("abc")]
    assert sorted(answered) == sorted([*tasks, tasks[1]])
    child = await runtime.reads.view(map_child_id(run_id, "each", 1))
    assert child.state is RunState.COMPLETED and child.input == {"ticket": "b", "n": 1}


async def test_a_map_over_a_tool_calls_inline_keyed_by_node_and_index(runtime, effects_path):
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {
                    "id": "mail",
                    "kind": "map",
                    "over": "$input",
                    "body": {
                        "kind": "tool",
                        "tool": "send_email",
                        "input": {"to": "$item", "subject": "s", "body": "b"},
                    },
                },
            ],
            "edges": [],
        },
    )
    run_id = await runtime.starts.start_graph_run(graph, ["x@example.com", "y@example.com"])
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED
    assert [o["to"] for o in view.detail["output"]["mail"]] == ["x@example.com", "y@example.com"]
    keys = [r["idempotency_key"] for r in ledger(effects_path)]
    assert keys == [graph_call_key(run_id, graph.hash, "mail", i, "send_email") for i in (0, 1)]


@pytest.mark.parametrize(
    ("node", "code"),
    [
        ({"id": "x", "kind": "agent", "agent": "sha256:" + "0" * 64}, ErrorCode.UNKNOWN_AGENT),
        ({"id": "x", "kind": "tool", "tool": "no_such_tool"}, ErrorCode.UNKNOWN_TOOL),
    ],
)
async def test_a_graph_that_does_not_resolve_starts_no_run(runtime, node, code):
    graph = await stored(runtime, {"schema_version": 1, "nodes": [node], "edges": []})
    with pytest.raises(OperationRefused) as refused:
        await runtime.starts.start_graph_run(graph, None)
    assert refused.value.code is code and refused.value.details["node"] == "x"
    runs, _ = await runtime.reads.list_runs()
    assert runs == []


async def test_each_agent_node_has_its_own_budget_and_a_crossing_parks_the_graph_run(
    runtime, providers, make_agent
):
    # One model call each: a run-wide budget of one step would stop the second node.
    talker = make_agent(providers(echo), extra="[budgets]\nsteps = 1")
    looper = make_agent(
        providers(tool_loop_script([("lookup_invoice", {"invoice_id": "INV-1"})])),
        tools=["lookup_invoice"],
        extra="[budgets]\nsteps = 1",
    )
    for agent in (talker, looper):
        await runtime.definitions.register_agent(agent)
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "a", "kind": "agent", "agent": talker.agent_def_hash},
                {"id": "b", "kind": "agent", "agent": talker.agent_def_hash},
                {"id": "c", "kind": "agent", "agent": looper.agent_def_hash},
            ],
            "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}],
        },
    )
    run_id = await runtime.starts.start_graph_run(graph, "go")
    view = await runtime.drive(run_id)
    # c's second call (after its tool) crosses its budget of one step.
    assert view.state is RunState.BUDGET_EXCEEDED and view.open_node == "c"
    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resume(run_id, {"extend_by": "x"})
    assert refused.value.code is ErrorCode.BAD_REQUEST  # a budget is not a gate
    await runtime.control.resume(run_id, {"extend_by": 1})
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED and view.detail["output"] == {"c": "done"}
    await sound_log(runtime, run_id)


async def test_a_failed_map_item_fails_the_graph_run_naming_node_index_and_child(
    runtime, providers, make_agent
):
    def script(call):
        if '"b"' in task_of(call):
            return ErrorReply(400, "no such model")  # will not pass: the child fails
        return echo(call)

    agent = await agent_hash(runtime, make_agent, providers(script))
    graph = await map_graph(runtime, agent, concurrency=1)
    run_id = await runtime.starts.start_graph_run(graph, ["a", "b", "c"])
    view = await runtime.drive(run_id)
    child = map_child_id(run_id, "each", 1)
    assert view.state is RunState.FAILED
    assert view.detail["error"].startswith(f"node 'each': map item 1 (child run {child}) failed:")
    log = await sound_log(runtime, run_id)
    # One item at a time, in item order: the item before the failed one was recorded.
    assert [e.event.index for e in log if e.event.KIND is EventKind.MAP_ITEM_COMPLETED] == [0]
    # The item after it never started: no child exists that nothing would drive.
    assert await runtime.reads.find_view(map_child_id(run_id, "each", 2)) is None


async def test_a_failed_map_item_starts_no_later_item(runtime, providers, make_agent):
    """One item at a time; item 1 fails, and the items after it get no head.

    Before, the failed item handed its slot on as it ended, so the next child's head was often
    written before the walker heard of the failure; that child stayed ``running`` with no driver
    until a restart recovered it as an ordinary run. Several graph runs, since which task the
    scheduler ran first decided it."""

    def script(call):
        if '"b"' in task_of(call):
            return ErrorReply(400, "no such model")
        return echo(call)

    agent = await agent_hash(runtime, make_agent, providers(script))
    graph = await map_graph(runtime, agent, concurrency=1)
    for _ in range(8):
        run_id = await runtime.starts.start_graph_run(graph, ["a", "b", "c", "d", "e"])
        view = await runtime.drive(run_id)
        assert view.state is RunState.FAILED
        assert "map item 1" in view.detail["error"]
        for index in (2, 3, 4):
            later = map_child_id(run_id, "each", index)
            assert await runtime.reads.find_view(later) is None, (
                index,
                await runtime.reads.view(later),
            )


async def test_a_failed_map_item_lets_the_items_in_flight_finish_before_the_run_fails(
    runtime, providers, make_agent
):
    """Three items at a time; item 1 fails at once while items 0 and 2 are mid-call. Their
    children are driven to completion and recorded before the graph run fails, and item 3 never
    starts. Before, the failure cancelled them mid-call: their children stayed ``running`` with
    nothing to drive them (their parent had failed) until a restart drove them as runs of
    their own."""

    def script(call):
        if '"b"' in task_of(call):
            return ErrorReply(400, "no such model")
        time.sleep(0.3)  # the provider's thread: items 0 and 2 are in flight when 1 fails
        return echo(call)

    agent = await agent_hash(runtime, make_agent, providers(script))
    graph = await map_graph(runtime, agent, concurrency=3)
    run_id = await runtime.starts.start_graph_run(graph, ["a", "b", "c", "d"])
    view = await runtime.drive(run_id)
    assert view.state is RunState.FAILED
    assert "map item 1" in view.detail["error"]
    for index in (0, 2):
        sibling = await runtime.reads.view(map_child_id(run_id, "each", index))
        assert sibling.state is RunState.COMPLETED, (index, sibling)
    log = await sound_log(runtime, run_id)
    recorded = [e.event.index for e in log if e.event.KIND is EventKind.MAP_ITEM_COMPLETED]
    assert sorted(recorded) == [0, 2]
    assert await runtime.reads.find_view(map_child_id(run_id, "each", 3)) is None


async def test_a_store_fault_under_a_map_item_lets_the_items_in_flight_reach_their_rest(
    runtime, providers, make_agent, monkeypatch
):
    """Two items at a time; the store refuses item 0's model answer while item 1 is mid-call.
    The walk raises the store fault (the healer's to handle) only once item 1 reached its rest:
    its call answered and recorded, not cut. Before, the fault cancelled item 1 mid-call: a
    write cut that way has an outcome nobody knows, for a person to settle."""

    def script(call):
        if '"b"' in task_of(call):
            time.sleep(0.3)  # the provider's thread: item 1 is mid-call when item 0's answer fails
        return echo(call)

    agent = await agent_hash(runtime, make_agent, providers(script))
    graph = await map_graph(runtime, agent, concurrency=2)
    run_id = await runtime.starts.start_graph_run(graph, ["a", "b", "c"])
    first = map_child_id(run_id, "each", 0)
    append = runtime.access.append

    async def refusing(child, events, view, **kwargs):
        if child == first and any(e.KIND is EventKind.MODEL_CALL_COMPLETED for e in events):
            raise StoreUnavailable(
                "the disk is full (a test's refusal); nothing was written", transient=True
            )
        return await append(child, events, view, **kwargs)

    monkeypatch.setattr(runtime.access, "append", refusing)
    with pytest.raises(StoreUnavailable):
        await runtime.drive(run_id)
    second = await runtime.reads.view(map_child_id(run_id, "each", 1))
    assert second.state is RunState.COMPLETED, second
    assert await runtime.reads.find_view(map_child_id(run_id, "each", 2)) is None
    monkeypatch.setattr(runtime.access, "append", append)
    view = await runtime.drive(run_id)  # the healer's drive: item 0 answered again, all recorded
    assert view.state is RunState.COMPLETED, view
    await sound_log(runtime, run_id)


async def test_a_fork_from_an_agent_node_presents_its_origins_key_for_the_idempotent_call(
    runtime, providers, make_agent, effects_path
):
    mail = {"to": "c@example.com", "subject": "s", "body": "b"}
    provider = providers(tool_loop_script([("send_email", mail)], final_text="mailed"))
    agent = make_agent(provider, tools=("send_email",))
    await runtime.definitions.register_agent(agent)
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "start", "kind": "fold", "over": "$input", "reducer": "count"},
                {"id": "notify", "kind": "agent", "agent": agent.agent_def_hash},
            ],
            "edges": [{"from": "start", "to": "notify"}],
        },
    )
    origin = await runtime.starts.start_graph_run(graph, [1, 2])
    assert (await runtime.drive(origin)).state is RunState.COMPLETED

    child_id, _ = await runtime.forks.fork(await runtime.forks.plan_fork(origin, "notify"))
    assert (await runtime.drive(child_id)).state is RunState.COMPLETED
    # A fork of the fork descends from the same origin, and presents the same key again.
    grandchild, _ = await runtime.forks.fork(await runtime.forks.plan_fork(child_id, "notify"))
    assert (await runtime.drive(grandchild)).state is RunState.COMPLETED
    # Another run of the same graph is another call: its own key, its email delivered.
    other = await runtime.starts.start_graph_run(graph, [3])
    assert (await runtime.drive(other)).state is RunState.COMPLETED
    key = graph_call_key(origin, graph.hash, "notify", 0, "send_email")
    for run_id in (origin, child_id, grandchild):
        (intent,) = [
            e.event
            for e in await sound_log(runtime, run_id)
            if e.event.KIND is EventKind.TOOL_CALL_REQUESTED
        ]
        assert intent.idempotency_key == key
    # The re-walked conversation asked again (the segment is the fork's), the email went once.
    assert provider.call_count == 8
    records = ledger(effects_path)
    other_key = graph_call_key(other, graph.hash, "notify", 0, "send_email")
    assert [(r["run_id"], r["idempotency_key"], r["delivered"]) for r in records] == [
        (origin, key, True),
        (child_id, key, False),
        (grandchild, key, False),
        (other, other_key, True),
    ]

    # A log recorded before agent nodes had graph keys: its open intent is executed again under
    # the key it recorded, not under the one a new walk would present.
    legacy = await runtime.reads.log(origin)
    at = next(i for i, e in enumerate(legacy) if e.event.KIND is EventKind.TOOL_CALL_REQUESTED)
    old = dataclasses.replace(legacy[at].event, idempotency_key="sha256:" + "e" * 64)
    older = str(uuid.uuid4())
    await runtime.access.append(older, [e.event for e in legacy[:at]] + [old], EMPTY_VIEW)
    assert (await runtime.drive(older)).state is RunState.COMPLETED
    last = ledger(effects_path)[-1]
    assert (last["run_id"], last["idempotency_key"]) == (older, old.idempotency_key)
    await sound_log(runtime, older)
