"""The composed load of ``test_kill_composed`` over a cluster: several `salvor serve` nodes on one
store, stopped one at a time (or all at once) at random instants, and paused past their lease.

Every node is a real `salvor serve` process with its own port, its own notify socket and its own
logs, over one store (a SQLite file, or a PostgreSQL schema) and one effect ledger (the demo
tools' bank, which records the pid of the node that performed each refund). The workload talks to
a live node drawn at random for every request, so a resume or a gate's answer often reaches a node
that does not own the run, and a run's children are often driven where its parent is not.

Stops, under the load, at a random instant:

* ``node``: SIGKILL one live node; it is restarted a moment later (a new node id, its runs
  taken over meanwhile by the live ones, or reclaimed by the restart when it proves the old
  process dead first);
* ``all``: SIGKILL every node at once, restart them all;
* ``term``: SIGTERM one node (a graceful stop hands its runs over at once), restart it;
* ``pause``: SIGSTOP one node past its lease, so the others take its runs over while it still
  holds them in memory, then SIGCONT it. From then on it must start nothing: no refund is sent by
  its pid after the moment it was continued (a refund it had sent before the pause may still be
  answered: that is its one effect in flight, which the taking node's probe sees).

The invariants are ``Composed``'s (logs contiguous and legal, each refund performed once, each
map item's child once, nothing by hand), checked after every stop, plus the pause rule above; at
the end every node is stopped with SIGTERM and every tree must have completed or rest on a write
whose probe could not tell.
"""

from __future__ import annotations

import json
import math
import random
import signal
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import httpx

from tests.chaos.test_kill_composed import KILL_DELAY, QUIET_SECONDS, SETTLE_SECONDS, Composed
from tests.chaos.test_kill_serve import Daemon
from tests.support.pausing import stop_outside_writes

# Stop kinds, and how often each is drawn when a schedule runs out.
STOP_KINDS = ("node", "all", "term", "pause")
STOP_WEIGHTS = (6, 1, 1, 2)
# A pause lasts the lease plus this much, in seconds (the others must have taken over by then).
PAUSE_PAST_LEASE = (1.0, 3.0)
# How long a killed node stays down before its restart, in seconds.
DOWN_FOR = (0.0, 2.0)


class Cluster(Composed):
    """``Composed``'s workload on ``nodes`` daemons over one store."""

    # What ``run_cluster`` draws from once its schedule runs out.
    stop_kinds = STOP_KINDS
    stop_weights = STOP_WEIGHTS

    def __init__(
        self,
        tmp_path: Path,
        store_url: str,
        seed: int,
        *,
        nodes: int,
        lease_seconds: float,
        fence_margin_seconds: float,
    ) -> None:
        super().__init__(tmp_path / "node0", store_url, seed)
        self.lease_seconds = lease_seconds
        self.nodes: list[Daemon] = [self.daemon]
        for index in range(1, nodes):
            node = Daemon(tmp_path / f"node{index}", store_url, self.effects)
            node.args += ["--model-endpoint", self.provider.base_url]
            self.nodes.append(node)
        for index, node in enumerate(self.nodes):
            node.tmp_path.mkdir(parents=True, exist_ok=True)
            node.args += [
                "--node-name",
                f"node{index}",
                "--lease-seconds",
                str(lease_seconds),
                "--fence-margin-seconds",
                str(fence_margin_seconds),
            ]
        self.clients = [httpx.Client(base_url=n.base_url, timeout=10) for n in self.nodes]
        self._route = random.Random(seed + 5)
        # (pid, when it was stopped, when it was continued, its log) of every pause
        self.paused: list[tuple[int, float, float, Path]] = []
        self.reported: set[tuple[int, str, int]] = set()  # pause violations already named
        self.tally_nodes: Counter = Counter()  # stop kind -> stops delivered

    # -- the nodes -------------------------------------------------------------------------

    def live(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.alive()]

    def start_all(self) -> None:
        for node in self.nodes:
            if not node.alive():
                node.start()

    def call(self, method: str, path: str, **kwargs) -> httpx.Response | None:
        """The request to a live node drawn at random (None when it died under the request, or
        no node is up)."""
        live = self.live()
        if not live:
            return None
        client = self.clients[self._route.choice(live)]
        try:
            return client.request(method, path, **kwargs)
        except httpx.TransportError:
            self.transport_errors += 1
            return None

    def close(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.alive():
                node.proc.send_signal(signal.SIGCONT)
                node.kill()
        for client in self.clients:
            client.close()
        super().close()

    # -- stops -----------------------------------------------------------------------------

    def stop_cluster(self, kind: str, rng: random.Random) -> None:
        """One stop of the kind named (every node is up); the invariants checked after it."""
        delay = rng.uniform(*KILL_DELAY)
        victim = rng.choice(self.live())
        node = self.nodes[victim]
        if kind == "node":
            self._under_load(delay, node.kill)
            self.tally.kills["node"] += 1
            self._checked(f"SIGKILL of node{victim} {delay:.2f}s into the round")
            self.operate_until(time.monotonic() + rng.uniform(*DOWN_FOR), top_up=True)
        elif kind == "all":

            def kill_all() -> None:
                for each in self.nodes:
                    each.kill()

            self._under_load(delay, kill_all)
            self.tally.kills["all"] += len(self.nodes)
            self._checked(f"SIGKILL of every node {delay:.2f}s into the round")
        elif kind == "term":
            self._under_load(delay, lambda: node.proc.send_signal(signal.SIGTERM))
            code = node.proc.wait(timeout=60)
            if code != 0:
                self.violation(f"node{victim} exited {code} on SIGTERM")
            self._checked(f"SIGTERM of node{victim} {delay:.2f}s into the round")
        else:
            held = self.lease_seconds + rng.uniform(*PAUSE_PAST_LEASE)

            def pause() -> None:
                # Never inside a write on SQLite: every node would wait for this one to continue.
                stop_outside_writes(node.proc.pid, self.store_url)
                stopped = time.time()
                time.sleep(held)
                # Stamped before the signal: a continued node may register again (and log it)
                # before this thread runs again, and its registration must count.
                continued = time.time()
                node.proc.send_signal(signal.SIGCONT)
                log = node.tmp_path / f"serve-{node.starts - 1:03d}.log"
                self.paused.append((node.proc.pid, stopped, continued, log))

            self._under_load(delay, pause, extra=held)
            self._checked(f"SIGSTOP of node{victim} for {held:.1f}s, {delay:.2f}s into the round")
        self.tally_nodes[kind] += 1
        self.start_all()

    def _under_load(self, delay: float, stopper, *, extra: float = 0.0) -> None:
        stopping = threading.Timer(delay, stopper)
        stopping.start()
        self.operate_until(time.monotonic() + KILL_DELAY[1] + extra + 2, top_up=True)
        stopping.join()

    def _checked(self, named: str) -> None:
        self.tally.stops += 1
        self.stop_named = f"stop {self.tally.stops} ({named})"
        # Requests already in the provider's and the ledger's buffers land first.
        time.sleep(0.2)
        self.check_trees()
        self.check_paused()

    def check_paused(self) -> None:
        """A node continued after a pause past its lease sends no refund until it has registered
        again under a new id (its lease lapsed in the store: every run it held may be a peer's
        now; what it drives after registering again it has claimed afresh)."""
        if not self.paused or not self.effects.exists():
            return
        lines = self.effects.read_text(encoding="utf-8").splitlines()
        sent = [r for r in map(json.loads, lines) if r["tool"] == "issue_refund:sent"]
        for pid, stopped, continued, log in self.paused:
            # A stopped node logs nothing, so a registration logged after the stop came after
            # the continue (the log's clock has milliseconds only: the continue's own instant
            # would miss one logged in the same millisecond).
            registered = _registered_again(log, pid, after=stopped)
            for record in sent:
                if record.get("pid") != pid or not continued < record["at"] < registered:
                    continue
                what = (pid, record["run_id"], record["seq"])
                if what in self.reported:
                    continue
                self.reported.add(what)
                self.violation(
                    f"the node (pid {pid}) continued at {continued:.3f} after a pause past its "
                    f"lease sent the refund of {record['input']['invoice_id']} at "
                    f"{record['at']:.3f}, before it registered again ({registered:.3f})"
                )

    # -- the end -----------------------------------------------------------------------------

    def settle(self) -> None:
        """Every node up, the gates answered until every tree rests, then SIGTERM to each."""
        self.start_all()
        began = quiet_since = time.monotonic()
        while time.monotonic() - began < SETTLE_SECONDS:
            if self.operate(top_up=False) == 0:
                break
            if not self._quiet():
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > QUIET_SECONDS:
                break
            time.sleep(0.2)
        self.settle_seconds = time.monotonic() - began
        self.unfinished = self.active()
        self.stop_named = "the final SIGTERM"
        for index, node in enumerate(self.nodes):
            code, _ = node.terminate()
            if code != 0:
                self.violation(f"node{index} exited {code} on SIGTERM")
        self.check_trees(final=True)
        self.check_paused()
        self.hands = self.needing_a_hand()

    def figures(self, began: float) -> dict:
        figures = super().figures(began)
        figures.update(
            nodes=len(self.nodes),
            stops_by_kind=dict(self.tally_nodes),
            pauses=len(self.paused),
            node_starts=[node.starts for node in self.nodes],
        )
        del figures["daemon_starts"]
        return figures


def _registered_again(log: Path, pid: int, *, after: float) -> float:
    """When the node of process ``pid`` registered under a new id after ``after``, by ``log``
    (its own clock, local time; a service's workers share one log, and a node's id names its
    pid), or infinity when it has not (yet). Registered again after a lapse, or for the first
    time: a process paused while it was starting (a worker its supervisor had just started
    again) had no lease to lose, and registers once it serves."""
    for line in log.read_text(errors="replace").splitlines():
        if f":{pid}:" not in line or (
            "this node registers again as" not in line and " as node " not in line
        ):
            continue
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if at > after:
            return at
    return math.inf


def run_cluster(harness: Cluster, kinds: list[str], *, stops: int, seconds: float) -> None:
    """Stop nodes by ``kinds`` in turn (drawn by the harness's RNG when the list runs out) until
    ``stops`` stops were made or ``seconds`` passed, then settle."""
    rng = random.Random(harness.seed + 2)
    began = time.monotonic()
    harness.start_all()
    harness.register()
    schedule = list(kinds)
    while harness.tally.stops < stops and time.monotonic() - began < seconds:
        if schedule:
            kind = schedule.pop(0)
        else:
            kind = rng.choices(harness.stop_kinds, harness.stop_weights)[0]
        harness.stop_cluster(kind, rng)
    harness.settle()


def checked_schedule(harness: Cluster, kinds: list[str], *, name: str) -> dict:
    """CI's short run: every stop of ``kinds`` made, the harness closed, its figures printed
    (under ``name``) and returned once nothing was violated and no run needs a hand."""
    began = time.monotonic()
    try:
        run_cluster(harness, kinds, stops=len(kinds), seconds=600)
    finally:
        harness.close()
    figures = harness.figures(began)
    print(f"{name}:", json.dumps(figures))
    assert figures["violations"] == [], "\n".join(figures["violations"])
    assert figures["runs_needing_a_hand"] == [], "\n".join(figures["runs_needing_a_hand"])
    assert figures["stops_by_kind"] == {kind: kinds.count(kind) for kind in set(kinds)}, figures
    return figures


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.chaos.cluster --stops 350``: the long cluster run, one JSON line out;
    exit status 0 exactly when nothing was violated and no run needs a hand."""
    from tests.chaos.long_run import chaos_arguments, chaos_parser, run_long

    parser = chaos_parser("python -m tests.chaos.cluster")
    parser.add_argument("--stops", type=int, default=350, help="node stops and pauses to make")
    parser.add_argument("--nodes", type=int, help="daemons (default: 3 on PostgreSQL, 2 on SQLite)")
    parser.add_argument("--lease-seconds", type=float, default=3.0)
    parser.add_argument("--fence-margin-seconds", type=float, default=1.0)
    parser.add_argument(
        "--workers",
        type=int,
        help="one `salvor serve --workers N` instead of nodes: its workers and its supervisor "
        "are stopped (tests/chaos/workers_chaos.py)",
    )
    args = chaos_arguments(parser, argv)

    def build(work, store_url, stack):
        leases = {
            "lease_seconds": args.lease_seconds,
            "fence_margin_seconds": args.fence_margin_seconds,
        }
        if args.workers:
            from tests.chaos.workers_chaos import Workers

            harness = Workers(work, store_url, args.seed, workers=args.workers, **leases)
        else:
            nodes = args.nodes or (3 if args.store else 2)
            harness = Cluster(work, store_url, args.seed, nodes=nodes, **leases)
        return harness, lambda: run_cluster(harness, [], stops=args.stops, seconds=args.max_seconds)

    return run_long(args, "salvor-cluster-chaos-", build, kept="the nodes' logs")


if __name__ == "__main__":
    raise SystemExit(main())
