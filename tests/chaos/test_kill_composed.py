"""Kill safety of composed runs: graph runs and subagent trees under SIGKILL, a kill during a
SIGTERM shutdown, and two kills in quick succession, on a real `salvor serve`.

The workload keeps a handful of roots in flight, each refunding invoices of its own (no two runs
share an invoice, so every write a kill interrupts is a real one):

* a graph run: a ``map`` over 2-4 invoices whose body is the ``refunder`` agent (one child run
  per item: look the invoice up, refund it with the keyed, probed ``issue_refund``), a ``fold``
  counting the items, a ``gate`` the workload answers over the API (approved or not, drawn per
  run), and a ``branch`` on that answer: approved, a ``send_email`` tool node; refused, a
  refunder agent node inside the graph run itself, refunding one more invoice;
* a subagent tree: a ``delegator`` whose ``subagent`` calls reach refunders, directly or through
  a second delegator, one leaf per invoice.

The model is the scripted provider of ``test_kill_serve`` (answering after a short random delay,
so calls are in flight when kills land), walking a script read from each run's first message;
the demo tools' ledger counts every refund that reached the bank. The daemon is stopped at random
instants in one of four ways: a SIGKILL; a SIGTERM, then a SIGKILL while it shuts down; a
SIGKILL, a restart, and a second SIGKILL within half a second of READY; a SIGKILL, then a restart
that kills itself inside its next refund (the demo tools' fault points: before the refund is
sent, between sending it and the bank's answer, after the answer). Nothing acts on the runs but
the workload: no resume but a gate's answer, no resolve, no abandon.

After every stop (daemon dead) and at the end, over every run of every tree:

* every log is contiguous and legal event by event (``assert_log_valid``), and the store's fold
  agrees with it;
* no identity was performed twice: the ledger holds at most one refund per invoice; every refund
  a log records as done (performed, or found by its probe) is the ledger's one;
* every map item's child finished exactly once: a graph run records each item at most once
  (once, when the map exited), under the child id the walk derives, and that child completed;
* nothing was done by hand: every resume carries the workload's gate answer, nothing was
  resolved by an operator or abandoned.

At the end, once the last restart had time to settle: every tree completed, or rests with a write
parked whose probe could not tell (the bank was sent the refund, its answer never recorded) and
every other unfinished run of the tree waiting on it. Anything else is a run needing a hand.

CI runs a short schedule here (14 stops on SQLite, 8 on PostgreSQL). The long run is a
script a person starts (``python -m tests.chaos.composed_chaos --kills 500``), printing one JSON
line; ``SALVOR_CHAOS_SEED`` picks the seed here.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from salvor.daemon.flows import child_run_id
from salvor.daemon.graphs import map_child_id
from salvor.protocol import EventKind, GuardRefusal, RunState
from salvor.store import EventStore

from tests.chaos.test_kill_serve import (
    KILL_DELAY,
    Chaos,
    agent_toml,
    assert_log_valid,
    step_reply,
)
from tests.support.disk import Filler, TmpfsRefused, tmpfs
from tests.support.scripted_provider import ProviderCall, Reply

pytestmark = pytest.mark.kill

SEED = int(os.environ.get("SALVOR_CHAOS_SEED", "20261206"))
# Roots in flight at once: each is several runs (a map's items, a tree's levels), on two cores.
IN_FLIGHT = 6
MAP_NODE = "each"
FINAL_TEXT = "refunds settled"
# How long a SIGTERMed daemon may shut down before the SIGKILL lands, in seconds (its deadline is
# longer; an idle one is done within a tenth of a second, so the kill often cuts the shutdown).
SIGTERM_GRACE = (0.0, 0.08)
# A second kill within this long after the restart's READY, in seconds (inside its recovery).
DOUBLE_KILL_WITHIN = 0.5
# The last restart's time to finish what it can by itself, in seconds.
SETTLE_SECONDS = 180.0
# Roots still going this long into the settling are named in the figures (a wait nobody ends).
SLOW_SECONDS = 30.0
# The settling ends early once nothing moved this long: what is left is parked, or stuck.
QUIET_SECONDS = 15.0
KILL_KINDS = ("random", "sigterm", "double", "in_write")
# Where the daemon kills itself inside a refund (the demo tools' fault points): after the intent
# is durable and before anything was sent; after the bank answered, before the call returned;
# between sending it and recording the bank's answer (its probe cannot tell).
IN_TOOL_VAR = "SALVOR_FAULT_KILL_IN_TOOL"
WRITE_POINTS = ("issue_refund:before", "issue_refund", "issue_refund:sent")
# How long a daemon started with a fault point may take to reach a refund, in seconds.
WRITE_WAIT = 20.0
# A disk-full cycle: the disk stays full until a drive stopped on it (SQLite writes into the
# room its WAL file already has, so a fill may take a while to bite), then this much longer, at
# most FULL_AT_MOST; then the load runs on the freed disk this long before the next cycle.
FULL_AFTER_A_STOP = (0.0, 3.0)
FULL_AT_MOST = 30.0
FREED_FOR = (1.0, 6.0)
# Status codes a start may answer while the store refuses writes: tried again on the next round.
STORE_REFUSED = frozenset({503, 507})


# --------------------------------------------------------------------------
# The workload: documents, agents, and the script the provider walks
# --------------------------------------------------------------------------


def refund_amount(invoice: str) -> int:
    return 100 + sum(map(ord, invoice)) % 900


def composed_script(call: ProviderCall) -> Reply:
    """One tool call per answer, read from the run's first message: a refunder looks its
    invoice up and refunds it; a delegator hands its invoices on with ``subagent``, to the next
    agent of its ``path``, one call per invoice when that agent is the last."""
    request = call.request
    work = json.loads(request["messages"][0]["content"][0]["text"])
    work = work.get("inputs", work)  # a subagent child's input: its task and its inputs
    if "path" in work:
        head, *rest = work["path"].split(",")
        if rest:
            steps = [
                [
                    "subagent",
                    {
                        "agent": head,
                        "task": "delegate",
                        "inputs": {"path": ",".join(rest), "invoices": work["invoices"]},
                    },
                ]
            ]
        else:
            steps = [
                ["subagent", {"agent": head, "task": "refund", "inputs": {"invoice_id": invoice}}]
                for invoice in work["invoices"].split()
            ]
    else:
        invoice = work["invoice_id"]
        steps = [
            ["lookup_invoice", {"invoice_id": invoice}],
            ["issue_refund", {"invoice_id": invoice, "amount_cents": refund_amount(invoice)}],
        ]
    return step_reply(call, steps, final=FINAL_TEXT)


def composed_graph(refunder: str) -> dict:
    """Refund every item (a map of refunder children), count them, ask, and on the answer
    either email or refund one more invoice inside the graph run itself."""
    return {
        "schema_version": 1,
        "nodes": [
            {
                "id": MAP_NODE,
                "kind": "map",
                "over": "$input.items",
                "concurrency": 2,
                "body": {"kind": "agent", "agent": refunder, "input": "$item"},
            },
            {"id": "tally", "kind": "fold", "over": f"$nodes.{MAP_NODE}", "reducer": "count"},
            {"id": "approve", "kind": "gate", "prompt": "Tell the customer?"},
            {
                "id": "route",
                "kind": "branch",
                "on": "$nodes.approve.approved",
                "cases": ["true", "false"],
                "default": "false",
            },
            {
                "id": "notify",
                "kind": "tool",
                "tool": "send_email",
                "input": {"to": "ops@example.com", "subject": "refunds", "body": "$input.case"},
            },
            {"id": "extra", "kind": "agent", "agent": refunder, "input": "$input.extra"},
        ],
        "edges": [
            {"from": MAP_NODE, "to": "tally"},
            {"from": "tally", "to": "approve"},
            {"from": "approve", "to": "route"},
            {"from": "route", "to": "notify", "case": "true"},
            {"from": "route", "to": "extra", "case": "false"},
        ],
    }


@dataclass
class Root:
    """One root of the workload and what it was asked to do."""

    case: str
    kind: str  # "graph" or "tree"
    input: dict
    approved: bool = False  # a graph run's gate answer
    run_id: str | None = None  # a graph run's id, once its start was seen


@dataclass
class Member:
    """One run of a tree, as the store holds it."""

    run_id: str
    role: str
    log: list
    parent: str | None = None


@dataclass
class Tally:
    kills: Counter = field(default_factory=Counter)  # stop kind -> SIGKILLs delivered
    stops: int = 0
    graceful: int = 0  # SIGTERMs that finished before their SIGKILL
    gate_answers: int = 0


class Composed(Chaos):
    """The composed workload on `Chaos`'s daemon, provider and HTTP client."""

    def __init__(self, tmp_path: Path, store_url: str, seed: int) -> None:
        super().__init__(tmp_path, store_url, seed, script=composed_script)
        self.seed = seed
        self.roots: dict[str, Root] = {}
        self.violations: list[str] = []
        self.tally = Tally()
        self.stop_named = "none yet"  # the last stop, for the violations it turns up
        self.final: set[str] = set()  # roots whose whole tree completed and was checked
        self.refunder: str | None = None
        self.graph: str | None = None
        self.hands: list[str] = []
        self.slow: list[str] = []  # roots still unsettled SLOW_SECONDS into the settling
        self.settle_seconds = 0.0
        self.parked_at: dict[str, str] = {}  # run -> the stop after which it was first parked
        self.writes_cut: set[tuple[str, int]] = set()  # refunds open at some stop
        self.parked_roots: set[str] = set()  # roots with a run of their tree parked once
        self.settled_by_probe: Counter = Counter()  # the probe's "found" -> refunds it settled
        self.disk_cycles = 0  # the disk filled and freed under the load
        self.cycles_that_bit = 0  # cycles during which /v1/health counted a run healing
        self.healing_seen = 0  # the most runs /v1/health counted healing at once
        self.unfinished = -1  # roots not completed when the settling ended

    # -- set-up and the workload's own actions -----------------------------------------

    def register(self) -> None:
        base = self.provider.base_url
        hashes = []
        for toml in (
            agent_toml(base, "refunder", ["lookup_invoice", "issue_refund"]),
            agent_toml(base, "delegator", [], ["subagent"]),
        ):
            response = self.http.post(
                "/v1/agents", content=toml, headers={"content-type": "application/toml"}
            )
            assert response.status_code == 201, response.text
            hashes.append(response.json()["agent"])
        self.refunder, self.agent = hashes
        response = self.http.post("/v1/graphs", json=composed_graph(self.refunder))
        assert response.status_code == 201, response.text
        self.graph = response.json()["graph"]

    def new_root(self) -> None:
        n = len(self.roots)
        case = f"c{n}-{uuid.uuid4().hex[:8]}"
        if self.rng.random() < 0.5:
            items = [{"invoice_id": f"INV-{case}-{i}"} for i in range(self.rng.randint(2, 4))]
            run_input = {"case": case, "items": items, "extra": {"invoice_id": f"INV-{case}-x"}}
            root = Root(case, "graph", run_input, approved=self.rng.random() < 0.5)
        else:
            path = self.rng.choice(["refunder", "delegator,refunder"])
            invoices = " ".join(f"INV-{case}-{i}" for i in range(self.rng.randint(1, 2)))
            run_input = {"task": "delegate", "inputs": {"path": path, "invoices": invoices}}
            root = Root(case, "tree", run_input, run_id=str(uuid.uuid4()))
        self.roots[case] = root

    def start_roots(self) -> None:
        """Start every root not yet seen started; a graph run whose start may have landed is
        looked for by its case label first (its id is the daemon's to choose)."""
        labels = {"suite": "chaos"}
        for root in self.roots.values():
            if root.case in self.created:
                continue
            if root.kind == "tree":
                body = {
                    "agent": self.agent,
                    "run_id": root.run_id,
                    "labels": labels,
                    "input": root.input,
                }
                response = self.call("POST", "/v1/runs", json=body)
            else:
                found = self.call("GET", "/v1/runs", params={"label": f"case:{root.case}"})
                if found is None:
                    return
                assert found.status_code == 200, found.text
                if found.json()["runs"]:
                    root.run_id = found.json()["runs"][0]["run"]
                    self.created.add(root.case)
                    continue
                body = {
                    "graph_hash": self.graph,
                    "input": root.input,
                    "labels": {**labels, "case": root.case},
                }
                response = self.call("POST", "/v1/graph-runs", json=body)
            if response is None:
                return
            if response.status_code == 201:
                root.run_id = response.json()["run"]
                self.created.add(root.case)
            elif response.status_code == 409 and response.json()["error"]["code"] == "run_exists":
                self.created.add(root.case)
            elif response.status_code in STORE_REFUSED and self.disk_full:
                return  # the store refused its head: started again once it takes writes
            else:
                raise AssertionError(f"starting {root.kind} {root.case}: {response.text}")

    def operate(self, *, top_up: bool) -> int:
        """One round: keep IN_FLIGHT roots going, answer the gates. Returns how many roots are
        not completed (-1 when the daemon did not answer)."""
        active = self.active()
        if active < 0:
            return -1
        if top_up:
            for _ in range(IN_FLIGHT - self.in_flight()):
                self.new_root()
        self.start_roots()
        by_id = {root.run_id: root for root in self.roots.values()}
        for run in self.listed("suspended") or []:
            root = by_id.get(run["run"])
            if root is not None and root.kind == "graph":
                self.tally.gate_answers += 1
                answer = {"approved": root.approved}
                self.call("POST", f"/v1/runs/{run['run']}/resume", json={"input": answer})
        return self.active()

    def active(self) -> int:
        """Roots not completed, as the daemon lists them (-1 when it did not answer)."""
        done = self.listed("completed")
        if done is None:
            return -1
        finished = {r["run"] for r in done}
        return len([r for r in self.roots.values() if r.run_id not in finished])

    def in_flight(self) -> int:
        """Roots going (-1 when the daemon did not answer): a tree resting on a parked write
        makes room for another, or the load would dwindle over a long run. A tree parked once
        and finished since counts as neither (counting it as parked for ever let a long run top
        up hundreds of roots over its IN_FLIGHT, all recovered at once by its last restart)."""
        done = self.listed("completed")
        if done is None:
            return -1
        finished = {r["run"] for r in done}
        return len(
            [
                r
                for r in self.roots.values()
                if r.run_id not in finished and r.case not in self.parked_roots
            ]
        )

    # -- stops ------------------------------------------------------------------------

    def stop(self, kind: str, rng: random.Random) -> None:
        """One stop of the kind named (the daemon is up); the invariants checked after it."""
        if kind == "random":
            delay = rng.uniform(*KILL_DELAY)
            self._under_load(delay, self.daemon.kill)
            self._stopped(f"SIGKILL {delay:.2f}s after READY", kind)
        elif kind == "sigterm":
            delay, grace = rng.uniform(*KILL_DELAY), rng.uniform(*SIGTERM_GRACE)

            def terminate_then_kill() -> None:
                self.daemon.proc.send_signal(signal.SIGTERM)
                time.sleep(grace)
                self.daemon.kill()

            self._under_load(delay, terminate_then_kill)
            if self.daemon.proc.returncode == -signal.SIGKILL:
                self._stopped(f"SIGKILL {grace:.2f}s into a SIGTERM {delay:.2f}s after READY", kind)
            else:
                self.tally.graceful += 1
                self._stopped(f"SIGTERM {delay:.2f}s after READY, done within {grace:.2f}s", None)
        elif kind == "double":
            delay, again = rng.uniform(*KILL_DELAY), rng.uniform(0, DOUBLE_KILL_WITHIN)
            self._under_load(delay, self.daemon.kill)
            self._stopped(f"SIGKILL {delay:.2f}s after READY (first of two)", kind)
            self.daemon.start()
            time.sleep(again)
            self.daemon.kill()
            self._stopped(f"second SIGKILL {again:.2f}s after the restart's READY", kind)
        else:
            delay = rng.uniform(*KILL_DELAY)
            self._under_load(delay, self.daemon.kill)
            self._stopped(f"SIGKILL {delay:.2f}s after READY (before a kill in a refund)", "random")
            point = rng.choices(WRITE_POINTS, (4, 4, 1))[0]
            self.daemon.env[IN_TOOL_VAR] = point
            try:
                self.daemon.start()
            except AssertionError:
                # The fault point fired in recovery, before READY.
                if self.daemon.proc.returncode != -signal.SIGKILL:
                    raise
            finally:
                del self.daemon.env[IN_TOOL_VAR]
            self.operate_until(time.monotonic() + WRITE_WAIT, top_up=True)
            if self.daemon.alive():
                self.daemon.kill()
                self._stopped(f"SIGKILL after {WRITE_WAIT}s with no refund reached", "random")
            else:
                self._stopped(f"the daemon's own SIGKILL in a refund, at {point}", kind)

    disk_full = False  # a disk-full cycle has the disk full now

    def disk_full_cycle(self, disk: Filler, rng: random.Random) -> None:
        """Under the load, fill the store's disk at a random instant, keep it full until a drive
        stopped on it and a little longer (the load goes on: starts the store refuses are tried
        again), free it, and let the load run on. The daemon is not restarted: what the full
        disk stopped must heal by itself."""
        self.operate_until(time.monotonic() + rng.uniform(*KILL_DELAY), top_up=True)
        disk.begin()
        self.disk_full = True
        self.disk_cycles += 1
        self.stop_named = f"disk-full cycle {self.disk_cycles}"
        bit = False
        try:
            deadline = time.monotonic() + FULL_AT_MOST
            while time.monotonic() < deadline:
                self.operate(top_up=True)
                healing = self._healing()
                if healing and not bit:
                    bit = True
                    deadline = min(deadline, time.monotonic() + rng.uniform(*FULL_AFTER_A_STOP))
                self.healing_seen = max(self.healing_seen, healing)
                time.sleep(0.05)
        finally:
            disk.end()
            self.disk_full = False
        self.cycles_that_bit += bit
        self.operate_until(time.monotonic() + rng.uniform(*FREED_FOR), top_up=True)

    def _healing(self) -> int:
        response = self.call("GET", "/v1/health")
        return 0 if response is None else response.json()["healing"]

    def _under_load(self, delay: float, stopper) -> None:
        # From another thread, so the stop may land inside any request the workload has open.
        killer = threading.Timer(delay, stopper)
        killer.start()
        self.operate_until(time.monotonic() + KILL_DELAY[1] + SIGTERM_GRACE[1] + 5, top_up=True)
        killer.join()

    def _stopped(self, named: str, kind: str | None) -> None:
        assert not self.daemon.alive()
        if kind is not None:
            self.tally.kills[kind] += 1
        self.tally.stops += 1
        self.stop_named = f"stop {self.tally.stops} ({named})"
        # Requests already in the provider's and the ledger's buffers land first.
        time.sleep(0.2)
        self.check_trees()

    @property
    def kills(self) -> int:
        return sum(self.tally.kills.values())

    # -- the invariants ---------------------------------------------------------------

    def violation(self, what: str) -> None:
        self.violations.append(f"{self.stop_named}: {what}")

    def trees(self, store: EventStore, roots: list[Root]) -> dict[str, list[Member]]:
        """Every run of each root's tree, as the store holds it now (children found from their
        parents' logs: a subagent call's child id, a map item's)."""
        found = {}
        for root in roots:
            if root.run_id is None:
                continue
            top = "graph run" if root.kind == "graph" else "subagent parent"
            members: list[Member] = []
            queue: list[tuple[str, str, str | None]] = [(root.run_id, top, None)]
            while queue:
                run_id, role, parent = queue.pop()
                log = store.read_log(run_id)
                if not log:
                    continue
                members.append(Member(run_id, role, log, parent))
                head = log[0].event
                for envelope in log:
                    event = envelope.event
                    if event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool == "subagent":
                        child = child_run_id(run_id, envelope.seq)
                        kind = "delegator" if event.input["task"] == "delegate" else "refunder"
                        queue.append((child, f"subagent child ({kind})", run_id))
                if head.KIND is EventKind.GRAPH_RUN_STARTED:
                    for index in range(len(head.input["items"])):
                        child = map_child_id(run_id, MAP_NODE, index)
                        queue.append((child, f"map item {index} child", run_id))
            found[root.case] = members
        return found

    def check_trees(self, *, final: bool = False) -> None:
        """The invariants over every tree not yet known complete (every tree when ``final``)."""
        roots = [r for r in self.roots.values() if final or r.case not in self.final]
        with EventStore.open(self.store_url) as store:
            trees = self.trees(store, roots)
            # The bank is read after the logs: a refund a log records done is in it by then, even
            # while live nodes of a cluster go on refunding.
            ledger = self.ledger()
            refunds = Counter(
                r["input"]["invoice_id"] for r in ledger if r["tool"] == "issue_refund"
            )
            for invoice, times in refunds.items():
                if times > 1:
                    runs = [
                        (r["run_id"], r["seq"])
                        for r in ledger
                        if r["tool"] == "issue_refund" and r["input"]["invoice_id"] == invoice
                    ]
                    self.violation(
                        f"invoice {invoice} refunded {times} times, by (run, seq) {runs}"
                    )
            for case, members in trees.items():
                complete = True
                for member in members:
                    complete &= self._check_run(store, member, refunds, final=final)
                    if member.run_id in self.parked_at:
                        self.parked_roots.add(case)
                if complete:
                    self.final.add(case)

    def _check_run(
        self, store: EventStore, member: Member, refunds: Counter, *, final: bool
    ) -> bool:
        """One run's invariants; whether it completed."""
        where = f"{member.role} {member.run_id}"
        try:
            view = assert_log_valid(member.log)
        except (AssertionError, GuardRefusal) as exc:  # a gap, or the guard refused an event
            self.violation(f"{where}: its log does not pass the append guard: {exc}")
            return False
        stored = store.read_view(member.run_id)
        # A live node of a cluster may have appended since the log was read: a row ahead of the
        # log is checked at a later stop.
        if stored != view and (stored is None or stored.next_seq == view.next_seq):
            self.violation(f"{where}: the runs row and the log disagree")
        if view.state is RunState.NEEDS_RECONCILIATION:
            self.parked_at.setdefault(member.run_id, self.stop_named)
        pending = view.pending
        if pending is not None and pending.kind == "tool" and pending.tool == "issue_refund":
            self.writes_cut.add((member.run_id, pending.seq))
        log = member.log
        done = {e.event.seq: e.event for e in log if e.event.KIND is EventKind.TOOL_CALL_COMPLETED}
        for envelope in log:
            event = envelope.event
            if event.KIND is EventKind.TOOL_CALL_REQUESTED and event.tool == "issue_refund":
                invoice = event.input["invoice_id"]
                completion = done.get(envelope.seq)
                if completion is None:
                    continue
                if completion.settled_by == "probe" and final:
                    self.settled_by_probe[completion.probe["answer"].get("found")] += 1
                if completion.deduplicated_from is not None:
                    self.violation(
                        f"{where}: the refund of {invoice} copied another run's "
                        f"({completion.deduplicated_from}), though no run shares its invoice"
                    )
                elif completion.settled_by == "operator":
                    self.violation(f"{where}: the refund of {invoice} was resolved by hand")
                elif refunds[invoice] != 1:
                    self.violation(
                        f"{where}: the refund of {invoice} is recorded done "
                        f"(settled by {completion.settled_by or 'its call'}) and the bank holds "
                        f"{refunds[invoice]}"
                    )
            elif event.KIND is EventKind.RESUMED:
                root = next((r for r in self.roots.values() if r.run_id == member.run_id), None)
                if root is None or event.input != {"approved": root.approved}:
                    self.violation(f"{where}: resumed with {event.input!r}, not a gate's answer")
            elif event.KIND is EventKind.RUN_ABANDONED:
                self.violation(f"{where}: abandoned")
        head = log[0].event
        if head.KIND is EventKind.GRAPH_RUN_STARTED:
            self._check_map(store, member, view)
        return view.state is RunState.COMPLETED

    def _check_map(self, store: EventStore, member: Member, view: Any) -> None:
        """Every map item's child finished exactly once: recorded at most once, under its own
        child, which completed; every item recorded once the map exited."""
        where = f"graph run {member.run_id}"
        items = len(member.log[0].event.input["items"])
        recorded = Counter()
        exited = False
        for envelope in member.log:
            event = envelope.event
            if event.KIND is EventKind.MAP_ITEM_COMPLETED and event.node == MAP_NODE:
                recorded[event.index] += 1
                if event.run_id != map_child_id(member.run_id, MAP_NODE, event.index):
                    self.violation(f"{where}: item {event.index} names child {event.run_id}")
                child = store.read_view(event.run_id)
                if child is None or child.state is not RunState.COMPLETED:
                    state = child.state.value if child else "no log"
                    self.violation(f"{where}: item {event.index} recorded, its child is {state}")
            elif event.KIND is EventKind.NODE_EXITED and event.node == MAP_NODE:
                exited = True
        for index, times in recorded.items():
            if times > 1:
                self.violation(f"{where}: map item {index} recorded {times} times")
        if exited and sorted(recorded) != list(range(items)):
            self.violation(f"{where}: the map exited with items {sorted(recorded)} of {items}")

    # -- the end ------------------------------------------------------------------------

    def settle(self) -> None:
        """Start the daemon a last time, answer gates (and nothing else) until every tree
        rests, stop it with SIGTERM, check everything and note the runs needing a hand."""
        if not self.daemon.alive():
            self.daemon.start()
        began = quiet_since = time.monotonic()
        while time.monotonic() - began < SETTLE_SECONDS:
            if self.operate(top_up=False) == 0:
                break
            if not self._quiet():
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > QUIET_SECONDS:
                break
            if not self.slow and time.monotonic() - began > SLOW_SECONDS:
                self.slow = self._unsettled()
            time.sleep(0.2)
        self.settle_seconds = time.monotonic() - began
        self.unfinished = self.active()
        code, _ = self.daemon.terminate()
        self.stop_named = "the final SIGTERM"
        if code != 0:
            self.violation(f"the daemon exited {code} on SIGTERM")
        self.check_trees(final=True)
        self.hands = self.needing_a_hand()

    def _unsettled(self) -> list[str]:
        """The roots not completed yet, with the state the daemon lists them in."""
        states = {}
        for status in ("running", "suspended", "sleeping", "needs_reconciliation"):
            for run in self.listed(status) or []:
                states[run["run"]] = f"{status} (driver {run.get('driver')})"
        return [
            f"{r.kind} {r.case} {r.run_id}: {states[r.run_id]}"
            for r in self.roots.values()
            if r.run_id in states
        ]

    def _quiet(self) -> bool:
        """No root is driven, at a gate or asleep: what is not completed waits on nothing the
        daemon is doing (a parked tree's parents are listed running with no driver)."""
        roots = {r.run_id for r in self.roots.values()}
        for status in ("running", "suspended", "sleeping"):
            listed = self.listed(status)
            if listed is None:
                return False
            for run in listed:
                if run["run"] in roots and (status != "running" or run.get("driver") != "none"):
                    return False
        return True

    def needing_a_hand(self) -> list[str]:
        """The runs the store shows resting short of an end with nothing in the tree parked on a
        write whose probe could not tell (or not waiting on such a one)."""
        hands = []
        with EventStore.open(self.store_url) as store:
            for case, members in self.trees(store, list(self.roots.values())).items():
                views = {m.run_id: assert_log_valid(m.log) for m in members}
                open_ = [m for m in members if views[m.run_id].state is not RunState.COMPLETED]
                parked = {
                    m.run_id
                    for m in open_
                    if views[m.run_id].state is RunState.NEEDS_RECONCILIATION
                    and self._probe_cannot_tell(store, m.run_id, views[m.run_id].pending.seq)
                }
                waiting = set()
                parents = {m.run_id: m.parent for m in members}
                for run_id in parked:
                    while parents.get(run_id) is not None:
                        run_id = parents[run_id]
                        waiting.add(run_id)
                for member in open_:
                    if member.run_id in parked or member.run_id in waiting:
                        continue
                    view = views[member.run_id]
                    pending = view.pending
                    what = f"{view.state.value}"
                    if pending is not None:
                        what += f", pending {pending.kind} at seq {pending.seq}"
                        what += f" ({pending.tool})" if pending.kind == "tool" else ""
                        if pending.kind == "tool" and pending.tool == "issue_refund":
                            what += ", " + self._bank_saw(member.run_id, pending.seq)
                    if member.run_id in self.parked_at:
                        what += f", parked since {self.parked_at[member.run_id]}"
                    hands.append(f"{member.role} {member.run_id} of {case}: {what}")
                if not members and self.roots[case].run_id is not None:
                    hands.append(f"{self.roots[case].kind} {case}: no log")
        return hands

    def _bank_saw(self, run_id: str, seq: int) -> str:
        """What the ledger shows of the refund at ``seq`` of ``run_id``."""
        lines = (
            self.effects.read_text(encoding="utf-8").splitlines() if self.effects.exists() else []
        )
        records = [
            r["tool"] for r in map(json.loads, lines) if r["run_id"] == run_id and r["seq"] == seq
        ]
        if "issue_refund" in records:
            return "the bank holds its refund"
        if "issue_refund:sent" in records:
            return "the bank was sent it and never answered"
        return "the bank was never sent it"

    @staticmethod
    def _probe_cannot_tell(store: EventStore, run_id: str, seq: int) -> bool:
        answer = store.claims.probe_answers([(run_id, seq)]).get((run_id, seq))
        return answer is not None and answer.verdict == "unknown"

    def figures(self, began: float) -> dict:
        return {
            "kills": self.kills,
            "runs": len([r for r in self.roots.values() if r.run_id is not None]),
            "violations": self.violations,
            "runs_needing_a_hand": self.hands,
            "seconds": round(time.monotonic() - began, 1),
            "seed": self.seed,
            "store": self.store_url.split(":", 1)[0],
            "kills_by_kind": dict(self.tally.kills),
            "stops": self.tally.stops,
            "sigterms_finished_first": self.tally.graceful,
            "gate_answers": self.tally.gate_answers,
            "daemon_starts": self.daemon.starts,
            "refunds_cut_open": len(self.writes_cut),
            "refunds_settled_by_probe": {str(k): n for k, n in self.settled_by_probe.items()},
            "settle_seconds": round(self.settle_seconds, 1),
            "roots_unfinished_at_the_end": self.unfinished,
            "unsettled_after_30s": self.slow,
            "disk_full_cycles": self.disk_cycles,
            "disk_full_cycles_that_stopped_a_run": self.cycles_that_bit,
            "most_runs_healing_at_once": self.healing_seen,
        }


def run_disk_full_cycles(harness: Composed, disk: Filler, *, cycles: int, seconds: float) -> None:
    """Fill and free the store's disk ``cycles`` times under the load (or until ``seconds``
    passed), with one daemon that is never restarted, then settle."""
    rng = random.Random(harness.seed + 3)
    began = time.monotonic()
    # The disk is a small tmpfs: the free-space floor would refuse every new run on it.
    harness.daemon.args += ["--min-free-bytes", "0"]
    # What this test is about is a drive stopped by the store, healing. A disk full for longer
    # than the node's lease (6 s by default; a full spell here lasts up to FULL_AT_MOST) also
    # lapses the lease, and that cuts every drive, a refund between its send and its answer
    # included: its probe then cannot tell, and the tree rests for a person, as documented (the
    # lapse mid-effect is the cluster and workers kill tests' subject). The lease outlasts a spell.
    harness.daemon.args += ["--lease-seconds", str(3 * FULL_AT_MOST)]
    harness.daemon.start()
    harness.register()
    while harness.disk_cycles < cycles and time.monotonic() - began < seconds:
        harness.disk_full_cycle(disk, rng)
        if not harness.daemon.alive():
            harness.violation("the daemon died")
            return
    harness.settle()
    if harness.daemon.starts != 1:
        harness.violation(f"the daemon was started {harness.daemon.starts} times")


def run_composed(harness: Composed, kinds: list[str], *, kills: int, seconds: float) -> None:
    """Stop the daemon by ``kinds`` in turn (drawn by the harness's RNG when the list runs out)
    until ``kills`` SIGKILLs landed or ``seconds`` passed, then settle."""
    rng = random.Random(harness.seed + 2)
    began = time.monotonic()
    harness.daemon.start()
    harness.register()
    schedule = list(kinds)
    while harness.kills < kills and time.monotonic() - began < seconds:
        kind = schedule.pop(0) if schedule else rng.choices(KILL_KINDS, (3, 1, 1, 1))[0]
        if not harness.daemon.alive():
            harness.daemon.start()
        harness.stop(kind, rng)
    harness.settle()


def test_composed_runs_killed_at_random_instants_perform_each_refund_once(
    tmp_path: Path, store_url: str
) -> None:
    began = time.monotonic()
    sqlite = store_url.startswith("sqlite")
    kinds = ["random"] * (8 if sqlite else 4) + ["sigterm", "sigterm", "double", "in_write"]
    kinds += ["double", "in_write"] if sqlite else []
    random.Random(SEED).shuffle(kinds)
    harness = Composed(tmp_path, store_url, SEED)
    try:
        # A double stop and a kill in a refund land two SIGKILLs each.
        kills = len(kinds) + kinds.count("double") + kinds.count("in_write")
        run_composed(harness, kinds, kills=kills, seconds=600)
    finally:
        harness.close()
    figures = harness.figures(began)
    print("composed chaos:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert all(figures["kills_by_kind"].get(kind) for kind in ("random", "double", "in_write"))


def test_composed_runs_through_disk_full_cycles_heal_with_no_restart(tmp_path: Path) -> None:
    """The composed load on a SQLite store whose disk fills and frees again and again: every
    tree completes on the one daemon (no restart, no resume but a gate's answer), each refund
    once, and at least one cycle stopped a run (``/v1/health`` counted it healing)."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        try:
            disk = Filler(stack.enter_context(tmpfs(tmp_path / "disk", "64m")))
        except TmpfsRefused as refused:
            pytest.skip(str(refused))
        harness = Composed(tmp_path, f"sqlite:///{disk.store_dir / 'salvor.db'}", SEED)
        stack.callback(harness.close)  # before the unmount: the daemon holds the store open
        run_disk_full_cycles(harness, disk, cycles=6, seconds=600)
    figures = harness.figures(began)
    print("composed disk-full cycles:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["disk_full_cycles_that_stopped_a_run"] > 0, figures
    # No kill cut a write: every tree completed, none rests on a parked write.
    assert figures["roots_unfinished_at_the_end"] == 0, figures
