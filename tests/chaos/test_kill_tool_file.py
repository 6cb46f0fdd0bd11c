"""Kill safety of a tool file: a flow sent over a link whose tool node reads a file of the client's,
the daemon SIGKILLed inside that tool, the client and its project gone, and a restarted daemon
finishing the flow from the files kept with the run.

The call is ``POST /v1/graph-runs`` with the flow's members (the client then goes away); the
daemon dies in ``read_document`` after it opened its copy and before the call's completion is
recorded (``SALVOR_FAULT_KILL_IN_TOOL``). The read is open at recovery, so it runs again: from the
stored member, in a fresh temporary copy, with the client's path in the log all along; the copy the
killed daemon left is removed. The email after it goes out once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from salvor.daemon.cli._flow_collect import collect_flow
from salvor.protocol import EventKind, call_body

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log
from tests.chaos.test_kill_serve import Daemon
from tests.support.daemon_apart import daemon_apart
from tests.support.runtime import ledger

pytestmark = pytest.mark.kill

DOCUMENT = {"title": "tide tables", "rows": [1, 2, 3]}

FLOW = """\
schema_version: 1
nodes:
  - {{id: doc, kind: tool, tool: read_document, input: {{path: {path}}}}}
  - id: notify
    kind: tool
    tool: send_email
    input: {{to: ops@example.com, subject: read, body: $nodes.doc.json.title}}
edges:
  - {{from: doc, to: notify}}
"""


def _wait_exit(daemon: Daemon) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while daemon.alive():
        assert time.monotonic() < deadline, "the daemon did not die in the tool"
        time.sleep(0.05)
    daemon.proc.wait()


def test_a_tool_file_is_read_from_the_store_after_a_kill_with_the_client_gone(
    tmp_path: Path, store_url: str
) -> None:
    project = tmp_path / "proj"
    flows = project / ".salvor" / "flows"
    flows.mkdir(parents=True)
    document = project / "data" / "doc.json"
    document.parent.mkdir()
    document.write_text(json.dumps(DOCUMENT))
    (flows / "main.yaml").write_text(FLOW.format(path=json.dumps(str(document))))
    files = collect_flow(str(flows / "main.yaml"), file_inputs={"read_document": ["path"]})
    body = call_body(files.bundle, dict(files.contents))

    effects = tmp_path / "effects.jsonl"
    daemon = daemon_apart(tmp_path, store_url)
    daemon.env["SALVOR_FAULT_KILL_IN_TOOL"] = "read_document"
    try:
        daemon.start()
        with daemon.client(timeout=SETTLE_SECONDS) as client:
            started = client.post("/v1/graph-runs", json=body)
        assert started.status_code == 201, started.text
        run_id = started.json()["run"]
        _wait_exit(daemon)  # killed inside the tool, its completion never recorded
        shutil.rmtree(project)  # the client's files are gone: only the store has them
        del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
        daemon.start()
        deadline = time.monotonic() + SETTLE_SECONDS
        with daemon.client(timeout=SETTLE_SECONDS) as client:
            while (status := client.get(f"/v1/runs/{run_id}").json()["status"])["state"] not in (
                "completed",
                "failed",
            ):
                assert time.monotonic() < deadline, status
                time.sleep(0.1)
        assert status["state"] == "completed", status
    finally:
        if daemon.proc is not None:
            daemon.kill()
    log = stored_log(store_url, run_id)
    requested = [e for e in log if e.kind == EventKind.TOOL_CALL_REQUESTED]
    assert [(e.event.tool, e.event.input.get("path")) for e in requested] == [
        ("read_document", str(document)),
        ("send_email", None),
    ]
    doc_exit = next(e for e in log if e.kind == EventKind.NODE_EXITED and e.event.node == "doc")
    assert doc_exit.event.output["json"] == DOCUMENT
    reads = [entry for entry in ledger(effects) if entry["tool"] == "read_document"]
    assert len(reads) == 2  # the open read ran again after the kill, from a fresh copy
    assert len({entry["opened"] for entry in reads}) == 2
    assert all(entry["opened"] != str(document) for entry in reads)
    # The killed daemon's copy was left behind; the restarted one removed it at its first handing.
    assert not os.path.exists(os.path.dirname(reads[0]["opened"]))
    emails = [entry for entry in ledger(effects) if entry["tool"] == "send_email"]
    assert len(emails) == 1 and emails[0]["input"]["body"] == "tide tables"
