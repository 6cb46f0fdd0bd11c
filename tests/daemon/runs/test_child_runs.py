"""Subagent children and their parents in the runs layer: a parked child leaves its parent's
call open (resuming the parent then is harmless), the child ending starts the parent again,
recovery leaves a child to its interrupted parent's drive, and abandoning a parent abandons
its children, theirs too (a graph run's map items among them).
"""

from __future__ import annotations

import uuid

import pytest
import trio
from salvor.daemon.agents import parse_definition
from salvor.daemon.flows import MAP_OF_LABEL, PARENT_LABEL, child_run_id
from salvor.daemon.recording import DriveInterrupted
from salvor.daemon.runs import DriverSet
from salvor.protocol import EMPTY_VIEW, EventKind, ModelCallRequested, RunStarted, RunState

from tests.support.flows import tool_use
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import text_reply


def named(runtime, provider, name: str, tools=()):
    text = f'name = "{name}"\n' + agent_toml(provider.base_url, tools=tools)
    return parse_definition(text, "toml", known_tools=runtime.kit.registry.names())


async def head(runtime, run_id: str, labels=None, agent="sha256:" + "f" * 64, *more) -> None:
    events = [RunStarted(agent_def_hash=agent, input=None, labels=labels), *more]
    await runtime.access.append(run_id, events, EMPTY_VIEW)


async def test_a_parked_child_holds_its_parents_call_until_it_ends_then_the_parent_goes_on(
    runtime, providers, make_agent
):
    child_provider = providers(
        lambda call: (
            tool_use("request_approval", {"reason": "sign off?"})
            if len(call.request["messages"]) == 1
            else text_reply("approved and done")
        )
    )
    await runtime.definitions.register_agent(
        named(runtime, child_provider, "approver", ["request_approval"])
    )
    provider = providers(
        [tool_use("subagent", {"agent": "approver", "task": "t"}), text_reply("parent done")]
    )
    parent = make_agent(provider, extra='flow_tools = ["subagent"]')
    run_id = await runtime.starts.start_run(parent, "go")
    with pytest.raises(DriveInterrupted, match="suspended"):
        await runtime.drive(run_id, agent=parent)
    child = child_run_id(run_id, 3)
    assert (await runtime.reads.view(child)).state is RunState.SUSPENDED
    view = await runtime.reads.view(run_id)
    assert view.state is RunState.AWAITING_TOOL and view.pending.tool == "subagent"

    # Resuming the parent meanwhile stops at the open call again, recording nothing.
    before = view.event_count
    assert (await runtime.control.resume(run_id)).outcome == "driving"
    with pytest.raises(DriveInterrupted):
        await runtime.drive(run_id, agent=parent)
    assert (await runtime.reads.view(run_id)).event_count == before
    assert child_provider.call_count == 1

    # A person answers the child; its driver ends it and starts the parent, which completes.
    await runtime.control.resume(child, {"approved": True})
    async with trio.open_nursery() as nursery:
        drivers = DriverSet(runtime, nursery)
        drivers.start(child)
    assert (await runtime.reads.view(child)).state is RunState.COMPLETED
    view = await runtime.reads.view(run_id)
    assert view.status() == {"state": "completed", "output": "parent done"}
    assert provider.call_count == 2 and child_provider.call_count == 2


async def test_recovery_leaves_a_child_to_its_interrupted_parents_drive(runtime):
    parent, child, alone = (str(uuid.uuid4()) for _ in range(3))
    cut = ModelCallRequested(request_hash="sha256:" + "0" * 64)
    await head(runtime, parent, None, "sha256:" + "f" * 64, cut)
    await head(runtime, child, {PARENT_LABEL: parent}, "sha256:" + "f" * 64, cut)
    # A child whose parent is not interrupted (it ended) is recovered on its own.
    await head(runtime, alone, {PARENT_LABEL: str(uuid.uuid4())}, "sha256:" + "f" * 64, cut)
    assert sorted(await runtime.reads.interrupted_runs()) == sorted([parent, alone])


async def test_abandoning_a_parent_abandons_its_open_children_and_theirs(runtime):
    parent, open_child, grandchild, ended = (str(uuid.uuid4()) for _ in range(4))
    await head(runtime, parent)
    await head(runtime, open_child, {PARENT_LABEL: parent})
    await head(runtime, grandchild, {PARENT_LABEL: open_child})
    await head(runtime, ended, {PARENT_LABEL: parent})
    await runtime.control.abandon(ended, "done with it")
    ended_log = await runtime.reads.log(ended)

    await runtime.control.abandon(parent, "not needed")
    for run_id, reason in (
        (parent, "not needed"),
        (open_child, f"its parent run {parent} was abandoned"),
        (grandchild, f"its parent run {open_child} was abandoned"),
    ):
        view = await runtime.reads.view(run_id)
        assert view.state is RunState.ABANDONED
        assert view.detail["reason"] == reason
    assert await runtime.reads.log(ended) == ended_log
    kinds = [e.event.KIND for e in await runtime.reads.log(open_child)]
    assert kinds.count(EventKind.RUN_ABANDONED) == 1


async def test_abandoning_a_graph_run_abandons_its_open_map_items(runtime):
    graph_run, open_item, ended_item = (str(uuid.uuid4()) for _ in range(3))
    await head(runtime, graph_run)
    await head(runtime, open_item, {MAP_OF_LABEL: graph_run})
    await head(runtime, ended_item, {MAP_OF_LABEL: graph_run})
    await runtime.control.abandon(ended_item, "done with it")

    await runtime.control.abandon(graph_run, "not needed")
    view = await runtime.reads.view(open_item)
    assert view.state is RunState.ABANDONED
    assert view.detail["reason"] == f"its graph run {graph_run} was abandoned"
    assert (await runtime.reads.view(ended_item)).detail["reason"] == "done with it"
    # Nothing is left for the next start to recover as a run of its own.
    assert graph_run not in await runtime.reads.interrupted_runs()
    assert open_item not in await runtime.reads.interrupted_runs()
