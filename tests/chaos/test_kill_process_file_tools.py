"""Kill safety of a process agent's file tools: a real `salvor serve --workspace DIR`, SIGKILLed
at each instant of a ``write`` and of an ``edit`` that appends a line, each made by a real
process agent (the ``mcp`` SDK stand-in script) through the ``salvor`` MCP server, then started
again.

The instants, as in ``test_kill_file_tools`` (the built-in agent's): right after the call's
intent is committed (nothing done), inside the tool right after its effect (done, not recorded),
and right after its completion is committed. A run of its own for each, one file each.

After the restart the daemon re-drives the run by itself: the process is started again and
answered from its log up to the open call, and while the agent waits on it the write is probed
by the plan its intent carries. Each run completes with no person's hand and each file holds its
intended content exactly once: cut after its effect, the probe finds the intended bytes and the
call is recorded as landed (``settled_by: "probe"``), not written again; cut before, the file
still holds what the plan found and the write is performed. Either way the agent is answered
exactly what the write answers when it performs. A file someone else changed meanwhile holds
neither, and its run waits for a person in needs_reconciliation, the file as they left it.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, task_of, wait_state
from tests.chaos.test_kill_serve import Daemon
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.files.test_process_file_tools import _process_agent
from tests.daemon.proxies.test_salvor_server import steps_script, tool_results
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

pytestmark = pytest.mark.kill

INSTANTS = ("intent", "effect", "completion")
TOOLS = ("write", "edit")
INTENDED = {"write": "written once\n", "edit": "day 1\nday 2\n"}
SALVOR_CALL = "mcp:salvor/tools/call"


def _call(case: str) -> tuple[str, dict]:
    """The one call the run named ``case`` (``<tool>-<instant>``) makes, on its own file."""
    tool, path = case.split("-")[0], f"notes/{case}.md"
    if tool == "write":
        return "write", {"path": path, "content": INTENDED["write"]}
    return "edit", {"path": path, "old_text": "day 1\n", "new_text": INTENDED["edit"]}


def _script(call: ProviderCall):
    case = task_of(call)
    return steps_script(lambda _: _call(case), lambda _: "done")(call)


def _answer(case: str) -> str:
    """What the agent is told its call returned: the write's own answer, as a performed write
    gives it (sorted JSON text)."""
    tool, tool_input = _call(case)
    answer = {"path": tool_input["path"], "bytes": len(INTENDED[tool].encode())}
    if tool == "edit":
        answer["replacements"] = 1
    return json.dumps(answer, sort_keys=True)


def _prepare(workspace: Path, case: str) -> None:
    if case.startswith("edit"):
        (workspace / "notes" / f"{case}.md").write_text("day 1\n")


def _start(client: httpx.Client, agent: str, case: str) -> str:
    started = client.post("/v1/runs", json={"agent": agent, "input": case})
    assert started.status_code == 201, started.text
    return started.json()["run"]


def _seqs(store_url: str, run_id: str) -> dict[str, int]:
    """Where the run's one file call sits in its log: its intent's seq and its completion's."""
    log = stored_log(store_url, run_id)
    (intent,) = [e for e in log if _is_file_call(e)]
    (completion,) = [
        e for e in log if e.kind == EventKind.TOOL_CALL_COMPLETED and e.event.seq == intent.seq
    ]
    return {"intent": intent.seq, "completion": completion.seq}


def _is_file_call(envelope) -> bool:
    event = envelope.event
    return (
        envelope.kind == EventKind.TOOL_CALL_REQUESTED
        and event.tool == SALVOR_CALL
        and event.input.get("name") in TOOLS
    )


def _fault(instant: str, tool: str, seqs: dict[str, int]) -> dict[str, str]:
    if instant == "effect":
        return {"SALVOR_FAULT_KILL_IN_TOOL": tool}
    return {"SALVOR_FAULT_KILL_AFTER_SEQ": str(seqs[instant])}


def _cut(daemon: Daemon, fault: dict[str, str], client: httpx.Client, agent: str, case: str):
    """Start the daemon with ``fault``, start the run ``case``, and wait for the SIGKILL."""
    daemon.kill()
    daemon.env.update(fault)
    daemon.start()
    run_id = _start(client, agent, case)
    assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
    for name in fault:
        del daemon.env[name]
    return run_id


def _told(provider: ScriptedProvider, case: str) -> list[str]:
    """The tool results the run ``case``'s last model call carried."""
    (last,) = [c for c in provider.calls if task_of(c) == case and tool_results(c)][-1:]
    return tool_results(last)


def test_a_process_agents_write_and_edit_killed_at_each_instant_land_once_by_their_probe(
    tmp_path: Path, store_url: str
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "notes").mkdir(parents=True)
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    runs: dict[str, str] = {}
    with ScriptedProvider(_script) as provider:
        daemon.args += ["--workspace", str(workspace)]
        daemon.env.update(
            SALVOR_MODEL_BASE_URL=provider.base_url,
            SALVOR_AGENT_UPSTREAM=provider.base_url,
            SALVOR_AGENT_KEY=SECRET,
        )
        try:
            daemon.start()
            with daemon.client(timeout=30) as client:
                registered = client.post(
                    "/v1/agents",
                    content=_process_agent(tmp_path, list(TOOLS)),
                    headers={"Content-Type": "application/toml"},
                )
                assert registered.status_code == 201, registered.text
                agent = registered.json()["agent"]
                # A run of each tool with no kill: where its call sits in the log.
                seqs = {}
                for tool in TOOLS:
                    _prepare(workspace, f"{tool}-plain")
                    run_id = _start(client, agent, f"{tool}-plain")
                    wait_state(client, run_id, "completed")
                    seqs[tool] = _seqs(store_url, run_id)
                for tool in TOOLS:
                    for instant in INSTANTS:
                        case = f"{tool}-{instant}"
                        _prepare(workspace, case)
                        fault = _fault(instant, tool, seqs[tool])
                        runs[case] = _cut(daemon, fault, client, agent, case)
                        daemon.start()
                        wait_state(client, runs[case], "completed")
        finally:
            if daemon.alive():
                daemon.kill()

    for tool in TOOLS:
        assert _told(provider, f"{tool}-plain") == [_answer(f"{tool}-plain")]
        for instant in INSTANTS:
            case = f"{tool}-{instant}"
            assert (workspace / "notes" / f"{case}.md").read_text() == INTENDED[tool], case
            log = stored_log(store_url, runs[case])
            assert [e.seq for e in log if _is_file_call(e)] == [seqs[tool]["intent"]], case
            (done,) = [
                e.event
                for e in log
                if e.kind == EventKind.TOOL_CALL_COMPLETED and e.event.seq == seqs[tool]["intent"]
            ]
            # Cut after its effect, only the probe could have settled it without writing again.
            assert (done.settled_by == "probe") == (instant == "effect"), (case, done)
            # The agent, replaying or live, was told what the write answers when it performs.
            assert _told(provider, case) == [_answer(case)], case


def test_a_process_agents_edit_of_a_file_changed_meanwhile_waits_for_a_person(
    tmp_path: Path, store_url: str
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "notes").mkdir(parents=True)
    target = workspace / "notes" / "edit-changed.md"
    target.write_text("day 1\n")
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    with ScriptedProvider(_script) as provider:
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
                run_id = _start(client, registered.json()["agent"], "edit-changed")
                assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
                assert target.read_text() == INTENDED["edit"]
                # Someone else changes the file while the daemon is down.
                target.write_text("day 1\nsomeone else's line\n")
                del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
                daemon.start()
                wait_state(client, run_id, "needs_reconciliation")
        finally:
            if daemon.alive():
                daemon.kill()
    assert target.read_text() == "day 1\nsomeone else's line\n"
    log = stored_log(store_url, run_id)
    (edit,) = [e for e in log if _is_file_call(e)]
    assert edit.event.effect == "write"
    # Its plan rode with its intent: what the file held, what it was to hold.
    assert set(edit.event.input["expect"]) >= {"before", "after", "path"}
    # Still open: the probe could not tell, so a person records what the edit did.
    assert not [e for e in log if e.kind == "ToolCallCompleted" and e.event.seq == edit.seq]
