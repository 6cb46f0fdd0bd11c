"""What a process run completes with when its agent answers on standard output, and the
``salvor`` MCP server turned off.

The agent answers as smolagents does: its model ends with a ``final_answer`` tool call the
framework performs itself (the model never hears back, so the trajectory has no final assistant
text), and the program prints its step log and then the answer. With ``output_from = "stdout"``
the run keeps that; by default it keeps the tool call the trajectory ended on
(tests/daemon/agents/test_real_agents.py runs the real smolagents).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from salvor.daemon.agents._definition import parse_definition
from salvor.daemon.agents._process import STDOUT_TAIL_BYTES

from tests.daemon.agents.test_process_agent import MODES, PLAN, process_agent
from tests.support.backends import SQLITE_ONLY
from tests.support.flows import tool_use
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is what a process run records as its
# output.
STORE_BACKENDS = SQLITE_ONLY

SMOL_AGENT = r"""
import json, os, urllib.request

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
FINAL_ANSWER = {
    "type": "function",
    "function": {
        "name": "final_answer",
        "description": "Provides a final answer to the given problem.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
}
body = {
    "model": "scripted-model",
    "messages": [{"role": "user", "content": os.environ["SALVOR_PROMPT"]}],
    "tools": [FINAL_ANSWER],
}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
)
with _no_proxy.open(request, timeout=60) as response:
    message = json.loads(response.read())["choices"][0]["message"]
(call,) = message["tool_calls"]
print(f"Step 1: calling tool {call['function']['name']!r}")
print("." * int(os.environ.get("NOISE", "0")))
stand_ins = sorted(k for k in os.environ if k.startswith("SALVOR_MCP_"))
print(f"stand-ins: {json.dumps(stand_ins)}")
print(f"Final answer: {json.loads(call['function']['arguments'])['answer']}")
print()
"""


def smol_agent(tmp_path: Path, extra: str = "", env: dict | None = None):
    script = tmp_path / "smol_agent.py"
    script.write_text(SMOL_AGENT)
    env_table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    text = (
        'name = "smol"\nkind = "process"\n'
        f"command = {json.dumps([sys.executable, str(script)])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n{extra}[env]\n{env_table}"
    )
    return parse_definition(text, "toml")


STAND_INS = '["SALVOR_MCP_SERVER_SALVOR", "SALVOR_MCP_URL_SALVOR"]'


async def test_an_agent_answering_on_stdout_completes_with_what_it_printed(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers([tool_use("final_answer", {"answer": "42"})] * 2)
    upstream_env(provider)
    printed = f"Step 1: calling tool 'final_answer'\n\nstand-ins: {STAND_INS}\nFinal answer: 42"

    by_default = smol_agent(tmp_path)
    run_id = await runtime.starts.start_run(by_default, "what is six times seven?")
    view = await runtime.drive(run_id, agent=by_default)
    # The last model turn called a tool: its call is the answer.
    answer = {"name": "final_answer", "arguments": {"answer": "42"}}
    assert view.status() == {
        "state": "completed",
        "output": {"tool_calls": [answer], "exit_code": 0},
    }

    on_stdout = smol_agent(tmp_path, 'output_from = "stdout"\n')
    run_id = await runtime.starts.start_run(on_stdout, "what is six times seven?")
    view = await runtime.drive(run_id, agent=on_stdout)
    assert view.status() == {"state": "completed", "output": {"reply": printed, "exit_code": 0}}


async def test_stdout_is_kept_from_its_end_within_the_bound(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers([tool_use("final_answer", {"answer": "42"})])
    upstream_env(provider)
    agent = smol_agent(tmp_path, 'output_from = "stdout"\n', {"NOISE": str(3 * STDOUT_TAIL_BYTES)})
    run_id = await runtime.starts.start_run(agent, "what is six times seven?")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    reply = view.detail["output"]["reply"]
    # The answer printed last survives; the step log's start, past the bound, does not.
    assert reply.endswith("Final answer: 42") and "Step 1" not in reply
    assert STDOUT_TAIL_BYTES - 100 < len(reply.encode()) <= STDOUT_TAIL_BYTES


async def test_salvor_mcp_false_offers_no_salvor_server(runtime, providers, upstream_env, tmp_path):
    provider = providers([tool_use("final_answer", {"answer": "42"})])
    upstream_env(provider)
    agent = smol_agent(tmp_path, 'output_from = "stdout"\nsalvor_mcp = false\n')
    run_id = await runtime.starts.start_run(agent, "what is six times seven?")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert "stand-ins: []" in view.detail["output"]["reply"]


@pytest.mark.parametrize("mode", MODES)
async def test_an_agent_that_ends_on_a_tool_call_keeps_it_on_every_wire(
    runtime, providers, upstream_env, tmp_path, mode
):
    """The real SDK agent of test_process_agent, stopped after its first answer (a tool call),
    plain and streamed on each wire: the call is put together from the stream's deltas."""
    provider = providers(tool_loop_script(PLAN, final_text="refund settled"))
    upstream_env(provider)
    exit_file = tmp_path / "exit_after"
    exit_file.write_text("1")
    agent = process_agent(tmp_path, mode, env={"EXITFILE": str(exit_file)})
    run_id = await runtime.starts.start_run(agent, "settle invoice A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {
        "state": "completed",
        "output": {
            "tool_calls": [{"name": "lookup_invoice", "arguments": {"invoice": "A-1"}}],
            "exit_code": 0,
        },
    }
