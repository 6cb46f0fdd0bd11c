"""Kill safety of the file and shell tools: a real `salvor serve --workspace DIR --allow-bash`,
SIGKILLed at each instant of a ``write``, an ``edit`` that appends a line, and a ``bash`` that
appends a line to a counter file, then started again.

The instants: right after the call's intent is committed (``SALVOR_FAULT_KILL_AFTER_SEQ`` at the
intent's seq: nothing done), inside the tool right after its effect (``SALVOR_FAULT_KILL_IN_TOOL``:
done, not recorded), and right after its completion is committed (the seq of the completion).
A run of its own for each, one file each, so every file tells what happened to its call alone.

After the restart each write and edit has completed and its file holds its intended content
exactly once: an open one was probed, performed when the file still held what its plan found,
recorded as landed (and not written again) when it already held the intended bytes. A ``bash``
ran at most once: cut open it waits for a person in needs_reconciliation (its counter holds no
line when killed before the command, one when killed after), never run again by itself;
completed, it stays completed with its one line.
"""

from __future__ import annotations

import json
import secrets
import signal
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, wait_state
from tests.chaos.test_kill_serve import TOKEN_VAR, Daemon, plan_script
from tests.support.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.kill

INSTANTS = ("intent", "effect", "completion")
INTENDED = {"write": "written once\n", "edit": "day 1\nday 2\n"}


def _agent(base_url: str) -> str:
    return (
        'name = "clerk"\nmodel = "scripted"\nmax_response_tokens = 256\n'
        'access = { write = ["**"] }\n'
        '[[tools]]\nname = "write"\n[[tools]]\nname = "edit"\n[[tools]]\nname = "bash"\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
    )


def _call(tool: str, case: str) -> list:
    if tool == "write":
        return ["write", {"path": f"notes/{case}.md", "content": INTENDED["write"]}]
    if tool == "edit":
        edit = {"old_text": "day 1\n", "new_text": INTENDED["edit"]}
        return ["edit", {"path": f"notes/{case}.md", **edit}]
    return ["bash", {"command": f"echo ran >> counters/{case}.txt"}]


def _prepare(workspace: Path, tool: str, case: str) -> None:
    if tool == "edit":
        (workspace / "notes" / f"{case}.md").write_text("day 1\n")


def _start(client: httpx.Client, agent: str, tool: str, case: str) -> str:
    started = client.post("/v1/runs", json={"agent": agent, "input": {"plan": [_call(tool, case)]}})
    assert started.status_code == 201, started.text
    return started.json()["run"]


def _seqs(store_url: str, run_id: str, tool: str) -> dict[str, int]:
    """Where ``tool``'s call sits in a run's log: its intent's seq and its completion's."""
    log = stored_log(store_url, run_id)
    (intent,) = [e for e in log if e.kind == EventKind.TOOL_CALL_REQUESTED and e.event.tool == tool]
    return {"intent": intent.seq, "completion": intent.seq + 1}


def _fault(instant: str, tool: str, seqs: dict[str, int]) -> dict[str, str]:
    if instant == "effect":
        return {"SALVOR_FAULT_KILL_IN_TOOL": tool}
    return {"SALVOR_FAULT_KILL_AFTER_SEQ": str(seqs[instant])}


def _settled(client: httpx.Client, run_id: str, tool: str, instant: str) -> dict:
    waits = tool == "bash" and instant != "completion"
    return wait_state(client, run_id, "needs_reconciliation" if waits else "completed")


def test_write_edit_and_bash_killed_at_each_instant_land_once(
    tmp_path: Path, store_url: str
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "notes").mkdir(parents=True)
    (workspace / "counters").mkdir()
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    token = secrets.token_urlsafe(24)
    daemon.env[TOKEN_VAR] = token
    daemon.headers = {"Authorization": f"Bearer {token}"}
    with ScriptedProvider(plan_script) as provider:
        daemon.args += ["--workspace", str(workspace), "--allow-bash", "--auth-token", TOKEN_VAR,
                        "--model-endpoint", provider.base_url]  # fmt: skip
        daemon.start()
        try:
            with daemon.client(timeout=30) as client:
                registered = client.post(
                    "/v1/agents",
                    content=_agent(provider.base_url),
                    headers={"Content-Type": "application/toml"},
                )
                assert registered.status_code == 201, registered.text
                agent = registered.json()["agent"]
                # A run of each tool with no kill: where its call sits in the log.
                seqs = {}
                for tool in ("write", "edit", "bash"):
                    _prepare(workspace, tool, f"{tool}-plain")
                    run_id = _start(client, agent, tool, f"{tool}-plain")
                    wait_state(client, run_id, "completed")
                    seqs[tool] = _seqs(store_url, run_id, tool)
                runs = {}
                for tool in ("write", "edit", "bash"):
                    for instant in INSTANTS:
                        case = f"{tool}-{instant}"
                        _prepare(workspace, tool, case)
                        daemon.kill()
                        daemon.env.update(_fault(instant, tool, seqs[tool]))
                        daemon.start()
                        runs[case] = _start(client, agent, tool, case)
                        assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, (
                            daemon.log()
                        )
                        for name in ("SALVOR_FAULT_KILL_IN_TOOL", "SALVOR_FAULT_KILL_AFTER_SEQ"):
                            daemon.env.pop(name, None)
                        daemon.start()
                        _settled(client, runs[case], tool, instant)
        finally:
            if daemon.proc is not None:
                daemon.kill()

    for tool in ("write", "edit"):
        for instant in INSTANTS:
            case = f"{tool}-{instant}"
            assert (workspace / "notes" / f"{case}.md").read_text() == INTENDED[tool], case
            log = stored_log(store_url, runs[case])
            (done,) = [
                e.event
                for e in log
                if e.kind == EventKind.TOOL_CALL_COMPLETED and e.seq == seqs[tool]["completion"]
            ]
            # Cut after its effect, only the probe could have settled it without writing again.
            assert (done.settled_by == "probe") == (instant == "effect"), (case, done)
            assert json.loads(json.dumps(done.output))["path"] == f"notes/{case}.md"
    counted = {
        instant: (workspace / "counters" / f"bash-{instant}.txt").read_text().count("ran\n")
        if (workspace / "counters" / f"bash-{instant}.txt").exists()
        else 0
        for instant in INSTANTS
    }
    assert counted == {"intent": 0, "effect": 1, "completion": 1}
    assert (workspace / "counters" / "bash-plain.txt").read_text() == "ran\n"
