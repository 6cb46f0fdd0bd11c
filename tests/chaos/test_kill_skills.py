"""Kill safety of a built-in agent's skills: a real ``salvor serve --skills-dir DIR``, SIGKILLed
right after its run recorded where its skill is (``resolve_skills``' completion), and right after
its first model call's intent; then the skill's SKILL.md is given another description and the
daemon is started again.

The run completes, its skills resolved once (one ``resolve_skills`` call in its log), and every
model call the provider is sent for it, before and after the kill, carries the description the
run recorded: a recovered run is offered exactly the prompt its recorded calls were.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, task_of, wait_state
from tests.chaos.test_kill_serve import Daemon, plan_script
from tests.support.scripted_provider import ScriptedProvider

pytestmark = pytest.mark.kill

BEFORE = "Tide tables for the harbour, as first written."
AFTER = "Tide tables, rewritten while the daemon was down."
INSTANTS = ("resolved", "model_intent")


def _skill(skills: Path, description: str) -> Path:
    folder = skills / "tide-tables"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: tide-tables\ndescription: {description}\n---\n")
    return folder / "SKILL.md"


def _agent(base_url: str) -> str:
    return (
        'name = "pilot"\nmodel = "scripted"\nmax_response_tokens = 256\n'
        'skills = ["tide-tables"]\n'
        f'[llm]\nprovider = "anthropic"\nbase_url = "{base_url}"\nmax_retries = 0\n'
    )


def _task(location: Path, case: str) -> dict:
    return {"plan": [["read", {"path": str(location)}]], "case": case}


def _seqs(store_url: str, run_id: str) -> dict[str, int]:
    """Where a run's skills were recorded resolved, and its first model call's intent."""
    log = stored_log(store_url, run_id)
    (resolve,) = [
        e for e in log
        if e.kind == EventKind.TOOL_CALL_REQUESTED and e.event.tool == "resolve_skills"
    ]  # fmt: skip
    model = next(e for e in log if e.kind == EventKind.MODEL_CALL_REQUESTED)
    return {"resolved": resolve.seq + 1, "model_intent": model.seq}


def test_a_run_killed_after_resolving_its_skills_keeps_the_prompt_it_recorded(
    tmp_path: Path, store_url: str
) -> None:
    skills = tmp_path / "skills"
    location = _skill(skills, BEFORE).resolve()
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    with ScriptedProvider(plan_script) as provider:
        daemon.args += ["--skills-dir", str(skills), "--model-endpoint", provider.base_url]
        daemon.start()
        runs: dict[str, str] = {}
        try:
            with daemon.client(timeout=30) as client:
                registered = client.post(
                    "/v1/agents",
                    content=_agent(provider.base_url),
                    headers={"Content-Type": "application/toml"},
                )
                assert registered.status_code == 201, registered.text
                agent = registered.json()["agent"]
                plain = client.post(
                    "/v1/runs", json={"agent": agent, "input": _task(location, "plain")}
                )
                wait_state(client, plain.json()["run"], "completed")
                seqs = _seqs(store_url, plain.json()["run"])
                for instant in INSTANTS:
                    _skill(skills, BEFORE)
                    daemon.kill()
                    daemon.env["SALVOR_FAULT_KILL_AFTER_SEQ"] = str(seqs[instant])
                    daemon.start()
                    started = client.post(
                        "/v1/runs", json={"agent": agent, "input": _task(location, instant)}
                    )
                    assert started.status_code == 201, started.text
                    runs[instant] = started.json()["run"]
                    assert daemon.proc.wait(timeout=SETTLE_SECONDS) == -signal.SIGKILL, daemon.log()
                    _skill(skills, AFTER)
                    del daemon.env["SALVOR_FAULT_KILL_AFTER_SEQ"]
                    daemon.start()
                    wait_state(client, runs[instant], "completed")
        finally:
            if daemon.proc is not None:
                daemon.kill()
        calls = provider.calls

    for instant in INSTANTS:
        mine = [call for call in calls if json.loads(task_of(call)).get("case") == instant]
        assert len(mine) >= 2, instant  # the read asked for, then the answer
        for call in mine:
            assert f"<description>{BEFORE}</description>" in call.request["system"], instant
            assert AFTER not in call.request["system"], instant
        log = stored_log(store_url, runs[instant])
        resolved = [
            e for e in log
            if e.kind == EventKind.TOOL_CALL_REQUESTED and e.event.tool == "resolve_skills"
        ]  # fmt: skip
        assert len(resolved) == 1, instant
        assert log[-1].kind == EventKind.RUN_COMPLETED, instant
