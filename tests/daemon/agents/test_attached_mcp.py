"""MCP servers attached to a run tree at run time (issue 32, item 5), in the built-in loop: the
operator's declared server (``--attachable-mcp``) attached by name to a run waiting on a
question, its tools listed through the log and offered from the next model call, a child started
after it inheriting it, a fork of a graph run seeing it, an unknown name refused with nothing
recorded, a server the operator withdrew failing the run in one sentence, and an open write of
an attached server probed on recovery as a definition's server's is.

Real runs over a real store, the fixture MCP server (a real stdio MCP server the daemon spawns),
the scripted provider as the only double.
"""

from __future__ import annotations

import uuid
from functools import partial

import pytest
import trio
from salvor.daemon.agents import parse_definition
from salvor.daemon.flows import PARENT_LABEL, TOOLS_LABEL, child_run_id
from salvor.daemon.mcp import parse_mcp_servers
from salvor.daemon.runs import Runtime
from salvor.daemon.web import OperationRefused
from salvor.protocol import EventKind, RunStarted, RunState, ToolsAttached

from tests.daemon.agents.test_probes import note_call
from tests.daemon.agents.test_run_tools import QUESTION, gated_graph, kinds
from tests.support.flows import offered_tools, tool_results, tool_use, with_flows
from tests.support.runtime import agent_toml
from tests.support.scripted_provider import text_reply

DESK_TOOLS = ["lookup", "write_note", "find_note"]


def desk(fx) -> dict:
    """The operator's attachable servers: ``desk``, the fixture server with a probed write."""
    (spec,) = parse_mcp_servers(
        [
            {
                "name": "desk",
                "command": fx.command("--find-note"),
                "tools": DESK_TOOLS,
                "effects": {"lookup": "read", "write_note": "write", "find_note": "read"},
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
        ]
    )
    return {"desk": spec}


@pytest.fixture
def attaching(runtime, fx) -> Runtime:
    """A runtime whose operator declares ``desk`` attachable (a daemon's, restarted over the same
    store, is built the same way)."""
    return Runtime(
        runtime.access, runtime.kit.registry, clock=runtime.kit.clock, attachable_mcp=desk(fx)
    )


async def start(runtime, agent, labels=None) -> str:
    await runtime.definitions.register_agent(agent)
    run_id = str(uuid.uuid4())
    head = RunStarted(agent_def_hash=agent.agent_def_hash, input="the task", labels=labels)
    await runtime.starts.open_log(run_id, [head])
    return run_id


def tool_calls(log) -> list[str]:
    return [e.event.tool for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]


async def waiting(runtime, providers, make_agent, *then):
    provider = providers([tool_use("ask_user", QUESTION), *then])
    agent = with_flows(make_agent(provider), flow_tools=["ask_user"])
    run_id = await start(runtime, agent)
    assert (await runtime.drive(run_id, agent=agent)).state is RunState.SUSPENDED
    return run_id, agent, provider


async def test_an_attached_server_is_listed_through_the_log_offered_and_called(
    attaching, providers, make_agent, fx
):
    run_id, agent, provider = await waiting(
        attaching, providers, make_agent, tool_use("lookup", {"key": "INV-7"}), text_reply("ok")
    )
    attached = await attaching.tools.attach(run_id, [], ["desk"])
    assert attached == {"run_id": run_id, "tools": ["mcp:desk"], "runs": [run_id], "busy": []}
    log = await attaching.reads.log(run_id)
    # The name only: no URL, command or header of the server is in the log.
    assert log[-1].event == ToolsAttached(tools=["mcp:desk"], by="operator")
    assert fx.starts == []  # nothing is spawned until a drive needs it

    await attaching.control.resume(run_id, {"answer": "INV-7"})
    view = await attaching.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "ok"}
    assert offered_tools(provider.calls[0]) == ["ask_user"]
    assert offered_tools(provider.calls[1]) == [*DESK_TOOLS, "ask_user"]
    assert tool_results(provider.calls[2])[-1]["content"] == "value of INV-7"
    assert [c["arguments"] for c in fx.calls_of("lookup")] == [{"key": "INV-7"}]
    log = await attaching.reads.log(run_id)
    # The listing is a recorded read made before the first call that offers its tools.
    assert tool_calls(log) == ["ask_user", "mcp:desk/tools/list", "lookup"]

    # A restarted daemon replays the whole run without reaching the server again.
    again = Runtime(
        attaching.access, attaching.kit.registry, clock=attaching.kit.clock, attachable_mcp={}
    )
    assert (await again.drive(run_id, agent=agent)).state is RunState.COMPLETED
    assert len(fx.starts) == 1


async def test_a_child_started_after_the_attachment_inherits_the_server(
    attaching, providers, make_agent, fx
):
    child_provider = providers([tool_use("lookup", {"key": "INV-8"}), text_reply("child done")])
    helper = parse_definition(
        'name = "helper"\n' + agent_toml(child_provider.base_url),
        "toml",
        known_tools=attaching.kit.registry.names(),
    )
    await attaching.definitions.register_agent(helper)
    call = {"agent": "helper", "task": "look INV-8 up"}
    provider = providers(
        [tool_use("ask_user", QUESTION), tool_use("subagent", call), text_reply("parent done")]
    )
    parent = with_flows(make_agent(provider), flow_tools=["ask_user", "subagent"])
    run_id = await start(attaching, parent)
    await attaching.drive(run_id, agent=parent)
    await attaching.tools.attach(run_id, [], ["desk"])
    await attaching.control.resume(run_id, {"answer": "INV-8"})
    view = await attaching.drive(run_id, agent=parent)
    assert view.status() == {"state": "completed", "output": "parent done"}

    (intent,) = [
        e for e in await attaching.reads.log(run_id) if getattr(e.event, "tool", None) == "subagent"
    ]
    child = child_run_id(run_id, intent.seq)
    assert (await attaching.reads.view(child)).labels == {
        PARENT_LABEL: run_id,
        TOOLS_LABEL: "mcp:desk",
    }
    assert offered_tools(child_provider.calls[0]) == DESK_TOOLS
    assert tool_calls(await attaching.reads.log(child)) == ["mcp:desk/tools/list", "lookup"]
    assert [c["arguments"] for c in fx.calls_of("lookup")] == [{"key": "INV-8"}]


async def test_a_graphs_agent_node_and_a_fork_see_the_attached_server(
    attaching, providers, make_agent, fx
):
    def script(call):
        if tool_results(call):
            return text_reply("looked")
        return tool_use("lookup", {"key": "INV-7"})

    provider = providers(script)
    agent = make_agent(provider)
    await attaching.definitions.register_agent(agent)
    graph = await gated_graph(attaching, agent.agent_def_hash)
    run_id = await attaching.starts.start_graph_run(graph, ["INV-7", "INV-8"])
    assert (await attaching.drive(run_id)).state is RunState.SUSPENDED  # at the gate

    await attaching.tools.attach(run_id, [], ["desk"])
    await attaching.control.resume(run_id, {"approved": True})
    view = await attaching.drive(run_id)
    assert view.state is RunState.COMPLETED, view.detail
    # The agent node and both map items were offered the server's tools and called one.
    assert [offered_tools(call) for call in provider.calls] == [DESK_TOOLS] * 6
    assert len(fx.calls_of("lookup")) == 3

    fork_id, _ = await attaching.forks.fork(await attaching.forks.plan_fork(run_id, "look"))
    assert "ToolsAttached" in kinds(await attaching.reads.log(fork_id))
    assert (await attaching.drive(fork_id)).state is RunState.COMPLETED
    assert [offered_tools(call) for call in provider.calls[6:]] == [DESK_TOOLS] * 6


@pytest.mark.parametrize(
    ("tools", "servers", "code"),
    [
        ([], ["nowhere"], "unknown_mcp_server"),
        (["lookup_invoice"], ["desk", "nowhere"], "unknown_mcp_server"),
        (["mcp:nowhere"], [], "unknown_mcp_server"),
    ],
)
async def test_an_undeclared_server_is_refused_with_nothing_recorded(
    attaching, providers, make_agent, tools, servers, code
):
    run_id, _, _ = await waiting(attaching, providers, make_agent)
    before = await attaching.reads.log(run_id)
    with pytest.raises(OperationRefused) as refused:
        await attaching.tools.attach(run_id, tools, servers)
    assert refused.value.code == code
    assert "declares no attachable MCP server 'nowhere'" in refused.value.message
    assert await attaching.reads.log(run_id) == before


async def test_a_server_the_operator_withdrew_fails_the_run_in_one_sentence(
    attaching, providers, make_agent, fx
):
    run_id, agent, provider = await waiting(attaching, providers, make_agent, text_reply("x"))
    await attaching.tools.attach(run_id, [], ["desk"])
    # The daemon restarted with an --attachable-mcp file that no longer has `desk`.
    withdrawn = Runtime(
        attaching.access, attaching.kit.registry, clock=attaching.kit.clock, attachable_mcp={}
    )
    await withdrawn.control.resume(run_id, {"answer": "INV-7"})
    view = await withdrawn.drive(run_id, agent=agent)
    assert view.state is RunState.FAILED
    assert "the MCP server 'desk' attached to this run is no longer among" in view.detail["error"]
    assert len(provider.calls) == 1 and fx.starts == []


async def test_an_agents_attach_tool_attaches_a_declared_server_on_the_allow_list(
    attaching, providers, make_agent, fx
):
    async def edit_mode_on() -> bool:
        return True

    attaching.kit.flows.edit_mode = edit_mode_on
    attaching.kit.flows.attachable = frozenset({"mcp:desk"})
    provider = providers(
        [
            tool_use("attach_tool", {"tools": ["mcp:desk"]}),
            tool_use("lookup", {"key": "INV-9"}),
            text_reply("found it"),
        ]
    )
    agent = with_flows(make_agent(provider), flow_tools=["attach_tool"])
    run_id = await start(attaching, agent)
    view = await attaching.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "found it"}
    assert offered_tools(provider.calls[1]) == [*DESK_TOOLS, "attach_tool"]
    assert len(fx.calls_of("lookup")) == 1


async def test_an_attached_servers_open_write_is_probed_on_recovery(
    attaching, providers, make_agent, fx
):
    """The write reached the server (its ledger has it) and the drive stopped before its
    completion: the restarted daemon lists the run among those it drives again and the drive
    probes the write with the server's declared read, finding it landed, so the write is recorded
    once, settled by the probe, and never sent again."""
    note = {"text": "INV-7", "hold": fx.hold("w")}
    run_id, agent, provider = await waiting(
        attaching, providers, make_agent, tool_use("write_note", note), text_reply("noted")
    )
    await attaching.tools.attach(run_id, [], ["desk"])
    await attaching.control.resume(run_id, {"answer": "INV-7"})
    # Drive until the server has the write, then stop the drive there (its intent stays open).
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(attaching.drive, run_id, agent=agent))
        with trio.fail_after(10):
            while not fx.calls_of("write_note"):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    fx.release("w")
    assert (await attaching.reads.view(run_id)).state is RunState.NEEDS_RECONCILIATION

    restarted = Runtime(
        attaching.access, attaching.kit.registry, clock=attaching.kit.clock, attachable_mcp=desk(fx)
    )
    assert run_id in await restarted.reads.interrupted_runs()
    view = await restarted.drive(run_id, agent=agent)
    assert view.status() == {"state": "completed", "output": "noted"}
    assert len(fx.calls_of("write_note")) == 1
    assert [c["arguments"] for c in fx.calls_of("find_note")] == [{"text": "INV-7"}]
    _, done = note_call(await restarted.reads.log(run_id))
    assert done.settled_by == "probe"
    assert len(provider.calls) == 3


async def test_a_graph_nodes_attached_write_is_probed_on_recovery(
    attaching, providers, make_agent, fx
):
    """The same in a graph run: its agent node wrote through the attached server and the drive
    stopped before the completion; the restarted daemon's recovery probes the write."""
    note = {"text": "INV-9", "hold": fx.hold("w")}

    def script(call):
        return text_reply("noted") if tool_results(call) else tool_use("write_note", note)

    agent = make_agent(providers(script))
    await attaching.definitions.register_agent(agent)
    graph = await gated_graph(attaching, agent.agent_def_hash)
    run_id = await attaching.starts.start_graph_run(graph, [])
    await attaching.drive(run_id)
    await attaching.tools.attach(run_id, [], ["desk"])
    await attaching.control.resume(run_id, {"approved": True})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(attaching.drive, run_id)
        with trio.fail_after(10):
            while not fx.calls_of("write_note"):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    fx.release("w")
    assert (await attaching.reads.view(run_id)).state is RunState.NEEDS_RECONCILIATION

    restarted = Runtime(
        attaching.access, attaching.kit.registry, clock=attaching.kit.clock, attachable_mcp=desk(fx)
    )
    assert run_id in await restarted.reads.interrupted_runs()
    view = await restarted.drive(run_id)
    assert view.state is RunState.COMPLETED, view.detail
    assert len(fx.calls_of("write_note")) == 1
    _, done = note_call(await restarted.reads.log(run_id))
    assert done.settled_by == "probe"
