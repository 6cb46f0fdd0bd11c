"""MCP servers attached at run time, seen by a process agent through the ``salvor`` MCP server
(issue 32, item 5, the process half): the operator's declared server, attached by name to a
process run that rests, is listed through the log as the drive starts; the real ``mcp`` SDK
client lists its tools after the flow tools, its model calls one, and the ``salvor`` lane relays
the call to the server through the daemon's own client, performed once. Neither the server's
URL nor its command reaches the log. An open write of the attached server, found after the drive
stopped inside it, is settled by the server's declared probe when a restarted daemon recovers
the run: performed once, never sent again. A keyed write relayed for a process run claims the
attached server's identity, the one a built-in agent's call of it claims, so the two runs'
writes of one key are performed once; and a tool the relay did not offer the agent (an attached
write's probe among them) is refused, the server never reached.
"""

from __future__ import annotations

import json

import pytest
import trio
from salvor.daemon.mcp import parse_mcp_servers
from salvor.daemon.runs import Runtime
from salvor.protocol import EventKind, RunState

from tests.daemon.agents.test_attached_mcp import DESK_TOOLS, desk
from tests.daemon.proxies.test_salvor_server import lane, salvor_agent, steps_script, tool_results
from tests.support.backends import SQLITE_ONLY
from tests.support.flows import tool_results as builtin_results
from tests.support.flows import tool_use
from tests.support.mcp_servers import HttpFixtureServer
from tests.support.scripted_provider import text_reply

# SQLite alone (tests/support/backends.py): what it tests is the salvor server's relay; the
# log's side of an attached server runs on both backends (tests/daemon/agents/test_attached_mcp).
STORE_BACKENDS = SQLITE_ONLY

FLOW_TOOLS = ["ask_user", "subagent", "finish", "flow_results"]


def listed(call) -> list[str]:
    return [tool["name"] for tool in call.request.get("tools") or []]


def attaching(runtime, servers) -> Runtime:
    """A runtime (a daemon's, or one restarted over the same store) whose operator declares
    ``servers`` attachable."""
    return Runtime(
        runtime.access, runtime.kit.registry, clock=runtime.kit.clock, attachable_mcp=servers
    )


def listings(log) -> list[str]:
    return [
        env.event.tool
        for env in log
        if env.kind == "ToolCallRequested" and env.event.tool.endswith("/tools/list")
    ]


@pytest.fixture
def http_desk(fx):
    """``desk`` over streamable HTTP: a server of its own on a loopback URL."""
    served = HttpFixtureServer(fx, "--find-note")
    try:
        (spec,) = parse_mcp_servers([{**_table(desk(fx)["desk"]), "url": served.url}])
        yield served, {"desk": spec}
    finally:
        served.stop()


def _table(spec) -> dict:
    return {
        "name": spec.name,
        "tools": list(spec.tools),
        "effects": dict(spec.effects),
        "idempotency_keys": {"write_note": "text"},
        "probes": {
            "write_note": {
                "tool": "find_note",
                "input": {"text": "text"},
                "landed": "found",
                "output": "note",
            }
        },
    }


async def test_a_resting_process_run_lists_an_attached_server_and_its_call_reaches_it(
    runtime, providers, upstream_env, tmp_path, fx, http_desk
):
    served, servers = http_desk
    provider = providers(
        steps_script(
            lambda _: ("lookup", {"key": "INV-7"}),
            lambda results: f"found {results[0]}",
        )
    )
    upstream_env(provider)
    daemon = attaching(runtime, servers)
    agent = salvor_agent(tmp_path, transport="http")
    run_id = await daemon.starts.start_run(agent, "look INV-7 up")
    attached = await daemon.tools.attach(run_id, [], ["desk"])
    assert attached["tools"] == ["mcp:desk"]

    view = await daemon.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED, view.detail
    # The flow tools, then the attached server's (the listing's input schemas with them).
    assert listed(provider.calls[0]) == FLOW_TOOLS + DESK_TOOLS
    assert tool_results(provider.calls[1]) == ["value of INV-7"]
    assert view.detail["output"]["reply"] == "found value of INV-7"
    # Relayed to the server once, by the daemon's own client.
    assert [c["arguments"] for c in fx.calls_of("lookup")] == [{"key": "INV-7"}]
    log = await daemon.reads.log(run_id)
    # The server's tools were listed through the log before the process started; the agent's
    # requests are the salvor lane's, its call recorded there as a read (the declared effect).
    assert listings(log) == ["mcp:desk/tools/list", "mcp:salvor/tools/list"]
    assert lane(log) == [
        "mcp:desk/tools/list",
        "mcp:salvor/initialize",
        "mcp:salvor/tools/list",
        "call:lookup",
    ]
    [call] = [e.event for e in log if e.kind == "ToolCallRequested" and e.event.input.get("name")]
    assert call.effect == "read"
    [shown] = [
        e.event.output["result"]["tools"]
        for e in log
        if e.kind == "ToolCallCompleted"
        and isinstance(e.event.output, dict)
        and "result" in e.event.output
        and "tools" in (e.event.output["result"] or {})
    ]
    assert [tool["name"] for tool in shown] == FLOW_TOOLS + DESK_TOOLS
    # No URL of the server (nor its port) is in the run's log, its listing included.
    stored = json.dumps([repr(e.event) for e in log])
    assert served.url not in stored and f":{served.port}" not in stored

    # A restarted daemon replays the whole run without reaching the server again.
    again = attaching(runtime, servers)
    assert (await again.drive(run_id, agent=agent)).state is RunState.COMPLETED
    assert len(fx.calls_of("lookup")) == 1 and len(fx.starts) == 1


async def test_an_attached_servers_open_write_of_a_process_run_is_probed_on_recovery(
    runtime, providers, upstream_env, tmp_path, fx
):
    """The write reached the server and the drive stopped before its completion was recorded:
    the restarted daemon lists the run among those it drives again, the agent's replay reaches
    the call and the lane probes it with the server's declared read, finding it landed."""
    note = {"text": "INV-7", "hold": fx.hold("w")}
    provider = providers(steps_script(lambda _: ("write_note", note), lambda _: "noted"))
    upstream_env(provider)
    daemon = attaching(runtime, desk(fx))
    agent = salvor_agent(tmp_path)
    run_id = await daemon.starts.start_run(agent, "note INV-7")
    await daemon.tools.attach(run_id, [], ["desk"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: daemon.drive(run_id, agent=agent))
        with trio.fail_after(30):
            while not fx.calls_of("write_note"):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    fx.release("w")
    assert (await daemon.reads.view(run_id)).state is RunState.NEEDS_RECONCILIATION

    restarted = attaching(runtime, desk(fx))
    assert run_id in await restarted.reads.interrupted_runs()
    view = await restarted.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED, view.detail
    assert len(fx.calls_of("write_note")) == 1
    assert [c["arguments"] for c in fx.calls_of("find_note")] == [{"text": "INV-7"}]
    log = await restarted.reads.log(run_id)
    [intent] = [
        e
        for e in log
        if e.kind == "ToolCallRequested" and e.event.input.get("name") == "write_note"
    ]
    assert intent.event.effect == "write"
    [done] = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    assert done.settled_by == "probe"
    # The recovered drive offered the listing its log holds: the server was listed once.
    assert listings(log) == ["mcp:desk/tools/list", "mcp:salvor/tools/list"]
    # The command that starts the server is the operator's: not in the log.
    assert fx.command()[1] not in json.dumps([repr(e.event) for e in log])


async def test_without_the_operators_declaration_the_attached_server_is_not_reached(
    runtime, providers, upstream_env, tmp_path, fx
):
    """A process run holding a server the operator's file no longer declares is failed in one
    sentence, the server never reached."""
    provider = providers(steps_script(lambda _: "nothing"))
    upstream_env(provider)
    daemon = attaching(runtime, desk(fx))
    agent = salvor_agent(tmp_path)
    run_id = await daemon.starts.start_run(agent, "anything")
    await daemon.tools.attach(run_id, [], ["desk"])
    view = await attaching(runtime, {}).drive(run_id, agent=agent)
    assert view.state is RunState.FAILED
    assert "no longer among the operator's attachable servers" in view.detail["error"]
    assert fx.starts == [] and provider.call_count == 0


def completion_of(log, tool_name: str):
    """The completion of the one call of ``tool_name`` in ``log`` (a built-in agent's call, or a
    call the ``salvor`` lane relayed), and its intent's seq."""
    [intent] = [
        e
        for e in log
        if e.kind == "ToolCallRequested"
        and (e.event.tool == tool_name or e.event.input.get("name") == tool_name)
    ]
    [done] = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    return intent, done


@pytest.mark.parametrize("process_first", [False, True], ids=["built_in_first", "process_first"])
async def test_a_built_in_and_a_process_runs_keyed_write_through_one_attached_server_is_one(
    runtime, providers, upstream_env, tmp_path, fx, make_agent, http_desk, process_first
):
    """A built-in run and a process run (the real ``mcp`` client over ``SALVOR_MCP_URL_SALVOR``,
    its write relayed by the ``salvor`` server) each write the note ``INV-7`` through the
    attached ``desk``: both claim the one identity, so the second copies the first's outcome
    and the server performs the write once. Each copy has the shape its own call records: a
    built-in run copying the lane's ``{"result": ...}`` keeps the server's result alone."""
    _, servers = http_desk
    daemon = attaching(runtime, servers)
    note = {"text": "INV-7"}
    noted = {"content": [{"type": "text", "text": "noted INV-7"}]}

    async def built_in() -> str:
        provider = providers([tool_use("write_note", note), text_reply("noted")])
        agent = make_agent(provider)
        run_id = await daemon.starts.start_run(agent, "note INV-7")
        await daemon.tools.attach(run_id, [], ["desk"])
        assert (await daemon.drive(run_id, agent=agent)).state is RunState.COMPLETED
        _, done = completion_of(await daemon.reads.log(run_id), "write_note")
        assert done.output == noted
        assert "noted INV-7" in json.dumps(builtin_results(provider.calls[1]))
        return run_id

    async def process() -> str:
        provider = providers(steps_script(lambda _: ("write_note", note), lambda r: f"got {r[0]}"))
        upstream_env(provider)
        agent = salvor_agent(tmp_path, transport="http")
        run_id = await daemon.starts.start_run(agent, "note INV-7 too")
        await daemon.tools.attach(run_id, [], ["desk"])
        view = await daemon.drive(run_id, agent=agent)
        assert view.state is RunState.COMPLETED, view.detail
        _, done = completion_of(await daemon.reads.log(run_id), "write_note")
        assert done.output["result"] == noted
        assert "noted INV-7" in tool_results(provider.calls[1])[0]
        return run_id

    first, second = (process, built_in) if process_first else (built_in, process)
    first_run = await first()
    assert len(fx.calls_of("write_note")) == 1
    second_run = await second()

    # Performed once: the second run's write copied the first's outcome.
    assert len(fx.calls_of("write_note")) == 1
    first_intent, _ = completion_of(await daemon.reads.log(first_run), "write_note")
    intent, done = completion_of(await daemon.reads.log(second_run), "write_note")
    assert intent.event.idempotency_key == first_intent.event.idempotency_key
    assert done.deduplicated_from == {"run_id": first_run, "seq": first_intent.seq}


async def test_an_attached_servers_probe_the_relay_did_not_offer_is_refused_to_the_agent(
    runtime, providers, upstream_env, tmp_path, fx
):
    """``desk``'s write is probed by its tool ``attach_tool``, which the relay does not offer
    (the name is a flow tool's, offered only in edit mode, which is off). The agent calling
    ``attach_tool`` by name is refused as any tool not offered is: an MCP tool error, recorded,
    the server never reached; the lane's own probe is another path (the recovery test above)."""
    (spec,) = parse_mcp_servers(
        [
            {
                "name": "desk",
                "command": fx.command("--extra-tool", "attach_tool"),
                "tools": ["lookup", "write_note", "attach_tool"],
                "effects": {"lookup": "read", "write_note": "write", "attach_tool": "read"},
                "probes": {
                    "write_note": {
                        "tool": "attach_tool",
                        "input": {"text": "text"},
                        "landed": "found",
                    }
                },
            }
        ]
    )
    provider = providers(
        steps_script(lambda _: ("attach_tool", {"text": "INV-7"}), lambda r: f"told {r[0]}")
    )
    upstream_env(provider)
    daemon = attaching(runtime, {"desk": spec})
    agent = salvor_agent(tmp_path)
    run_id = await daemon.starts.start_run(agent, "probe it")
    await daemon.tools.attach(run_id, [], ["desk"])
    view = await daemon.drive(run_id, agent=agent)
    assert view.state is RunState.COMPLETED, view.detail
    # Not offered: the flow tools without attach_tool, then desk's two others.
    assert listed(provider.calls[0]) == FLOW_TOOLS + ["lookup", "write_note"]
    assert fx.calls_of("attach_tool") == []
    [refusal] = tool_results(provider.calls[1])
    assert "offers no tool 'attach_tool'" in refusal
    _, done = completion_of(await daemon.reads.log(run_id), "attach_tool")
    assert done.output["result"]["isError"] is True
