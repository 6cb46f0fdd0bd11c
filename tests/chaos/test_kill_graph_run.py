"""Kill safety of a graph run: a real `salvor serve`, SIGKILLed (by the test, or by a demo fault
point inside a tool) and restarted, once per scenario: at a gate and mid-node, inside a map's
fan-out, inside a delay, mid-write in an agent node, and then a fork of the recovered run.

The scripted provider (in this process) counts every call it serves and the demo tools' ledger
every effect. Every time: the log re-folds through the append guard, no completed model or tool
call is executed again, a write cut mid-call is probed on restart when its tool declares a probe
(settled from the world if it landed, performed once if it did not) and parked for a person
when it declares none (never performed twice), and the graph run completes. The new scenarios
run on SQLite: the store's own kill safety is the other chaos modules' subject; these are about
the walk.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from salvor.protocol import EventKind, parse_instant
from salvor.store import EventStore

from tests.chaos.test_kill_serve import Daemon, assert_log_valid
from tests.support.runtime import ledger
from tests.support.scripted_provider import (
    ProviderCall,
    ScriptedProvider,
    text_reply,
    tool_loop_script,
)

pytestmark = pytest.mark.kill

SETTLE_SECONDS = 60.0
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


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


def register_agent(client: httpx.Client, provider: ScriptedProvider, tools: tuple = ()) -> str:
    """A built-in agent on the scripted provider, offered ``tools``; its hash."""
    tables = "".join(f'[[tools]]\nname = "{name}"\n' for name in tools)
    response = client.post(
        "/v1/agents",
        content=(
            'model = "scripted"\n[llm]\nprovider = "anthropic"\n'
            f'base_url = "{provider.base_url}"\nmax_retries = 0\n{tables}'
        ),
        headers={"Content-Type": "application/toml"},
    )
    assert response.status_code == 201, response.text
    return response.json()["agent"]


def start_graph_run(client: httpx.Client, document: dict, run_input) -> str:
    graph_hash = client.post("/v1/graphs", json=document).json()["graph"]
    started = client.post("/v1/graph-runs", json={"graph_hash": graph_hash, "input": run_input})
    assert started.status_code == 201, started.text
    return started.json()["run"]


def wait_until(what, condition, *args):
    """Poll ``condition(*args)`` (a value, or None) until it gives one."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        value = condition(*args)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"never {what}")


def stored_log(store_url: str, run_id: str) -> list:
    """``run_id``'s log once the daemon is down, checked legal."""
    with EventStore.open(store_url) as store:
        log = store.read_log(run_id)
    assert_log_valid(log)
    return log


def no_open_intent(log: list) -> bool:
    """Every model and tool call intent of ``log`` has its completion."""
    intents = {
        e.seq
        for e in log
        if e.event.KIND in (EventKind.MODEL_CALL_REQUESTED, EventKind.TOOL_CALL_REQUESTED)
    }
    done = {
        e.event.seq
        for e in log
        if e.event.KIND in (EventKind.MODEL_CALL_COMPLETED, EventKind.TOOL_CALL_COMPLETED)
    }
    return intents <= done


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
            run_id = start_graph_run(client, graph(register_agent(client, provider)), "go")

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


def map_items_recorded(client: httpx.Client, run_id: str) -> int:
    nodes = client.get(f"/v1/runs/{run_id}/graph").json()["nodes"]
    return next((n["map"]["completed"] for n in nodes if n["node"] == "each" and "map" in n), 0)


@SQLITE
def test_a_graph_run_killed_inside_its_map_fan_out_drives_only_the_items_left(
    tmp_path: Path, store_url: str
) -> None:
    items = ["i0", "i1", "i2", "i3"]
    held, release = {"i2": threading.Event(), "i3": threading.Event()}, threading.Event()

    def hold_the_last_two(call: ProviderCall) -> None:
        if task_of(call) in held and not release.is_set():
            held[task_of(call)].set()
            release.wait(timeout=SETTLE_SECONDS)

    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    with ScriptedProvider(answer, on_call=hold_the_last_two) as provider:
        daemon.env["SALVOR_MODEL_BASE_URL"] = provider.base_url
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            document = {
                "schema_version": 1,
                "nodes": [
                    {
                        "id": "each",
                        "kind": "map",
                        "over": "$input",
                        "concurrency": 4,
                        "body": {
                            "kind": "agent",
                            "agent": register_agent(client, provider),
                            "input": "$item",
                        },
                    }
                ],
                "edges": [],
            }
            run_id = start_graph_run(client, document, items)
            # Two items recorded as MapItemCompleted, the other two children mid-call.
            for event in held.values():
                assert event.wait(SETTLE_SECONDS)
            wait_until("two items recorded", lambda: map_items_recorded(client, run_id) == 2)
            daemon.kill()
            release.set()
            daemon.start()
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()
        served = {task_of(call) for call in provider.calls}
        per_item = {item: [task_of(c) for c in provider.calls].count(item) for item in served}

    assert body["status"]["output"] == {"each": [f"after {item}" for item in items]}
    # The recorded items' calls were not made again; the cut ones once more each.
    assert per_item == {"i0": 1, "i1": 1, "i2": 2, "i3": 2}
    log = stored_log(store_url, run_id)
    recorded = [e.event for e in log if e.event.KIND is EventKind.MAP_ITEM_COMPLETED]
    assert sorted(event.index for event in recorded) == [0, 1, 2, 3]
    for event in recorded:
        child = stored_log(store_url, event.run_id)
        assert [e.event.KIND for e in child].count(EventKind.MODEL_CALL_REQUESTED) == 1


@SQLITE
def test_a_graph_run_killed_inside_a_delay_is_woken_after_the_restart_and_completes(
    tmp_path: Path, store_url: str
) -> None:
    document = {
        "schema_version": 1,
        "nodes": [
            {"id": "one", "kind": "agent", "agent": None},
            {"id": "nap", "kind": "delay", "seconds": 1},
            {"id": "two", "kind": "agent", "agent": None, "input": "$nodes.one"},
        ],
        "edges": [{"from": "one", "to": "nap"}, {"from": "nap", "to": "two"}],
    }
    daemon = Daemon(tmp_path, store_url, tmp_path / "effects.jsonl")
    with ScriptedProvider(answer) as provider:
        daemon.env["SALVOR_MODEL_BASE_URL"] = provider.base_url
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register_agent(client, provider)
            for node in document["nodes"]:
                if node["kind"] == "agent":
                    node["agent"] = agent
            run_id = start_graph_run(client, document, "go")
            wake_at = parse_instant(wait_state(client, run_id, "sleeping")["status"]["wake_at"])
            daemon.kill()
            # Down until the instant has passed (the wake is the wall clock's, in another
            # process: nothing to wait on but the clock), so the restarted daemon finds it due.
            time.sleep(max(0.0, (wake_at - datetime.now(UTC)).total_seconds()))
            daemon.start()
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()
        served = sorted(provider.count_by_request_hash().values())

    assert body["status"]["output"] == {"two": "after after go"}
    assert served == [1, 1]
    kinds = [e.event.KIND for e in stored_log(store_url, run_id)]
    assert kinds.count(EventKind.SLEEP_STARTED) == kinds.count(EventKind.SLEEP_COMPLETED) == 1


REFUND = {"invoice_id": "INV-7", "amount_cents": 500}
# What each demo write answers, read back from the ledger's record of it.
ANSWER_OF = {
    "issue_refund": lambda r: r["refund"],
    "publish_post": lambda r: {"post_id": r["post_id"], "title": r["input"]["title"]},
}


def resolve_from_ledger(client: httpx.Client, effects: Path, run_id: str, tool: str) -> None:
    """As a person would: the run is parked on ``tool``'s open write, which the world shows
    happened once; record what it answered, and the daemon walks on by itself."""
    body = wait_state(client, run_id, "needs_reconciliation")
    assert body["pending"]["tool"] == tool, body
    (record,) = [r for r in ledger(effects) if r["tool"] == tool]
    assert record["seq"] == body["pending"]["seq"]
    resolved = client.post(f"/v1/runs/{run_id}/resolve", json={"output": ANSWER_OF[tool](record)})
    assert resolved.status_code == 200, resolved.text


POST = {"title": "refunded", "body": "INV-7 is refunded"}


def writes_then_tell(writes):
    """The script and graph of a run whose node `write` makes ``writes`` and `tell` answers."""

    def script(call: ProviderCall):
        # Node `write` is asked about the run's input; node `tell` about write's answer.
        return writes(call) if task_of(call) == "go" else answer(call)

    document = {
        "schema_version": 1,
        "nodes": [
            {"id": "write", "kind": "agent", "agent": None},
            {"id": "tell", "kind": "agent", "agent": None},
        ],
        "edges": [{"from": "write", "to": "tell"}],
    }
    return script, document


@SQLITE
def test_writes_cut_mid_call_in_an_agent_node_are_probed_or_parked_and_a_fork_repeats_none(
    tmp_path: Path, store_url: str
) -> None:
    writes = tool_loop_script([("issue_refund", REFUND), ("publish_post", POST)], final_text="ok")
    script, document = writes_then_tell(writes)
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    with ScriptedProvider(script) as provider:
        daemon.env["SALVOR_MODEL_BASE_URL"] = provider.base_url
        # The refund's kill point: after the bank answered, before the completion is recorded.
        daemon.env["SALVOR_FAULT_KILL_IN_TOOL"] = "issue_refund"
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register_agent(client, provider, ("issue_refund", "publish_post"))
            for node in document["nodes"]:
                node["agent"] = agent
            run_id = start_graph_run(client, document, "go")
            daemon.proc.wait(timeout=SETTLE_SECONDS)
            # The refund's intent is open: the restart probes it (no person), finds it landed,
            # records the bank's answer and walks on, to die inside the post (a write with no
            # probe at all).
            daemon.env["SALVOR_FAULT_KILL_IN_TOOL"] = "publish_post"
            daemon.start()
            daemon.proc.wait(timeout=SETTLE_SECONDS)
            del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
            daemon.start()
            resolve_from_ledger(client, effects, run_id, "publish_post")
            body = wait_state(client, run_id, "completed")
            assert body["status"]["output"] == {"tell": "after ok"}
            served_origin = provider.count_by_request_hash()

            # The recovered run forked from `tell`: its prefix holds both writes, settled.
            forked = client.post(f"/v1/runs/{run_id}/fork", json={"from_node": "tell"})
            assert forked.status_code == 201, forked.text
            child = forked.json()["run"]
            assert (
                wait_state(client, child, "completed")["status"]["output"]
                == body["status"]["output"]
            )
            client.close()
        finally:
            daemon.kill()
        served_fork = provider.count_by_request_hash() - served_origin

    # Each of write's three model calls and tell's one served once; the fork re-asked tell only.
    assert sorted(served_origin.values()) == [1, 1, 1, 1]
    assert sorted(served_fork.values()) == [1]
    # Each write performed once in the world, across three processes and a fork.
    assert [r["tool"] for r in ledger(effects) if r["tool"] != "issue_refund:sent"] == [
        "issue_refund",
        "publish_post",
    ]
    origin_log = stored_log(store_url, run_id)
    settled = [e.event for e in origin_log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED]
    assert [event.settled_by for event in settled] == ["probe", "operator"]
    (refund,) = [r for r in ledger(effects) if r["tool"] == "issue_refund"]
    assert settled[0].output == refund["refund"]
    child_log = stored_log(store_url, child)
    assert no_open_intent(child_log)
    entered_tell = next(
        e.seq
        for e in child_log
        if e.event.KIND is EventKind.NODE_ENTERED and e.event.node == "tell"
    )
    prefix_tools = [
        e.event.tool
        for e in child_log[:entered_tell]
        if e.event.KIND is EventKind.TOOL_CALL_REQUESTED
    ]
    assert prefix_tools == ["issue_refund", "publish_post"]


@SQLITE
def test_a_refund_cut_before_it_was_sent_in_an_agent_node_is_probed_and_performed_once(
    tmp_path: Path, store_url: str
) -> None:
    script, document = writes_then_tell(
        tool_loop_script([("issue_refund", REFUND)], final_text="ok")
    )
    effects = tmp_path / "effects.jsonl"
    daemon = Daemon(tmp_path, store_url, effects)
    with ScriptedProvider(script) as provider:
        daemon.env["SALVOR_MODEL_BASE_URL"] = provider.base_url
        # Killed with the refund's intent durable and nothing sent to the bank.
        daemon.env["SALVOR_FAULT_KILL_IN_TOOL"] = "issue_refund:before"
        daemon.start()
        try:
            client = httpx.Client(base_url=daemon.base_url, timeout=30)
            agent = register_agent(client, provider, ("issue_refund",))
            for node in document["nodes"]:
                node["agent"] = agent
            run_id = start_graph_run(client, document, "go")
            daemon.proc.wait(timeout=SETTLE_SECONDS)
            assert ledger(effects) == []
            # The restart probes the open refund (no person): not landed, so it is sent once.
            del daemon.env["SALVOR_FAULT_KILL_IN_TOOL"]
            daemon.start()
            body = wait_state(client, run_id, "completed")
            client.close()
        finally:
            daemon.kill()

    assert body["status"]["output"] == {"tell": "after ok"}
    (refund,) = [r for r in ledger(effects) if r["tool"] == "issue_refund"]
    log = stored_log(store_url, run_id)
    (completion,) = [
        e.event
        for e in log
        if e.event.KIND is EventKind.TOOL_CALL_COMPLETED and e.event.seq == refund["seq"]
    ]
    assert completion.output == refund["refund"] and completion.settled_by is None
    assert no_open_intent(log)
    with EventStore.open(store_url) as store:
        answer = store.claims.probe_answers([(run_id, refund["seq"])])[(run_id, refund["seq"])]
    assert (answer.tool, answer.verdict) == ("lookup_refund", "not_landed")
