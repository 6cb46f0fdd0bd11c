"""Kill safety of a baseline one step of a call captured and a later step reads: what the later
snapshot compares with is read from the call's logs, not held in the daemon's memory.

A flow sent over a link compares its baselines, but its nested run ``main`` updates its own and
captures ``__baselines__/main/given.json``; the flow's own snapshot ``check`` (its baselines
share that directory) comes after an agent node, and the client sent no such file. A real
`salvor serve` is SIGKILLed while that agent's model call is open, and the next one, with the
client gone, finishes the flow: ``check`` reads the capture from the stored logs and passes, the
nested run ran once, and every log is whole.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.daemon.graphs import flow_child_id
from salvor.protocol import EventKind, call_body

from tests.chaos.test_kill_graph_run import stored_log
from tests.chaos.test_kill_nested_flow import HOLD_SECONDS, _wait_completed
from tests.daemon.cli.test_flow_remote import _agent, _echo
from tests.support.daemon_apart import daemon_apart
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

pytestmark = pytest.mark.kill

MAIN = """\
schema_version: 1
nodes:
  - {id: main, kind: flow, flow: inner, input: $input, update_baselines: true}
  - {id: answer, kind: agent, agent_file: ../../agents/echo.toml, input: $input}
  - {id: check, kind: snapshot, name: given, of: $input}
edges:
  - {from: main, to: answer}
  - {from: answer, to: check}
"""

INNER = """\
schema_version: 1
nodes:
  - {id: given, kind: snapshot, name: given, of: $input}
edges: []
"""


def _project(tmp_path: Path, base_url: str) -> Path:
    flows = tmp_path / "proj" / ".salvor" / "flows"
    flows.mkdir(parents=True)
    (tmp_path / "proj" / "agents" / "prompts").mkdir(parents=True)
    (tmp_path / "proj" / "agents" / "echo.toml").write_text(_agent(base_url))
    (tmp_path / "proj" / "agents" / "prompts" / "echo.txt").write_text("You echo.")
    (flows / "main.yaml").write_text(MAIN)
    (flows / "inner.yaml").write_text(INNER)
    return flows / "main.yaml"


def test_a_capture_read_by_a_later_step_survives_a_sigkilled_daemon(
    tmp_path: Path, store_url: str
) -> None:
    seen, release = threading.Event(), threading.Event()

    def hold_first(call: ProviderCall) -> None:
        if call.index == 0:
            seen.set()
            release.wait(HOLD_SECONDS)

    with ScriptedProvider(_echo, on_call=hold_first) as provider:
        flow = _project(tmp_path, provider.base_url)
        files = collect_flow(str(flow))
        given = f"{Path(flow).resolve().parent}/__baselines__/main/given.json"
        assert files.bundle.members[given].state == "missing"
        body = {**call_body(files.bundle, dict(files.contents)), "input": "tide"}
        daemon = daemon_apart(tmp_path, store_url, provider)
        try:
            daemon.start()
            with daemon.client(timeout=HOLD_SECONDS) as client:
                started = client.post("/v1/graph-runs", json=body)
            assert started.status_code == 201, started.text
            run_id = started.json()["run"]
            assert seen.wait(HOLD_SECONDS), "the agent's model call never came"
            daemon.kill()  # SIGKILL: the capture is in the store, the read not yet made
            release.set()
            daemon.start()
            _wait_completed(store_url, run_id)
        finally:
            release.set()
            if daemon.proc is not None:
                daemon.kill()
    parent = stored_log(store_url, run_id)
    child = stored_log(store_url, flow_child_id(run_id, "main"))
    exits = {e.event.node: e.event.output for e in parent if e.kind == EventKind.NODE_EXITED}
    assert exits["check"] == "tide"  # compared with the capture: equal, so the value
    assert parent[-1].kind == EventKind.RUN_COMPLETED
    assert parent[-1].event.output == {"check": "tide"}
    kinds = [e.kind for e in parent]
    assert kinds.count(EventKind.NODE_ENTERED) == kinds.count(EventKind.NODE_EXITED) == 3
    assert [e.kind for e in child].count(EventKind.GRAPH_RUN_STARTED) == 1
    captured = [e.event.output for e in child if e.kind == EventKind.NODE_EXITED]
    assert captured == [
        {"baseline": "captured", "path": given, "value": "tide", "client": "writes"}
    ]
    # The cut call was issued once more; nothing else was.
    assert len(provider.calls) == 2
