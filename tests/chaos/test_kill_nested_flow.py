"""Kill safety of a nested flow: a flow file whose ``flow`` node runs another flow of the project as
a child graph run, killed twice while the child is in flight.

``salvor graph run outer.yaml`` is SIGKILLed while the child's first model call is open; a real
`salvor serve` on the same store takes the orphaned runs over, and is SIGKILLed in turn while the
child's call after its refund is open; the next `salvor serve` finishes the flow from the files
kept with the run (the project is gone by then). The child runs once, under the id the walk
derives, and nothing is done twice: one refund in the ledger, one head, one entry and one exit of
the flow node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from salvor.daemon.graphs import flow_child_id
from salvor.protocol import EventKind, RunState
from salvor.store import EventStore

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log
from tests.chaos.test_kill_serve import Daemon, agent_toml, step_reply
from tests.support.runtime import ledger
from tests.support.scripted_provider import ProviderCall, ScriptedProvider
from tests.support.spawn import salvor_process

pytestmark = pytest.mark.kill

OUTER = """\
schema_version: 1
nodes:
  - {id: inner, kind: flow, flow: refund, input: {invoice_id: $input.invoice_id}}
  - id: notify
    kind: tool
    tool: send_email
    input: {to: ops@example.com, subject: refunded, body: $nodes.inner.refund}
edges:
  - {from: inner, to: notify}
"""

INNER = """\
schema_version: 1
nodes:
  - {id: refund, kind: agent, agent_file: ../../agents/refunder.toml}
edges: []
"""

# How long a held model call waits for the test to kill its caller, in seconds.
HOLD_SECONDS = 60.0


def _script(call: ProviderCall):
    invoice = json.loads(call.request["messages"][0]["content"][0]["text"])["invoice_id"]
    steps = [["issue_refund", {"invoice_id": invoice, "amount_cents": 250}]]
    return step_reply(call, steps, final="refunded")


class Holds:
    """Holds the provider's calls with the given indexes until the test lets them go."""

    def __init__(self, *indexes: int) -> None:
        self.seen = {index: threading.Event() for index in indexes}
        self.release = threading.Event()

    def __call__(self, call: ProviderCall) -> None:
        if call.index in self.seen:
            self.seen[call.index].set()
            self.release.wait(HOLD_SECONDS)

    def wait(self, index: int) -> None:
        assert self.seen[index].wait(HOLD_SECONDS), f"the provider never saw call {index}"


def _project(tmp_path: Path, base_url: str) -> Path:
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    (project / "agents").mkdir()
    (project / "agents" / "refunder.toml").write_text(
        agent_toml(base_url, name="refunder", tools=["issue_refund"])
    )
    (flows / "outer.yaml").write_text(OUTER)
    (flows / "refund.yaml").write_text(INNER)
    return project


def _wait_completed(store_url: str, run_id: str) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        with EventStore.open(store_url) as store:
            view = store.read_view(run_id)
        if view is not None and view.state is RunState.COMPLETED:
            return
        assert view is None or view.state is not RunState.FAILED, view.detail
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not complete within {SETTLE_SECONDS}s")


def test_a_nested_flow_killed_twice_runs_its_child_once(tmp_path: Path, store_url: str) -> None:
    holds = Holds(0, 2)
    effects = tmp_path / "effects.jsonl"
    with ScriptedProvider(_script, on_call=holds) as provider:
        project = _project(tmp_path, provider.base_url)
        run_id = str(uuid.uuid4())
        env = {key: value for key, value in os.environ.items() if not key.startswith("SALVOR_")}
        env.update(SALVOR_STORE=store_url, SALVOR_DEMO_EFFECTS=str(effects))
        cli = salvor_process(
            ["graph", "run", str(project / ".salvor/flows/outer.yaml"), "--run-id", run_id,
             "--input", '{"invoice_id": "inv-7"}'],
            env=env,
        )  # fmt: skip
        try:
            holds.wait(0)  # the child's first model call is open in the command
        finally:
            os.kill(cli.pid, signal.SIGKILL)
            cli.wait()
        shutil.rmtree(project)  # from here on only the files kept with the run exist
        daemon = Daemon(tmp_path, store_url, effects)
        daemon.args += ["--model-endpoint", provider.base_url]
        try:
            daemon.start()
            holds.wait(2)  # the child refunded and asks again: the daemon dies here
            daemon.kill()
            holds.release.set()
            daemon.start()
            _wait_completed(store_url, run_id)
        finally:
            holds.release.set()
            if daemon.proc is not None:
                daemon.kill()
    child = flow_child_id(run_id, "inner")
    parent, child_log = stored_log(store_url, run_id), stored_log(store_url, child)
    with EventStore.open(store_url) as store:
        children, _ = store.list_runs(label=("salvor.map_of", run_id), limit=10)
    assert [summary.run_id for summary in children] == [child]
    assert child_log[0].event.flow is not None and child_log[-1].kind == EventKind.RUN_COMPLETED
    kinds = [envelope.kind for envelope in parent]
    assert kinds.count(EventKind.NODE_ENTERED) == 2 and kinds.count(EventKind.NODE_EXITED) == 2
    assert parent[-1].event.output == {"notify": parent[-2].event.output}
    refunds = [entry for entry in ledger(effects) if entry["tool"] == "issue_refund"]
    assert len(refunds) == 1, refunds
    emails = [entry for entry in ledger(effects) if entry["tool"] == "send_email"]
    assert len(emails) == 1 and emails[0]["input"]["body"] == "refunded"
