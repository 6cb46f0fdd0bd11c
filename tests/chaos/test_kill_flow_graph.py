"""Kill safety of the flow tools in a graph's agent node: a real `salvor serve`, SIGKILLed and
restarted.

An agent node asks a person a question (``ask_user``): the graph run waits with the question as
its reason, a wrong answer is refused with the run still waiting, the daemon is killed while it
waits, and after the restart the right answer reaches the node's conversation, whose finish is
the graph's output. An agent node finishes with the ``branch`` a branch node routes on, and the
daemon is killed while that node's model call is in flight: after the restart the call is asked
once more, its finish is recorded once and routes the way it said, and the other side is
skipped. Both on every backend: the question, the open call and the node's progress are durable
state, and recovery reads them back from the store.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind

from tests.chaos.test_kill_flow_tools import answer_across_a_kill, register
from tests.chaos.test_kill_graph_run import (
    SETTLE_SECONDS,
    start_graph_run,
    stored_log,
    wait_state,
)
from tests.chaos.test_kill_serve import Daemon
from tests.support.flows import tool_results, tool_use, triage_graph
from tests.support.runtime import ledger
from tests.support.scripted_provider import ProviderCall, ScriptedProvider

pytestmark = pytest.mark.kill

QUESTION = {"question": "Which size?", "type": "select", "options": ["S", "M"]}
SIZED = 'flow_tools = ["ask_user"]\noutputs = [{ name = "size" }]'
TRIAGED = 'outputs = [{ name = "priority" }]'
URGENT = {"status": "complete", "summary": "disk full", "branch": "urgent", "priority": "p1"}


def order_by_the_answer(call: ProviderCall):
    """A script: ask which size until the conversation holds the answer, then finish with it."""
    results = tool_results(call)
    if not results:
        return tool_use("ask_user", QUESTION)
    size = json.loads(results[0]["content"])["answer"]
    return tool_use("finish", {"status": "complete", "summary": f"ordered {size}", "size": size})


def one_node(agent: str) -> dict:
    return {
        "schema_version": 1,
        "nodes": [{"id": "order", "kind": "agent", "agent": agent, "input": "$input"}],
        "edges": [],
    }


def test_an_agent_nodes_question_survives_a_kill_and_its_answer_completes_the_graph(
    tmp_path: Path, store_url: str
) -> None:
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    with ScriptedProvider(order_by_the_answer) as provider:
        daemon.args += ["--model-endpoint", provider.base_url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, SIZED)
            run_id = start_graph_run(client, one_node(agent), "a shirt")
            waiting = wait_state(client, run_id, "suspended")
            assert waiting["status"]["reason"] == "Which size?"
            schema = waiting["status"]["input_schema"]
            assert schema["required"] == ["answer"]
            assert schema["properties"]["answer"]["enum"] == ["S", "M"]

            body = answer_across_a_kill(daemon, client, run_id, waiting, wrong="XL", right="M")
            client.close()
        finally:
            daemon.kill()
        served = sorted(provider.count_by_request_hash().values())
        calls = provider.calls

    assert body["status"]["output"] == {
        "order": {"status": "complete", "summary": "ordered M", "outputs": {"size": "M"}}
    }
    # The question and the finish, each asked once: the restart re-asked nothing.
    assert served == [1, 1]
    (answered,) = tool_results(calls[1])
    assert json.loads(answered["content"]) == {"answer": "M"}
    kinds = [e.event.KIND for e in stored_log(store_url, run_id)]
    assert kinds.count(EventKind.SUSPENDED) == 1 and kinds.count(EventKind.RESUMED) == 1
    assert kinds.count(EventKind.MODEL_CALL_REQUESTED) == 2


def test_an_agent_node_killed_mid_call_finishes_once_down_the_branch_it_named(
    tmp_path: Path, store_url: str
) -> None:
    in_triage, release = threading.Event(), threading.Event()

    def hold_the_first_call(call: ProviderCall) -> None:
        # The node's call is held (in the provider's thread) until the daemon is killed.
        if not release.is_set():
            in_triage.set()
            release.wait(timeout=SETTLE_SECONDS)

    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    with ScriptedProvider(lambda call: tool_use("finish", URGENT), on_call=hold_the_first_call) as (
        provider
    ):
        daemon.args += ["--model-endpoint", provider.base_url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register(client, provider, TRIAGED)
            run_id = start_graph_run(client, triage_graph(agent), "the disk is full")

            assert in_triage.wait(SETTLE_SECONDS)
            daemon.kill()
            release.set()
            daemon.start()  # recovery on start re-drives the interrupted graph run
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()
        served = sorted(provider.count_by_request_hash().values())

    assert served == [2]  # the call the kill cut, asked once more
    log = stored_log(store_url, run_id)
    kinds = [e.event.KIND for e in log]
    assert kinds.count(EventKind.MODEL_CALL_REQUESTED) == 1
    assert kinds.count(EventKind.MODEL_CALL_COMPLETED) == 1
    exits = [e.event for e in log if e.event.KIND is EventKind.NODE_EXITED]
    (finished,) = [exit for exit in exits if exit.node == "triage"]
    assert finished.output == {
        "status": "complete",
        "summary": "disk full",
        "outputs": {"priority": "p1"},
        "branch": "urgent",
    }
    (routed,) = [exit for exit in exits if exit.node == "route"]
    assert routed.branch_case == "urgent"
    skipped = [e.event.node for e in log if e.event.KIND is EventKind.NODE_SKIPPED]
    assert skipped == ["shelve"]
    assert "shelve" not in {exit.node for exit in exits}
    (sent,) = ledger(effects)
    assert sent["tool"] == "send_email"
    assert sent["input"]["subject"] == "p1" and sent["input"]["body"] == "disk full"
    assert body["status"]["state"] == "completed"
