"""The cluster's kill run over one service of several workers: ``salvor serve --workers N``, each
worker a node over the one store, behind one port (issue 30: two workers on SQLite).

``Cluster``'s workload and invariants, on one service whose processes are stopped instead of
whole nodes, at random instants under the load:

* ``worker``: SIGKILL one worker; its supervisor starts it again after its backoff while the
  other worker takes its runs over (the kernel proves the dead pid dead at once: the takeover
  does not wait for the lease). The oldest worker is chosen, so no slot dies young
  ``CRASH_LIMIT`` times in a row and stops the service on purpose;
* ``all``: SIGKILL every worker and the supervisor at once (a machine's crash), restart;
* ``supervisor``: SIGKILL the supervisor alone: its workers see their lifeline close and stop as
  on SIGTERM, then the service is started again;
* ``term``: SIGTERM the service (the graceful stop hands every run over), restart;
* ``pause``: SIGSTOP one worker past its lease while its sibling takes its runs over, then
  SIGCONT: it must send no refund until it has registered again (``Cluster.check_paused``, by
  the worker's pid in the service's one log).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from tests.chaos.cluster import PAUSE_PAST_LEASE, Cluster
from tests.chaos.test_kill_composed import KILL_DELAY
from tests.chaos.test_kill_serve import READY_TIMEOUT
from tests.support.pausing import stop_outside_writes

WORKER_STOPS = ("worker", "all", "supervisor", "term", "pause")
WORKER_STOP_WEIGHTS = (6, 1, 1, 1, 2)


class Workers(Cluster):
    """``Composed``'s workload on one ``salvor serve --workers N`` over one store."""

    stop_kinds = WORKER_STOPS
    stop_weights = WORKER_STOP_WEIGHTS

    def __init__(
        self,
        tmp_path: Path,
        store_url: str,
        seed: int,
        *,
        workers: int,
        lease_seconds: float,
        fence_margin_seconds: float,
    ) -> None:
        super().__init__(
            tmp_path,
            store_url,
            seed,
            nodes=1,
            lease_seconds=lease_seconds,
            fence_margin_seconds=fence_margin_seconds,
        )
        self.service = self.nodes[0]
        args = self.service.args
        args[args.index("--workers") + 1] = str(workers)
        # READY once every worker is, worker 0 first: several interpreters' starts.
        self.service.ready_timeout = (workers + 1) * READY_TIMEOUT
        self.workers = workers

    def worker_pids(self) -> list[int]:
        """The live workers' pids, oldest first (the supervisor's children, by start time)."""
        children: list[str] = []
        # Each thread's children: trio starts a process from a worker thread of its own.
        for task in Path(f"/proc/{self.service.proc.pid}/task").glob("*"):
            try:
                children += (task / "children").read_text().split()
            except OSError:
                continue  # the thread ended meanwhile
        started = {}
        for child in map(int, children):
            try:
                stat = Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # gone meanwhile
            if stat[0] not in ("Z", "X"):
                started[child] = int(stat[19])
        return sorted(started, key=started.__getitem__)

    def stop_cluster(self, kind: str, rng: random.Random) -> None:
        """One stop of the kind named (the service is up); the invariants checked after it."""
        delay = rng.uniform(*KILL_DELAY)
        service = self.service
        if kind == "worker":
            killed: list[int] = []

            def kill_oldest() -> None:
                pids = self.worker_pids()
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])

            self._under_load(delay, kill_oldest)
            self.tally.kills["worker"] += len(killed)
            self._checked(f"SIGKILL of worker pid {killed} {delay:.2f}s into the round")
        elif kind == "all":

            def kill_all() -> None:
                for pid in self.worker_pids():
                    os.kill(pid, signal.SIGKILL)
                service.kill()

            self._under_load(delay, kill_all)
            self.tally.kills["all"] += 1 + self.workers
            self._checked(f"SIGKILL of the whole service {delay:.2f}s into the round")
        elif kind == "supervisor":
            orphans: list[int] = []

            def kill_supervisor() -> None:
                orphans.extend(self.worker_pids())
                service.kill()

            self._under_load(delay, kill_supervisor)
            self.tally.kills["supervisor"] += 1
            self._wait_for_workers_gone(orphans)
            self._checked(f"SIGKILL of the supervisor {delay:.2f}s into the round")
        elif kind == "term":
            self._under_load(delay, lambda: service.proc.send_signal(signal.SIGTERM))
            code = service.proc.wait(timeout=120)
            if code != 0:
                self.violation(f"the service exited {code} on SIGTERM")
            self._checked(f"SIGTERM of the service {delay:.2f}s into the round")
        else:
            held = self.lease_seconds + rng.uniform(*PAUSE_PAST_LEASE)
            log = service.tmp_path / f"serve-{service.starts - 1:03d}.log"

            def pause() -> None:
                pids = self.worker_pids()
                if not pids:
                    return
                victim = rng.choice(pids)
                # Never inside a write on SQLite: its sibling would wait for it to continue.
                stop_outside_writes(victim, self.store_url)
                stopped = time.time()
                time.sleep(held)
                continued = time.time()  # before the signal, as Cluster's pause
                os.kill(victim, signal.SIGCONT)
                self.paused.append((victim, stopped, continued, log))

            self._under_load(delay, pause, extra=held)
            self._checked(f"SIGSTOP of a worker for {held:.1f}s, {delay:.2f}s into the round")
        self.tally_nodes[kind] += 1
        if not service.alive():
            service.start()

    def _wait_for_workers_gone(self, orphans: list[int]) -> None:
        """After the supervisor's SIGKILL: its workers stop by themselves (their lifeline closed);
        a worker still running a minute later is a violation."""
        deadline = time.monotonic() + 60
        while orphans and time.monotonic() < deadline:
            orphans = [pid for pid in orphans if _running(pid)]
            time.sleep(0.1)
        if orphans:
            self.violation(f"workers {orphans} outlived their SIGKILLed supervisor by 60 s")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
