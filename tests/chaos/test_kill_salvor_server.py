"""A process agent asking a person and then delegating through the ``salvor`` MCP server under a
real `salvor serve` that is SIGKILLed while the child works.

The parent is the stand-in suite's ``mcp`` SDK agent on ``$SALVOR_MCP_SERVER_SALVOR``. Its
``ask_user`` call parks the run (the process stopped) until the test answers over HTTP, a wrong
answer refused first; the process, started again and answered from its log, then makes a
``subagent`` call that starts a built-in child on the scripted provider (in this process), whose
model call is held until the daemon is killed. The next daemon recovers the parent, whose
process is started again and answered from its log up to its open call; the call finds the one
child the killed daemon started and drives it on; the parent then finishes with the child's
typed outputs. On both backends: the child's id and its single head are the store's to keep.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from salvor.daemon.flows import PARENT_LABEL, child_run_id
from salvor.store import EventStore

from tests.chaos.test_kill_graph_run import wait_state
from tests.chaos.test_kill_process_agent import wait_terminal
from tests.chaos.test_kill_serve import Daemon, assert_log_valid
from tests.daemon.agents.test_process_agent import SECRET
from tests.daemon.proxies.test_salvor_server import OUTPUTS, handed_on, salvor_agent, steps_script
from tests.support.api_server import agent_toml
from tests.support.flows import tool_use
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

pytestmark = pytest.mark.kill

SETTLE_SECONDS = 60.0
QUESTION = {"question": "Which colour?", "type": "select", "options": ["blue", "green"]}


def asking_then_delegating_script():
    """The parent's model: ask which colour, hand the answer to ``helper``, then finish with what
    the child returned."""
    return steps_script(
        lambda _: ("ask_user", QUESTION),
        lambda results: (
            "subagent",
            {
                "agent": "helper",
                "task": f"find the {json.loads(results[0])['answer']} one",
                "inputs": {"k": "v"},
            },
        ),
        lambda results: ("finish", handed_on(results[1])),
        lambda _: "done",
    )


def is_parent(call: ProviderCall) -> bool:
    """The parent's calls offer the salvor server's tools; the child's none."""
    return any(tool["name"] == "subagent" for tool in call.request.get("tools") or [])


def test_sigkill_mid_child_leaves_one_child_and_the_parent_completes_with_its_result(
    tmp_path: Path, store_url: str
) -> None:
    parent_script = asking_then_delegating_script()
    child_finish = {"status": "complete", "summary": "found it", "colour": "blue", "count": 3}

    def answer(call: ProviderCall):
        return parent_script(call) if is_parent(call) else tool_use("finish", child_finish)

    in_child, release = threading.Event(), threading.Event()

    def hold_the_child(call: ProviderCall) -> None:
        # The child's model call is held (in the provider's thread) until the daemon is killed.
        if not is_parent(call) and not release.is_set():
            in_child.set()
            release.wait(timeout=SETTLE_SECONDS)

    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    daemon.allow_process_agents()
    with ScriptedProvider(answer, on_call=hold_the_child) as provider:
        daemon.env.update(
            SALVOR_MODEL_BASE_URL=provider.base_url,
            SALVOR_AGENT_UPSTREAM=provider.base_url,
            SALVOR_AGENT_KEY=SECRET,
        )
        try:
            daemon.start()
            with daemon.client(timeout=30) as client:
                for text in (
                    agent_toml(provider.base_url, name="helper", extra=OUTPUTS),
                    salvor_agent(tmp_path, extra=OUTPUTS).stored_text,
                ):
                    registered = client.post(
                        "/v1/agents", content=text, headers={"Content-Type": "application/toml"}
                    )
                    assert registered.status_code == 201, registered.text
                parent_hash = registered.json()["agent"]
                started = client.post("/v1/runs", json={"agent": parent_hash, "input": "go"})
                assert started.status_code == 201, started.text
                run_id = started.json()["run"]

                waiting = wait_state(client, run_id, "suspended")
                assert waiting["status"]["reason"] == "Which colour?"
                wrong = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": "red"}})
                assert wrong.status_code == 400, wrong.text
                assert client.get(f"/v1/runs/{run_id}").json()["status"] == waiting["status"]
                right = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": "blue"}})
                assert right.status_code == 202, right.text

                assert in_child.wait(SETTLE_SECONDS)
                daemon.kill()
                release.set()
                daemon.start()  # recovery re-drives the parent, which drives its child on
                body = wait_terminal(client, run_id, timeout=SETTLE_SECONDS)
                assert body["status"]["state"] == "completed", body
                # The child's typed outputs, handed on by the parent's own finish.
                assert body["status"]["output"] == {
                    "status": "complete",
                    "summary": "helper said: found it",
                    "outputs": {"colour": "blue", "count": 3},
                }
                listed = client.get("/v1/runs", params={"label": f"{PARENT_LABEL}:{run_id}"})
                (child,) = [entry["run"] for entry in listed.json()["runs"]]
                child_status = client.get(f"/v1/runs/{child}").json()["status"]
                assert child_status == {
                    "state": "completed",
                    "output": {
                        "status": "complete",
                        "summary": "found it",
                        "outputs": {"colour": "blue", "count": 3},
                    },
                }
            code, _ = daemon.terminate()
            assert code == 0
        finally:
            if daemon.alive():
                daemon.kill()
        parent_calls = [c.request_hash for c in provider.calls if is_parent(c)]
        child_calls = [c.request_hash for c in provider.calls if not is_parent(c)]

    with EventStore.open(store_url) as store:
        parent_log = store.read_log(run_id)
        child_log = store.read_log(child)
    assert_log_valid(parent_log)
    assert_log_valid(child_log)
    subagent = next(
        env
        for env in parent_log
        if env.kind == "ToolCallRequested" and env.event.input.get("name") == "subagent"
    )
    assert child == child_run_id(run_id, subagent.seq)
    assert [env.kind for env in child_log].count("RunStarted") == 1
    assert child_log[0].event.input["task"] == "find the blue one"  # the answer it was given
    # The parent's model calls were each served once (its process, started again after the
    # answer and after the restart, was answered from the log up to its open call); the child's
    # one call was asked again only because the kill cut it.
    assert len(parent_calls) == len(set(parent_calls)) == 4
    assert len(child_calls) == 2 and len(set(child_calls)) == 1
