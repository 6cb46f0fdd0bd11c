"""Two `salvor serve` over one store: a dead node's runs finish on its peer (each node killed in
turn and started again), a paused node does nothing once it wakes, either node answers for a run
the other drives, and a stream on either follows it.

Real processes on one store (an SQLite file, and PostgreSQL when ``SALVOR_TEST_POSTGRES_URL`` is
set), the scripted provider as the model (it counts every call it serves, and holds chosen calls
in flight so a kill or a pause lands mid-call), the demo tools' ledger as the world (every
lookup, refund and email a node performs). The invariants are the kill suites': every log
contiguous and legal, no completed model call served again, no tool performed twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from salvor.protocol import EventKind, RunState
from salvor.store import EventStore

from tests.chaos.test_kill_cli import _tool_results
from tests.chaos.test_kill_serve import Daemon, agent_toml, assert_log_valid, step_reply
from tests.support.pausing import stop_outside_writes
from tests.support.scripted_provider import ProviderCall, Reply, ScriptedProvider

pytestmark = pytest.mark.kill

LEASE = "2"
MARGIN = "0.5"
SETTLE_SECONDS = 90.0
GATE_INPUT = {"approved": True, "note": "approved on the other node"}


def plan_of(call: ProviderCall) -> dict:
    return json.loads(call.request["messages"][0]["content"][0]["text"])


def script(call: ProviderCall) -> Reply:
    return step_reply(call, plan_of(call)["plan"])


class Held:
    """The provider's hook: holds the model calls it picks, each until it is let go."""

    def __init__(self) -> None:
        self.picking = True
        self.released = threading.Event()  # lets every held call go, now and later
        self.lock = threading.Lock()
        self.held: list[str] = []  # request hashes held, in arrival order
        self.gates: list[threading.Event] = []  # one per held call: set lets it go

    def __call__(self, call: ProviderCall) -> None:
        with self.lock:
            if not self.picking or _tool_results(call) != plan_of(call)["hold_at"]:
                return
            self.held.append(call.request_hash)
            gate = threading.Event()
            self.gates.append(gate)
        deadline = time.monotonic() + SETTLE_SECONDS
        while not (gate.is_set() or self.released.is_set()) and time.monotonic() < deadline:
            gate.wait(0.05)

    def let_go(self) -> None:
        """Let every call held so far go (later ones are held again while picking)."""
        with self.lock:
            for gate in self.gates:
                gate.set()

    def wait_held(self, n: int) -> None:
        until(lambda: len(self.held) >= n, f"{n} model calls held in flight")


def until(check, what: str, timeout: float = SETTLE_SECONDS) -> Any:
    """Poll ``check`` (bounded) until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout:g}s: {what}")


class Cluster:
    """Two nodes (or one per name of ``names``) over one store, the scripted provider, and the
    ledger of the world."""

    def __init__(self, tmp_path: Path, store_url: str, names: tuple = ("n1", "n2")) -> None:
        self.store_url = store_url
        self.effects = tmp_path / "effects.jsonl"
        self.hook = Held()
        self.provider = ScriptedProvider(script, on_call=self.hook)
        self.nodes: list[Daemon] = []
        for name in names:
            where = tmp_path / name
            where.mkdir()
            node = Daemon(where, store_url, self.effects)
            node.args += [
                "--model-endpoint",
                self.provider.base_url,
                "--node-name",
                name,
                "--lease-seconds",
                LEASE,
                "--fence-margin-seconds",
                MARGIN,
            ]
            self.nodes.append(node)
        self.http = [httpx.Client(base_url=n.base_url, timeout=10) for n in self.nodes]
        self.agent: str | None = None
        self.plans: dict[str, list] = {}

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        response = self.http[0].post(
            "/v1/agents",
            content=agent_toml(self.provider.base_url),
            headers={"content-type": "application/toml"},
        )
        assert response.status_code == 201, response.text
        self.agent = response.json()["agent"]

    def close(self) -> None:
        self.hook.released.set()
        for node in self.nodes:
            if node.proc is not None and node.alive():
                os.kill(node.proc.pid, signal.SIGCONT)
                node.kill()
        for client in self.http:
            client.close()
        self.provider.stop()

    def said(self, index: int, pattern: str) -> re.Match | None:
        """The first line of node ``index``'s current log matching ``pattern`` (the whole log:
        ``Daemon.log`` keeps a tail, which a burst of lines after the one looked for would
        push it out of)."""
        node = self.nodes[index]
        text = (node.tmp_path / f"serve-{node.starts - 1:03d}.log").read_text(errors="replace")
        return re.search(pattern, text)

    def node_id(self, index: int) -> str:
        found = re.search(r"as node (\S+),", self.nodes[index].log())
        assert found, self.nodes[index].log()
        return found.group(1)

    def start_run(self, on: int, plan: list, hold_at: int) -> str:
        run_id = str(uuid.uuid4())
        self.plans[run_id] = plan
        body = {
            "agent": self.agent,
            "run_id": run_id,
            "labels": {"suite": "cluster"},
            "input": {"plan": plan, "hold_at": hold_at},
        }
        response = self.http[on].post("/v1/runs", json=body)
        assert response.status_code == 201, response.text
        return run_id

    def run(self, on: int, run_id: str) -> dict:
        response = self.http[on].get(f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_state(self, on: int, run_id: str, state: str) -> dict:
        return until(
            lambda: (body := self.run(on, run_id))["status"]["state"] == state and body,
            f"run {run_id} {state} on node {on + 1}",
        )

    def ledger(self) -> list[dict]:
        if not self.effects.exists():
            return []
        records = map(json.loads, self.effects.read_text(encoding="utf-8").splitlines())
        return [r for r in records if r["tool"] != "issue_refund:sent"]

    def log(self, run_id: str) -> list:
        with EventStore.open(self.store_url) as store:
            return store.read_log(run_id)

    def check(self, held: Counter) -> None:
        """Every run completed with a legal log; each model call served once (twice when a stop
        cut it while it was held in flight); each tool performed once."""
        served = self.provider.count_by_request_hash()
        performed = Counter((r["run_id"], r["seq"]) for r in self.ledger())
        with EventStore.open(self.store_url) as store:
            for run_id, plan in self.plans.items():
                log = store.read_log(run_id)
                view = assert_log_valid(log)
                assert store.read_view(run_id) == view, run_id
                assert view.state is RunState.COMPLETED, (run_id, view.status())
                requested = [
                    e.event.request_hash.removeprefix("sha256:")
                    for e in log
                    if e.event.KIND is EventKind.MODEL_CALL_REQUESTED
                ]
                assert len(requested) == len(set(requested)) == len(plan) + 1, run_id
                for request_hash in requested:
                    assert served[request_hash] == 1 + held[request_hash], (run_id, request_hash)
                intents = [e for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
                assert [e.event.tool for e in intents] == [name for name, _ in plan], run_id
                for intent in intents:
                    if intent.event.tool in ("lookup_invoice", "issue_refund", "send_email"):
                        assert performed[(run_id, intent.seq)] == 1, (run_id, intent.seq)
        assert sum(served.values()) == sum(len(p) + 1 for p in self.plans.values()) + sum(
            held.values()
        )


def plan(case: int) -> list:
    return [
        ["lookup_invoice", {"invoice_id": f"INV-{case}"}],
        ["issue_refund", {"invoice_id": f"INV-K{case}", "amount_cents": 100 + case}],
        ["send_email", {"to": f"c{case}@example.com", "subject": "refunded", "body": "done"}],
    ]


@pytest.fixture
def cluster(tmp_path: Path, store_url: str):
    harness = Cluster(tmp_path, store_url)
    try:
        harness.start()
        yield harness
    finally:
        harness.close()


def test_a_killed_nodes_runs_are_driven_to_the_end_by_its_peer(cluster: Cluster) -> None:
    runs = [cluster.start_run(0, plan(case), hold_at=case % 4) for case in range(8)]
    cluster.hook.wait_held(len(runs))
    first = cluster.node_id(0)
    # The peer reads who drives each run from the store.
    for run_id in runs:
        body = cluster.run(1, run_id)
        assert (body["driver"], body.get("driver_node")) == ("attached", first), body
    cluster.nodes[0].kill()
    cut = Counter(cluster.hook.held)
    cluster.hook.picking = False
    cluster.hook.released.set()
    for run_id in runs:
        cluster.wait_state(1, run_id, "completed")
    cluster.check(cut)
    second = cluster.node_id(1)
    with EventStore.open(cluster.store_url) as store:
        assert {store.owners.owner(r).node_id for r in runs} == {second}


def test_a_paused_node_wakes_past_its_lease_and_does_nothing(cluster: Cluster) -> None:
    run_id = cluster.start_run(0, plan(0), hold_at=1)  # its answer asks for the refund
    cluster.hook.wait_held(1)
    paused = cluster.nodes[0].proc.pid
    stop_outside_writes(paused, cluster.store_url)
    try:
        # The peer takes the run over once the paused node's lease lapsed, and issues the call
        # again (held too: the run's log stays where the paused node left it).
        cluster.hook.wait_held(2)
        log, ledger = cluster.log(run_id), cluster.ledger()
        # The paused node's own call has its answer, asking for the refund, as it wakes.
        cluster.hook.gates[0].set()
    finally:
        os.kill(paused, signal.SIGCONT)
    # Whichever it learns first ends the drive and names it: its lease's deadline passed, the
    # store refused its renewal, its heartbeat found the run taken, or the fence refused an append.
    until(
        lambda: cluster.said(0, rf"run {run_id}: .*(lease|taken over|took the run over)"),
        "the woken node saying its drive ended",
    )
    # It appended nothing (the next seq was free: only the fence refused it) and refunded nothing.
    assert cluster.log(run_id) == log
    assert cluster.ledger() == ledger
    cluster.hook.released.set()
    cluster.wait_state(1, run_id, "completed")
    cluster.check(Counter(cluster.hook.held[:1]))


def test_either_node_answers_a_gate_of_a_run_the_other_owns(cluster: Cluster) -> None:
    gated = [["request_approval", {"reason": "refund?"}], *plan(3)]
    run_id = cluster.start_run(0, gated, hold_at=-1)
    cluster.wait_state(0, run_id, "suspended")
    response = cluster.http[1].post(f"/v1/runs/{run_id}/resume", json={"input": GATE_INPUT})
    assert response.status_code in (200, 202), response.text
    cluster.wait_state(1, run_id, "completed")
    cluster.check(Counter())
    events = [e.event for e in cluster.log(run_id)]
    assert [e.input for e in events if e.KIND is EventKind.RESUMED] == [GATE_INPUT]


def test_an_abandon_sent_to_the_peer_stops_the_drive_of_the_owner(cluster: Cluster) -> None:
    run_id = cluster.start_run(0, plan(5), hold_at=1)
    cluster.hook.wait_held(1)
    response = cluster.http[1].post(f"/v1/runs/{run_id}/abandon", json={"reason": "not needed"})
    assert response.status_code == 200, response.text
    until(
        lambda: cluster.said(0, rf"run {run_id}.*(ended elsewhere|took the run over)"),
        "the owner stopping its drive",
    )
    log = cluster.log(run_id)
    assert log[-1].event.KIND is EventKind.RUN_ABANDONED
    ledger = cluster.ledger()
    cluster.hook.released.set()
    until(lambda: cluster.run(0, run_id).get("driver") is None, "the run at rest on its owner")
    assert cluster.log(run_id) == log
    assert cluster.ledger() == ledger


def test_a_stream_on_the_peer_follows_a_run_the_other_node_drives_through_a_quiet_spell(
    cluster: Cluster,
) -> None:
    run_id = cluster.start_run(0, plan(6), hold_at=1)
    cluster.hook.wait_held(1)
    # Quiet for longer than the stream's detach grace (5 s) before the run goes on.
    timer = threading.Timer(7.0, cluster.hook.released.set)
    timer.start()
    try:
        url = f"{cluster.nodes[1].base_url}/v1/runs/{run_id}/events"
        lines = []
        with httpx.stream("GET", url, timeout=SETTLE_SECONDS) as stream:
            for line in stream.iter_lines():
                lines.append(line)
                if len(lines) >= 2 and lines[-2] == "event: end":
                    break
    finally:
        timer.cancel()
    end = json.loads(lines[-1].removeprefix("data:").strip())
    assert "detached" not in end and end["status"]["state"] == "completed", lines[-6:]
    cluster.check(Counter())


def test_each_node_killed_in_turn_and_started_again_loses_nothing(cluster: Cluster) -> None:
    cut: Counter = Counter()
    for victim in (0, 1, 0):
        peer = 1 - victim
        before = len(cluster.hook.held)
        cluster.hook.picking = True
        runs = [
            cluster.start_run(victim, plan(len(cluster.plans)), hold_at=case % 4)
            for case in range(4)
        ]
        cluster.hook.wait_held(before + len(runs))
        cluster.nodes[victim].kill()
        cut.update(cluster.hook.held[before:])
        cluster.hook.picking = False  # the peer's calls go through
        cluster.hook.let_go()
        for run_id in runs:
            cluster.wait_state(peer, run_id, "completed")
        # Started again (a new node: the old one's runs went to its peer, none are left to it).
        cluster.nodes[victim].start()
    cluster.check(cut)
