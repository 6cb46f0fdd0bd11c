"""Store faults heal: which failures count as one, the backoff, and
the driving set re-driving a run.

The faults are real: on SQLite the store's file, its WAL and their directory
are made immutable (``chattr +i``, root on a filesystem that supports it;
skipped elsewhere, naming why); on PostgreSQL another connection holds the
rows an append or a write check must lock while the store's statements time
out. The schedule itself runs in virtual time against a store stand-in that
refuses a given number of write checks.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio
from salvor.daemon.recording._store_access import open_store_access
from salvor.daemon.runs._drivers import DriverSet
from salvor.daemon.runs._healing import Backoff, StoreHealing
from salvor.daemon.runs._runtime import Runtime
from salvor.protocol import EMPTY_VIEW, ModelCallRequested, RunStarted, RunState
from salvor.store import EventStore, StoreUnavailable, store_fault
from salvor.store._errors import passes_by_itself

from tests.support.scripted_provider import text_reply

# -- the backoff -----------------------------------------------------------------------------------

BACKOFF_TABLE = [
    (1, 1.0),
    (2, 2.0),
    (3, 4.0),
    (4, 8.0),
    (5, 16.0),
    (6, 32.0),
    (7, 60.0),
    (8, 60.0),
    (10**6, 60.0),
]


@pytest.mark.parametrize(("attempt", "nominal"), BACKOFF_TABLE)
def test_backoff_doubles_from_one_second_to_a_minute_with_jitter_in_the_upper_half(
    attempt, nominal
) -> None:
    backoff = Backoff()
    assert backoff.nominal(attempt) == nominal
    assert backoff.delay(attempt, 0.0) == nominal
    assert nominal / 2 < backoff.delay(attempt, 0.999) < nominal


def test_a_backoff_that_cannot_wait_is_refused() -> None:
    for bad in ({"first": 0}, {"first": 2, "ceiling": 1}, {"jitter": 1}):
        with pytest.raises(ValueError):
            Backoff(**bad)
    with pytest.raises(ValueError):
        Backoff().nominal(0)


# -- which failures are store faults ---------------------------------------------------------------


def test_a_missing_table_or_a_constraint_is_no_store_fault() -> None:
    connection = sqlite3.connect(":memory:")
    with pytest.raises(sqlite3.OperationalError) as missing:
        connection.execute("SELECT * FROM nowhere")
    connection.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    connection.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as duplicate:
        connection.execute("INSERT INTO t VALUES (1)")
    # SQLite names a missing table "operational": its result code tells
    # it from a busy or full database.
    assert not passes_by_itself(missing.value)
    assert not passes_by_itself(duplicate.value)
    assert not store_fault(StoreUnavailable("the store URL is empty"))


class Refusal:
    """Makes the store at ``url`` refuse writes for real, and take them again."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self._locker = None
        if self.sqlite:
            if shutil.which("chattr") is None:
                pytest.skip("chattr is not installed (install e2fsprogs)")
            path = Path(url.removeprefix("sqlite:///"))
            self.paths = [path, path.with_name(path.name + "-wal"), path.parent]
        else:
            # The store gives up waiting on a held lock within 300 ms, as on a busy server: a lock
            # timeout, not a statement timeout, so a statement slowed by a loaded machine (not
            # blocked by the lock) still runs to its end.
            self.url = url.replace("options=", "options=-clock_timeout%3D300%20", 1)

    def begin(self, *run_ids: str) -> None:
        if self.sqlite:
            done = subprocess.run(
                ["chattr", "+i", *map(str, self.paths)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                pytest.skip(
                    f"chattr +i is refused here (it needs root and a filesystem that supports it): "
                    f"{done.stderr.strip()}"
                )
            return
        import psycopg

        self._locker = psycopg.connect(
            self.url.replace("postgresql+psycopg://", "postgresql://", 1).replace(
                "-clock_timeout%3D300%20", "", 1
            )
        )
        self._locker.execute("SELECT * FROM store_meta FOR UPDATE")
        for run_id in run_ids:
            self._locker.execute("SELECT * FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))

    def end(self) -> None:
        if self.sqlite:
            subprocess.run(
                ["chattr", "-i", *map(str, self.paths)], capture_output=True, check=False
            )
        elif self._locker is not None:
            self._locker.close()
            self._locker = None


@pytest.fixture
def refusal(store_url: str, tmp_path: Path):
    made = Refusal(store_url, tmp_path)
    try:
        yield made
    finally:
        made.end()


def test_a_store_that_refuses_writes_raises_a_store_fault_and_takes_writes_again(
    refusal: Refusal,
) -> None:
    with EventStore.open(refusal.url) as store:
        store.check_writable()
        refusal.begin()
        with pytest.raises(StoreUnavailable) as refused:
            store.check_writable()
        assert store_fault(refused.value), refused.value.message
        assert "does not accept writes" in refused.value.message
        refusal.end()
        store.check_writable()


# -- the schedule, in virtual time -----------------------------------------------------------------


class StandIn:
    """A store whose write check refuses ``refusals`` times, and a
    start that notes each re-drive."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.checks: list[float] = []
        self.started: list[tuple[float, str]] = []

    async def check_writable(self) -> None:
        self.checks.append(trio.current_time())
        if len(self.checks) <= self.refusals:
            raise StoreUnavailable(
                "the store at test does not accept writes: database or disk is full", transient=True
            )

    def start(self, run_id: str) -> bool:
        self.started.append((trio.current_time(), run_id))
        return True


FAULT = StoreUnavailable(
    "the store at test failed to commit an append: database or disk is full", transient=True
)


async def test_runs_are_re_driven_together_once_the_store_takes_a_write(
    autojump_clock, caplog
) -> None:
    caplog.set_level(logging.INFO, "salvor.healing")
    healing = StoreHealing(draw=lambda: 0.0)  # no jitter: the waits are the nominal ones
    store = StandIn(refusals=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(healing.heal_forever, store.check_writable, store.start)
        healing.stopped("run-a", FAULT)
        healing.stopped("run-b", FAULT)
        assert len(healing) == 2
        with trio.fail_after(60):
            while len(store.started) < 2:
                await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    # Checks at 1 s, then 2, 4 and 8 s after each refusal; the fourth is taken.
    assert store.checks == [1.0, 3.0, 7.0, 15.0]
    assert sorted(run for _, run in store.started) == ["run-a", "run-b"]
    assert {at for at, _ in store.started} == {15.0}
    assert "re-driving run run-a after a store error (attempt 4)" in caplog.text
    assert caplog.text.count("the store still refuses writes") == 3
    healing.settled("run-a", "rested completed")
    assert (
        "run run-a: re-driven after a store error, it got past the store on attempt 4"
        in caplog.text
    )
    # A run whose re-drive stops on the store again waits its next, longer, turn.
    healing.stopped("run-b", FAULT)
    assert healing.waiting("run-b") and len(healing) == 1


async def test_a_run_the_store_keeps_refusing_is_given_up_after_the_bound(
    autojump_clock, caplog
) -> None:
    healing = StoreHealing(give_up_after=300, draw=lambda: 0.0)
    store = StandIn(refusals=10**6)
    async with trio.open_nursery() as nursery:
        await nursery.start(healing.heal_forever, store.check_writable, store.start)
        healing.stopped("run-a", FAULT)
        with trio.fail_after(3600):
            while len(healing):
                await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert store.started == []
    assert trio.current_time() < 300 + 61
    assert "gave up re-driving run run-a after a store error" in caplog.text
    assert "`salvor resume run-a` or a restart drives it again" in caplog.text


async def test_a_run_something_else_drives_is_no_longer_waited_for(autojump_clock) -> None:
    healing = StoreHealing(draw=lambda: 0.0)
    store = StandIn(refusals=0)
    healing.stopped("run-a", FAULT)
    healing.forget("run-a")  # a resume started it
    await trio.sleep(5)
    assert await healing.heal_due(store.check_writable, store.start) == 0
    assert store.checks == [] and len(healing) == 0


# -- the driving set, over a real store ------------------------------------------------------------


async def test_a_drive_stopped_by_a_store_fault_is_driven_again_and_completes(
    store_url, refusal: Refusal, registry, clock, providers, make_agent, caplog
) -> None:
    caplog.set_level(logging.INFO, "salvor")
    provider = providers([text_reply("settled"), text_reply("settled")])
    agent = make_agent(provider)
    async with open_store_access(refusal.url) as access:
        runtime = Runtime(access, registry, clock=clock)
        run_id = await runtime.start_run(agent, {"task": "one"})
        healing = StoreHealing(backoff=Backoff(first=0.05, ceiling=0.2))
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                drivers = DriverSet(runtime, nursery, healing=healing)
                drivers.spawn(
                    lambda: healing.heal_forever(access.check_writable, drivers.start),
                    name="healing",
                )
                before = await runtime.view(run_id)
                refusal.begin(run_id)
                drivers.start(run_id, agent)
                while not healing.waiting(run_id):
                    await trio.sleep(0.02)
                assert not drivers.driving(run_id)
                assert (
                    await runtime.view(run_id)
                ).next_seq == before.next_seq  # nothing of the drive landed
                refusal.end()
                while (await runtime.view(run_id)).state is not RunState.COMPLETED:
                    await trio.sleep(0.02)
                while len(healing):
                    await trio.sleep(0.02)
                drivers.cancel_all("the test is over")
    # The write check kept the re-drives from paying for a model call
    # whose answer could not be kept.
    assert provider.call_count == 1
    assert f"re-driving run {run_id} after a store error (attempt" in caplog.text
    assert f"run {run_id}: re-driven after a store error, it got past the store" in caplog.text


async def test_a_drive_stopped_for_another_reason_is_not_retried(runtime) -> None:
    """A run whose agent this store does not hold: its drive fails for good, and is left alone."""
    orphan = "00000000-0000-4000-8000-000000000002"
    await runtime.access.append(
        orphan,
        [
            RunStarted(agent_def_hash="sha256:" + "f" * 64, input=None),
            ModelCallRequested(request_hash="sha256:" + "0" * 64),
        ],
        EMPTY_VIEW,
    )
    healing = StoreHealing()
    async with trio.open_nursery() as nursery:
        drivers = DriverSet(runtime, nursery, healing=healing)
        drivers.start(orphan)
    assert not drivers.driving(orphan) and len(healing) == 0
