"""Kill safety of the notification outbox: a real `salvor serve --notify-webhook`, SIGKILLed.

A run reaches a gate while the operator's webhook refuses (500); the daemon is SIGKILLed before
any delivery succeeded. Restarted with the webhook accepting, the daemon delivers the gate's
notification from the store (once or more, never lost: at least once), and the run still
answers its gate and completes. Both backends: the row was written with the gate's own event,
in its transaction, and the restart reads it back.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from salvor.store import EventStore

from tests.chaos.test_kill_graph_run import SETTLE_SECONDS, wait_state
from tests.chaos.test_kill_serve import Daemon
from tests.support.scripted_provider import ScriptedProvider, tool_loop_script
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.kill


def gate_agent(provider: ScriptedProvider) -> str:
    return (
        'model = "scripted"\n[llm]\nprovider = "anthropic"\n'
        f'base_url = "{provider.base_url}"\nmax_retries = 0\n'
        '[[tools]]\nname = "request_approval"\n'
    )


def outbox(store_url: str, run_id: str) -> list:
    with EventStore.open(store_url) as store:
        return store.outbox.entries(run_id)


def test_a_notification_refused_before_a_kill_is_delivered_after_the_restart(
    tmp_path: Path, store_url: str
) -> None:
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    with (
        ScriptedProvider(tool_loop_script([("request_approval", {})], final_text="ok")) as model,
        WebhookReceiver([500]) as receiver,
    ):
        daemon.args += ["--model-endpoint", model.base_url, "--notify-webhook", receiver.url]
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            registered = client.post(
                "/v1/agents",
                content=gate_agent(model),
                headers={"Content-Type": "application/toml"},
            )
            assert registered.status_code == 201, registered.text
            started = client.post(
                "/v1/runs", json={"agent": registered.json()["agent"], "input": "refund INV-9"}
            )
            assert started.status_code == 201, started.text
            run_id = started.json()["run"]
            waiting = wait_state(client, run_id, "suspended")

            # The first delivery was refused; the daemon dies before any other succeeds.
            assert receiver.wait_for(1, SETTLE_SECONDS, answered=True)
            daemon.kill()
            assert set(receiver.answered) == {500}
            (row,) = outbox(store_url, run_id)
            assert (row.kind, row.delivered_at) == ("gate", None)

            refused = len(receiver.answered)
            receiver.accept_from_now()
            daemon.start()
            assert receiver.wait_for(refused + 1, SETTLE_SECONDS, answered=True)
            assert receiver.answered[-1] == 200

            assert client.get(f"/v1/runs/{run_id}").json()["status"] == waiting["status"]
            resumed = client.post(f"/v1/runs/{run_id}/resume", json={"input": {"approved": True}})
            assert resumed.status_code == 202, resumed.text
            assert wait_state(client, run_id, "completed")["status"]["state"] == "completed"
            client.close()
        finally:
            daemon.kill()

    (row,) = outbox(store_url, run_id)
    assert row.kind == "gate" and row.delivered_at is not None
    # A kill between a refusal and its mark loses the count of that attempt, never the row.
    assert 0 <= row.attempts <= receiver.answered.count(500)
    assert receiver.answered.count(200) == 1
    # Every attempt carried the row's bytes, the one accepted included.
    assert {request.body for request in receiver.requests} == {row.body.encode()}
    body = receiver.requests[-1].json()
    assert (body["kind"], body["run"], body["status"]) == ("gate", run_id, waiting["status"])
