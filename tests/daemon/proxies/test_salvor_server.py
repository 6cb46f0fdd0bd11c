"""The ``salvor`` MCP server a process agent reaches: the flow tools through a stand-in lane.

The agent is the stand-in suite's script on the real ``mcp`` SDK client
(``tests.support.mcp_standin_agents.AGENT``), pointed at ``$SALVOR_MCP_SERVER_SALVOR``
(stdio, through the relay) or ``$SALVOR_MCP_URL_SALVOR`` (streamable HTTP); its model is the
scripted provider, whose answers depend only on the conversation so far (what a tool call
returned is what the next answer is built from).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import trio
from salvor.daemon.agents._definition import DefinitionError, parse_definition
from salvor.daemon.flows import AUTONOMOUS_LABEL, AUTONOMOUS_REFUSAL, PARENT_LABEL, child_run_id
from salvor.protocol import RunStarted, question_schema

from tests.support.backends import SQLITE_ONLY
from tests.support.flows import tool_use
from tests.support.mcp_standin_agents import AGENT
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import ProviderCall, text_reply

# SQLite alone (tests/support/backends.py): what it tests is the salvor server's lane; the kill
# test of tests/chaos/test_kill_salvor_server runs on both backends.
STORE_BACKENDS = SQLITE_ONLY

QUESTION = {"question": "Which colour?", "type": "select", "options": ["red", "blue"]}


def salvor_agent(tmp_path: Path, *, transport: str = "stdio", extra: str = "", env=None):
    """A process agent on the ``mcp`` SDK whose only MCP server is salvor's own."""
    script = tmp_path / "mcp_agent.py"
    script.write_text(AGENT)
    env_table = "".join(
        f"{k} = {json.dumps(v)}\n" for k, v in {"SERVER": "SALVOR", **(env or {})}.items()
    )
    text = (
        'name = "asker"\nkind = "process"\ncommand = '
        f"{json.dumps([sys.executable, str(script), transport])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n{extra}"
        f"[env]\n{env_table}"
    )
    return parse_definition(text, "toml")


def tool_results(call: ProviderCall) -> list[str]:
    """What the agent told the model its tool calls returned, in order."""
    found = []
    for message in call.request["messages"]:
        for block in message["content"]:
            if block["type"] == "tool_result":
                content = block["content"]
                found.append(content if isinstance(content, str) else json.dumps(content))
    return found


def steps_script(*steps):
    """A script whose answer k is ``steps[k](results)`` (a tool call ``(name, input)`` or the
    final text), ``results`` being the tool results the conversation holds."""

    def script(call: ProviderCall):
        results = tool_results(call)
        step = steps[len(results)](results)
        if isinstance(step, str):
            content, stop = [{"type": "text", "text": step}], "end_turn"
        else:
            name, tool_input = step
            content = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{len(results)}",
                    "name": name,
                    "input": tool_input,
                }
            ]
            stop = "tool_use"
        reply = {"model": call.request["model"], "content": content, "stop_reason": stop}
        return reply, {"input_tokens": 10, "output_tokens": 5}

    return script


def lane(log) -> list[str]:
    return [
        env.event.tool
        if env.event.tool != "mcp:salvor/tools/call"
        else f"call:{env.event.input['name']}"
        for env in log
        if env.kind == "ToolCallRequested"
    ]


def kinds(log) -> list[str]:
    return [env.kind for env in log]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_ask_user_parks_the_process_run_and_the_resumed_process_gets_the_answer(
    server_factory, providers, tmp_path, monkeypatch, transport
):
    from tests.daemon.agents.test_process_agent import SECRET

    provider = providers(
        steps_script(
            lambda _: ("ask_user", QUESTION),
            lambda results: f"the person chose {json.loads(results[0])['answer']}",
        )
    )
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    server = await server_factory(allow_process_agents=True)
    agent = await server.register_agent(salvor_agent(tmp_path, transport=transport).stored_text)
    run_id = await server.start_run(agent, "pick a colour")
    body = await server.wait_resting(run_id)
    assert body["status"] == {
        "state": "suspended",
        "reason": "Which colour?",
        "input_schema": question_schema(QUESTION),
    }, body
    served = provider.call_count

    wrong = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"answer": "green"}}
    )
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (400, "bad_request")
    after = (await server.client.get(f"/v1/runs/{run_id}")).json()
    assert after["status"]["state"] == "suspended" and after["event_count"] == body["event_count"]

    right = await server.client.post(
        f"/v1/runs/{run_id}/resume", json={"input": {"answer": "blue"}}
    )
    assert right.status_code in (200, 202), right.text
    body = await server.wait_resting(run_id)
    assert body["status"]["state"] == "completed", body
    assert body["status"]["output"] == {"reply": "the person chose blue", "exit_code": 0}
    # The resumed process was answered from the log: the model was asked once more, with the
    # answer as the call's result (its JSON text; the SDK also had it as structuredContent).
    assert provider.call_count == served + 1
    assert json.loads(tool_results(provider.calls[-1])[0]) == {"answer": "blue"}
    log = await server.state.runtime.reads.log(run_id)
    assert lane(log) == ["mcp:salvor/initialize", "mcp:salvor/tools/list", "call:ask_user"]
    assert kinds(log).count("Suspended") == 1 and kinds(log).count("Resumed") == 1


OUTPUTS = 'outputs = ["colour", { name = "count", type = "number" }]\n'
GOOD = {"status": "complete", "summary": "painted it", "colour": "blue", "count": 3}


async def test_finish_is_checked_its_result_is_the_run_output_and_no_tool_is_called_after_it(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(
        steps_script(
            lambda _: ("finish", {"status": "complete", "summary": "painted it", "count": 3}),
            lambda _: ("finish", {**GOOD, "count": "three"}),
            lambda _: ("finish", {**GOOD, "status": "done"}),
            lambda _: ("finish", GOOD),
            lambda _: ("ask_user", QUESTION),
            lambda _: ("finish", {"status": "error", "summary": "again"}),
            lambda _: "all done",
        )
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path, extra=OUTPUTS)
    run_id = await runtime.starts.start_run(agent, "paint it")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    # The typed outputs, in their JSON types, under `outputs`.
    finished = {
        "status": "complete",
        "summary": "painted it",
        "outputs": {"colour": "blue", "count": 3},
    }
    assert view.detail["output"] == finished
    # The finish schema the model was offered carries the declared outputs.
    (schema,) = [t for t in provider.calls[0].request["tools"] if t["name"] == "finish"]
    assert schema["input_schema"]["properties"]["count"] == {"type": "number"}
    results = tool_results(provider.calls[-1])
    # The bad finishes (a missing required output, a wrong type, a status finish does not know)
    # were answered with what is wrong, as the tool's error.
    assert "`colour`" in results[0]
    assert "count" in results[1] and "status" in results[2]
    assert json.loads(results[3]) == finished
    # After the good finish nothing is performed or recorded; the model reads why.
    assert all("no tool can be called after finish" in text for text in results[4:])
    log = await runtime.reads.log(run_id)
    assert lane(log) == ["mcp:salvor/initialize", "mcp:salvor/tools/list"] + ["call:finish"] * 4
    assert "Suspended" not in kinds(log)
    refused = [
        env.event.output["result"]
        for env in log
        if env.kind == "ToolCallCompleted" and env.event.output["result"].get("isError")
    ]
    assert len(refused) == 3

    # A re-run reproduces the finish from the log, and refuses the same calls after it.
    rerun = await runtime.starts.start_run(agent, None, replay_of=run_id)
    view = await runtime.drive(rerun, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"] == finished
    assert lane(await runtime.reads.log(rerun)) == lane(log)


async def test_the_tools_a_process_run_is_offered_follow_its_session(
    runtime, providers, upstream_env, tmp_path
):
    """A top-level run sees ask_user, subagent, finish and flow_results (authoring waits for edit
    mode); a child of an autonomous tree sees ask_user and finish, and its question is refused as
    the tool's error, never a suspension."""
    as_child = steps_script(
        lambda _: ("ask_user", {"question": "Go on?", "type": "confirm"}),
        lambda _: ("finish", {"status": "complete", "summary": "went on alone"}),
        lambda _: "done",
    )

    def script(call: ProviderCall):
        offered = [tool["name"] for tool in call.request["tools"]]
        return (
            steps_script(lambda _: "nothing to do")(call)
            if "subagent" in offered
            else as_child(call)
        )

    provider = providers(script)
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    await runtime.definitions.register_agent(agent)

    async def listed(labels) -> tuple[list[str], object]:
        run_id = str(uuid.uuid4())
        head = RunStarted(agent_def_hash=agent.agent_def_hash, input="go", labels=labels)
        await runtime.starts.open_log(run_id, [head])
        view = await runtime.drive(run_id, agent=agent)
        assert view.state.value == "completed", view.detail
        log = await runtime.reads.log(run_id)
        tools = next(
            env.event.output["result"]["tools"]
            for env in log
            if env.kind == "ToolCallCompleted" and "tools" in env.event.output.get("result", {})
        )
        return [tool["name"] for tool in tools], view

    main, _ = await listed(None)
    assert main == ["ask_user", "subagent", "finish", "flow_results"]
    # What the model was offered is what the server listed.
    assert [t["name"] for t in provider.calls[0].request["tools"]] == main
    child, view = await listed({PARENT_LABEL: str(uuid.uuid4()), AUTONOMOUS_LABEL: "true"})
    assert child == ["ask_user", "finish"]
    assert view.detail["output"]["summary"] == "went on alone"
    assert AUTONOMOUS_REFUSAL in tool_results(provider.calls[-1])[0]


@pytest.mark.parametrize("name", ["salvor", "Salvor", "SALVOR"])
def test_a_process_agent_declaring_a_server_named_salvor_is_refused(name):
    text = (
        'kind = "process"\ncommand = ["agent"]\n'
        f'[[mcp_servers]]\nname = "{name}"\nurl = "https://mcp.example/mcp"\n'
    )
    with pytest.raises(DefinitionError, match="its own MCP server named `salvor`"):
        parse_definition(text, "toml")


def helper_agent(runtime, provider, *, tools=(), extra: str = ""):
    """The built-in child a subagent call names, ``helper``, on its own scripted provider."""
    text = 'name = "helper"\n' + agent_toml(provider.base_url, tools=tools, extra=extra)
    return parse_definition(text, "toml", known_tools=runtime.kit.registry.names())


def handed_on(result: str) -> dict:
    """The parent's finish after its subagent call answered ``result``: the child's summary,
    and its typed outputs as the parent's own."""
    child = json.loads(result)
    return {"status": "complete", "summary": f"helper said: {child['summary']}", **child["outputs"]}


def delegating_script():
    """The parent's model: delegate to ``helper``, then finish with what the child returned."""
    return steps_script(
        lambda _: (
            "subagent",
            {"agent": "helper", "task": "find the colour", "inputs": {"k": "v"}},
        ),
        lambda results: ("finish", handed_on(results[0])),
        lambda _: "done",
    )


async def children(runtime, parent: str) -> list[str]:
    page, _ = await runtime.reads.list_runs(label=(PARENT_LABEL, parent))
    return [summary.run_id for summary in page]


def subagent_seq(log) -> int:
    return next(
        env.seq
        for env in log
        if env.kind == "ToolCallRequested"
        and env.event.tool == "mcp:salvor/tools/call"
        and env.event.input["name"] == "subagent"
    )


async def test_a_process_agent_delegates_to_a_built_in_child_and_finishes_with_its_result(
    runtime, providers, upstream_env, tmp_path
):
    child_finish = {"status": "complete", "summary": "found it", "colour": "blue", "count": 3}
    child_provider = providers([tool_use("finish", child_finish, tokens=7)])
    await runtime.definitions.register_agent(helper_agent(runtime, child_provider, extra=OUTPUTS))
    provider = providers(delegating_script())
    upstream_env(provider)
    agent = salvor_agent(tmp_path, extra=OUTPUTS)
    run_id = await runtime.starts.start_run(agent, "delegate it")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    # The parent completes with the child's typed outputs, handed on through its own finish.
    assert view.detail["output"] == {
        "status": "complete",
        "summary": "helper said: found it",
        "outputs": {"colour": "blue", "count": 3},
    }
    log = await runtime.reads.log(run_id)
    # With a daemon behind the run, subagent and flow_results are offered too.
    assert [t["name"] for t in provider.calls[0].request["tools"]] == [
        "ask_user",
        "subagent",
        "finish",
        "flow_results",
    ]
    (child,) = await children(runtime, run_id)
    assert child == child_run_id(run_id, subagent_seq(log))
    child_view = await runtime.reads.view(child)
    assert child_view.input == {"task": "find the colour", "inputs": {"k": "v"}}
    child_result = {
        "status": "complete",
        "summary": "found it",
        "outputs": {"colour": "blue", "count": 3},
    }
    assert child_view.status() == {"state": "completed", "output": child_result}
    # The call's answer is the child's finish result, with the child's usage.
    answered = json.loads(tool_results(provider.calls[1])[0])
    assert answered == {
        **child_result,
        "usage": {"input_tokens": 7, "output_tokens": 5, "steps": 1},
    }
    assert child_provider.call_count == 1


async def test_a_child_resting_short_stops_the_process_parent_until_the_child_ends(
    runtime, providers, upstream_env, tmp_path
):
    child_provider = providers(
        [
            (
                {
                    "model": "scripted-model",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_0",
                            "name": "request_approval",
                            "input": {},
                        }
                    ],
                    "stop_reason": "tool_use",
                },
                {"input_tokens": 7, "output_tokens": 3},
            ),
            text_reply("blue"),
        ]
    )
    await runtime.definitions.register_agent(
        helper_agent(runtime, child_provider, tools=("request_approval",))
    )
    provider = providers(delegating_script())
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    run_id = await runtime.starts.start_run(agent, "delegate it")
    view = await runtime.drive(run_id, agent=agent)
    # The child waits on a person: the parent's call stays open, its process is stopped, and the
    # parent waits on the call (nothing of its completion is recorded).
    (child,) = await children(runtime, run_id)
    assert (await runtime.reads.view(child)).state.value == "suspended"
    assert view.state.value == "awaiting_tool", view.detail
    assert view.pending.tool == "mcp:salvor/tools/call" and view.pending.input["name"] == "subagent"
    served = provider.call_count
    assert served == 1

    assert (await runtime.control.resume(child, {"approved": True})).outcome == "driving"
    assert (await runtime.drive(child)).state.value == "completed"
    # Driven again, the parent's process starts from the top: its first model call is answered
    # from the log, the open subagent call finds its child's result, and no second child exists.
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"]["summary"] == "helper said: blue"
    assert await children(runtime, run_id) == [child]
    # (the finish and the answer after it are the two new calls; none was asked twice)
    assert provider.call_count == served + 2
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 1]
    assert child_provider.call_count == 2


async def test_a_process_agent_as_a_built_in_parents_child_finishes_with_its_typed_outputs(
    runtime, providers, upstream_env, make_agent, tmp_path
):
    """The other way round: a built-in parent's subagent call starts a process child, whose
    salvor server is a child session's (ask_user and finish only)."""
    child_provider = providers(steps_script(lambda _: ("finish", GOOD), lambda _: "done"))
    upstream_env(child_provider)
    await runtime.definitions.register_agent(salvor_agent(tmp_path, extra=OUTPUTS))
    provider = providers(
        [
            tool_use("subagent", {"agent": "asker", "task": "paint it"}),
            text_reply("the child painted it"),
        ]
    )
    parent = make_agent(provider, extra='flow_tools = ["subagent"]\n')
    run_id = await runtime.starts.start_run(parent, "delegate")
    view = await runtime.drive(run_id, agent=parent)
    assert view.status() == {"state": "completed", "output": "the child painted it"}, view.detail
    (child,) = await children(runtime, run_id)
    child_log = await runtime.reads.log(child)
    listed = next(
        env.event.output["result"]["tools"]
        for env in child_log
        if env.kind == "ToolCallCompleted" and "tools" in env.event.output.get("result", {})
    )
    assert [tool["name"] for tool in listed] == ["ask_user", "finish"]
    result = {
        "status": "complete",
        "summary": "painted it",
        "outputs": {"colour": "blue", "count": 3},
    }
    assert (await runtime.reads.view(child)).status() == {"state": "completed", "output": result}
    # The parent's model read the child's finish result as the call's answer.
    answered = json.loads(tool_results(provider.calls[1])[0])
    assert {k: answered[k] for k in result} == result


async def listed_children(server, parent: str) -> list[str]:
    listed = await server.client.get("/v1/runs", params={"label": f"{PARENT_LABEL}:{parent}"})
    return [entry["run"] for entry in listed.json()["runs"]]


async def test_under_serve_a_child_resumed_by_a_person_starts_its_process_parent_again(
    server_factory, providers, tmp_path, monkeypatch
):
    from tests.daemon.agents.test_process_agent import SECRET

    child_provider = providers(
        [tool_use("request_approval", {"reason": "may I?"}), text_reply("blue")]
    )
    provider = providers(delegating_script())
    monkeypatch.setenv("SALVOR_AGENT_UPSTREAM", provider.base_url)
    monkeypatch.setenv("SALVOR_AGENT_KEY", SECRET)
    server = await server_factory(allow_process_agents=True)
    await server.register_agent(
        'name = "helper"\n' + agent_toml(child_provider.base_url, tools=("request_approval",))
    )
    agent = await server.register_agent(salvor_agent(tmp_path).stored_text)
    run_id = await server.start_run(agent, "delegate it")
    with trio.fail_after(30):
        while not (listed := await listed_children(server, run_id)):
            await trio.sleep(0.02)
    (child,) = listed
    assert (await server.wait_resting(child))["status"]["state"] == "suspended"
    # The parent waits on its open call with no driver and no process.
    with trio.fail_after(30):
        while (parent := (await server.client.get(f"/v1/runs/{run_id}")).json()).get(
            "driver"
        ) == "attached":
            await trio.sleep(0.02)
    assert parent["status"]["state"] == "awaiting_tool", parent
    resumed = await server.client.post(
        f"/v1/runs/{child}/resume", json={"input": {"approved": True}}
    )
    assert resumed.status_code in (200, 202), resumed.text
    # The child completes under its own driver, which then starts the parent again.
    with trio.fail_after(30):
        while (body := await server.wait_resting(run_id))["status"]["state"] != "completed":
            await trio.sleep(0.02)
    assert body["status"]["output"] == {
        "status": "complete",
        "summary": "helper said: blue",
        "outputs": {},
    }
    assert await listed_children(server, run_id) == [child]
    assert sorted(provider.count_by_request_hash().values()) == [1, 1, 1]


TWO_SERVERS = r"""
import asyncio, json, os, shlex, urllib.request
from contextlib import AsyncExitStack

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(messages, tools):
    body = {"model": "scripted-model", "messages": messages, "tools": tools}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
    )
    with _no_proxy.open(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["message"]


async def main():
    async with AsyncExitStack() as stack:
        owner, tools = {}, []
        for server in ("SALVOR", "FIX"):
            argv = shlex.split(os.environ[f"SALVOR_MCP_SERVER_{server}"])
            streams = await stack.enter_async_context(
                stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
            )
            session = await stack.enter_async_context(ClientSession(*streams))
            await session.initialize()
            for tool in (await session.list_tools()).tools:
                owner[tool.name] = session
                schema = getattr(tool, "input_schema", None) or tool.inputSchema
                tools.append(
                    {"type": "function", "function": {"name": tool.name, "parameters": schema}}
                )
        messages = [{"role": "user", "content": os.environ["SALVOR_PROMPT"]}]
        while True:
            message = complete(messages, tools)
            calls = message.get("tool_calls") or []
            if not calls:
                print(message.get("content"))
                return
            messages.append(
                {
                    "role": "assistant",
                    "content": message.get("content"),
                    "tool_calls": [
                        {"id": c["id"], "type": "function", "function": c["function"]}
                        for c in calls
                    ],
                }
            )
            for c in calls:
                name = c["function"]["name"]
                result = await owner[name].call_tool(name, json.loads(c["function"]["arguments"]))
                text = "".join(b.text for b in result.content if b.type == "text")
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": text})


asyncio.run(main())
"""


async def test_after_finish_no_tool_of_any_server_is_called(
    runtime, providers, upstream_env, tmp_path, fx
):
    provider = providers(
        steps_script(
            lambda _: ("lookup", {"key": "a"}),
            lambda _: ("finish", {"status": "complete", "summary": "looked it up"}),
            lambda _: ("write_note", {"text": "after the end"}),
            lambda _: "done",
        )
    )
    upstream_env(provider)
    script = tmp_path / "two_servers.py"
    script.write_text(TWO_SERVERS)
    agent = parse_definition(
        'kind = "process"\n'
        f"command = {json.dumps([sys.executable, str(script)])}\n"
        f"cwd = {json.dumps(str(tmp_path))}\ntimeout = 60\n"
        f'[[mcp_servers]]\nname = "fix"\ncommand = {fx.toml_command()}\n'
        'effects = { lookup = "read", write_note = "write" }\n',
        "toml",
    )
    run_id = await runtime.starts.start_run(agent, "look it up")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert view.detail["output"]["summary"] == "looked it up"
    # The declared server's write after the finish never reached it and left nothing in the log.
    assert [call["tool"] for call in fx.ledger] == ["lookup"]
    assert "no tool can be called after finish" in tool_results(provider.calls[-1])[2]
    calls = [
        (env.event.tool, env.event.input.get("name"))
        for env in await runtime.reads.log(run_id)
        if env.kind == "ToolCallRequested" and env.event.tool.endswith("tools/call")
    ]
    assert calls == [("mcp:fix/tools/call", "lookup"), ("mcp:salvor/tools/call", "finish")]


async def test_authoring_is_offered_to_a_process_run_while_edit_mode_is_on(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(
        steps_script(lambda _: ("flow_agents", {"op": "list"}), lambda _: "looked")
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path)

    async def drive_one() -> tuple[list[str], str]:
        run_id = await runtime.starts.start_run(agent, "look at the catalog")
        view = await runtime.drive(run_id, agent=agent)
        assert view.state.value == "completed", view.detail
        offered = [t["name"] for t in provider.calls[-2].request["tools"]]
        return offered, tool_results(provider.calls[-1])[0]

    offered, answer = await drive_one()
    assert offered == ["ask_user", "subagent", "finish", "flow_results"]
    assert "offers no tool 'flow_agents'" in answer

    # The setting is read afresh, no restart: the next run's listing has the authoring tools, and
    # its call of one is performed.
    await runtime.definitions.set_edit_mode(True)
    offered, answer = await drive_one()
    assert offered == [
        "ask_user",
        "subagent",
        "finish",
        "flow_results",
        "flow_agents",
        "flow_write",
        "attach_tool",
    ]
    assert "asker" in [entry["name"] for entry in json.loads(answer)]
