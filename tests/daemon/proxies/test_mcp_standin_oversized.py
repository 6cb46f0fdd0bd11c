"""Messages over the 4 MiB cap, end to end through the stand-ins.

An agent's oversized request is refused before anything is recorded: the
HTTP endpoint answers ``413`` with a JSON-RPC error, and the stdio relay turns
that into a JSON-RPC error under the request's own id. A server's oversized
answer ends its session: a read is tried again and then fails with an error
naming the cap, a write parks the run (it may have happened). Either way the
run's log stays sound and the agent hears why.
"""

from __future__ import annotations

import json

import pytest
from salvor.daemon.mcp._session import MAX_MESSAGE_BYTES
from salvor.daemon.proxies._mcp_endpoint import serve_mcp

from tests.support.backends import SQLITE_ONLY
from tests.support.mcp_servers import HttpFixtureServer
from tests.support.mcp_standin_agents import standin_agent
from tests.support.scripted_provider import tool_loop_script

# SQLite alone (tests/support/backends.py): what it tests is the stand-ins' size caps.
STORE_BACKENDS = SQLITE_ONLY

OVER = MAX_MESSAGE_BYTES + 1024


def errors(tmp_path) -> list[str]:
    path = tmp_path / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_oversized_request_is_refused_and_nothing_is_recorded(
    runtime, providers, upstream_env, tmp_path, fx, transport
):
    plan = [("write_note", {"text": "big"}), ("lookup", {"key": "after"})]
    provider = providers(tool_loop_script(plan, final_text="carried on"))
    upstream_env(provider)
    agent = standin_agent(
        tmp_path,
        f"command = {fx.toml_command()}\n",
        transport=transport,
        env={"PAD_BYTES": str(OVER)},
    )
    run_id = await runtime.starts.start_run(agent, "send too much")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    # The agent was told why, and went on; the refused call left no
    # trace in the log or at the server.
    (refused,) = errors(tmp_path)
    assert f"over the {MAX_MESSAGE_BYTES}-byte cap" in refused, refused
    log = await runtime.reads.log(run_id)
    called = [
        e.event.input.get("name")
        for e in log
        if e.kind == "ToolCallRequested" and e.event.tool == "mcp:fix/tools/call"
    ]
    assert called == ["lookup"]
    assert [c["tool"] for c in fx.ledger] == ["lookup"]


@pytest.fixture(params=["stdio-server", "http-server"])
def fx_server(request, fx):
    """The fixture server as the definition names it: a command, or a URL it serves on."""
    if request.param == "stdio-server":
        yield f"command = {fx.toml_command()}\n"
        return
    server = HttpFixtureServer(fx)
    yield f"url = {json.dumps(server.url)}\n"
    server.stop()


@pytest.mark.parametrize(
    ("effect", "state"), [("read", "completed"), ("write", "needs_reconciliation")]
)
async def test_an_oversized_answer_from_the_server_is_refused_naming_the_cap(
    runtime, providers, upstream_env, tmp_path, fx, fx_server, effect, state
):
    provider = providers(tool_loop_script([("big", {"size": OVER})], final_text="too big"))
    upstream_env(provider)
    effects = f'effects = {{ big = "{effect}" }}\n'
    agent = standin_agent(tmp_path, fx_server, effects=effects)
    run_id = await runtime.starts.start_run(agent, "answer too much")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == state, view.detail
    log = await runtime.reads.log(run_id)
    (intent,) = [
        e for e in log if e.kind == "ToolCallRequested" and e.event.input.get("name") == "big"
    ]
    completions = [
        e.event.output for e in log if e.kind == "ToolCallCompleted" and e.event.seq == intent.seq
    ]
    if effect == "write":
        # It went out and no usable answer came back: never guessed, a person settles it.
        assert completions == [] and view.pending.seq == intent.seq
        assert len(fx.calls_of("big")) == 1
        return
    (output,) = completions
    assert f"over the {MAX_MESSAGE_BYTES}-byte cap" in output["__salvor_error"]["message"]
    assert len(json.dumps(output)) < 10_000  # the oversized answer itself is never recorded
    (told,) = errors(tmp_path)
    assert f"over the {MAX_MESSAGE_BYTES}-byte cap" in told
    assert len(fx.calls_of("big")) == 3  # a read: tried again, on a new session each time


async def test_the_endpoint_answers_an_oversized_body_413_without_reading_on_or_reaching_the_lane():
    class Untouchable:
        name = "fix"

        async def receive(self, message, headers):
            raise AssertionError("an oversized message reached the lane")

    chunk = b"x" * (1024 * 1024)
    chunks = iter([chunk] * 8)
    read = []

    async def receive():
        read.append(1)
        return {"type": "http.request", "body": next(chunks), "more_body": True}

    sent = []

    async def send(message):
        sent.append(message)

    await serve_mcp({"fix": Untouchable()}, "fix", {"method": "POST", "headers": []}, receive, send)
    assert sent[0]["status"] == 413
    body = json.loads(sent[1]["body"])
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32600
    assert f"over the {MAX_MESSAGE_BYTES}-byte cap" in body["error"]["message"]
    assert len(read) == 5  # it stopped reading once past the cap
