"""An upstream that does not answer in time: the agent gets its own wire's 504,
nothing is recorded as done."""

from __future__ import annotations

import threading

from tests.daemon.agents.test_process_agent import PLAN, process_agent
from tests.support.scripted_provider import tool_loop_script


async def test_an_upstream_timeout_reaches_the_agent_and_leaves_the_call_open(
    runtime, providers, upstream_env, tmp_path, monkeypatch
) -> None:
    release = threading.Event()

    def on_call(call) -> None:
        release.wait(10)  # longer than the proxy waits

    provider = providers(tool_loop_script(PLAN), on_call=on_call)
    upstream_env(provider)
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM_TIMEOUT", "0.5")
    agent = process_agent(tmp_path, "openai")
    run_id = await runtime.starts.start_run(agent, "settle A-1")
    try:
        view = await runtime.drive(run_id, agent=agent)
    finally:
        release.set()
    assert view.state.value == "failed"
    # The agent's own SDK saw a 504 in its wire's shape and gave up; its stderr says so.
    assert "exited with code 1" in view.detail["error"] and "timed out" in view.detail["error"]
    kinds = [e.kind for e in await runtime.reads.log(run_id)]
    assert kinds == ["RunStarted", "ModelCallRequested", "RunFailed"]  # never completed
    assert provider.call_count == 1
