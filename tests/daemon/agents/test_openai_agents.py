"""The openai-agents SDK as a process agent, made durable through the loopback proxy.

The agent is a real ``agents`` program (``Agent``, ``function_tool``,
``Runner.run_sync``) as its author wrote it, tracing left to salvor's
environment (which switches it off), and the SDK's default model, which
speaks OpenAI Responses; salvor only points ``OPENAI_BASE_URL`` at its proxy.
The scripted provider is the upstream, and the agent's tool appends each
real execution to a file, so both the model calls served and the tool side
effects can be counted across a SIGKILL of the agent process, and a re-run
of a recorded run is answered from its log alone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from salvor.daemon.runs._runtime import Runtime

from tests.daemon.agents.test_process_agent import (
    PLAN,
    SECRET,
    assert_no_secret,
    kinds,
    process_agent,
)
from tests.support.backends import SQLITE_ONLY
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is a real SDK agent through the model
# proxy.
STORE_BACKENDS = SQLITE_ONLY

# Looked up, not imported: the SDK runs in the agent's process, and importing it here (about two
# CPU-seconds) would be paid at collection by every xdist worker.
if importlib.util.find_spec("agents") is None:
    pytest.skip("the openai-agents SDK is in the test extra", allow_module_level=True)

AGENTS_AGENT = r'''
import json, os, signal
from pathlib import Path

from agents import Agent, RunHooks, Runner, function_tool

Path(os.environ["PIDFILE"]).write_text(str(os.getpid()))
effects = Path(os.environ["EFFECTS"])
marker = Path(os.environ.get("MARKER", "/nonexistent/marker"))
die_after = int(os.environ.get("DIE_AFTER", "0"))


@function_tool
def lookup_invoice(invoice: str) -> str:
    """Look up an invoice by its number."""
    with effects.open("a") as out:
        out.write(invoice + "\n")
    return json.dumps({"invoice": invoice, "amount": 42})


class DieOnce(RunHooks):
    """SIGKILL this process after model call DIE_AFTER, the first time the run gets there."""

    calls = 0

    async def on_llm_end(self, context, agent, response):
        self.calls += 1
        if self.calls == die_after and not marker.exists():
            marker.write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)


settings = {}
if os.environ.get("STATELESS_REASONING"):
    # A reasoning model kept out of the provider's storage: its reasoning comes back
    # encrypted in each answer, and the SDK sends it again with the next call.
    from agents import ModelSettings
    from openai.types.shared import Reasoning

    settings["model_settings"] = ModelSettings(
        reasoning=Reasoning(effort="low"),
        store=False,
        parallel_tool_calls=False,
        response_include=["reasoning.encrypted_content"],
    )
clerk = Agent(
    name="clerk",
    instructions="Settle the invoices you are given.",
    tools=[lookup_invoice],
    **settings,
)
result = Runner.run_sync(clerk, os.environ["SALVOR_PROMPT"], hooks=DieOnce())
print(result.final_output)
'''


SETTINGS = {"default-settings": {}, "stateless-reasoning": {"STATELESS_REASONING": "1"}}


def agents_process(tmp_path: Path, settings: str, **env: str):
    env = {"EFFECTS": str(tmp_path / "effects.txt"), **SETTINGS[settings], **env}
    return process_agent(tmp_path, "agents", env=env, script=AGENTS_AGENT)


def tool_runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.txt"
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def upstream(providers, monkeypatch):
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    return provider


def check_sdk_requests(upstream, settings: str) -> None:
    """What the SDK sent reached the upstream untouched, its reasoning items included."""
    bodies = [call.body for call in upstream.calls]
    assert {call.wire for call in upstream.calls} == {"responses"}
    assert all("include" in body and body["model"] and body["instructions"] for body in bodies)
    sent_back = [
        [item["encrypted_content"] for item in body["input"] if item.get("type") == "reasoning"]
        for body in bodies
    ]
    if settings == "stateless-reasoning":
        assert all(
            body["store"] is False and body["parallel_tool_calls"] is False for body in bodies
        )
        opaque = "scripted-opaque-reasoning-{}".format
        assert sent_back == [[], [opaque(0)], [opaque(0), opaque(1)]]
    else:
        assert sent_back == [[], [], []]


@pytest.mark.parametrize("settings", SETTINGS)
async def test_an_openai_agents_run_is_recorded_over_responses(
    runtime, upstream, tmp_path, store_url, settings
):
    agent = agents_process(tmp_path, settings)
    run_id = await runtime.starts.start_run(agent, "settle invoices A-1 and B-2")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "exit_code": 0}
    assert tool_runs(tmp_path) == ["A-1", "B-2"]
    assert upstream.call_count == 3 and set(upstream.count_by_request_hash().values()) == {1}
    assert {call.api_key for call in upstream.calls} == {SECRET}
    check_sdk_requests(upstream, settings)
    log = await kinds(runtime, run_id)
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3
    assert (view.input_tokens, view.output_tokens) == (60, 15)
    await assert_no_secret(runtime, run_id, store_url)


@pytest.mark.parametrize("settings", SETTINGS)
async def test_an_openai_agents_process_killed_after_its_first_call_is_restarted_by_the_drive(
    runtime, upstream, tmp_path, store_url, settings
):
    marker = tmp_path / "died"
    agent = agents_process(tmp_path, settings, DIE_AFTER="1", MARKER=str(marker))
    restarting = Runtime(
        runtime.access, runtime.kit.registry, clock=runtime.kit.clock, process_restarts=1
    )
    run_id = await restarting.starts.start_run(agent, "settle invoices A-1 and B-2")
    view = await restarting.drive(run_id, agent=agent)
    assert marker.exists()  # the first process did die after its first model call
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "exit_code": 0}
    # The restarted agent got call 1 from the log: every distinct request served once,
    # and each tool ran once (the kill came before the first tool call).
    assert upstream.call_count == 3
    assert sorted(upstream.count_by_request_hash().values()) == [1, 1, 1]
    assert tool_runs(tmp_path) == ["A-1", "B-2"]
    check_sdk_requests(
        upstream, settings
    )  # call 1's reasoning, answered from the log, went on upstream
    log = await kinds(runtime, run_id)
    assert log.count("ModelCallRequested") == 3 and log.count("ModelCallCompleted") == 3
    assert log[-1] == "RunCompleted"
    await assert_no_secret(runtime, run_id, store_url)


async def test_an_openai_agents_run_is_rerun_from_its_log_with_no_upstream_call(
    runtime, upstream, tmp_path
):
    agent = agents_process(tmp_path, "stateless-reasoning")
    origin = await runtime.starts.start_run(agent, "settle invoices A-1 and B-2")
    assert (await runtime.drive(origin, agent=agent)).state.value == "completed"
    served = upstream.call_count
    rerun = await runtime.starts.start_run(agent, None, replay_of=origin)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == {"reply": "refund settled", "exit_code": 0}
    assert upstream.call_count == served
