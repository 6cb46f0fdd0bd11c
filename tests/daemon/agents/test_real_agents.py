"""Real agent programs run unchanged as process agents: what each needs from salvor.

* a program whose only act is calling ``finish`` on the ``salvor`` MCP server (the real ``mcp``
  client) completes with that result, having made no model call;
* smolagents (the real package, ``ToolCallingAgent`` on its OpenAI-compatible model class)
  answers through its ``final_answer`` tool, and the run keeps that call's arguments;
* the ``llm`` CLI takes its prompt as an argument (``{prompt}`` in ``command``, no shell), and a
  program whose prompt never reached its model is not reported completed;
* the SDK telemetry switches are off in every agent's environment, and the openai-agents SDK
  then makes no connection beyond the loopback proxy (counted by a capture proxy it is pointed at).

The scripted provider is the upstream (the one allowed double); everything else is real.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest
from salvor.daemon.agents._definition import DefinitionError, parse_definition

from tests.support.backends import SQLITE_ONLY
from tests.support.flows import tool_use
from tests.support.scripted_provider import text_reply

# SQLite alone (tests/support/backends.py): what it tests is what a real agent program needs at
# the process boundary, which is the same whatever the store.
STORE_BACKENDS = SQLITE_ONLY

BIN = Path(sys.executable).parent


def definition(tmp_path: Path, command: list[str], env: dict | None = None, extra: str = ""):
    table = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (env or {}).items())
    return parse_definition(
        'name = "real"\nkind = "process"\n'
        f"command = {json.dumps(command)}\ncwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f"{extra}[env]\n{table}",
        "toml",
    )


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- finish without a model call ---------------------------------------------------------------

FINISH_ONLY = r"""
import asyncio, os, shlex, sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

try:
    from mcp.client.streamable_http import streamable_http_client
except ImportError:  # the SDK's older name
    from mcp.client.streamable_http import streamablehttp_client as streamable_http_client


async def main():
    if sys.argv[1] == "stdio":
        argv = shlex.split(os.environ["SALVOR_MCP_SERVER_SALVOR"])
        opened = stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
    else:
        opened = streamable_http_client(os.environ["SALVOR_MCP_URL_SALVOR"])
    async with opened as streams, ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        result = await session.call_tool(
            "finish",
            {"status": "complete", "summary": "filed: " + os.environ["SALVOR_PROMPT"]},
        )
        # mcp 2 says is_error, mcp 1 isError.
        assert not getattr(result, "is_error", getattr(result, "isError", False)), result


asyncio.run(main())
"""


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_agent_that_only_calls_finish_completes_with_its_result(
    runtime, providers, upstream_env, tmp_path, transport
):
    provider = providers([])
    upstream_env(provider)
    agent = definition(
        tmp_path, [sys.executable, script(tmp_path, "finish.py", FINISH_ONLY), transport]
    )
    run_id = await runtime.starts.start_run(agent, "ticket 7")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {
        "state": "completed",
        "output": {"status": "complete", "summary": "filed: ticket 7", "outputs": {}},
    }
    assert provider.call_count == 0


# -- smolagents: the answer is a tool call -----------------------------------------------------

SMOLAGENTS = r'''
import os

from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
def lookup_invoice(invoice: str) -> str:
    """Look up an invoice by its number.

    Args:
        invoice: The invoice number.
    """
    with open("effects.txt", "a") as out:
        out.write(invoice + "\n")
    return "invoice " + invoice + ": 42 EUR"


agent = ToolCallingAgent(
    tools=[lookup_invoice], model=OpenAIServerModel(model_id="gpt-4o-mini"), max_steps=4
)
print(agent.run(os.environ["SALVOR_PROMPT"]))
'''


@pytest.mark.skipif(importlib.util.find_spec("smolagents") is None, reason="in the test extra")
async def test_a_smolagents_answer_through_its_final_answer_tool_is_the_runs_output(
    runtime, providers, upstream_env, tmp_path
):
    # Look the invoice up, then answer through final_answer.
    provider = providers(
        [
            tool_use("lookup_invoice", {"invoice": "A-1"}),
            tool_use("final_answer", {"answer": "refund 42 EUR on A-1"}, use_id="toolu_1"),
        ]
    )
    upstream_env(provider)
    agent = definition(tmp_path, [sys.executable, script(tmp_path, "smol.py", SMOLAGENTS)])
    run_id = await runtime.starts.start_run(agent, "refund invoice A-1")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {
        "state": "completed",
        "output": {
            "tool_calls": [
                {"name": "final_answer", "arguments": {"answer": "refund 42 EUR on A-1"}}
            ],
            "exit_code": 0,
        },
    }
    assert (tmp_path / "effects.txt").read_text().split() == ["A-1"]
    assert provider.call_count == 2 and {c.wire for c in provider.calls} == {"openai"}
    # The tool's answer reached the model before it answered.
    assert "42 EUR" in json.dumps(provider.calls[1].body)


# -- the llm CLI: its prompt as an argument ----------------------------------------------------

LLM = shutil.which("llm", path=str(BIN))
# Shell syntax that would run something if the prompt ever went through a shell.
PROMPT = "summarise; $(touch pwned) `touch pwned` 'quoted' \"twice\""


def llm_agent(tmp_path: Path, *args: str):
    # LLM_USER_PATH: llm keeps its log database there, not in the operator's home.
    return definition(tmp_path, [LLM, "-m", "gpt-4o-mini", *args], {"LLM_USER_PATH": str(tmp_path)})


@pytest.mark.skipif(LLM is None, reason="the llm CLI is in the test extra")
async def test_the_llm_cli_gets_the_prompt_as_one_argument_and_answers_it(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers([text_reply("Nothing to summarise.")])
    upstream_env(provider)
    agent = llm_agent(tmp_path, "{prompt}")
    run_id = await runtime.starts.start_run(agent, PROMPT)
    view = await runtime.drive(run_id, agent=agent)
    assert view.status() == {
        "state": "completed",
        "output": {"reply": "Nothing to summarise.", "exit_code": 0},
    }
    (call,) = provider.calls
    assert call.body["messages"][-1]["content"] == PROMPT
    assert not (tmp_path / "pwned").exists()


@pytest.mark.skipif(LLM is None, reason="the llm CLI is in the test extra")
async def test_an_agent_whose_prompt_never_reached_its_model_fails_saying_so(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers([text_reply("How can I help you today?")])
    upstream_env(provider)
    # No {prompt}: llm reads no prompt (its stdin is empty) and asks its model anyway.
    agent = llm_agent(tmp_path)
    run_id = await runtime.starts.start_run(agent, "summarise the refund policy")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "failed" and provider.call_count == 1
    error = view.detail["error"]
    assert "none of its 1 model call carried the run's prompt" in error
    assert "{prompt}" in error and "SALVOR_PROMPT" in error


def test_prompt_is_replaced_only_as_a_whole_argument(tmp_path):
    for command in (["sh", "-c", "llm {prompt}"], ["llm", "--text={prompt}"], ["{prompt}"]):
        with pytest.raises(DefinitionError):
            definition(tmp_path, command)
    assert definition(tmp_path, ["llm", "{prompt}"]).process.command == ("llm", "{prompt}")


# -- telemetry off -----------------------------------------------------------------------------

# Each switch as the package that reads it wants it (see salvor.daemon.processes._child_env).
TELEMETRY_SWITCHES = {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "AGNO_TELEMETRY": "false",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "MEM0_TELEMETRY": "False",
    "HAYSTACK_TELEMETRY_ENABLED": "False",
}

ENV_DUMP = r"""
import json, os, sys
names = json.loads(sys.argv[1])
with open("seen.json", "w") as out:
    json.dump({name: os.environ.get(name) for name in names}, out)
"""


async def test_every_telemetry_switch_is_off_in_an_agents_environment_unless_its_env_says(
    runtime, tmp_path, monkeypatch
):
    # A switch turned on in the daemon's own environment does not reach the agent.
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("AGNO_TELEMETRY", "true")
    names = json.dumps([*TELEMETRY_SWITCHES])
    command = [sys.executable, script(tmp_path, "env.py", ENV_DUMP), names]
    # The definition's env is the operator's choice, and wins.
    agent = definition(tmp_path, command, {"DO_NOT_TRACK": "0"})
    run_id = await runtime.starts.start_run(agent, "x")
    await runtime.drive(run_id, agent=agent)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {**TELEMETRY_SWITCHES, "DO_NOT_TRACK": "0"}


class CaptureProxy:
    """An HTTPS proxy on loopback that lets nothing through and remembers each request line
    (``CONNECT host:443 ...``): every connection an agent makes to a public host through it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                try:
                    head = conn.recv(65536).decode("latin-1")
                    self.requests.append(head.split("\r\n", 1)[0])
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def close(self) -> None:
        # A shutdown wakes the accept that a close alone may leave blocked.
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def capture_proxy():
    proxy = CaptureProxy()
    yield proxy
    proxy.close()


AGENTS_SDK = r"""
import os
from agents import Agent, Runner

clerk = Agent(name="clerk", instructions="Answer briefly.")
print(Runner.run_sync(clerk, os.environ["SALVOR_PROMPT"]).final_output)
"""


@pytest.mark.skipif(importlib.util.find_spec("agents") is None, reason="in the test extra")
async def test_an_openai_agents_run_exports_no_trace_unless_its_definition_turns_tracing_on(
    runtime, providers, upstream_env, tmp_path, capture_proxy
):
    provider = providers([text_reply("done")] * 2)
    upstream_env(provider)
    command = [sys.executable, script(tmp_path, "sdk.py", AGENTS_SDK)]
    # Every https request of the process goes through the capture proxy; the model calls are
    # plain http to the loopback proxy and do not.
    through = {"HTTPS_PROXY": capture_proxy.url, "https_proxy": capture_proxy.url}

    agent = definition(tmp_path, command, through)
    run_id = await runtime.starts.start_run(agent, "say done")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status()["output"] == {"reply": "done", "exit_code": 0}
    assert capture_proxy.requests == []

    # The same program with tracing switched back on does reach out: the capture sees it.
    traced = definition(tmp_path, command, {**through, "OPENAI_AGENTS_DISABLE_TRACING": "0"})
    run_id = await runtime.starts.start_run(traced, "say done")
    view = await runtime.drive(run_id, agent=traced)
    assert view.status()["output"] == {"reply": "done", "exit_code": 0}
    assert capture_proxy.requests and all(
        line.startswith("CONNECT api.openai.com:443") for line in capture_proxy.requests
    )
