"""``flow_results`` over a run tree recorded by hand, on both backends: each action's answer, the
names ``flow`` and ``agent`` may take, the refusals naming what the tree holds, and that no
action (answered or refused) changes a row of any table of the store.

The tree: a main run that wrote two graphs with ``flow_write`` (one name twice: the newest
write wins), its children (a reviewer that finished with a typed result, one that failed, a
writer waiting on a person, and two graph runs of the publishing graph, one finished and one
parked at its gate), beside runs of another tree that must not show.
"""

from __future__ import annotations

import pytest
import trio
from salvor.daemon.agents import parse_definition
from salvor.daemon.flows import FLOW_LABEL, PARENT_LABEL, FlowSession
from salvor.daemon.runs._flow_catalog import FlowCatalog
from salvor.daemon.tools import ToolFailed
from salvor.protocol import (
    EMPTY_VIEW,
    RunCompleted,
    RunFailed,
    RunStarted,
    Session,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    graph_from_value,
)

from tests.protocol.graphs import chain, publishing
from tests.support.flows import store_tables
from tests.support.graph_runs import APPROVAL, SKIP_REASON, published

MAIN = "10000000-0000-4000-8000-000000000001"
REVIEWED = "10000000-0000-4000-8000-000000000002"
FAILED = "10000000-0000-4000-8000-000000000003"
WAITING = "10000000-0000-4000-8000-000000000004"
GRAPH_DONE = "10000000-0000-4000-8000-000000000005"
GRAPH_GATED = "10000000-0000-4000-8000-000000000006"
STRANGER = "10000000-0000-4000-8000-000000000007"
STRANGERS_CHILD = "10000000-0000-4000-8000-000000000008"
BY_NAME_DONE = "10000000-0000-4000-8000-000000000009"
BY_NAME_GATED = "10000000-0000-4000-8000-00000000000a"

PUBLISHING = graph_from_value(publishing())
CHAIN = graph_from_value(chain(2))
VERDICT = {"status": "complete", "summary": "the refund is owed", "outputs": {"verdict": "pay"}}


def _agent(name: str):
    text = (
        f'name = "{name}"\nmodel = "m"\nsystem_prompt = "You {name}."\n[llm]\nprovider = "demo"\n'
    )
    return parse_definition(text, "toml")


def _flow_write(seq: int, name: str, graph: str) -> list:
    return [
        ToolCallRequested(
            tool="flow_write",
            input={"name": name, "content": "..."},
            effect="idempotent",
            idempotency_key=f"k{seq}",
        ),
        ToolCallCompleted(
            seq=seq,
            output={"written": True, "diagnostics": [], "graph": graph, "flow": f"custom/{name}"},
        ),
    ]


@pytest.fixture
async def tree(runtime):
    reviewer, writer, main = _agent("reviewer"), _agent("writer"), _agent("main")
    for agent in (reviewer, writer, main):
        await runtime.definitions.register_agent(agent)
    await runtime.definitions.register_graph(PUBLISHING)
    await runtime.definitions.register_graph(CHAIN)
    child = {PARENT_LABEL: MAIN}
    logs = {
        MAIN: [
            RunStarted(agent_def_hash=main.agent_def_hash, input=None),
            *_flow_write(1, "publishing", CHAIN.hash),
            *_flow_write(3, "publishing", PUBLISHING.hash),
            *_flow_write(5, "pair", CHAIN.hash),
        ],
        REVIEWED: [
            RunStarted(agent_def_hash=reviewer.agent_def_hash, input={"task": "t"}, labels=child),
            RunCompleted(output=VERDICT),
        ],
        FAILED: [
            RunStarted(agent_def_hash=reviewer.agent_def_hash, input={"task": "u"}, labels=child),
            RunFailed(error="the model refused"),
        ],
        WAITING: [
            RunStarted(agent_def_hash=writer.agent_def_hash, input={"task": "v"}, labels=child),
            Suspended(reason="Which tone?", input_schema=APPROVAL),
        ],
        GRAPH_DONE: published(PUBLISHING.hash, labels=child),
        # Parked at the gate: research and draft exited, approve entered.
        GRAPH_GATED: published(PUBLISHING.hash, labels=child)[:15],
        STRANGER: [RunStarted(agent_def_hash=main.agent_def_hash, input=None)],
        STRANGERS_CHILD: [
            RunStarted(
                agent_def_hash=reviewer.agent_def_hash,
                input=None,
                labels={PARENT_LABEL: STRANGER},
            ),
            RunCompleted(output="not yours"),
        ],
        # Two runs the operator started by the flow's name (nobody's children), the newer parked.
        BY_NAME_DONE: published(PUBLISHING.hash, labels={FLOW_LABEL: "team/publishing"}),
        BY_NAME_GATED: published(PUBLISHING.hash, labels={FLOW_LABEL: "team/publishing"})[:15],
    }
    for run_id, events in logs.items():
        await runtime.access.append(run_id, events, EMPTY_VIEW)
    return FlowCatalog(runtime.definitions, credentials=runtime.kit.credentials)


async def _results(host: FlowCatalog, **args):
    session = FlowSession(run_id=MAIN, session=Session.MAIN, host=host)
    return await host.flow_results(session, args)


async def test_list_shows_the_finished_children_and_the_flows_written(tree) -> None:
    answer = await _results(tree, action="list")
    assert answer["flows"] == [
        {"flow": "custom/publishing", "graph": PUBLISHING.hash},
        {"flow": "custom/pair", "graph": CHAIN.hash},
    ]
    results = {entry["run"]: entry for entry in answer["results"]}
    assert set(results) == {REVIEWED, FAILED, GRAPH_DONE}
    assert results[REVIEWED] == {
        "run": REVIEWED,
        "agent": "reviewer",
        "state": "completed",
        "status": "complete",
        "summary": "the refund is owed",
        "outputs": ["verdict"],
    }
    assert results[FAILED] == {
        "run": FAILED,
        "agent": "reviewer",
        "state": "failed",
        "status": "error",
        "summary": "the model refused",
        "outputs": [],
    }
    # A run output that is no finish result reads as a complete one with its text as summary.
    assert results[GRAPH_DONE]["graph"] == PUBLISHING.hash
    assert results[GRAPH_DONE]["flow"] == "custom/publishing"
    assert results[GRAPH_DONE]["status"] == "complete"
    assert results[GRAPH_DONE]["summary"] == '{"publish": {"posted": true}, "tally": 7}'


async def test_summary_names_a_child_by_id_agent_name_or_flow(tree) -> None:
    by_name = await _results(tree, action="summary", flow="reviewer")
    # The newest child of that agent: the failed one was recorded after the reviewed one.
    assert by_name["run"] == FAILED
    by_id = await _results(tree, action="summary", flow=REVIEWED)
    assert by_id["steps"] == [
        {
            "step": "reviewer",
            "state": "finished",
            "status": "complete",
            "summary": "the refund is owed",
            "outputs": ["verdict"],
        }
    ]
    # The flow's name finds its newest graph run, here the one parked at the gate.
    gated = await _results(tree, action="summary", flow="custom/publishing")
    assert gated["run"] == GRAPH_GATED
    assert [(s["node"], s["state"]) for s in gated["steps"]] == [
        ("research", "finished"),
        ("draft", "finished"),
        ("approve", "running"),
    ]
    assert gated["steps"][0] == {
        "node": "research",
        "name": "Research",
        "state": "finished",
        "status": "complete",
        "summary": "notes",
        "outputs": [],
    }
    done = await _results(tree, action="summary", flow=GRAPH_DONE)
    skipped = next(step for step in done["steps"] if step["node"] == "cool_off")
    assert skipped == {
        "node": "cool_off",
        "state": "finished",
        "status": "skipped",
        "summary": SKIP_REASON,
    }


async def test_agent_shows_one_node_or_one_child_in_full(tree) -> None:
    route = await _results(tree, action="agent", flow=GRAPH_DONE, agent="route")
    assert route == {
        "run": GRAPH_DONE,
        "graph": PUBLISHING.hash,
        "flow": "custom/publishing",
        "state": "completed",
        "step": {
            "node": "route",
            "state": "finished",
            "input": True,
            "status": "complete",
            "summary": "true",
            "outputs": {},
            "branch_case": "true",
        },
    }
    by_node_name = await _results(tree, action="agent", flow=GRAPH_DONE, agent="Research")
    assert by_node_name["step"]["node"] == "research"
    assert by_node_name["step"]["input"] == {"topic": "tides"}
    pending = await _results(tree, action="agent", flow=GRAPH_GATED, agent="publish")
    assert pending["step"] == {"node": "publish", "state": "pending"}

    reviewed = await _results(tree, action="agent", flow=REVIEWED, agent="reviewer")
    assert reviewed == {
        "run": REVIEWED,
        "agent": "reviewer",
        "state": "completed",
        "step": {
            "step": "reviewer",
            "state": "finished",
            "input": {"task": "t"},
            **VERDICT,
            "usage": {"input_tokens": 0, "output_tokens": 0},
            "step_count": 0,
        },
    }


async def test_runs_counts_the_children_or_shows_one_runs_nodes(tree) -> None:
    answer = await _results(tree, action="runs")
    assert {entry["run"] for entry in answer["runs"]} == {
        REVIEWED,
        FAILED,
        WAITING,
        GRAPH_DONE,
        GRAPH_GATED,
    }
    assert answer["counts"] == {"completed": 2, "failed": 1, "suspended": 2}
    gated = next(entry for entry in answer["runs"] if entry["run"] == GRAPH_GATED)
    # Eight nodes: two finished, one running, the five the walk has not reached pending.
    assert gated["nodes"] == {"finished": 2, "pending": 5, "running": 1}

    nodes = (await _results(tree, action="runs", flow=GRAPH_GATED))["nodes"]
    # In walk order, then the nodes not reached in the graph's own order.
    reached = [("research", "finished"), ("draft", "finished"), ("approve", "running")]
    assert [(n["node"], n["state"]) for n in nodes][:3] == reached
    assert [n["node"] for n in nodes[3:]] == [
        node for node in PUBLISHING.order if node not in {"research", "draft", "approve"}
    ]
    assert all(n == {"node": n["node"], "state": "pending"} for n in nodes[3:])
    assert nodes[1] == {
        "node": "draft",
        "state": "finished",
        "status": "complete",
        "summary": "draft one",
        "outputs": [],
    }
    waiting = await _results(tree, action="runs", flow="writer")
    assert waiting["nodes"] == [{"node": "writer", "state": "running"}]


async def test_a_flows_name_finds_the_newest_run_started_by_it_outside_the_tree(tree) -> None:
    by_name = await _results(tree, action="summary", flow="team/publishing")
    assert (by_name["run"], by_name["flow"], by_name["state"]) == (
        BY_NAME_GATED,
        "team/publishing",
        "suspended",
    )
    assert [(s["node"], s["state"]) for s in by_name["steps"]][-1] == ("approve", "running")
    nodes = (await _results(tree, action="runs", flow="team/publishing"))["nodes"]
    assert {n["state"] for n in nodes} == {"finished", "running", "pending"}
    research = await _results(tree, action="agent", flow="team/publishing", agent="research")
    assert research["step"]["input"] == {"topic": "tides"}
    # Not the tree's: neither listed nor counted among its runs.
    listed = await _results(tree, action="list")
    assert BY_NAME_DONE not in {entry["run"] for entry in listed["results"]}
    assert len((await _results(tree, action="runs"))["runs"]) == 5
    # A name the run wrote still answers with the tree's own run of it.
    assert (await _results(tree, action="summary", flow="custom/publishing"))["run"] == GRAPH_GATED


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"action": "summary", "flow": "reveiwer"}, "did you mean 'reviewer'?"),
        ({"action": "summary", "flow": STRANGERS_CHILD}, REVIEWED),
        ({"action": "summary", "flow": "team/nothing"}, "answers to `flow` 'team/nothing'"),
        ({"action": "summary"}, "action `summary` needs `flow`"),
        ({"action": "agent", "flow": REVIEWED}, "needs `agent` as well as `flow`"),
        ({"action": "agent", "flow": GRAPH_DONE, "agent": "drafts"}, "did you mean 'draft'?"),
        ({"action": "agent", "flow": REVIEWED, "agent": "writer"}, "runs the agent 'reviewer'"),
    ],
)
async def test_a_name_nothing_answers_to_is_refused_naming_what_is_there(tree, args, says) -> None:
    with pytest.raises(ToolFailed) as refused:
        await _results(tree, **args)
    assert refused.value.retryable is False
    assert says in refused.value.message


async def test_no_action_changes_any_row_of_the_store(tree, store_url) -> None:
    before = await trio.to_thread.run_sync(store_tables, store_url)
    assert all(before[table] for table in ("events", "runs", "agents", "graphs", "store_meta"))
    asked = [
        {"action": "list"},
        {"action": "runs"},
        *({"action": "runs", "flow": flow} for flow in (GRAPH_DONE, GRAPH_GATED, "writer")),
        *({"action": "summary", "flow": flow} for flow in ("reviewer", "custom/pair", WAITING)),
        {"action": "agent", "flow": GRAPH_GATED, "agent": "approve"},
        {"action": "agent", "flow": REVIEWED, "agent": "reviewer"},
        {"action": "summary", "flow": "nobody"},
        {"action": "agent", "flow": GRAPH_DONE, "agent": "nobody"},
    ]
    for args in asked:
        try:
            await _results(tree, **args)
        except ToolFailed:
            pass
    assert await trio.to_thread.run_sync(store_tables, store_url) == before
