"""What every composed kill test shares: roots of run trees (graph runs, subagent trees) kept in
flight on a real `salvor serve`, the daemon stopped at random instants, the invariants that hold
for any workload checked after every stop, and the settling at the end.

A workload is a subclass of ``ComposedLoad``: it registers its agents and graph (``register``),
draws its roots (``draw_root``), answers what its roots suspend on (``answer``), checks what
its tools did in the world (``check_world``, ``check_log``) and says which resting run waits for
a person for a reason it expects (``parked_for_a_person``). A graph root's input holds its map's
``items`` and its map node is ``MAP_NODE``.

The stops, at a random instant under the load: a SIGKILL; a SIGTERM, then a SIGKILL while it
shuts down; a SIGKILL, a restart, and a second SIGKILL within half a second of READY; a SIGKILL,
then a restart that kills itself inside one of the workload's writes (``write_points``, the
daemon's ``SALVOR_FAULT_KILL_IN_TOOL`` fault points, or another fault variable a workload names
in ``fault``). Nothing acts on the runs but the workload: no resume but its own answers, no
resolve, no abandon.

After every stop (daemon dead) and at the end, over every run of every tree: every log is
contiguous and legal event by event (``assert_log_valid``) and the store's fold agrees with it;
no call was settled by an operator and no run abandoned; every resume carries the workload's
answer; every map item's child finished exactly once (recorded at most once, under the child id
the walk derives, and that child completed). At the end, every tree completed, or rests with a
run parked for a person (``parked_for_a_person``) and every other unfinished run of the tree
waiting on it: anything else is a run needing a hand.
"""

from __future__ import annotations

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

from salvor.daemon.flows import child_run_id
from salvor.daemon.graphs import map_child_id
from salvor.protocol import EventKind, GuardRefusal, RunState
from salvor.store import EventStore

from tests.chaos.test_kill_serve import KILL_DELAY, Chaos, assert_log_valid

SEED = int(os.environ.get("SALVOR_CHAOS_SEED", "20261206"))
# Roots in flight at once: each is several runs (a map's items, a tree's levels), on two cores.
IN_FLIGHT = 6
MAP_NODE = "each"
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
IN_TOOL_VAR = "SALVOR_FAULT_KILL_IN_TOOL"
# How long a daemon started with a fault point may take to reach a write, in seconds.
WRITE_WAIT = 20.0
# Status codes a start may answer while the store refuses writes: tried again on the next round.
STORE_REFUSED = frozenset({503, 507})


@dataclass
class Root:
    """One root of the workload and what it was asked to do."""

    case: str
    kind: str  # "graph" or "tree"
    input: dict
    answer: dict | None = None  # what the workload resumes the root with when it suspends
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


class ComposedLoad(Chaos):
    """Roots of run trees on `Chaos`'s daemon, provider and HTTP client; see the module."""

    # The fault points the "in_write" stop draws from, with their weights.
    write_points: tuple[tuple[str, int], ...] = ()
    # Roots kept in flight (a workload of heavier runs keeps fewer).
    in_flight_roots = IN_FLIGHT

    def __init__(self, tmp_path: Path, store_url: str, seed: int, *, script) -> None:
        super().__init__(tmp_path, store_url, seed, script=script)
        self.seed = seed
        self.roots: dict[str, Root] = {}
        self.violations: list[str] = []
        self.tally = Tally()
        self.stop_named = "none yet"  # the last stop, for the violations it turns up
        self.final: set[str] = set()  # roots whose whole tree completed and was checked
        self.graph: str | None = None
        self.hands: list[str] = []
        self.slow: list[str] = []  # roots still unsettled SLOW_SECONDS into the settling
        self.settle_seconds = 0.0
        self.parked_at: dict[str, str] = {}  # run -> the stop after which it was first parked
        self.parked_roots: set[str] = set()  # roots with a run of their tree parked once
        self.disk_cycles = 0  # the disk filled and freed under the load
        self.cycles_that_bit = 0  # cycles during which /v1/health counted a run healing
        self.healing_seen = 0  # the most runs /v1/health counted healing at once
        self.unfinished = -1  # roots not completed when the settling ended

    # -- what a workload says ------------------------------------------------------------

    def register(self) -> None:
        """Register the agents (``self.agent``: a tree root's) and the graph (``self.graph``)."""
        raise NotImplementedError

    def draw_root(self, case: str) -> Root:
        """A new root named ``case`` (a tree's ``run_id`` drawn here, a graph run's at start)."""
        raise NotImplementedError

    def answer(self, root: Root) -> None:
        """Answer a root listed suspended (its ``answer`` is set): resume it with that."""
        self.tally.gate_answers += 1
        self.call("POST", f"/v1/runs/{root.run_id}/resume", json={"input": root.answer})

    def check_world(self) -> Any:
        """Read the world the tools act on (after the logs were read), check what holds of it
        whatever the logs say, and return it for ``check_log``."""
        return None

    def check_log(self, where: str, member: Member, view: Any, world: Any, *, final: bool) -> None:
        """The workload's invariants over one run's valid log."""

    def parked_for_a_person(self, store: EventStore, run_id: str, view: Any) -> bool:
        """Whether a run resting in needs_reconciliation waits for a person as expected."""
        return False

    def what_pending(self, run_id: str, pending: Any) -> str:
        """More to say of a pending call of a run needing a hand ("" when nothing)."""
        return ""

    # -- the workload's own actions ------------------------------------------------------

    def new_root(self) -> None:
        case = f"c{len(self.roots)}-{uuid.uuid4().hex[:8]}"
        self.roots[case] = self.draw_root(case)

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
        """One round: keep ``in_flight_roots`` roots going, answer the roots that wait on the
        workload. Returns how many roots are not completed (-1 when the daemon did not answer)."""
        active = self.active()
        if active < 0:
            return -1
        if top_up:
            for _ in range(self.in_flight_roots - self.in_flight()):
                self.new_root()
        self.start_roots()
        by_id = {root.run_id: root for root in self.roots.values()}
        for run in self.listed("suspended") or []:
            root = by_id.get(run["run"])
            if root is not None and root.answer is not None:
                self.answer(root)
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
            self._kill_in_a_write(rng, kind)

    def _kill_in_a_write(self, rng: random.Random, kind: str) -> None:
        delay = rng.uniform(*KILL_DELAY)
        self._under_load(delay, self.daemon.kill)
        self._stopped(f"SIGKILL {delay:.2f}s after READY (before a kill in a write)", "random")
        points, weights = zip(*self.write_points, strict=True)
        point = rng.choices(points, weights)[0]
        variable, value = self.fault(point)
        self.daemon.env[variable] = value
        try:
            self.daemon.start()
        except AssertionError:
            # The fault point fired in recovery, before READY.
            if self.daemon.proc.returncode != -signal.SIGKILL:
                raise
        finally:
            del self.daemon.env[variable]
        self.operate_until(time.monotonic() + WRITE_WAIT, top_up=True)
        if self.daemon.alive():
            self.daemon.kill()
            self._stopped(f"SIGKILL after {WRITE_WAIT}s with no write reached", "random")
        else:
            self._stopped(f"the daemon's own SIGKILL in a write, at {point}", kind)

    def fault(self, point: str) -> tuple[str, str]:
        """The variable, and its value, that make a daemon kill itself at ``point`` (one of
        ``write_points``): by default a fault point of the demo tools (``IN_TOOL_VAR``)."""
        return IN_TOOL_VAR, point

    disk_full = False  # a disk-full cycle (``composed_disk``) has the disk full now

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
                        role = f"subagent child ({event.input['agent']})"
                        queue.append((child, role, run_id))
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
            # The world is read after the logs: what a log records done is in it by then, even
            # while live nodes of a cluster go on acting.
            world = self.check_world()
            for case, members in trees.items():
                complete = True
                for member in members:
                    complete &= self._check_run(store, member, world, final=final)
                    if member.run_id in self.parked_at:
                        self.parked_roots.add(case)
                # A root not started yet has no members: nothing of it is known complete.
                if complete and members:
                    self.final.add(case)

    def _check_run(self, store: EventStore, member: Member, world: Any, *, final: bool) -> bool:
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
        requested = {}
        for envelope in member.log:
            event = envelope.event
            if event.KIND is EventKind.TOOL_CALL_REQUESTED:
                requested[envelope.seq] = event.tool
            elif event.KIND is EventKind.TOOL_CALL_COMPLETED and event.settled_by == "operator":
                self.violation(f"{where}: its {requested.get(event.seq)} was resolved by hand")
            elif event.KIND is EventKind.RESUMED:
                root = next((r for r in self.roots.values() if r.run_id == member.run_id), None)
                if root is None or event.input != root.answer:
                    self.violation(f"{where}: resumed with {event.input!r}, not the workload's")
            elif event.KIND is EventKind.RUN_ABANDONED:
                self.violation(f"{where}: abandoned")
        self.check_log(where, member, view, world, final=final)
        if member.log[0].event.KIND is EventKind.GRAPH_RUN_STARTED:
            self._check_map(store, member)
        return view.state is RunState.COMPLETED

    def _check_map(self, store: EventStore, member: Member) -> None:
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
        """Start the daemon a last time, answer the roots (and nothing else) until every tree
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
        """The runs the store shows resting short of an end with nothing in the tree parked for
        a person (or not waiting on such a one)."""
        hands = []
        with EventStore.open(self.store_url) as store:
            for case, members in self.trees(store, list(self.roots.values())).items():
                views = {m.run_id: assert_log_valid(m.log) for m in members}
                open_ = [m for m in members if views[m.run_id].state is not RunState.COMPLETED]
                parked = {
                    m.run_id
                    for m in open_
                    if views[m.run_id].state is RunState.NEEDS_RECONCILIATION
                    and self.parked_for_a_person(store, m.run_id, views[m.run_id])
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
                        more = self.what_pending(member.run_id, pending)
                        what += f", {more}" if more else ""
                    if member.run_id in self.parked_at:
                        what += f", parked since {self.parked_at[member.run_id]}"
                    hands.append(f"{member.role} {member.run_id} of {case}: {what}")
                if not members and self.roots[case].run_id is not None:
                    hands.append(f"{self.roots[case].kind} {case}: no log")
        return hands

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
            "settle_seconds": round(self.settle_seconds, 1),
            "roots_unfinished_at_the_end": self.unfinished,
            "unsettled_after_30s": self.slow,
            "disk_full_cycles": self.disk_cycles,
            "disk_full_cycles_that_stopped_a_run": self.cycles_that_bit,
            "most_runs_healing_at_once": self.healing_seen,
        }


def run_composed(harness: ComposedLoad, kinds: list[str], *, kills: int, seconds: float) -> None:
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


def kill_schedule(sqlite: bool, seed: int) -> tuple[list[str], int]:
    """The short schedule CI runs (14 stops on SQLite, 8 on PostgreSQL), shuffled by ``seed``,
    and the SIGKILLs it lands (a double stop and a kill in a write land two each)."""
    kinds = ["random"] * (8 if sqlite else 4) + ["sigterm", "sigterm", "double", "in_write"]
    kinds += ["double", "in_write"] if sqlite else []
    random.Random(seed).shuffle(kinds)
    return kinds, len(kinds) + kinds.count("double") + kinds.count("in_write")
