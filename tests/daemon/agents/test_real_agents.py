"""Real agent programs run unchanged as process agents: what each needs from salvor.

* the SDK telemetry switches are off in every agent's environment, and the openai-agents SDK
  then makes no connection beyond the loopback proxy (counted by a capture proxy it is pointed at).

The scripted provider is the upstream (the one allowed double); everything else is real.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import threading
from pathlib import Path

import pytest
from salvor.daemon.agents._definition import parse_definition

from tests.support.backends import SQLITE_ONLY
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
    run_id = await runtime.start_run(agent, "x")
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
    run_id = await runtime.start_run(agent, "say done")
    view = await runtime.drive(run_id, agent=agent)
    assert view.status()["output"] == {"reply": "done", "exit_code": 0}
    assert capture_proxy.requests == []

    # The same program with tracing switched back on does reach out: the capture sees it.
    traced = definition(tmp_path, command, {**through, "OPENAI_AGENTS_DISABLE_TRACING": "0"})
    run_id = await runtime.start_run(traced, "say done")
    view = await runtime.drive(run_id, agent=traced)
    assert view.status()["output"] == {"reply": "done", "exit_code": 0}
    assert capture_proxy.requests and all(
        line.startswith("CONNECT api.openai.com:443") for line in capture_proxy.requests
    )
