"""Kill safety of a graph run: a real `salvor serve`, SIGKILLed while the run waits at its gate
and again mid-node (an agent node's model call in flight), restarted each time.

The graph is agent -> idempotent email -> gate -> agent. The scripted provider (in this process)
counts every call it serves and the demo tools' ledger every email sent. After both kills and the
operator's approval, the run completes with a valid log; the first agent's call was served once,
the second's once plus once for the kill that cut it, and the email went out once.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind
from salvor.store import EventStore

from tests.chaos.test_kill_serve import Daemon, assert_log_valid
from tests.support.runtime import ledger
from tests.support.scripted_provider import ProviderCall, ScriptedProvider, text_reply

pytestmark = pytest.mark.kill

SETTLE_SECONDS = 60.0


def task_of(call: ProviderCall) -> str:
    return call.request["messages"][0]["content"][0]["text"]


def answer(call: ProviderCall):
    return text_reply(f"after {task_of(call)}")


def graph(agent: str) -> dict:
    return {
        "schema_version": 1,
        "nodes": [
            {"id": "one", "kind": "agent", "agent": agent},
            {
                "id": "mail",
                "kind": "tool",
                "tool": "send_email",
                "input": {"to": "ops@example.com", "subject": "draft", "body": "$nodes.one"},
            },
            {"id": "approve", "kind": "gate", "prompt": "Go on?"},
            {"id": "two", "kind": "agent", "agent": agent, "input": "$nodes.one"},
        ],
        "edges": [
            {"from": "one", "to": "mail"},
            {"from": "mail", "to": "approve"},
            {"from": "approve", "to": "two"},
        ],
    }


def wait_state(client: httpx.Client, run_id: str, state: str) -> dict:
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        body = client.get(f"/v1/runs/{run_id}").json()
        if body["status"]["state"] == state and body.get("driver") != "attached":
            return body
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} never rested {state}: {body}")


def test_a_graph_run_killed_at_its_gate_and_mid_node_completes_repeating_nothing(
    tmp_path: Path, store_url: str
) -> None:
    in_two, release = threading.Event(), threading.Event()

    def hold_node_two(call: ProviderCall) -> None:
        # Node two's call is held (in the provider's thread) until the daemon is killed.
        if task_of(call).startswith("after") and not release.is_set():
            in_two.set()
            release.wait(timeout=SETTLE_SECONDS)

    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    with ScriptedProvider(answer, on_call=hold_node_two) as provider:
        daemon.env["SALVOR_MODEL_BASE_URL"] = provider.base_url
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = client.post(
                "/v1/agents",
                content=(
                    'model = "scripted"\n[llm]\nprovider = "anthropic"\n'
                    f'base_url = "{provider.base_url}"\nmax_retries = 0\n'
                ),
                headers={"Content-Type": "application/toml"},
            ).json()["agent"]
            graph_hash = client.post("/v1/graphs", json=graph(agent)).json()["graph"]
            started = client.post("/v1/graph-runs", json={"graph_hash": graph_hash, "input": "go"})
            assert started.status_code == 201, started.text
            run_id = started.json()["run"]

            # Inside the gate wait.
            wait_state(client, run_id, "suspended")
            daemon.kill()
            daemon.start()
            resumed = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"ok": True}})
            assert resumed.status_code == 202, resumed.text

            # Mid-node: node two's model call is in flight.
            assert in_two.wait(SETTLE_SECONDS)
            daemon.kill()
            release.set()
            daemon.start()  # recovery on start re-drives the interrupted run
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()
        assert body["status"]["output"] == {"two": "after after go"}
        served = sorted(provider.count_by_request_hash().values())

    with EventStore.open(store_url) as store:
        log = store.read_log(run_id)
    assert_log_valid(log)
    kinds = [envelope.event.KIND for envelope in log]
    assert kinds.count(EventKind.MODEL_CALL_REQUESTED) == 2
    assert kinds.count(EventKind.TOOL_CALL_REQUESTED) == 1
    assert served == [1, 2]  # node one's call once; node two's once more for the kill that cut it
    assert [record["tool"] for record in ledger(effects)] == ["send_email"]
