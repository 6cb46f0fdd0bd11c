"""Kill safety of the flow tools: a real `salvor serve`, SIGKILLed and restarted.

A parent agent delegates to a child agent (``subagent``), and the daemon is killed while the
child's model call is in flight and the parent's call is open: after the restart exactly one
child run exists, and the parent completes with the child's typed outputs. An agent asks a
person a question (``ask_user``): a wrong answer is refused with the run still waiting, the
daemon is killed while it waits, and after the restart the right answer completes the run with
the answer it was given. Both on every backend: the child's head and the question are durable
state, and recovery reads them back from the store.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from salvor.daemon.flows import PARENT_LABEL
from salvor.protocol import EventKind

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, stored_log, wait_state
from tests.chaos.test_kill_serve import Daemon
from tests.support.flows import tool_results, tool_use
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, text_reply

pytestmark = pytest.mark.kill

QUESTION = {"question": "Which size?", "type": "select", "options": ["S", "M"]}
CHECKED = {"status": "complete", "summary": "checked", "verdict": "refund", "amount": 12.5}


def register(client: httpx.Client, provider: ScriptedProvider, fields: str) -> str:
    response = client.post(
        "/v1/agents",
        content=(
            f'model = "scripted"\n{fields}\n[llm]\nprovider = "anthropic"\n'
            f'base_url = "{provider.base_url}"\nmax_retries = 0\n'
        ),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code == 201, response.text
    return response.json()["agent"]


def start_run(client: httpx.Client, agent: str, run_input) -> str:
    started = client.post("/v1/runs", json={"agent": agent, "input": run_input})
    assert started.status_code == 201, started.text
    return started.json()["run"]


def answer_across_a_kill(
    daemon: Daemon, client: httpx.Client, run_id: str, waiting: dict, *, wrong: str, right: str
) -> dict:
    """Answer a run waiting on a question ``wrong`` (refused, still waiting), SIGKILL the daemon
    while it waits, restart it, answer ``right``; the run's body once it completed.

    The question survives the kill exactly: the status after the restart is the one before.
    """
    refused = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": wrong}})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "bad_request"
    assert client.get(f"/v1/runs/{run_id}").json()["status"] == waiting["status"]

    daemon.kill()
    daemon.start()
    assert client.get(f"/v1/runs/{run_id}").json()["status"] == waiting["status"]
    resumed = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"answer": right}})
    assert resumed.status_code == 202, resumed.text
    return wait_state(client, run_id, "completed")


def echo_the_result(first):
    """A script: ``first`` until the conversation holds a tool result, then that result's text."""

    def script(call: ProviderCall):
        results = tool_results(call)
        return text_reply(results[0]["content"]) if results else first

    return script


def test_a_parent_killed_while_its_child_thinks_completes_with_one_child(
    tmp_path: Path, store_url: str
) -> None:
    in_child, release = threading.Event(), threading.Event()

    def hold_the_child(call: ProviderCall) -> None:
        # The child's first model call is held (in the provider's thread) until the daemon dies.
        if not release.is_set():
            in_child.set()
            release.wait(timeout=SETTLE_SECONDS)

    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    with (
        ScriptedProvider([tool_use("finish", CHECKED)] * 2, on_call=hold_the_child) as child,
        ScriptedProvider(
            echo_the_result(tool_use("subagent", {"agent": "checker", "task": "check it"}))
        ) as parent,
    ):
        daemon.args += ["--model-endpoint", child.base_url, "--model-endpoint", parent.base_url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            register(
                client,
                child,
                'name = "checker"\n'
                'outputs = [{ name = "verdict" }, { name = "amount", type = "number" }]',
            )
            agent = register(client, parent, 'name = "desk"\nflow_tools = ["subagent"]')
            run_id = start_run(client, agent, "refund INV-7?")

            assert in_child.wait(SETTLE_SECONDS)
            daemon.kill()
            release.set()
            daemon.start()  # recovery drives the parent, whose open call drives the child on
            body = wait_state(client, run_id, "completed")
            listed = client.get("/v1/runs", params={"label": f"{PARENT_LABEL}:{run_id}"}).json()
            children = client.get(f"/v1/runs/{run_id}/children").json()["children"]
            (child_id,) = [summary["run"] for summary in listed["runs"]]
            assert [summary["run"] for summary in children] == [child_id]
            assert client.get(f"/v1/runs/{child_id}").json()["parent"] == run_id
            client.close()
        finally:
            daemon.kill()
        child_served = sorted(child.count_by_request_hash().values())
        parent_served = sorted(parent.count_by_request_hash().values())

    assert json.loads(body["status"]["output"]) == {
        "status": "complete",
        "summary": "checked",
        "outputs": {"verdict": "refund", "amount": 12.5},
    }
    child_log = stored_log(store_url, child_id)
    assert [e.event.KIND for e in child_log].count(EventKind.RUN_STARTED) == 1
    assert child_served == [2]  # the call the kill cut, asked once more
    assert parent_served == [1, 1]  # the parent's model calls, never twice
    parent_log = stored_log(store_url, run_id)
    calls = [e for e in parent_log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
    assert [call.event.tool for call in calls] == ["subagent"]


def test_a_question_survives_a_kill_and_only_a_fitting_answer_resumes_it(
    tmp_path: Path, store_url: str
) -> None:
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    with ScriptedProvider(echo_the_result(tool_use("ask_user", QUESTION))) as provider:
        daemon.args += ["--model-endpoint", provider.base_url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, 'flow_tools = ["ask_user"]')
            run_id = start_run(client, agent, "order a shirt")
            waiting = wait_state(client, run_id, "suspended")
            assert waiting["status"]["reason"] == "Which size?"
            schema = waiting["status"]["input_schema"]
            assert schema["properties"]["answer"]["enum"] == ["S", "M"]

            body = answer_across_a_kill(daemon, client, run_id, waiting, wrong="XL", right="M")
            client.close()
        finally:
            daemon.kill()
        served = sorted(provider.count_by_request_hash().values())

    assert json.loads(body["status"]["output"]) == {"answer": "M"}
    assert served == [1, 1]
    log = stored_log(store_url, run_id)
    kinds = [e.event.KIND for e in log]
    assert kinds.count(EventKind.RESUMED) == 1 and kinds.count(EventKind.SUSPENDED) == 1
