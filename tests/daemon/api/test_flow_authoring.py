"""A built-in main-session run over a real daemon whose agent opts into the authoring tools, on
both backends: its first model call is offered neither; edit mode is turned on over HTTP while
the run waits on its ``ask_user``, and the next call (after the answer, without a restart) is
offered both. It then writes a bad agent file and a good one (line-numbered diagnostics; nothing
registered, then registered), a bad graph and a good one likewise, hands a task to the agent it
wrote, lists the catalog and reads its results. Afterwards every ``flow_results`` action over
its tree leaves every table of the store as it was.

The scripted provider is the only double; the main agent and the child it writes both talk to it
(told apart by their system prompts).
"""

from __future__ import annotations

import json

import trio
from salvor.daemon.flows import FlowSession
from salvor.daemon.tools import ToolFailed
from salvor.protocol import Session

from tests.support.api_server import agent_toml
from tests.support.flows import offered_tools, store_tables, tool_results, tool_use
from tests.support.scripted_provider import text_reply

EDIT_MODE = "/v1/settings/edit-mode"
MAIN_TOOLS = ["ask_user", "subagent", "flow_results", "flow_agents", "flow_write"]

BROKEN_AGENT = """---
name: broken
description: Misspells its model.
modle: scripted-model
---
You are broken.
"""
BROKEN_GRAPH = """schema_version: 1
nodes:
  - id: ask
    kind: gate
    prompt: Ready?
edges:
  - from: ask
    to: gohst
"""
GOOD_GRAPH = """schema_version: 1
nodes:
  - id: ask
    kind: gate
    prompt: Ready?
edges: []
"""


def helper_agent(base_url: str) -> str:
    return f"""---
name: helper
description: Says whether a refund is owed.
model: scripted-model
inputs: [invoice]
outputs:
  - name: verdict
llm:
  provider: anthropic
  base_url: {base_url}
  max_retries: 0
---
You help.
"""


def main_script(base_url: str):
    """The main conversation's turns, by how many tool results it holds; the child's one."""
    turns = [
        tool_use("ask_user", {"question": "Shall I write the helper?", "type": "confirm"}),
        tool_use("flow_agents", {"op": "write", "content": BROKEN_AGENT}),
        tool_use("flow_agents", {"op": "write", "content": helper_agent(base_url)}),
        tool_use("flow_write", {"name": "check", "content": BROKEN_GRAPH}),
        tool_use("flow_write", {"name": "check", "content": GOOD_GRAPH}),
        tool_use("subagent", {"agent": "helper", "task": "INV-7", "inputs": {"invoice": "7"}}),
        tool_use("flow_agents", {"op": "list"}),
        tool_use("flow_results", {"action": "list"}),
        text_reply("all written"),
    ]

    def script(call):
        if call.request.get("system") == "You help.":
            return tool_use("finish", {"status": "complete", "summary": "owed", "verdict": "pay"})
        return turns[len(tool_results(call))]

    return script


def _answer(call, index: int) -> tuple[dict, bool]:
    result = tool_results(call)[index]
    return json.loads(result["content"]), bool(result.get("is_error"))


async def test_edit_mode_flipped_while_a_run_waits_offers_authoring_at_its_next_call(
    server, providers, store_url
) -> None:
    scripts = {}
    provider = providers(lambda call: scripts["main"](call))
    scripts["main"] = main_script(provider.base_url)
    flow_tools = "flow_tools = " + json.dumps(MAIN_TOOLS) + "\n"
    main = await server.register_agent(
        agent_toml(provider.base_url, name="author", extra=flow_tools)
    )
    api = server.client
    assert (await api.get(EDIT_MODE)).json() == {"enabled": False}
    run_id = await server.start_run(main, "write me a helper")
    waiting = await server.wait_resting(run_id)
    assert waiting["status"]["state"] == "suspended"
    assert offered_tools(provider.calls[0]) == ["ask_user", "subagent", "flow_results"]

    response = await api.put(EDIT_MODE, json={"enabled": True})
    assert response.status_code == 200, response.text
    resumed = await api.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": True}})
    assert resumed.status_code == 202, resumed.text
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "all written"}, done

    mains = [call for call in provider.calls if call.request.get("system") != "You help."]
    assert offered_tools(mains[1]) == MAIN_TOOLS
    last = mains[-1]

    # The bad agent file: diagnostics with the line of the misspelt key, nothing registered.
    broken, failed = _answer(last, 1)
    assert not failed and broken["written"] is False
    errors = [d for d in broken["diagnostics"] if d["severity"] == "error"]
    assert errors and errors[0]["line"] == 4, broken
    written, _ = _answer(last, 2)
    assert written["written"] is True and written["name"] == "helper", written
    agents = (await api.get("/v1/agents")).json()["agents"]
    assert sorted(a.get("name") for a in agents) == ["author", "helper"]

    # The bad graph: the dangling edge's line; then the good one stored under its name.
    bad_graph, _ = _answer(last, 3)
    assert bad_graph["written"] is False
    assert any(d["severity"] == "error" and d["line"] in (7, 8) for d in bad_graph["diagnostics"])
    graph, _ = _answer(last, 4)
    assert graph["written"] is True and graph["flow"] == "custom/check", graph
    graphs = (await api.get("/v1/graphs")).json()["graphs"]
    assert [g["graph"] for g in graphs] == [graph["graph"]]

    child, _ = _answer(last, 5)
    assert (child["status"], child["outputs"]) == ("complete", {"verdict": "pay"}), child
    catalog, _ = _answer(last, 6)
    helper = next(entry for entry in catalog if entry["name"] == "helper")
    assert helper == {
        "name": "helper",
        "description": "Says whether a refund is owed.",
        "tools": [],
        "skills": [],
        "inputs": ["invoice"],
        "outputs": [{"name": "verdict", "type": "string"}],
        "source_type": "store",
        "architect": {},
        "agent": written["agent"],
        "kind": "builtin",
    }
    results, _ = _answer(last, 7)
    assert results["flows"] == [{"flow": "custom/check", "graph": graph["graph"]}]
    (entry,) = results["results"]
    assert (entry["agent"], entry["status"], entry["outputs"]) == (
        "helper",
        "complete",
        ["verdict"],
    )

    # Every action over the finished tree, answered or refused, leaves the store as it was.
    host = server.state.runtime.kit.flows
    session = FlowSession(run_id=run_id, session=Session.MAIN, host=host)
    before = await trio.to_thread.run_sync(store_tables, store_url)
    for args in (
        {"action": "list"},
        {"action": "runs"},
        {"action": "runs", "flow": "helper"},
        {"action": "summary", "flow": "helper"},
        {"action": "agent", "flow": entry["run"], "agent": "helper"},
        {"action": "summary", "flow": "custom/check"},
        {"action": "agent", "flow": "helper", "agent": "nobody"},
    ):
        try:
            await host.flow_results(session, args)
        except ToolFailed:
            pass
    await host.agent_catalog()
    assert await trio.to_thread.run_sync(store_tables, store_url) == before


async def test_an_agent_in_edit_mode_cannot_stand_in_for_another_under_its_name(
    server, providers
) -> None:
    """The operator registered ``helper``; a run in edit mode writes its own file named
    ``helper`` and then hands ``helper`` a task. The write is refused with a diagnostic naming the
    taken name, and the task goes to the operator's helper (on main the run's stand-in took the
    name, and every later ``subagent helper`` ran it)."""
    scripts = {}
    provider = providers(lambda call: scripts["main"](call))
    stand_in = helper_agent(provider.base_url).replace("You help.", "You stand in.")
    turns = [
        tool_use("flow_agents", {"op": "write", "content": stand_in}),
        tool_use("subagent", {"agent": "helper", "task": "INV-7", "inputs": {"invoice": "7"}}),
        text_reply("handed over"),
    ]

    def script(call):
        system = call.request.get("system")
        if system == "You help.":
            return tool_use("finish", {"status": "complete", "summary": "owed", "verdict": "pay"})
        if system == "You stand in.":
            return tool_use("finish", {"status": "complete", "summary": "no", "verdict": "none"})
        return turns[len(tool_results(call))]

    scripts["main"] = script
    api = server.client
    registered = await api.post(
        "/v1/agents",
        content=helper_agent(provider.base_url),
        headers={"Content-Type": "text/markdown"},
    )
    assert registered.status_code == 201, registered.text
    operators = registered.json()["agent"]
    main = await server.register_agent(
        agent_toml(
            provider.base_url, name="author", extra='flow_tools = ["subagent", "flow_agents"]\n'
        )
    )
    assert (await api.put(EDIT_MODE, json={"enabled": True})).status_code == 200
    run_id = await server.start_run(main, "hand INV-7 to helper")
    done = await server.wait_resting(run_id)
    assert done["status"] == {"state": "completed", "output": "handed over"}, done

    last = [
        call
        for call in provider.calls
        if call.request.get("system")
        not in (
            "You help.",
            "You stand in.",
        )
    ][-1]
    refused, _ = _answer(last, 0)
    assert refused["written"] is False, refused
    (error,) = refused["diagnostics"]
    assert "the name 'helper' is already taken by another agent" in error["message"]
    assert operators in error["message"]
    child, _ = _answer(last, 1)
    assert child["outputs"] == {"verdict": "pay"}, child
    names = [(a.get("name"), a["agent"]) for a in (await api.get("/v1/agents")).json()["agents"]]
    assert [agent for name, agent in names if name == "helper"] == [operators]
