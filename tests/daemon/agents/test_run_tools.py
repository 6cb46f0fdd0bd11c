"""Tools attached to a run tree at run time (issue 32, item 5), in the built-in loop: the
operator's attachment offered from the run's next model call and called like any tool, a child
started after it inheriting it, a replay offering what the recorded calls offered, and an
agent's ``attach_tool`` held to the operator's allow-list.

Real runs over a real store, the scripted provider as the only double.
"""

from __future__ import annotations

import json
import uuid

import pytest
import trio
from salvor.daemon.agents import parse_definition
from salvor.daemon.flows import PARENT_LABEL, TOOLS_LABEL, child_run_id
from salvor.daemon.graphs import map_child_id
from salvor.daemon.runs import Runtime
from salvor.daemon.runs import _run_tools as run_tools_module
from salvor.daemon.web import OperationRefused
from salvor.protocol import EventKind, RunStarted, RunState, ToolsAttached, graph_from_value

from tests.support.flows import offered_tools, tool_results, tool_use, with_flows
from tests.support.runtime import agent_toml, ledger
from tests.support.scripted_provider import text_reply

QUESTION = {"question": "Which invoice?", "type": "input"}
LOOKUP = {"invoice_id": "INV-7"}


def kinds(log) -> list[str]:
    return [envelope.event.KIND.value for envelope in log]


async def start(runtime, agent, labels=None) -> str:
    await runtime.definitions.register_agent(agent)
    run_id = str(uuid.uuid4())
    head = RunStarted(agent_def_hash=agent.agent_def_hash, input="the task", labels=labels)
    await runtime.starts.open_log(run_id, [head])
    return run_id


def lookups(effects_path) -> list[dict]:
    return [entry for entry in ledger(effects_path) if entry["tool"] == "lookup_invoice"]


async def test_an_attached_tool_is_offered_from_the_next_model_call_and_called(
    runtime, providers, make_agent, effects_path
):
    provider = providers(
        [tool_use("ask_user", QUESTION), tool_use("lookup_invoice", LOOKUP), text_reply("paid")]
    )
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    run_id = await start(runtime, agent)
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.SUSPENDED

    attached = await runtime.tools.attach(run_id, ["lookup_invoice"])
    assert attached == {"run_id": run_id, "tools": ["lookup_invoice"], "runs": [run_id], "busy": []}
    log = await runtime.reads.log(run_id)
    assert log[-1].event == ToolsAttached(tools=["lookup_invoice"], by="operator")
    # Resting where it was: the attachment changes no state.
    assert (await runtime.reads.view(run_id)).state is RunState.SUSPENDED

    await runtime.control.resume(run_id, {"answer": "INV-7"})
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "paid"}
    assert offered_tools(provider.calls[0]) == ["ask_user"]
    assert offered_tools(provider.calls[1]) == ["lookup_invoice", "ask_user"]
    # Called like any registry tool: performed once, its answer told to the model.
    (performed,) = lookups(effects_path)
    assert performed["run_id"] == run_id
    answer = json.loads(tool_results(provider.calls[2])[-1]["content"])
    assert answer["invoice_id"] == "INV-7"
    calls = [
        e.event.tool
        for e in await runtime.reads.log(run_id)
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED
    ]
    assert calls == ["ask_user", "lookup_invoice"]


async def test_a_replay_offers_what_each_recorded_call_offered(
    runtime, providers, make_agent, effects_path
):
    """Recovery re-runs the loop from the top: the calls before the attachment are matched
    without the tool, the ones after with it; nothing is performed again."""
    provider = providers(
        [
            tool_use("ask_user", QUESTION),
            tool_use("lookup_invoice", LOOKUP),
            tool_use("ask_user", {"question": "Refund it?", "type": "confirm"}),
            text_reply("left alone"),
        ]
    )
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    run_id = await start(runtime, agent)
    await runtime.drive(run_id, agent=agent)
    await runtime.tools.attach(run_id, ["lookup_invoice"])
    await runtime.control.resume(run_id, {"answer": "INV-7"})
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.SUSPENDED
    # A fresh runtime over the same store (a restarted daemon) replays the whole prefix.
    again = Runtime(runtime.access, runtime.kit.registry, clock=runtime.kit.clock)
    await again.control.resume(run_id, {"answer": False})
    view = await again.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "left alone"}
    assert len(provider.calls) == 4
    assert offered_tools(provider.calls[3]) == ["lookup_invoice", "ask_user"]
    assert len(lookups(effects_path)) == 1


async def test_a_child_started_after_the_attachment_inherits_it(
    runtime, providers, make_agent, effects_path
):
    child_provider = providers([tool_use("lookup_invoice", LOOKUP), text_reply("child done")])
    helper = parse_definition(
        'name = "helper"\n' + agent_toml(child_provider.base_url),
        "toml",
        known_tools=runtime.kit.registry.names(),
    )
    await runtime.definitions.register_agent(helper)
    call = {"agent": "helper", "task": "look INV-7 up"}
    provider = providers(
        [tool_use("ask_user", QUESTION), tool_use("subagent", call), text_reply("parent done")]
    )
    parent = with_flows(make_agent(provider), flow_tools=["ask_user", "subagent"])
    run_id = await start(runtime, parent)
    await runtime.drive(run_id, agent=parent)
    await runtime.tools.attach(run_id, ["lookup_invoice"])
    await runtime.control.resume(run_id, {"answer": "INV-7"})
    view = await runtime.drive(run_id, agent=parent)
    assert view.status() == {"state": "completed", "output": "parent done"}

    (call_intent,) = [
        e for e in await runtime.reads.log(run_id) if getattr(e.event, "tool", None) == "subagent"
    ]
    child = child_run_id(run_id, call_intent.seq)
    child_view = await runtime.reads.view(child)
    assert child_view.labels == {PARENT_LABEL: run_id, TOOLS_LABEL: "lookup_invoice"}
    assert offered_tools(child_provider.calls[0]) == ["lookup_invoice"]
    (performed,) = lookups(effects_path)
    assert performed["run_id"] == child


async def test_an_attachment_reaches_a_resting_child_and_skips_ended_ones(
    runtime, providers, make_agent
):
    provider = providers([tool_use("ask_user", QUESTION), text_reply("done")])
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    root = await start(runtime, agent)
    resting = await start(runtime, agent, {PARENT_LABEL: root})
    await runtime.drive(resting, agent=agent)
    ended = await start(runtime, make_agent(providers([text_reply("x")])), {PARENT_LABEL: root})
    await runtime.drive(ended)
    attached = await runtime.tools.attach(root, ["lookup_invoice", "lookup_invoice"])
    assert attached["runs"] == [root, resting]
    assert kinds(await runtime.reads.log(resting))[-1] == "ToolsAttached"
    assert "ToolsAttached" not in kinds(await runtime.reads.log(ended))
    # Attaching again records nothing more; a new name is recorded alone.
    logs = [await runtime.reads.log(run) for run in (root, resting)]
    await runtime.tools.attach(root, ["lookup_invoice"])
    assert [await runtime.reads.log(run) for run in (root, resting)] == logs
    again = await runtime.tools.attach(root, ["lookup_invoice", "lookup_refund"])
    assert again["tools"] == ["lookup_invoice", "lookup_refund"]
    assert (await runtime.reads.log(resting))[-1].event == ToolsAttached(
        tools=["lookup_refund"], by="operator"
    )


@pytest.mark.parametrize(
    ("names", "code"),
    [(["no_such_tool"], "unknown_tool"), (["lookup_invoice", "nope"], "unknown_tool")],
)
async def test_an_unknown_tool_is_refused_with_nothing_recorded(
    runtime, providers, make_agent, names, code
):
    provider = providers([tool_use("ask_user", QUESTION)])
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    run_id = await start(runtime, agent)
    await runtime.drive(run_id, agent=agent)
    before = await runtime.reads.log(run_id)
    with pytest.raises(OperationRefused) as refused:
        await runtime.tools.attach(run_id, names)
    assert refused.value.code == code
    assert await runtime.reads.log(run_id) == before


async def test_an_ended_run_takes_no_attachment(runtime, providers, make_agent):
    agent = make_agent(providers([text_reply("done")]))
    run_id = await start(runtime, agent)
    await runtime.drive(run_id, agent=agent)
    with pytest.raises(OperationRefused) as refused:
        await runtime.tools.attach(run_id, ["lookup_invoice"])
    assert refused.value.code == "wrong_state"


async def _edit_mode_on() -> bool:
    return True


async def test_an_agents_attach_tool_is_held_to_the_operators_allow_list(
    runtime, providers, make_agent, effects_path
):
    runtime.kit.flows.edit_mode = _edit_mode_on
    runtime.kit.flows.attachable = frozenset({"lookup_invoice"})
    provider = providers(
        [
            tool_use("attach_tool", {"tools": ["issue_refund"]}),
            tool_use("attach_tool", {"tools": ["lookup_invoice"]}),
            tool_use("lookup_invoice", LOOKUP),
            text_reply("found it"),
        ]
    )
    agent = with_flows(make_agent(provider), flow_tools=["attach_tool"])
    run_id = await start(runtime, agent)
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "found it"}
    refused = tool_results(provider.calls[1])[-1]
    assert refused["is_error"] is True
    assert "does not allow agents to attach 'issue_refund'" in refused["content"]
    assert offered_tools(provider.calls[1]) == ["attach_tool"]
    assert offered_tools(provider.calls[2]) == ["lookup_invoice", "attach_tool"]
    assert len(lookups(effects_path)) == 1


async def test_without_edit_mode_an_agent_is_not_offered_attach_tool(
    runtime, providers, make_agent
):
    runtime.kit.flows.attachable = frozenset({"lookup_invoice"})
    provider = providers([text_reply("nothing to do")])
    agent = with_flows(make_agent(provider), flow_tools=["attach_tool"])
    run_id = await start(runtime, agent)
    await runtime.drive(run_id, agent=agent)
    assert offered_tools(provider.calls[0]) == []


APPROVAL = {
    "type": "object",
    "required": ["approved"],
    "properties": {"approved": {"type": "boolean"}},
}


async def gated_graph(runtime, agent_hash: str):
    """approve (a gate) -> look (an agent node) -> each (a map of the agent over two items)."""
    graph = graph_from_value(
        {
            "schema_version": 1,
            "nodes": [
                {"id": "approve", "kind": "gate", "prompt": "Go?", "approval_schema": APPROVAL},
                {"id": "look", "kind": "agent", "agent": agent_hash, "input": "$input"},
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input",
                    "body": {"kind": "agent", "agent": agent_hash, "input": "$item"},
                },
            ],
            "edges": [{"from": "approve", "to": "look"}, {"from": "look", "to": "each"}],
        }
    )
    await runtime.definitions.register_graph(graph)
    return graph


async def test_a_graphs_agent_node_its_map_items_and_a_fork_see_the_attachment(
    runtime, providers, make_agent, effects_path
):
    def script(call):
        # Look the invoice up once per conversation, then answer.
        if tool_results(call):
            return text_reply("looked")
        return tool_use("lookup_invoice", LOOKUP)

    provider = providers(script)
    agent = make_agent(provider)
    await runtime.definitions.register_agent(agent)
    graph = await gated_graph(runtime, agent.agent_def_hash)
    run_id = await runtime.starts.start_graph_run(graph, ["INV-7", "INV-8"])
    assert (await runtime.drive(run_id)).state is RunState.SUSPENDED  # at the gate

    await runtime.tools.attach(run_id, ["lookup_invoice"])
    await runtime.control.resume(run_id, {"approved": True})
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED, view.detail
    # The agent node and both map items were offered it, and each called it once.
    assert [offered_tools(call) for call in provider.calls] == [["lookup_invoice"]] * 6
    assert len(lookups(effects_path)) == 3
    item = map_child_id(run_id, "each", 0)
    assert (await runtime.reads.view(item)).labels[TOOLS_LABEL] == "lookup_invoice"

    # A fork re-walking the agent node copies the attachment with the prefix it cuts.
    fork_id, _ = await runtime.forks.fork(await runtime.forks.plan_fork(run_id, "look"))
    assert "ToolsAttached" in kinds(await runtime.reads.log(fork_id))
    assert (await runtime.drive(fork_id)).state is RunState.COMPLETED
    assert [offered_tools(call) for call in provider.calls[6:]] == [["lookup_invoice"]] * 6


async def test_a_run_a_drive_holds_past_the_wait_is_refused_and_a_held_child_is_busy(
    runtime, providers, make_agent, monkeypatch
):
    monkeypatch.setattr(run_tools_module, "HOLD_WAIT_SECONDS", 0.2)
    provider = providers([tool_use("ask_user", QUESTION)] * 2)
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    root = await start(runtime, agent)
    await runtime.drive(root, agent=agent)
    child = await start(runtime, agent, {PARENT_LABEL: root})
    await runtime.drive(child, agent=agent)
    held, release = trio.Event(), trio.Event()

    async def hold(run_id: str) -> None:
        async with runtime.access.driving.hold(run_id):
            held.set()
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, root)
        await held.wait()
        before = await runtime.reads.log(root)
        with pytest.raises(OperationRefused) as refused:
            await runtime.tools.attach(root, ["lookup_invoice"])
        assert refused.value.code == "wrong_state"
        assert "did not rest within 0.2s" in refused.value.message
        assert await runtime.reads.log(root) == before
        release.set()

    held, release = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold, child)
        await held.wait()
        attached = await runtime.tools.attach(root, ["lookup_invoice"])
        release.set()
    assert (attached["runs"], attached["busy"]) == ([root], [child])
    assert "ToolsAttached" not in kinds(await runtime.reads.log(child))
