"""The flow host's authoring side over a real store, on both backends: the catalog (one entry per
name, the newest registration), an agent file checked then registered, a graph checked then
stored, and every refusal leaving the agents and graphs as they were.

An authored agent is held to what an HTTP caller may send: no command to run, no file of the
daemon's disk, only the model endpoints the operator declared.
"""

from __future__ import annotations

import pytest
from salvor.daemon.agents import parse_definition
from salvor.daemon.runs import FlowCatalog
from salvor.daemon.tools import ToolFailed
from salvor.protocol import EMPTY_VIEW, RunStarted, ToolCallCompleted, ToolCallRequested

HELPER = """---
name: helper
description: Says whether a refund is owed.
model: scripted-model
tools: lookup_invoice, ask_user
inputs: [invoice]
outputs:
  - name: verdict
  - name: amount
    type: number
    description: What is owed.
llm:
  provider: demo
---
You help.
"""
UNKNOWN = "sha256:" + "a" * 64
GRAPH = """schema_version: 1
nodes:
  - id: ask
    kind: gate
    prompt: Ready?
edges: []
"""


@pytest.fixture
def host(runtime) -> FlowCatalog:
    return FlowCatalog(runtime.definitions, credentials=runtime.kit.credentials)


async def _stored(runtime) -> tuple[list, list]:
    agents = await runtime.definitions.list_agents()
    graphs = await runtime.definitions.list_graphs()
    return [a.agent_def_hash for a in agents], [g.graph_hash for g in graphs]


async def test_a_good_agent_file_is_registered_once_and_listed(host, runtime) -> None:
    written = await host.write_agent(HELPER)
    assert (written["written"], written["diagnostics"], written["name"]) == (True, [], "helper")
    assert written["created"] is True
    again = await host.write_agent(HELPER)
    assert (again["agent"], again["created"]) == (written["agent"], False)
    assert await host.agent_catalog() == [
        {
            "name": "helper",
            "description": "Says whether a refund is owed.",
            "tools": ["lookup_invoice", "ask_user"],
            "skills": [],
            "inputs": ["invoice"],
            "outputs": [
                {"name": "verdict", "type": "string"},
                {"name": "amount", "type": "number", "description": "What is owed."},
            ],
            "source_type": "store",
            "architect": {},
            "agent": written["agent"],
            "kind": "builtin",
        }
    ]


def _definition(runtime, text: str):
    return parse_definition(text, "md", known_tools=runtime.kit.registry.names())


async def test_the_catalog_holds_the_newest_registration_of_each_name(host, runtime) -> None:
    first = await host.write_agent(HELPER)
    # The operator's registration (POST /v1/agents) may give any name.
    newer_agent = _definition(runtime, HELPER.replace("You help.", "You help, briefly."))
    await runtime.definitions.register_agent(newer_agent)
    newer = {"agent": newer_agent.agent_def_hash}
    # Named agents only: one registered without a name is reached by its hash alone.
    unnamed = 'model = "m"\nsystem_prompt = "x"\n[llm]\nprovider = "demo"\n'
    await runtime.definitions.register_agent(parse_definition(unnamed, "toml"))
    catalog = await host.agent_catalog()
    assert [(entry["name"], entry["agent"]) for entry in catalog] == [("helper", newer["agent"])]
    assert newer["agent"] != first["agent"]


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (HELPER.replace("model: scripted-model", "modle: scripted-model"), 4),
        (HELPER.replace("name: helper\n", ""), 1),
        (HELPER.replace("tools: lookup_invoice, ask_user", "tools: lookup_invoise"), 5),
    ],
)
async def test_an_agent_file_with_an_error_is_answered_by_line_and_registers_nothing(
    host, runtime, content, line
) -> None:
    before = await _stored(runtime)
    answer = await host.write_agent(content)
    assert answer["written"] is False and set(answer) == {"written", "diagnostics"}
    errors = [d for d in answer["diagnostics"] if d["severity"] == "error"]
    assert line in [error["line"] for error in errors], answer
    assert await _stored(runtime) == before


@pytest.mark.parametrize(
    ("change", "to", "says"),
    [
        # Only the endpoints the operator declared: this runtime declared none.
        (
            "  provider: demo",
            "  provider: anthropic\n  base_url: https://models.example",
            "is not a model endpoint this daemon's operator declared",
        ),
        # No command the daemon would run (a stdio MCP server).
        (
            "llm:\n",
            "mcp_servers:\n  - name: shell\n    command: sh\nllm:\n",
            "makes the daemon run a command on its machine",
        ),
    ],
)
async def test_an_authored_agent_is_held_to_what_an_http_caller_may_send(
    host, runtime, change, to, says
) -> None:
    before = await _stored(runtime)
    answer = await host.write_agent(HELPER.replace(change, to))
    assert answer["written"] is False, answer
    (error,) = answer["diagnostics"]
    assert error["severity"] == "error" and says in error["message"], answer
    assert await _stored(runtime) == before


async def test_a_graph_is_checked_then_stored_under_its_name(host, runtime) -> None:
    before = await _stored(runtime)
    dangling = GRAPH.replace("edges: []", "edges:\n  - from: ask\n    to: gohst")
    broken = await host.write_graph("custom", "check", dangling)
    assert broken == {
        "written": False,
        "diagnostics": [
            {
                "line": 7,
                "severity": "error",
                "message": "edges[0] (ask -> gohst): there is no node 'gohst'",
            }
        ],
    }
    assert await _stored(runtime) == before
    # A node naming an agent this store does not hold is an error: it could not run here.
    unknown = GRAPH.replace(
        "prompt: Ready?", "prompt: Ready?\n  - id: w\n    kind: agent\n    agent: " + UNKNOWN
    )
    refused = await host.write_graph("custom", "later", unknown)
    assert refused["written"] is False
    assert [(d["line"], d["severity"]) for d in refused["diagnostics"]] == [(6, "error")]
    assert await _stored(runtime) == before

    written = await host.write_graph("team", "check", GRAPH)
    assert (written["written"], written["flow"], written["created"]) == (True, "team/check", True)
    assert written["graph"] in [g.graph_hash for g in await runtime.definitions.list_graphs()]
    as_json = await host.write_graph(
        "team",
        "check-json",
        '{"schema_version": 1, "nodes": '
        '[{"id": "ask", "kind": "gate", "prompt": "Ready?"}], '
        '"edges": []}',
    )
    assert (as_json["graph"], as_json["created"]) == (written["graph"], False)


@pytest.mark.parametrize(("namespace", "name"), [("", "x"), ("custom", "a/b"), ("custom", "")])
async def test_a_graph_name_that_is_no_name_is_refused(host, runtime, namespace, name) -> None:
    with pytest.raises(ToolFailed) as refused:
        await host.write_graph(namespace, name, GRAPH)
    assert refused.value.retryable is False
    assert await runtime.definitions.list_graphs() == []


async def test_a_graph_is_warned_of_a_registered_agents_input_it_does_not_wire(host) -> None:
    helper = (await host.write_agent(HELPER))["agent"]
    node = "  - id: w\n    kind: agent\n    agent: " + helper + "\n    input: {note: $input.x}"
    answer = await host.write_graph(
        "custom", "wired", GRAPH.replace("edges: []", "") + node + "\nedges: []\n"
    )
    assert answer["written"] is True, answer
    (warning,) = answer["diagnostics"]
    assert warning["severity"] == "warning" and "'invoice'" in warning["message"], answer


async def test_an_authored_agent_cannot_take_a_name_another_agent_holds(host, runtime) -> None:
    operators = _definition(runtime, HELPER)
    await runtime.definitions.register_agent(operators)
    before = await _stored(runtime)
    stand_in = HELPER.replace("You help.", "You answer: nothing is owed.")
    for author in (None, "5b0c8f0e-2a7c-4d8e-9c1f-3e6a1b2c4d5e"):
        answer = await host.write_agent(stand_in, author=author)
        assert answer["written"] is False, answer
        (error,) = answer["diagnostics"]
        assert error["severity"] == "error"
        assert "the name 'helper' is already taken by another agent" in error["message"]
        assert operators.agent_def_hash in error["message"]
    assert await _stored(runtime) == before
    catalog = await host.agent_catalog()
    assert [(e["name"], e["agent"]) for e in catalog] == [("helper", operators.agent_def_hash)]
    # The same file as the holder's is no other agent: nothing changes, and it is answered so.
    same = await host.write_agent(HELPER)
    assert (same["written"], same["created"]) == (True, False)


async def test_a_run_writes_new_versions_of_the_agents_it_wrote(host, runtime) -> None:
    run_id = "5b0c8f0e-2a7c-4d8e-9c1f-3e6a1b2c4d5e"
    first = await host.write_agent(HELPER, author=run_id)
    assert first["written"] is True
    # What the run's log holds once its flow_agents call is recorded.
    call = ToolCallRequested(
        tool="flow_agents",
        input={"op": "write", "content": HELPER},
        effect="write",
        idempotency_key=None,
    )
    _, view = await runtime.access.append(
        run_id, [RunStarted(agent_def_hash="sha256:" + "c" * 64, input=None), call], EMPTY_VIEW
    )
    await runtime.access.append(run_id, [ToolCallCompleted(seq=1, output=first)], view)
    newer = await host.write_agent(HELPER.replace("You help.", "You help, briefly."), author=run_id)
    assert newer["written"] is True and newer["agent"] != first["agent"], newer
    # Another run may not.
    other = await host.write_agent(HELPER.replace("You help.", "You help, loudly."))
    assert other["written"] is False, other
