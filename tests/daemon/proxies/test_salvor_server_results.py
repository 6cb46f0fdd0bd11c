"""``flow_results`` on both agent kinds: a built-in agent calling it natively and a process agent
calling it through the ``salvor`` MCP server with the real ``mcp`` SDK client each delegate to the
same child, then read their tree with the four actions, and get the same answers (their children's
ids apart, which derive from each parent's run); a name nothing in the tree answers to is the
call's error naming what is there. The host's side, each action over a tree recorded by hand and
that no action changes a row of the store, is ``tests/daemon/runs/test_flow_results.py``'s.
"""

from __future__ import annotations

import json

from salvor.daemon.agents import parse_definition
from salvor.daemon.flows import FLOW_LABEL
from salvor.protocol import EMPTY_VIEW

from tests.daemon.proxies.test_salvor_server import (
    OUTPUTS,
    children,
    helper_agent,
    salvor_agent,
    steps_script,
    tool_results,
)
from tests.support.backends import SQLITE_ONLY
from tests.support.graph_runs import published
from tests.support.runtime import agent_toml

# The lane is the salvor server's, tested on SQLite (tests/support/backends.py).
STORE_BACKENDS = SQLITE_ONLY

CHILD_FINISH = {"status": "complete", "summary": "found it", "colour": "blue", "count": 3}
BY_NAME = "10000000-0000-4000-8000-000000000009"
READS = [
    {"action": "list"},
    {"action": "summary", "flow": "helper"},
    {"action": "agent", "flow": "helper", "agent": "helper"},
    {"action": "runs"},
    {"action": "runs", "flow": "helper"},
    # A flow's name: the newest run the operator started by it, nobody's child.
    {"action": "summary", "flow": "team/publishing"},
]


def reading_script():
    """Delegate to ``helper``, read the tree with each action, name a flow nobody ran and an
    agent nobody registered, end."""
    steps = [lambda _: ("subagent", {"agent": "helper", "task": "find the colour"})]
    steps += [lambda _, args=args: ("flow_results", args) for args in READS]
    steps += [lambda _: ("flow_results", {"action": "summary", "flow": "helpr"})]
    steps += [lambda _: ("subagent", {"agent": "helpr", "task": "again"})]
    steps += [lambda _: "read it all"]
    return steps_script(*steps)


async def _read(runtime, provider, agent) -> tuple[list, list[str]]:
    """What ``agent``'s flow_results calls answered (its child's id as ``CHILD``), and the
    two refusals' texts."""
    run_id = await runtime.starts.start_run(agent, "delegate, then look")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    (child,) = await children(runtime, run_id)  # none for the name nobody registered
    # Each flow_results call is recorded as a read (natively, or as the lane's tools/call).
    log = await runtime.reads.log(run_id)
    reads = [
        env.event.effect
        for env in log
        if env.kind == "ToolCallRequested"
        and "flow_results" in (env.event.tool, env.event.input.get("name"))
    ]
    assert reads == ["read"] * (len(READS) + 1)
    results = [text.replace(child, "CHILD") for text in tool_results(provider.calls[-1])]
    return [json.loads(text) for text in results[1:-2]], results[-2:]


async def test_both_agent_kinds_read_their_tree_with_every_action_alike(
    runtime, providers, upstream_env, tmp_path
):
    child_provider = providers(steps_script(lambda _: ("finish", CHILD_FINISH), lambda _: "done"))
    await runtime.definitions.register_agent(helper_agent(runtime, child_provider, extra=OUTPUTS))
    by_name = published(labels={FLOW_LABEL: "team/publishing"})
    await runtime.access.append(BY_NAME, by_name, EMPTY_VIEW)

    native_provider = providers(reading_script())
    text = 'name = "reader"\n' + agent_toml(
        native_provider.base_url, extra='flow_tools = ["subagent", "flow_results"]'
    )
    builtin = parse_definition(text, "toml", known_tools=runtime.kit.registry.names())
    native, native_refusals = await _read(runtime, native_provider, builtin)

    process_provider = providers(reading_script())
    upstream_env(process_provider)
    process, process_refusals = await _read(runtime, process_provider, salvor_agent(tmp_path))
    assert process == native

    listed, summary, agent, runs, run_state, by_name = native
    brief = {"status": "complete", "summary": "found it", "outputs": ["colour", "count"]}
    entry = {"run": "CHILD", "agent": "helper", "state": "completed"}
    assert listed == {"results": [{**entry, **brief}], "flows": []}
    assert summary == {**entry, "steps": [{"step": "helper", "state": "finished", **brief}]}
    step = agent["step"]
    assert (step["step"], step["state"], step["input"]) == (
        "helper",
        "finished",
        {"task": "find the colour", "inputs": {}},
    )
    # In full: the typed outputs in their JSON types.
    assert step["outputs"] == {"colour": "blue", "count": 3}
    assert runs == {"runs": [entry], "counts": {"completed": 1}}
    assert run_state["nodes"][0]["node"] == "helper"
    assert run_state["nodes"][0]["state"] == "finished"
    assert (by_name["run"], by_name["flow"], by_name["state"]) == (
        BY_NAME,
        "team/publishing",
        "completed",
    )
    assert by_name["steps"][0]["node"] == "research"
    for no_flow, no_agent in (native_refusals, process_refusals):
        assert "no run in this run's tree answers to `flow` 'helpr'" in no_flow, no_flow
        assert "did you mean 'helper'?" in no_flow
        assert "no registered agent is named 'helpr'" in no_agent, no_agent
        assert "(did you mean 'helper'?)" in no_agent
