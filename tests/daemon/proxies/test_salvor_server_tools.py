"""Tools attached at run time, seen by a process agent through the ``salvor`` MCP server: the
real ``mcp`` SDK client lists them (after the flow tools) at its next drive, its model calls one,
and the call goes through the ``salvor`` lane, recorded and performed once; a process child
started after the attachment lists it too. An agent's ``attach_tool`` outside the operator's
allow-list is an MCP tool error, nothing attached. (A keyed write's relayed call and its identity
across runs: ``test_salvor_server_keyed_tools``.)
"""

from __future__ import annotations

import json

from salvor.daemon.flows import TOOLS_LABEL

from tests.daemon.proxies.test_salvor_server import lane, salvor_agent, steps_script, tool_results
from tests.support.backends import SQLITE_ONLY
from tests.support.runtime import ledger

# SQLite alone (tests/support/backends.py): what it tests is the salvor server's listing; the log's
# side of an attachment runs on both backends (tests/daemon/agents/test_run_tools.py).
STORE_BACKENDS = SQLITE_ONLY

LOOKUP = {"invoice_id": "INV-7"}


def listed(call) -> list[str]:
    return [tool["name"] for tool in call.request.get("tools") or []]


async def test_a_process_run_lists_an_attached_tool_and_calls_it_through_the_lane(
    runtime, providers, upstream_env, tmp_path, effects_path
):
    provider = providers(
        steps_script(
            lambda _: ("lookup_invoice", LOOKUP),
            lambda results: "owed " + str(json.loads(results[0])["amount_cents"]),
        )
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    run_id = await runtime.starts.start_run(agent, "what does INV-7 owe?")
    await runtime.tools.attach(run_id, ["lookup_invoice"])
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    assert listed(provider.calls[0]) == ["ask_user", "subagent", "finish", "flow_results"] + [
        "lookup_invoice"
    ]
    assert view.detail["output"]["reply"].startswith("owed ")
    assert [e["input"] for e in ledger(effects_path) if e["tool"] == "lookup_invoice"] == [LOOKUP]
    log = await runtime.reads.log(run_id)
    assert lane(log) == ["mcp:salvor/initialize", "mcp:salvor/tools/list", "call:lookup_invoice"]
    # Read as a plain call's answer would be: the invoice's record, as JSON text.
    assert json.loads(tool_results(provider.calls[1])[0])["invoice_id"] == "INV-7"


async def test_a_process_child_started_after_the_attachment_lists_it(
    runtime, providers, upstream_env, tmp_path
):
    provider = providers(steps_script(lambda _: "nothing to do"))
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    # What a child's head holds when its parent's tree had the tool attached (run_child and the
    # walk write it: tests/daemon/agents/test_run_tools.py).
    run_id = await runtime.starts.start_run(
        agent, "anything?", labels={TOOLS_LABEL: "lookup_invoice,no_such_tool"}
    )
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    # A name the registry lacks is not listed; the rest is.
    assert listed(provider.calls[0])[-1] == "lookup_invoice"
    assert "no_such_tool" not in listed(provider.calls[0])


async def test_an_attach_tool_outside_the_allow_list_is_a_tool_error(
    runtime, providers, upstream_env, tmp_path
):
    async def edit_mode_on() -> bool:
        return True

    runtime.kit.flows.edit_mode = edit_mode_on
    runtime.kit.flows.attachable = frozenset({"lookup_invoice"})
    provider = providers(
        steps_script(
            lambda _: ("attach_tool", {"tools": ["issue_refund"]}),
            lambda _: ("attach_tool", {"tools": ["lookup_invoice"]}),
            lambda results: "done",
        )
    )
    upstream_env(provider)
    agent = salvor_agent(tmp_path)
    run_id = await runtime.starts.start_run(agent, "get what you need")
    view = await runtime.drive(run_id, agent=agent)
    assert view.state.value == "completed", view.detail
    refused, accepted = tool_results(provider.calls[2])
    assert "does not allow agents to attach 'issue_refund'" in refused
    assert json.loads(accepted) == {"attached": ["lookup_invoice"]}
    assert "attach_tool" in listed(provider.calls[0])
