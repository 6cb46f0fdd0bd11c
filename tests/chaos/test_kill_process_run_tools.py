"""Kill safety of a keyed registry write attached at run time to a process agent's run: a real
`salvor serve` with ``--allow-process-agents`` and the demo tools, SIGKILLed twice, the agent the
stand-in suite's ``mcp`` SDK script on the ``salvor`` MCP server.

The daemon dies as the run's head is durable, so the run rests never driven; the operator
attaches ``issue_refund`` over the store (``salvor tools attach``). The next daemon recovers the
run, the agent refunds through the ``salvor`` lane, and the daemon dies inside the refund after
the bank answered (``SALVOR_FAULT_KILL_IN_TOOL``). The daemon after that probes the open write
with ``lookup_refund`` and settles it: refunded once, never sent again.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
from salvor.daemon.tools import call_identity
from salvor.protocol import EventKind

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, wait_state
from tests.chaos.test_kill_process_attached_mcp import only_run
from tests.chaos.test_kill_run_tools import IN_TOOL_VAR
from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.proxies.test_salvor_server import salvor_agent, steps_script
from tests.support.runtime import ledger
from tests.support.scripted_provider import ScriptedProvider
from tests.support.spawn import run_salvor

pytestmark = pytest.mark.kill


def test_a_process_runs_relayed_refund_killed_mid_call_is_settled_by_its_probe(
    tmp_path: Path, store_url: str
) -> None:
    """A process agent (the ``mcp`` SDK script on the ``salvor`` MCP server) refunds through the
    relayed ``issue_refund`` the operator attached over the store; the daemon dies inside the
    refund after the bank answered. The next daemon recovers the run, the agent's replay reaches
    the open write and the lane settles it with ``lookup_refund``: refunded once, never sent
    again, under the identity a built-in agent's call of it claims."""
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    refund = {"invoice_id": "INV-7", "amount_cents": 1200}
    script = steps_script(lambda _: ("issue_refund", refund), lambda r: f"refunded: {r[0]}")
    with ScriptedProvider(script) as provider:
        daemon.allow_process_agents()
        # The daemon dies as the run's head is durable, so the run rests never driven.
        daemon.env.update(
            SALVOR_AGENT_UPSTREAM=provider.base_url,
            SALVOR_AGENT_KEY=SECRET,
            SALVOR_FAULT_KILL_AFTER_SEQ="0",
        )
        try:
            daemon.start()
            with daemon.client(timeout=30) as client:
                registered = client.post(
                    "/v1/agents",
                    content=salvor_agent(tmp_path).stored_text,
                    headers={"Content-Type": "application/toml"},
                )
                assert registered.status_code == 201, registered.text
                try:
                    client.post(
                        "/v1/runs", json={"agent": registered.json()["agent"], "input": "x"}
                    )
                except httpx.HTTPError:
                    pass  # the daemon died before it answered
            assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
            del daemon.env["SALVOR_FAULT_KILL_AFTER_SEQ"]
            run_id = only_run(store_url)
            attached = run_salvor(
                ["tools", "attach", run_id, "issue_refund", "--store", store_url],
                capture_output=True,
                timeout=60,
            )
            assert attached.returncode == 0, attached.stderr

            # The bank refunds and answers; the daemon dies before the completion is recorded.
            daemon.env[IN_TOOL_VAR] = "issue_refund"
            daemon.start()
            assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
            del daemon.env[IN_TOOL_VAR]
            daemon.start()
            with daemon.client(timeout=30) as client:
                body = wait_state(client, run_id, "completed")
        finally:
            daemon.kill()

    assert [e["tool"] for e in ledger(effects) if e["tool"].startswith("issue_refund")] == [
        "issue_refund:sent",
        "issue_refund",
    ]
    (landed,) = [e["refund"] for e in ledger(effects) if e["tool"] == "issue_refund"]
    log = stored_log(store_url, run_id)
    (intent,) = [
        e
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED
        and e.event.input.get("name") == "issue_refund"
    ]
    assert intent.event.tool == "mcp:salvor/tools/call" and intent.event.effect == "write"
    assert intent.event.idempotency_key == call_identity("issue_refund", ["invoice_id"], refund)
    (done,) = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    assert done.settled_by == "probe"
    assert json.loads(done.output["result"]["content"][0]["text"]) == landed
    assert json.loads(body["status"]["output"]["reply"].removeprefix("refunded: ")) == landed
