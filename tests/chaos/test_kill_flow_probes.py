"""Kill safety of a keyed write made by an agent-file node of a flow run: the write's intent is
durable when its process dies, so the run rests parked on it (needs_reconciliation), and only
the recovery sweep's probe can settle it without a person.

``salvor graph run flow.yaml`` dies right after the refund's intent (nothing sent to the bank);
the project is deleted; a real `salvor serve` on the same store takes the run over, probes the
refund (not landed), sends it, and is SIGKILLed after the bank answered and before the answer is
recorded; the next `salvor serve` probes again, finds the refund landed and settles it from the
world. The sweep knows the node's agent only through the files kept with the run (the stored
graph names no agent for that node), exactly as the walk binds it. One refund in the world.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest
from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log
from tests.chaos.test_kill_nested_flow import _wait_completed
from tests.chaos.test_kill_serve import Daemon, agent_toml, step_reply
from tests.support.runtime import ledger
from tests.support.scripted_provider import ProviderCall, ScriptedProvider
from tests.support.spawn import salvor_process

pytestmark = pytest.mark.kill

FLOW = """\
schema_version: 1
nodes:
  - {id: refund, kind: agent, agent_file: ../../agents/refunder.toml}
edges: []
"""


def _script(call: ProviderCall):
    invoice = json.loads(call.request["messages"][0]["content"][0]["text"])["invoice_id"]
    steps = [["issue_refund", {"invoice_id": invoice, "amount_cents": 250}]]
    return step_reply(call, steps, final="refunded")


def _start_dying(daemon: Daemon) -> None:
    """Start ``daemon`` with a fault point armed, and wait for it to die there (before READY,
    when its first recovery reaches the point, or after)."""
    try:
        daemon.start()
    except AssertionError:
        assert daemon.proc is not None and daemon.proc.returncode == -signal.SIGKILL
    daemon.proc.wait(timeout=SETTLE_SECONDS)
    assert daemon.proc.returncode == -signal.SIGKILL, daemon.log()


def test_an_agent_file_nodes_open_refund_is_probed_by_recovery_and_performed_once(
    tmp_path: Path, store_url: str
) -> None:
    effects = tmp_path / "effects.jsonl"
    with ScriptedProvider(_script) as provider:
        project = tmp_path / "proj"
        flows = project / ".salvor" / "flows"
        flows.mkdir(parents=True)
        (project / "agents").mkdir()
        (project / "agents" / "refunder.toml").write_text(
            agent_toml(provider.base_url, name="refunder", tools=["issue_refund"])
        )
        (flows / "refund.yaml").write_text(FLOW)
        run_id = str(uuid.uuid4())
        env = {key: value for key, value in os.environ.items() if not key.startswith("SALVOR_")}
        env.update(
            SALVOR_STORE=store_url,
            SALVOR_DEMO_EFFECTS=str(effects),
            SALVOR_FAULT_KILL_IN_TOOL="issue_refund:before",
        )
        cli = salvor_process(
            ["graph", "run", str(flows / "refund.yaml"), "--run-id", run_id,
             "--input", '{"invoice_id": "inv-9"}'],
            env=env,
        )  # fmt: skip
        assert cli.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL
        assert ledger(effects) == []
        shutil.rmtree(project)  # from here on only the files kept with the run exist

        daemon = Daemon(tmp_path, store_url, effects)
        daemon.args += ["--model-endpoint", provider.base_url]
        try:
            # Its probe finds nothing landed, so it sends the refund, and dies before recording
            # the bank's answer: the intent is open again.
            daemon.env["SALVOR_FAULT_KILL_IN_TOOL"] = "issue_refund"
            _start_dying(daemon)
            del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
            daemon.start()
            _wait_completed(store_url, run_id)
        finally:
            if daemon.proc is not None:
                daemon.kill()

    (refund,) = [entry for entry in ledger(effects) if entry["tool"] == "issue_refund"]
    sent = [entry for entry in ledger(effects) if entry["tool"] == "issue_refund:sent"]
    assert len(sent) == 1, sent
    log = stored_log(store_url, run_id)
    assert log[0].event.flow is not None
    (completion,) = [e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    assert completion.settled_by == "probe" and completion.output == refund["refund"]
    with EventStore.open(store_url) as store:
        answer = store.claims.probe_answers([(run_id, refund["seq"])])[(run_id, refund["seq"])]
    assert (answer.tool, answer.verdict) == ("lookup_refund", "landed")
    assert log[-1].kind == EventKind.RUN_COMPLETED
