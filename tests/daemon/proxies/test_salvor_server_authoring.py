"""Authoring's diagnostics on both agent kinds: a built-in agent calling ``flow_agents`` write and
``flow_write`` natively, and a process agent calling them through the ``salvor`` MCP server with
the real ``mcp`` SDK client, get the same answers: every problem of the file at once, each on its
line with its suggestion."""

from __future__ import annotations

import json

from salvor.daemon.agents import parse_definition

from tests.daemon.agents.test_diagnostics import FIVE, five_problems
from tests.daemon.proxies.test_salvor_server import salvor_agent, steps_script, tool_results
from tests.support.backends import SQLITE_ONLY
from tests.support.runtime import agent_toml

# The lane is the salvor server's, tested on SQLite (tests/support/backends.py).
STORE_BACKENDS = SQLITE_ONLY

# Two unknown tools on one line, an unknown key on the next.
CLERK = """---
name: clerk
description: Files refunds.
model: m
tools: lookup_invoce, isue_refund
colour: red
llm:
  provider: demo
---
File it.
"""


async def _answers(runtime, provider, agent) -> list:
    """What ``agent``'s two authoring calls answered, as the model was told."""
    run_id = await runtime.starts.start_run(agent, "author a clerk and a flow")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    return [json.loads(result) for result in tool_results(provider.calls[-1])]


async def test_both_agent_kinds_get_every_diagnostic_of_their_authoring_calls(
    runtime, providers, upstream_env, tmp_path
):
    await runtime.definitions.register_agent(FIVE)
    await runtime.definitions.set_edit_mode(True)
    script = steps_script(
        lambda _: ("flow_agents", {"op": "write", "content": CLERK}),
        lambda _: ("flow_write", {"name": "five", "content": five_problems(FIVE.agent_def_hash)}),
        lambda _: "done",
    )
    native_provider = providers(script)
    text = 'name = "author"\n' + agent_toml(
        native_provider.base_url, extra='flow_tools = ["flow_agents", "flow_write"]'
    )
    builtin = parse_definition(text, "toml", known_tools=runtime.kit.registry.names())
    native = await _answers(runtime, native_provider, builtin)

    process_provider = providers(script)
    upstream_env(process_provider)
    assert await _answers(runtime, process_provider, salvor_agent(tmp_path)) == native

    clerk, flow = native
    assert clerk["written"] is False
    assert [(d["line"], d["severity"], d.get("suggestion")) for d in clerk["diagnostics"]] == [
        (5, "error", "lookup_invoice"),
        (5, "error", "issue_refund"),
        (6, "error", None),
    ]
    assert flow["written"] is False
    assert [(d["line"], d["severity"]) for d in flow["diagnostics"]] == [
        (3, "warning"),
        (8, "error"),
        (11, "warning"),
        (15, "error"),
        (27, "error"),
    ]
    assert flow["diagnostics"][1]["suggestion"] == FIVE.agent_def_hash
    assert await runtime.definitions.list_graphs() == []


FLOW = "schema_version: 1\nnodes:\n  - id: ok\n    kind: gate\n    prompt: Go?\nedges: []\n"


async def test_edit_mode_flipped_while_a_process_run_waits_holds_its_next_authoring_call(
    runtime, providers, upstream_env, tmp_path
):
    """A process run's listing is what it recorded (its replay answers it again after a resume),
    but each authoring call is held to edit mode when it is made: turned on while the run waits,
    its next call is performed; turned off, refused, nothing written."""
    provider = providers(
        steps_script(
            lambda _: ("ask_user", {"question": "Go on?", "type": "confirm"}),
            lambda _: ("flow_write", {"name": "gated", "content": FLOW}),
            lambda _: "done",
        )
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path)

    async def waiting_then_resumed(edit_mode: bool) -> str:
        run_id = await runtime.starts.start_run(agent, "author when allowed")
        assert (await runtime.drive(run_id, agent=agent)).state.value == "suspended"
        await runtime.definitions.set_edit_mode(edit_mode)
        await runtime.control.resume(run_id, {"answer": True})
        view = await runtime.drive(run_id, agent=agent)
        assert view.state.value == "completed", view.detail
        return tool_results(provider.calls[-1])[1]

    await runtime.definitions.set_edit_mode(True)
    refused = await waiting_then_resumed(False)
    assert "offers no tool 'flow_write'" in refused, refused
    assert await runtime.definitions.list_graphs() == []
    written = json.loads(await waiting_then_resumed(True))
    assert (written["written"], written["flow"]) == (True, "custom/gated")
    assert len(await runtime.definitions.list_graphs()) == 1


PLANNER = """---
name: planner
description: Plans a refund's steps.
model: scripted-model
tools: lookup_invoice, ask_user
inputs: [invoice]
outputs:
  - name: plan
  - name: steps
    type: number
card:
  label: Planner
architect:
  use_when: a refund needs steps
llm:
  provider: demo
---
Plan.
"""


async def test_a_process_agent_writes_an_agent_file_and_lists_it_with_every_field(
    runtime, providers, upstream_env, tmp_path
):
    await runtime.definitions.set_edit_mode(True)
    provider = providers(
        steps_script(
            lambda _: ("flow_agents", {"op": "write", "content": PLANNER}),
            lambda _: ("flow_agents", {"op": "list"}),
            lambda _: "done",
        )
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    await runtime.definitions.register_agent(agent)
    run_id = await runtime.starts.start_run(agent, "write a planner")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    written, listed = (json.loads(text) for text in tool_results(provider.calls[-1]))
    assert (written["written"], written["diagnostics"], written["created"]) == (True, [], True)
    # Registered: the catalog (one entry per name) lists it after the process agent itself.
    assert [entry["name"] for entry in listed] == ["asker", "planner"]
    assert listed[1] == {
        "name": "planner",
        "description": "Plans a refund's steps.",
        "tools": ["lookup_invoice", "ask_user"],
        "inputs": ["invoice"],
        "outputs": [{"name": "plan", "type": "string"}, {"name": "steps", "type": "number"}],
        "source_type": "store",
        "architect": {"use_when": "a refund needs steps"},
        "agent": written["agent"],
        "kind": "builtin",
        "card": {"label": "Planner"},
        "skills": [],
    }
    assert (await runtime.definitions.find_agent(written["agent"])).name == "planner"
