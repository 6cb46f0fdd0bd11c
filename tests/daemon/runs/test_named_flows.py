"""``flow_write`` keeps a flow by name, on both backends: a second write with other content is
the name's next version (the first graph still stored and listed among its versions), the same
content again makes none, and the writing run is recorded as each version's author."""

from __future__ import annotations

import pytest
from salvor.daemon.runs import FlowCatalog, FlowNames
from salvor.daemon.web import OperationRefused

from tests.support.flows import tool_results, tool_use, with_flows
from tests.support.scripted_provider import text_reply

FIRST = """schema_version: 1
nodes:
  - id: ask
    kind: gate
    prompt: Ready?
edges: []
"""
SECOND = FIRST.replace("Ready?", "Ready now?")


@pytest.fixture
def host(runtime) -> FlowCatalog:
    return FlowCatalog(runtime.definitions, credentials=runtime.kit.credentials)


async def test_writing_a_name_again_makes_its_next_version_and_keeps_the_first(
    host, runtime
) -> None:
    names = FlowNames(runtime.definitions.access)
    first = await host.write_graph("team", "triage", FIRST, author="run-a")
    assert (first["flow"], first["version"], first["new_version"]) == ("team/triage", 1, True)
    second = await host.write_graph("team", "triage", SECOND, author="run-b")
    assert (second["version"], second["new_version"]) == (2, True)
    assert second["graph"] != first["graph"]
    # The same content again: no new version, and the answer says so.
    again = await host.write_graph("team", "triage", SECOND, author="run-c")
    assert (again["version"], again["new_version"], again["created"]) == (2, False, False)

    versions = await names.versions("team", "triage")
    assert [(v.version, v.graph_hash, v.run_id) for v in versions] == [
        (1, first["graph"], "run-a"),
        (2, second["graph"], "run-b"),
    ]
    # The first version's graph is still stored: a run started on it walks it to its end.
    assert await runtime.definitions.find_graph(first["graph"]) is not None
    namespace, name, current = await names.current("team/triage")
    assert (namespace, name, current.graph_hash) == ("team", "triage", second["graph"])
    (listed,) = await names.list()
    assert (listed.namespace, listed.name, listed.version) == ("team", "triage", 2)


async def test_a_refused_write_names_nothing(host, runtime) -> None:
    broken = FIRST.replace("edges: []", "edges:\n  - from: ask\n    to: gohst")
    assert (await host.write_graph("team", "triage", broken))["written"] is False
    assert await FlowNames(runtime.definitions.access).list() == []
    with pytest.raises(OperationRefused) as refused:
        await FlowNames(runtime.definitions.access).current("team/triage")
    assert refused.value.code == "unknown_flow"


async def test_a_built_in_agents_flow_write_keeps_the_flow_by_name(
    runtime, providers, make_agent
) -> None:
    await runtime.definitions.set_edit_mode(True)
    write = {"namespace": "team", "name": "triage"}
    plan = [
        tool_use("flow_write", {**write, "content": FIRST}),
        tool_use("flow_write", {**write, "content": SECOND}),
        text_reply("written"),
    ]
    provider = providers(lambda call: plan[len(tool_results(call))])
    agent = with_flows(make_agent(provider), flow_tools=["flow_write"])
    await runtime.definitions.register_agent(agent)
    run_id = await runtime.starts.start_run(agent, "write the triage flow")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "written"}

    versions = await runtime.definitions.flow_names.versions("team", "triage")
    assert [(v.version, v.run_id) for v in versions] == [(1, run_id), (2, run_id)]
