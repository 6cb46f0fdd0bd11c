"""Kill safety of a comparing run of a flow with pinned agent nodes.

A real `salvor serve` runs the flow over a link once to record its baselines, then again to
compare, and is SIGKILLed right after the compare's first commit past its head: the first pinned
node's calls, answered from its baseline, and the read tool node's open intent. The next
`salvor serve` finishes the run from its log and the files kept with it, the client gone: the
first node's calls answered from the log, the second's from its baseline, and still not one call
reaches the provider.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log
from tests.daemon.cli.test_flow_pinned import echo, project_with
from tests.daemon.cli.test_flow_pinned_remote import run_remote
from tests.support.daemon_apart import daemon_apart
from tests.support.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.kill

FLOW = """\
schema_version: 1
nodes:
  - {id: first, kind: agent, agent_file: ../../agents/echo.toml, pinned: true}
  - {id: look, kind: tool, tool: lookup_invoice, input: {invoice_id: inv_1}}
  - {id: second, kind: agent, agent_file: ../../agents/echo.toml, pinned: true, input: $nodes.first}
edges:
  - {from: first, to: look}
  - {from: look, to: second}
"""


def test_a_compare_killed_mid_run_finishes_after_a_restart_with_no_provider_call(
    tmp_path: Path, store_url: str
) -> None:
    with ScriptedProvider(echo) as provider:
        _compare_killed_and_restarted(tmp_path, store_url, provider)


def _compare_killed_and_restarted(tmp_path: Path, store_url: str, provider) -> None:
    project = project_with(tmp_path, provider.base_url)
    (project / ".salvor" / "flows" / "main.yaml").write_text(FLOW)
    daemon = daemon_apart(tmp_path, store_url, provider)
    daemon.start()
    try:
        updated = run_remote(project, daemon, "--update-baselines")
        assert updated.returncode == 0, updated.stdout + updated.stderr
        recorded = len(provider.calls)
        assert recorded == 2
        daemon.kill()

        # Seq 1 is in the compare's first batch after its head: killed once it is durable.
        daemon.env["SALVOR_FAULT_KILL_AFTER_SEQ"] = "1"
        daemon.start()
        cut = run_remote(project, daemon)
        assert cut.returncode == 1, cut.stdout + cut.stderr
        run_id = cut.stdout.splitlines()[0]
        assert "may have run" in cut.stderr
        deadline = time.monotonic() + SETTLE_SECONDS
        while daemon.alive():
            assert time.monotonic() < deadline, "the fault did not kill the daemon"
            time.sleep(0.05)
        cut_log = stored_log(store_url, run_id)
        assert EventKind.RUN_COMPLETED not in [envelope.kind for envelope in cut_log]

        del daemon.env["SALVOR_FAULT_KILL_AFTER_SEQ"]
        daemon.start()
        with daemon.client(timeout=SETTLE_SECONDS) as http:

            def status() -> dict:
                return http.get(f"/v1/runs/{run_id}").json()["status"]

            while status()["state"] != "completed":
                assert time.monotonic() < deadline + SETTLE_SECONDS, status()
                time.sleep(0.05)
            assert status()["output"] == {"second": "hello"}
    finally:
        daemon.kill()
    assert len(provider.calls) == recorded, "a call of the comparing run reached the provider"
    log = stored_log(store_url, run_id)
    assert [envelope.seq for envelope in log] == list(range(len(log)))
    assert log[: len(cut_log)] == cut_log
    answered = [e.event for e in log if e.kind is EventKind.MODEL_CALL_COMPLETED]
    assert len(answered) == 2 and all(event.baseline for event in answered)
    entered = [e.event.node for e in log if e.kind is EventKind.NODE_ENTERED]
    assert entered == ["first", "look", "second"]
