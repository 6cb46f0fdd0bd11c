"""Flow tools in graph runs: an agent node's conversation is a child session whose finish is its
output (a branch node routes on its ``branch``, a later node reads its typed outputs), and a
graph run's autonomy reaches its agent nodes and its map children.
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.flows import AUTONOMOUS_LABEL, MAP_OF_LABEL
from salvor.daemon.graphs import map_child_id
from salvor.daemon.web import OperationRefused
from salvor.protocol import EventKind, RunState, graph_from_value

from tests.support.backends import SQLITE_ONLY
from tests.support.flows import offered_tools, tool_results, tool_use, triage_graph
from tests.support.runtime import ledger

# Above the store: the walk reaches it through the RunContext calls every run makes.
STORE_BACKENDS = SQLITE_ONLY

TRIAGE = 'outputs = [{ name = "priority" }]\nflow_tools = ["ask_user"]'


async def stored(runtime, document: dict):
    graph = graph_from_value(document)
    await runtime.definitions.register_graph(graph)
    return graph


async def test_an_agent_node_finishes_with_the_branch_its_branch_node_routes_on(
    runtime, providers, make_agent, effects_path
):
    urgent = {"status": "complete", "summary": "disk full", "branch": "urgent", "priority": "p1"}
    provider = providers(
        [
            tool_use("finish", {"status": "complete", "summary": "s", "priority": "p1"}),
            tool_use("finish", {**urgent, "branch": "soon"}),
            tool_use("finish", urgent),
        ]
    )
    agent = make_agent(provider, extra=TRIAGE)
    await runtime.definitions.register_agent(agent)
    graph = await stored(runtime, triage_graph(agent.agent_def_hash))
    run_id = await runtime.starts.start_graph_run(graph, "the disk is full")
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED

    assert offered_tools(provider.calls[0]) == ["ask_user", "finish"]
    (finish,) = [t for t in provider.calls[0].request["tools"] if t["name"] == "finish"]
    assert finish["input_schema"]["properties"]["branch"]["enum"] == ["urgent", "later"]
    assert "branch" in finish["input_schema"]["required"]
    no_branch, wrong_branch = (tool_results(call)[-1] for call in provider.calls[1:])
    assert no_branch["is_error"] and "branch" in no_branch["content"]
    assert wrong_branch["is_error"] and "urgent" in wrong_branch["content"]

    log = await runtime.reads.log(run_id)
    exits = {e.event.node: e.event for e in log if e.event.KIND is EventKind.NODE_EXITED}
    assert exits["triage"].output == {
        "status": "complete",
        "summary": "disk full",
        "outputs": {"priority": "p1"},
        "branch": "urgent",
    }
    assert exits["route"].branch_case == "urgent"
    (sent,) = [r for r in ledger(effects_path) if r["tool"] == "send_email"]
    assert sent["input"]["subject"] == "p1" and sent["input"]["body"] == "disk full"


async def test_an_autonomous_graph_runs_its_agent_nodes_and_map_items_autonomously(
    runtime, providers, make_agent
):
    provider = providers(
        lambda call: (
            tool_use("ask_user", {"question": "Which?", "type": "input"})
            if not tool_results(call)
            else tool_use("finish", {"status": "complete", "summary": "guessed", "priority": "p3"})
        )
    )
    agent = make_agent(provider, extra=TRIAGE)
    await runtime.definitions.register_agent(agent)
    graph = await stored(
        runtime,
        {
            "schema_version": 1,
            "nodes": [
                {"id": "one", "kind": "agent", "agent": agent.agent_def_hash, "input": "$input"},
                {
                    "id": "each",
                    "kind": "map",
                    "over": "$input.items",
                    "body": {"kind": "agent", "agent": agent.agent_def_hash, "input": "$item"},
                },
            ],
            "edges": [],
        },
    )
    run_id = await runtime.starts.start_graph_run(
        graph, {"items": ["a"]}, labels={AUTONOMOUS_LABEL: "true"}
    )
    view = await runtime.drive(run_id)
    assert view.state is RunState.COMPLETED
    assert "Suspended" not in [e.event.KIND.value for e in await runtime.reads.log(run_id)]
    for call in provider.calls:
        for result in tool_results(call):
            assert result["is_error"] and "autonomous" in result["content"]
    child = await runtime.reads.view(map_child_id(run_id, "each", 0))
    assert child.labels == {MAP_OF_LABEL: run_id, AUTONOMOUS_LABEL: "true"}
    assert child.status()["output"]["summary"] == "guessed"
    assert view.detail["output"]["each"][0]["outputs"] == {"priority": "p3"}


async def test_an_agent_nodes_question_parks_the_graph_run_until_it_is_answered(
    runtime, providers, make_agent
):
    finish = {"status": "complete", "summary": "asked", "branch": "later", "priority": "p2"}
    provider = providers(
        lambda call: (
            tool_use("ask_user", {"question": "How bad?", "type": "input"})
            if not tool_results(call)
            else tool_use("finish", finish)
        )
    )
    agent = make_agent(provider, extra=TRIAGE)
    await runtime.definitions.register_agent(agent)
    graph = await stored(runtime, triage_graph(agent.agent_def_hash))
    run_id = await runtime.starts.start_graph_run(graph, "something broke")
    view = await runtime.drive(run_id)
    assert view.state is RunState.SUSPENDED and view.open_node == "triage"
    assert view.detail["reason"] == "How bad?"
    with pytest.raises(OperationRefused) as refused:
        await runtime.control.resume(run_id, {"answer": 3})
    assert refused.value.code == "bad_request"
    await runtime.control.resume(run_id, {"answer": "not very"})
    view = await runtime.drive(run_id)
    assert view.state is RunState.SLEEPING  # routed `later`: the shelve delay
    assert json.loads(tool_results(provider.calls[1])[0]["content"]) == {"answer": "not very"}
