"""Several daemons over one store on one machine: a starting daemon's orphan sweep kills only the
agents of a daemon that is provably dead, never a live sibling's (issue 30, item 3).

Real processes throughout. A "daemon" here is a process that starts an agent the way salvor
does (the store's mark, its run, and its own owner mark from ``owner_mark``, in a session of
its own) and then stays alive; the sweep runs in another process, as a second daemon starting
over the same store would run it. The agents are started untethered, so only the sweep can
take them down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.processes import gone, wait_gone

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sweep reads /proc"
)

STORE = "sqlite:////var/lib/salvor/siblings.db"

# A daemon: starts one marked agent for its run, says the agent started, then lives on.
DAEMON = r"""
import os, subprocess, sys, time
from pathlib import Path
from salvor.daemon.processes import MARK_VAR, OWNER_VAR, RUN_VAR, owner_mark, store_fingerprint
store, run_id, ready = sys.argv[1:4]
env = {**os.environ, MARK_VAR: store_fingerprint(store), RUN_VAR: run_id, OWNER_VAR: owner_mark()}
subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True
)
Path(ready).write_text("started")
time.sleep(300)
"""

# A second daemon starting over the same store: its sweep, and what it killed.
SWEEP = r"""
import json, sys
from salvor.daemon.processes._orphans import kill_orphans, store_fingerprint
print(json.dumps(sorted(kill_orphans(store_fingerprint(sys.argv[1])))))
"""


def agents_of(run_id: str) -> list[int]:
    """The pids (as this test sees them) of the live processes carrying ``run_id``'s mark."""
    needle = f"SALVOR_RUN_ID={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and not gone(int(entry.name)):
            found.append(int(entry.name))
    return found


class Daemon:
    def __init__(self, tmp_path: Path, run_id: str, prefix: tuple[str, ...] = ()) -> None:
        self.run_id = run_id
        ready = tmp_path / f"{run_id}.ready"
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-c", DAEMON, STORE, run_id, str(ready)],
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not ready.exists() or not self.agents():
            assert self.process.poll() is None, "the daemon ended before its agent started"
            assert time.monotonic() < deadline, "the daemon never started its agent"
            time.sleep(0.02)
        self.agent = self.agents()[0]

    def agents(self) -> list[int]:
        return agents_of(self.run_id)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def clean_up(self) -> None:
        for pid in self.agents():
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.kill()


@pytest.fixture
def daemons(tmp_path):
    started: list[Daemon] = []

    def start(run_id: str, prefix: tuple[str, ...] = ()) -> Daemon:
        daemon = Daemon(tmp_path, run_id, prefix)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.clean_up()


def sweep() -> list[str]:
    """A second daemon's start-up sweep, in a process of its own; the runs it killed agents of."""
    done = subprocess.run(
        [sys.executable, "-c", SWEEP, STORE], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


RUN_LIVE = "00000000-0000-4000-8000-0000000000a1"
RUN_DEAD = "00000000-0000-4000-8000-0000000000d1"
RUN_CONTAINED = "00000000-0000-4000-8000-0000000000c1"


def test_a_starting_daemon_spares_a_live_siblings_agent_and_kills_a_dead_ones(daemons) -> None:
    live, dead = daemons(RUN_LIVE), daemons(RUN_DEAD)
    dead.kill()  # SIGKILL: nothing of it runs, its agent is left behind
    assert sweep() == [RUN_DEAD]
    assert wait_gone(dead.agent), "the agent of a dead daemon survived the sweep"
    assert not gone(live.agent), "the sweep killed a live sibling's agent"
    assert sweep() == []  # and a second daemon starting later leaves it alone too
    assert not gone(live.agent)


def _pid_namespaces_available() -> bool:
    try:
        return (
            subprocess.run(
                ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"],
                check=False,
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _pid_namespaces_available(), reason="no unprivileged pid namespaces")
def test_a_sibling_in_another_pid_namespace_is_never_taken_for_dead(daemons) -> None:
    # A daemon in a container of its own (a pid namespace): the pid its agent's owner mark
    # names means another process here (or none), which proves nothing about that daemon.
    contained = daemons(
        RUN_CONTAINED,
        prefix=("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"),
    )
    assert sweep() == []
    assert not gone(contained.agent), "the sweep killed the agent of a live contained daemon"
