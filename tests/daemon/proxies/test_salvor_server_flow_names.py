"""A process agent's ``flow_write`` through the ``salvor`` MCP server keeps the flow by name, as a
built-in agent's does: the real ``mcp`` SDK client (``tests.daemon.proxies.test_salvor_server``'s
agent) writes the same name twice with other content, and the store holds two versions, each
written by that run, the answers saying which."""

from __future__ import annotations

import json

from tests.daemon.proxies.test_salvor_server import salvor_agent, steps_script, tool_results

FIRST = "schema_version: 1\nnodes:\n  - id: ok\n    kind: gate\n    prompt: Go?\nedges: []\n"
SECOND = FIRST.replace("Go?", "Go now?")


async def test_a_process_agents_flow_write_keeps_the_flow_by_name(
    runtime, providers, upstream_env, tmp_path
) -> None:
    await runtime.definitions.set_edit_mode(True)
    write = {"namespace": "team", "name": "triage"}
    provider = providers(
        steps_script(
            lambda _: ("flow_write", {**write, "content": FIRST}),
            lambda _: ("flow_write", {**write, "content": SECOND}),
            lambda _: "written",
        )
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    run_id = await runtime.starts.start_run(agent, "write the triage flow")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail

    answers = [json.loads(result) for result in tool_results(provider.calls[-1])]
    assert [(a["flow"], a["version"], a["new_version"]) for a in answers] == [
        ("team/triage", 1, True),
        ("team/triage", 2, True),
    ]
    versions = await runtime.definitions.flow_names.versions("team", "triage")
    assert [(v.version, v.graph_hash, v.run_id) for v in versions] == [
        (1, answers[0]["graph"], run_id),
        (2, answers[1]["graph"], run_id),
    ]
