"""Abandoning a child over HTTP drives on the run that waits on it: a subagent's parent hears that
its child was abandoned (an error result) and goes on, with no resume by hand."""

from __future__ import annotations

import trio
from salvor.daemon.flows import child_run_id

from tests.support.api_server import agent_toml
from tests.support.backends import SQLITE_ONLY
from tests.support.flows import tool_use
from tests.support.scripted_provider import text_reply

# SQLite alone (tests/support/backends.py): what it tests is the route's next step, above the store.
STORE_BACKENDS = SQLITE_ONLY


async def test_an_abandoned_subagent_child_is_heard_by_its_parent_which_goes_on(server, providers):
    child_provider = providers([tool_use("request_approval", {"reason": "sign off?"})])
    await server.register_agent(
        agent_toml(child_provider.base_url, name="approver", tools=["request_approval"])
    )
    provider = providers(
        [tool_use("subagent", {"agent": "approver", "task": "t"}), text_reply("parent done")]
    )
    parent = await server.register_agent(
        agent_toml(provider.base_url, extra='flow_tools = ["subagent"]')
    )
    run_id = await server.start_run(parent, "go")
    child = child_run_id(run_id, 3)
    with trio.fail_after(30):  # the parent's drive starts its child
        while (await server.client.get(f"/v1/runs/{child}")).status_code == 404:
            await trio.sleep(0.01)
    assert (await server.wait_resting(child))["status"]["state"] == "suspended"

    response = await server.client.post(f"/v1/runs/{child}/abandon", json={"reason": "not now"})
    assert response.status_code == 200, response.text
    body = await server.wait_resting(run_id)
    assert body["status"] == {"state": "completed", "output": "parent done"}, body
    # The parent's model heard how its child ended.
    heard = provider.calls[1].request["messages"][-1]["content"][0]
    assert heard["type"] == "tool_result" and "abandoned" in str(heard["content"]), heard
    assert child_provider.call_count == 1
