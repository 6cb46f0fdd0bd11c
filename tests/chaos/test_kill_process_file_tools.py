"""Kill safety of a process agent's file tools: a real `salvor serve --workspace DIR`, SIGKILLed
inside an ``edit`` the agent (the ``mcp`` SDK stand-in script) made through the ``salvor`` MCP
server, right after the file changed and before the call's completion was recorded.

The next daemon re-drives the run: the process is started again and answered from its log up to
the open call, which is a write its lane has no probe for, so the run waits for a person in
needs_reconciliation and the edit is not made again: the line it appends is there once.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, wait_state
from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.files.test_process_file_tools import _process_agent
from tests.daemon.proxies.test_salvor_server import steps_script
from tests.support.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.kill

APPEND = {"path": "notes/log.md", "old_text": "day 1\n", "new_text": "day 1\nday 2\n"}


def test_a_process_agents_edit_cut_after_its_effect_waits_for_a_person_and_lands_once(
    tmp_path: Path, store_url: str
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "notes").mkdir(parents=True)
    (workspace / "notes" / "log.md").write_text("day 1\n")
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    with ScriptedProvider(steps_script(lambda _: ("edit", APPEND), lambda _: "done")) as provider:
        daemon.args += ["--workspace", str(workspace)]
        daemon.env.update(
            SALVOR_MODEL_BASE_URL=provider.base_url,
            SALVOR_AGENT_UPSTREAM=provider.base_url,
            SALVOR_AGENT_KEY=SECRET,
            SALVOR_FAULT_KILL_IN_TOOL="edit",
        )
        try:
            daemon.start()
            with daemon.client(timeout=30) as client:
                registered = client.post(
                    "/v1/agents",
                    content=_process_agent(tmp_path, ["edit"]),
                    headers={"Content-Type": "application/toml"},
                )
                assert registered.status_code == 201, registered.text
                started = client.post(
                    "/v1/runs", json={"agent": registered.json()["agent"], "input": "append"}
                )
                assert started.status_code == 201, started.text
                run_id = started.json()["run"]
                assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
                assert (workspace / "notes" / "log.md").read_text() == "day 1\nday 2\n"

                del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
                daemon.start()
                wait_state(client, run_id, "needs_reconciliation")
        finally:
            if daemon.alive():
                daemon.kill()
    assert (workspace / "notes" / "log.md").read_text() == "day 1\nday 2\n"
    log = stored_log(store_url, run_id)
    edits = [
        e for e in log if e.kind == "ToolCallRequested" and e.event.input.get("name") == "edit"
    ]
    assert len(edits) == 1 and edits[0].event.effect == "write"
    # Still open: a person records what the edit did; nothing answered it by itself.
    assert not [e for e in log if e.kind == "ToolCallCompleted" and e.event.seq == edits[0].seq]
