"""Kill safety of tools attached at run time: a real `salvor serve`, SIGKILLed and restarted.

An agent waits on a question; the operator attaches a registry tool to its run; the daemon is
killed while the run waits. After the restart the attachment is still there (read back from the
log, never from the dead process's memory), and once the question is answered the agent's next
model call is offered the tool and calls it, performed once. An attached write with a probe,
killed between its intent and its completion, is probed when the restarted daemon recovers the
run, exactly as a write its definition declares: one that landed is settled by the probe and the
run goes on; one whose outcome the probe cannot tell (the bank was sent it, no answer recorded)
parks the run for a person. Either way it is never performed again.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_flow_tools import register, start_run
from tests.chaos.test_kill_graph_run import stored_log, wait_state
from tests.chaos.test_kill_serve import Daemon
from tests.support.flows import tool_results, tool_use
from tests.support.runtime import ledger
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, text_reply

pytestmark = pytest.mark.kill

QUESTION = {"question": "Which invoice?", "type": "input"}
IN_TOOL_VAR = "SALVOR_FAULT_KILL_IN_TOOL"


def asks_then(tool: str, tool_input_of):
    """A script: ask which invoice; then call ``tool`` with ``tool_input_of(answer)``; then
    answer with that call's result."""

    def script(call: ProviderCall):
        results = tool_results(call)
        if not results:
            return tool_use("ask_user", QUESTION)
        if len(results) == 1:
            answer = json.loads(results[0]["content"])["answer"]
            return tool_use(tool, tool_input_of(answer), use_id="toolu_1")
        return text_reply(results[-1]["content"])

    return script


def offered(call: ProviderCall) -> list[str]:
    return [tool["name"] for tool in call.request.get("tools") or []]


def attach(client: httpx.Client, run_id: str, tool: str) -> None:
    response = client.post(f"/v1/runs/{run_id}/tools", json={"tools": [tool]})
    assert response.status_code == 200, response.text
    assert response.json()["tools"] == [tool]


def test_an_attachment_survives_a_kill_and_its_tool_is_called_once(
    tmp_path: Path, store_url: str
) -> None:
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    with ScriptedProvider(asks_then("lookup_invoice", lambda a: {"invoice_id": a})) as provider:
        daemon.args += ["--model-endpoint", provider.base_url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, 'flow_tools = ["ask_user"]')
            run_id = start_run(client, agent, "what does INV-7 owe?")
            waiting = wait_state(client, run_id, "suspended")
            attach(client, run_id, "lookup_invoice")

            daemon.kill()
            daemon.start()
            assert client.get(f"/v1/runs/{run_id}").json()["status"] == waiting["status"]
            resumed = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": "INV-7"}})
            assert resumed.status_code == 202, resumed.text
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()
        calls = list(provider.calls)

    assert json.loads(body["status"]["output"])["invoice_id"] == "INV-7"
    assert offered(calls[0]) == ["ask_user"]
    assert offered(calls[1]) == ["lookup_invoice", "ask_user"]
    assert [e["input"] for e in ledger(effects) if e["tool"] == "lookup_invoice"] == [
        {"invoice_id": "INV-7"}
    ]
    log = stored_log(store_url, run_id)
    assert [e.event.KIND for e in log].count(EventKind.TOOLS_ATTACHED) == 1
    assert [e.event.tool for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED] == [
        "ask_user",
        "lookup_invoice",
    ]


@pytest.mark.parametrize(
    ("fault", "rests", "settled_by"),
    [("issue_refund", "completed", "probe"), ("issue_refund:sent", "needs_reconciliation", None)],
    ids=["landed", "outcome-unknown"],
)
def test_an_attached_write_killed_mid_call_is_probed_on_restart_and_never_sent_again(
    tmp_path: Path, store_url: str, fault: str, rests: str, settled_by: str | None
) -> None:
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    refund = {"invoice_id": "INV-7", "amount_cents": 1200}
    with ScriptedProvider(asks_then("issue_refund", lambda a: refund)) as provider:
        daemon.args += ["--model-endpoint", provider.base_url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, 'flow_tools = ["ask_user"]')
            run_id = start_run(client, agent, "refund INV-7")
            wait_state(client, run_id, "suspended")
            attach(client, run_id, "issue_refund")

            # The refund is sent (and, landed, answered), then the daemon dies before its
            # completion is recorded.
            daemon.kill()
            daemon.env[IN_TOOL_VAR] = fault
            daemon.start()
            client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": "yes"}})
            daemon.proc.wait(timeout=30)
            del daemon.env[IN_TOOL_VAR]
            daemon.start()
            body = wait_state(client, run_id, rests)
            client.close()
        finally:
            daemon.kill()

    sent = [e for e in ledger(effects) if e["tool"] == "issue_refund:sent"]
    assert len(sent) == 1
    log = stored_log(store_url, run_id)
    requested = [e for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
    assert [e.event.tool for e in requested] == ["ask_user", "issue_refund"]
    assert requested[-1].event.effect == "write"
    completed = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == requested[-1].seq
    ]
    if settled_by is None:
        assert body["pending"]["tool"] == "issue_refund" and completed == []
    else:
        (done,) = completed
        assert done.settled_by == settled_by
        assert done.output["invoice_id"] == "INV-7"
