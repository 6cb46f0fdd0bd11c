"""Orphaned agent processes: found by the mark in their environment, killed with their group.

Real processes throughout: an "agent" in a session of its own with a child,
marked as a salvor over some store would mark it, and the sweep run as
`salvor serve` runs it on start.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from salvor.daemon.processes._orphans import (
    MARK_VAR,
    OWNER_VAR,
    RUN_VAR,
    owner_mark,
    store_fingerprint,
    sweep_orphans,
)

from tests.daemon.agents.test_process_agent import process_agent
from tests.support.processes import gone, wait_gone

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the sweep reads /proc"
)

STORE = "sqlite:////var/lib/salvor/salvor.db"
OTHER_STORE = "sqlite:////srv/other/salvor.db"
RUN_A = "00000000-0000-4000-8000-00000000000a"
RUN_B = "00000000-0000-4000-8000-00000000000b"
# The owner mark of a salvor that is gone: this pid, but started at another instant than the
# process that has it now (as after the pid was recycled).
GONE_OWNER = f"{os.getpid()}:0"

# An agent that starts a child (same group) and waits: the shape a real
# agent with a tool subprocess has.
PARENT = r"""
import subprocess, sys, time
from pathlib import Path
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(120)
"""


class Agent:
    def __init__(
        self, tmp_path: Path, name: str, store: str, run_id: str, owner: str | None = None
    ) -> None:
        pidfile = tmp_path / f"{name}.child"
        env = {**os.environ, MARK_VAR: store_fingerprint(store), RUN_VAR: run_id}
        if owner is not None:
            env[OWNER_VAR] = owner
        self.process = subprocess.Popen(
            [sys.executable, "-c", PARENT, str(pidfile)], env=env, start_new_session=True
        )
        deadline = time.monotonic() + 20
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline, "the agent never started its child"
            time.sleep(0.02)
        self.child = int(pidfile.read_text())

    @property
    def pids(self) -> list[int]:
        return [self.process.pid, self.child]

    def alive(self) -> bool:
        return not any(gone(pid) for pid in self.pids)

    def stop(self) -> None:
        for pid in self.pids:
            try:
                os.killpg(os.getpgid(pid), 9)
            except ProcessLookupError:
                pass
        self.process.wait()


@pytest.fixture
def agents(tmp_path):
    started: list[Agent] = []

    def start(
        name: str, store: str = STORE, run_id: str = RUN_A, owner: str | None = GONE_OWNER
    ) -> Agent:
        agent = Agent(tmp_path, name, store, run_id, owner)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


async def test_the_sweep_kills_marked_agents_and_their_groups_and_spares_another_store(
    agents, caplog
):
    mine, other = agents("mine"), agents("other", store=OTHER_STORE)
    assert mine.alive() and other.alive()
    with caplog.at_level(logging.WARNING, logger="salvor.orphans"):
        killed = await sweep_orphans(STORE)
    assert all(wait_gone(pid) for pid in mine.pids), (
        "the marked agent or its child survived the sweep"
    )
    assert other.alive(), "an agent of another store was killed"
    assert killed == {RUN_A: sorted(killed[RUN_A])} and set(killed[RUN_A]) <= set(mine.pids)
    lines = [r.getMessage() for r in caplog.records if r.name == "salvor.orphans"]
    assert len(lines) == 1 and lines[0].startswith(f"run {RUN_A}: killed agent process ")
    assert str(mine.process.pid) in lines[0]


async def test_a_sweep_for_one_run_leaves_the_other_runs_agents(agents):
    a, b = agents("a", run_id=RUN_A), agents("b", run_id=RUN_B)
    killed = await sweep_orphans(STORE, RUN_A)
    assert set(killed) == {RUN_A}
    assert all(wait_gone(pid) for pid in a.pids)
    assert b.alive()


async def test_nothing_marked_means_nothing_killed(agents):
    other = agents("other", store=OTHER_STORE)
    assert await sweep_orphans(STORE) == {}
    assert other.alive()


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


@pytest.fixture
def owner():
    """A live process standing in for another salvor over the same store (a
    `salvor run` in another terminal)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


async def test_an_agent_whose_owner_lives_is_spared_and_one_whose_owner_was_killed_is_not(
    agents, owner
):
    mark = f"{owner.pid}:{start_time(owner.pid)}"
    alive_owner = agents("alive-owner", owner=mark)
    await sweep_orphans(STORE)
    assert alive_owner.alive(), "the sweep killed the agent of a live salvor"
    owner.kill()
    owner.wait()
    await sweep_orphans(STORE)
    assert all(wait_gone(pid) for pid in alive_owner.pids), (
        "the agent of a killed salvor survived the sweep"
    )


async def test_an_owner_mark_whose_pid_was_recycled_does_not_spare_the_agent(agents, owner):
    # The pid lives, but it is not the process that started the agent: that
    # one started at another instant.
    recycled = agents("recycled", owner=f"{owner.pid}:{int(start_time(owner.pid)) - 1}")
    await sweep_orphans(STORE)
    assert all(wait_gone(pid) for pid in recycled.pids)


async def test_an_agent_naming_no_owner_is_left_running_and_named(agents, caplog):
    # Nothing proves its salvor dead (several may share the store and the machine): a person
    # is told, the sweep kills nothing.
    unmarked = agents("unmarked", owner=None)
    with caplog.at_level(logging.WARNING, logger="salvor.orphans"):
        assert await sweep_orphans(STORE) == {}
    assert unmarked.alive()
    # One line per process the mark is on: the agent and its child.
    found = sorted(r.getMessage() for r in caplog.records if r.name == "salvor.orphans")
    assert [line.split()[1] for line in found] == sorted(str(pid) for pid in unmarked.pids)
    assert all(f"carries this store's mark (run {RUN_A})" in line for line in found)


async def test_a_driven_process_agent_carries_the_mark_of_its_store(runtime, store_url, tmp_path):
    seen = tmp_path / "mark.txt"
    script = (
        "import os, sys\nfrom pathlib import Path\n"
        f"Path({str(seen)!r}).write_text(' '.join(os.environ.get(v, '') for v in "
        f"{(MARK_VAR, RUN_VAR, OWNER_VAR)!r}))\n"
    )
    # The definition's env cannot take the mark off: it is applied after it.
    agent = process_agent(tmp_path, script=script, env={MARK_VAR: "spoofed"})
    run_id = await runtime.starts.start_run(agent, "hello")
    await runtime.drive(run_id, agent=agent)
    assert (
        seen.read_text() == f"{store_fingerprint(runtime.access.store.url)} {run_id} {owner_mark()}"
    )
