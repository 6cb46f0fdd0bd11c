"""Benchmark: how soon a SIGKILLed node's runs are driven again by its peers, and that nothing was
performed twice.

``--nodes`` real ``salvor serve --demo-tools`` processes over one PostgreSQL schema (made for
the run and dropped after it), each at the default lease and fence margin, share one scripted
provider. ``--runs`` runs are started over HTTP, spread over the nodes in turn; each walks a plan
of four tools (a lookup, a refund keyed on an invoice of its own, a second lookup, an email), so
five model calls. The provider answers every call after a short random delay and holds each run's
call at one step of its plan (the step varies by run, so runs stand before and after their
refund) until the kill, so every run is in flight at that instant: its owner row names its node,
marked driving. A node drives at most ``ServeConfig.recovery_concurrency`` runs at once; the
others it owns wait, claimed, for a slot.

The victim (the first node) is SIGKILLed at instant T (the bench's monotonic clock, read just
before the signal), and the held calls of the other nodes are let go, so the survivors are busy
with their own runs while they take the victim's over. Two signals, per run the victim owned:

* ``claimed``: the store's owner row names a live node other than the victim, marked driving, at
  a higher epoch than at T (polled from the bench every 20 ms: one query for all of them). This
  is the takeover itself: from then on exactly one live node holds the run.
* ``reissued``: the provider receives a call of that run after T, which only its new owner can
  send (the victim is dead): the run is moving again. It includes the wait for a pacing slot on
  the new owner, which the survivors' own runs share.

``--peers remote`` (the default) makes the victim look like a node on another machine (its
``nodes`` row's ``boot_id`` is rewritten before any run starts), so its peers judge it by its
lease alone, as they must across hosts: the issue's target, lease + 2 s, is about that case.
``--peers local`` leaves it on this machine, where a peer proves a dead pid dead by the kernel
at its next heartbeat, without waiting for the lease.

Beside them, to tell where the time went: when the victim's lease lapsed in the store (its expiry
against the database's clock), each claim's time after that lapse, and when each survivor's sweep
that found the victim's runs ended (its "taking over" log line).

The floor, from the same configuration: a lease is renewed every ``lease / 6`` s and swept for
every ``TAKEOVER_SECONDS``, so a peer can first take a run over ``lease - heartbeat`` after T, and
at the latest ``lease + sweep`` (printed as ``floor_seconds``), before any cost of its own.

Then every run is let finish, and checked: every log contiguous and legal and completed; each
refund performed once (the ledger's answered refunds, by invoice); each email delivered once per
key; no model call served more often than once, plus once for a call the kill cut (the last call
of each of the victim's runs begun before T).

Prints one JSON object; never a timed assertion.

    python tests/bench/bench_takeover.py [--store URL] [--nodes 3] [--runs 300]
    [--peers remote|local] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
from salvor.daemon.cluster._lease import (
    DEFAULT_FENCE_MARGIN_SECONDS,
    DEFAULT_LEASE_SECONDS,
    HEARTBEATS_PER_LEASE,
)
from salvor.daemon.cluster._takeover import TAKEOVER_SECONDS
from salvor.daemon.serve._serve import ServeConfig
from salvor.protocol import EventKind, RunState
from salvor.store import EventStore
from sqlalchemy import text

from tests.bench.bench_store import bench_store_url
from tests.chaos.test_kill_cli import _tool_results
from tests.chaos.test_kill_serve import Daemon, agent_toml, assert_log_valid, step_reply
from tests.support.scripted_provider import ProviderCall, Reply, ScriptedProvider

TARGET_SLACK_SECONDS = 2.0  # the figure: within lease + 2 s
POLL_SECONDS = 0.02
ANSWER_DELAY = (0.1, 0.5)  # seconds the provider takes for a call it does not hold
SETTLE_SECONDS = 600.0
TOOLS = ["lookup_invoice", "issue_refund", "send_email"]
DRIVES_PER_NODE = ServeConfig.__dataclass_fields__["recovery_concurrency"].default


def plan_of(call: ProviderCall) -> dict:
    return json.loads(call.request["messages"][0]["content"][0]["text"])


def plan(case: int) -> list:
    return [
        ["lookup_invoice", {"invoice_id": f"INV-{case}"}],
        ["issue_refund", {"invoice_id": f"INV-K{case}", "amount_cents": 100 + case}],
        ["lookup_invoice", {"invoice_id": f"INV-{case}-after"}],
        ["send_email", {"to": f"c{case}@example.com", "subject": "refunded", "body": "done"}],
    ]


class Provider:
    """The scripted provider's hook: holds each run's call at its ``hold_at`` step until the
    kill, delays every other call, and notes every call's run and instant."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.holding = True
        self.released = threading.Event()
        self.held = 0
        self.calls: list[tuple[float, str, str]] = []  # (monotonic, run id, request hash)
        self.server = ScriptedProvider(self.script, on_call=self.on_call)

    def script(self, call: ProviderCall) -> Reply:
        return step_reply(call, plan_of(call)["plan"])

    def on_call(self, call: ProviderCall) -> None:
        body = plan_of(call)
        with self.lock:
            self.calls.append((time.monotonic(), body["run_id"], call.request_hash))
            hold = self.holding and _tool_results(call) == body["hold_at"]
            if hold:
                self.held += 1
            delay = self.rng.uniform(*ANSWER_DELAY)
        if hold:
            self.released.wait(SETTLE_SECONDS)
        time.sleep(delay)

    def release(self) -> None:
        with self.lock:
            self.holding = False
        self.released.set()


def until(check, what: str, timeout: float = SETTLE_SECONDS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"not within {timeout:g}s: {what}")


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {
        "count": len(ordered),
        "min": round(ordered[0], 3),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(ordered[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=os.environ.get("SALVOR_TEST_POSTGRES_URL"))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--peers", choices=("remote", "local"), default="remote")
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if not args.store or not args.store.startswith("postgresql"):
        raise SystemExit("--store takes a postgresql:// URL (or set SALVOR_TEST_POSTGRES_URL)")
    if args.nodes < 2:
        raise SystemExit("--nodes must be at least 2: one to kill and one to take over")
    scratch = args.dir or Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    scratch.mkdir(parents=True, exist_ok=True)
    with bench_store_url(args.store, scratch) as store_url:
        print(json.dumps(_measure(store_url, scratch, args)))


def _node_id(node: Daemon) -> str:
    found = re.search(r"as node (\S+),", node.log())
    if not found:
        raise SystemExit(f"no node id in the daemon's log:\n{node.log()}")
    return found.group(1)


def _measure(store_url: str, scratch: Path, args) -> dict:
    load_before = os.getloadavg()
    effects = scratch / "effects.jsonl"
    provider = Provider(args.seed)
    nodes: list[Daemon] = []
    for index in range(args.nodes):
        where = scratch / f"n{index}"
        where.mkdir()
        node = Daemon(where, store_url, effects)
        node.args += ["--model-endpoint", provider.server.base_url, "--node-name", f"n{index}"]
        nodes.append(node)
    store = EventStore.open(store_url)
    try:
        for node in nodes:
            node.start()
        ids = [_node_id(node) for node in nodes]
        victim, victim_id = nodes[0], ids[0]
        if args.peers == "remote":
            # The victim plays a node on another machine: its peers cannot ask their kernel
            # about its pid, so only its lease tells them it is gone.
            with store._engine.begin() as connection:
                connection.execute(
                    text("UPDATE nodes SET boot_id = 'another-host' WHERE node_id = :node_id"),
                    {"node_id": victim_id},
                )
        return _drive(store, provider, nodes, ids, victim, victim_id, effects, args, load_before)
    finally:
        provider.release()
        for node in nodes:
            if node.alive():
                node.kill()
        provider.server.stop()
        store.close()


def _drive(store, provider, nodes, ids, victim, victim_id, effects, args, load_before) -> dict:
    clients = [httpx.Client(base_url=node.base_url, timeout=60) for node in nodes]
    response = clients[0].post(
        "/v1/agents",
        content=agent_toml(provider.server.base_url, tools=TOOLS),
        headers={"content-type": "application/toml"},
    )
    response.raise_for_status()
    agent = response.json()["agent"]
    run_ids = [str(uuid.uuid4()) for _ in range(args.runs)]
    plans = {run_id: plan(case) for case, run_id in enumerate(run_ids)}

    def start(case: int) -> None:
        run_id = run_ids[case]
        body = {
            "agent": agent,
            "run_id": run_id,
            "input": {"plan": plans[run_id], "hold_at": case % 5, "run_id": run_id},
        }
        response = clients[case % len(clients)].post("/v1/runs", json=body)
        if response.status_code != 201:
            raise SystemExit(f"a run did not start: {response.status_code} {response.text}")

    began = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(start, range(args.runs)))
    started_seconds = time.monotonic() - began

    def in_flight():
        owners = store.owners.owners(run_ids)
        if len(owners) < len(run_ids) or not all(
            o.driving and o.node_live for o in owners.values()
        ):
            return None
        per_node = Counter(o.node_id for o in owners.values())
        expected = sum(min(n, DRIVES_PER_NODE) for n in per_node.values())
        return owners if provider.held >= expected else None

    at_kill = until(in_flight, "every run in flight")
    victims = {r: o.epoch for r, o in at_kill.items() if o.node_id == victim_id}
    load_at_kill = os.getloadavg()

    kill_at, kill_wall = time.monotonic(), time.time()
    os.kill(victim.proc.pid, signal.SIGKILL)
    provider.release()
    claimed: dict[str, tuple[float, str]] = {}
    seen_driving = 0
    while len(claimed) < len(victims) and time.monotonic() - kill_at < SETTLE_SECONDS:
        now = time.monotonic()
        for run_id, owner in store.owners.owners(list(victims)).items():
            if run_id in claimed:
                continue
            # Another node's at a higher epoch: a peer won the claim (driving it, unless it
            # already let it rest between two polls).
            if owner.node_id not in (None, victim_id) and owner.epoch > victims[run_id]:
                claimed[run_id] = (now - kill_at, owner.node_id)
                seen_driving += owner.driving and owner.node_live
        time.sleep(POLL_SECONDS)
    victim.proc.wait()
    lapsed = _lease_left(store, victim_id, kill_at)

    def settled():
        states = Counter(store.read_view(r).state for r in run_ids)
        done = sum(n for s, n in states.items() if s not in _ACTIVE)
        return states if done == len(run_ids) else None

    states = until(settled, "every run at rest")
    finished_seconds = time.monotonic() - kill_at

    with provider.lock:
        calls = list(provider.calls)
    reissued: dict[str, float] = {}
    cut: dict[str, str] = {}  # a victim run's last call begun before T: the kill may cut it
    for at, run_id, request_hash in calls:
        if run_id not in victims:
            continue
        if at < kill_at:
            cut[run_id] = request_hash
        elif run_id not in reissued:
            reissued[run_id] = at - kill_at
    checks = _check(store, run_ids, plans, effects, provider, cut)

    lease, margin = DEFAULT_LEASE_SECONDS, DEFAULT_FENCE_MARGIN_SECONDS
    heartbeat = lease / HEARTBEATS_PER_LEASE
    target = lease + TARGET_SLACK_SECONDS
    claim_times = [t for t, _ in claimed.values()]
    for client in clients:
        client.close()
    return {
        "bench": "takeover",
        "backend": "postgresql",
        "nodes": args.nodes,
        "runs": args.runs,
        "peers": args.peers,
        "lease_seconds": lease,
        "fence_margin_seconds": margin,
        "heartbeat_seconds": heartbeat,
        "sweep_seconds": TAKEOVER_SECONDS,
        "drives_per_node": DRIVES_PER_NODE,
        "started_seconds": round(started_seconds, 2),
        "victim_runs": len(victims),
        "taken_by": dict(Counter(node for _, node in claimed.values())),
        "victim_lease_lapsed_after_kill": round(lapsed, 3),
        "sweep_found_after_kill": _sweeps_after(nodes[1:], ids[1:], kill_wall),
        "claimed": _percentiles(claim_times),
        "claimed_after_lapse": _percentiles([t - lapsed for t in claim_times]),
        "reissued": _percentiles(list(reissued.values())),
        "claimed_seen_driving_on_a_live_node": seen_driving,
        "not_claimed": len(victims) - len(claimed),
        "not_reissued": len(victims) - len(reissued),
        "floor_seconds": {
            "first": round(lease - heartbeat, 3) if args.peers == "remote" else 0.0,
            "last": round(lease + TAKEOVER_SECONDS, 3)
            if args.peers == "remote"
            else round(heartbeat + TAKEOVER_SECONDS, 3),
        },
        "target_seconds": target,
        "claimed_over_target": sum(t > target for t in claim_times),
        "reissued_over_target": sum(t > target for t in reissued.values()),
        **checks,
        "states": {s.value: n for s, n in states.items()},
        "finished_seconds_after_kill": round(finished_seconds, 2),
        "meets_target": (
            len(claimed) == len(victims)
            and all(t <= target for t in claim_times)
            and checks["duplicates"] == 0
        ),
        "load_before": [round(x, 2) for x in load_before],
        "load_at_kill": [round(x, 2) for x in load_at_kill],
        "cpus": os.cpu_count(),
    }


TAKING_OVER = r"^(\S+ \S+) salvor\.cluster INFO taking over"


def _sweeps_after(nodes: list[Daemon], ids: list[str], kill_wall: float) -> dict:
    """Per survivor, seconds from the kill until each of its sweeps that found runs to take
    over ended (its log's "taking over" lines, stamped by the node's clock, this machine's)."""
    found = {}
    for node, node_id in zip(nodes, ids, strict=True):
        seconds = []
        written = (node.tmp_path / f"serve-{node.starts - 1:03d}.log").read_text(errors="replace")
        for stamp in re.findall(TAKING_OVER, written, re.MULTILINE):
            at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at > kill_wall:
                seconds.append(round(at - kill_wall, 3))
        found[node_id] = seconds
    return found


def _lease_left(store, victim_id: str, kill_at: float) -> float:
    """Seconds from the kill until the victim's lease lapsed in the store (the database's clock:
    its expiry less the database's now, read after the kill, plus the time since the kill)."""
    now = _NOW_SQL
    with store._engine.connect() as connection:
        expires, now_text = connection.execute(
            text(f"SELECT lease_expires_at, {now} FROM nodes WHERE node_id = :node_id"),
            {"node_id": victim_id},
        ).one()
        read_at = time.monotonic()
    return (_instant(expires) - _instant(now_text)).total_seconds() + (read_at - kill_at)


def _instant(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")


_NOW_SQL = "to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"


_ACTIVE = {RunState.NOT_STARTED, RunState.RUNNING, RunState.AWAITING_MODEL, RunState.AWAITING_TOOL}


def _check(store, run_ids, plans, effects: Path, provider: Provider, cut: dict) -> dict:
    """What was performed twice, and which logs are not whole."""
    records = [json.loads(line) for line in effects.read_text(encoding="utf-8").splitlines()]
    refunds = Counter(r["input"]["invoice_id"] for r in records if r["tool"] == "issue_refund")
    emails = Counter(
        r["idempotency_key"] for r in records if r["tool"] == "send_email" and r["delivered"]
    )
    lookups = Counter((r["run_id"], r["seq"]) for r in records if r["tool"] == "lookup_invoice")
    served = provider.server.count_by_request_hash()
    allowed = Counter(cut.values())
    model_twice = sum(
        max(0, served[h] - 1 - allowed[h]) for h in served if served[h] > 1 + allowed[h]
    )
    bad_logs, incomplete = 0, 0
    for run_id in run_ids:
        log = store.read_log(run_id)
        try:
            view = assert_log_valid(log)
        except Exception:  # noqa: BLE001 -- counted, the run named below
            bad_logs += 1
            continue
        intents = [e.event.tool for e in log if e.event.KIND is EventKind.TOOL_CALL_REQUESTED]
        if view.state is not RunState.COMPLETED or intents != [n for n, _ in plans[run_id]]:
            incomplete += 1
    refunds_twice = sum(n - 1 for n in refunds.values() if n > 1)
    emails_twice = sum(n - 1 for n in emails.values() if n > 1)
    return {
        "refunds": sum(refunds.values()),
        "refunds_twice": refunds_twice,
        "emails_delivered_twice": emails_twice,
        "lookups_twice": sum(n - 1 for n in lookups.values() if n > 1),
        "model_calls_served": sum(served.values()),
        "model_calls_served_twice_beyond_cut": model_twice,
        "duplicates": refunds_twice + emails_twice + model_twice,
        "bad_logs": bad_logs,
        "not_completed_as_planned": incomplete,
    }


if __name__ == "__main__":
    main()
