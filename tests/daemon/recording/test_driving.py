"""The one answer to "who drives this run" in a process: a drive of a held run waits for the one
holding it, then goes on; the same task holding it again holds it once; a cancelled wait takes
nothing; a run nobody holds or waits for leaves no entry behind; a stop ends the holder and those
waiting, not the drive that comes after it."""

from __future__ import annotations

import trio
import trio.testing
from salvor.daemon.recording import DriveStopped, InProcessDriving


async def test_a_second_drive_of_a_held_run_waits_for_the_first_to_end(autojump_clock):
    driving = InProcessDriving()
    order = []

    async def drive(name: str, seconds: float) -> None:
        async with driving.hold("run"):
            order.append(f"{name} in")
            await trio.sleep(seconds)
            order.append(f"{name} out")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drive, "first", 5)
        await trio.testing.wait_all_tasks_blocked()
        assert driving.driven("run")
        nursery.start_soon(drive, "second", 1)
        await trio.testing.wait_all_tasks_blocked()  # so that it waits before the third does
        nursery.start_soon(drive, "third", 1)
    assert order == ["first in", "first out", "second in", "second out", "third in", "third out"]
    assert not driving.driven("run")
    assert driving._holds == {}


async def test_other_runs_are_not_held_up(autojump_clock):
    driving = InProcessDriving()
    async with driving.hold("run"):
        with trio.fail_after(1):
            async with driving.hold("another"):
                assert driving.driven("run") and driving.driven("another")


async def test_the_task_that_holds_a_run_holds_it_again_at_once(autojump_clock):
    driving = InProcessDriving()
    async with driving.hold("run"):
        with trio.fail_after(1):
            async with driving.hold("run"):
                assert driving.driven("run")
        assert driving.driven("run")  # the inner block did not let it go
    assert not driving.driven("run")


async def test_a_cancelled_wait_takes_nothing_and_leaves_nothing(autojump_clock):
    driving = InProcessDriving()
    waited = trio.CancelScope()

    async def wait_for_the_run() -> None:
        with waited:
            async with driving.hold("run"):
                raise AssertionError("held while another drive held it")

    async with driving.hold("run"), trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_the_run)
        await trio.testing.wait_all_tasks_blocked()
        assert driving._holds["run"].users == 2
        waited.cancel(reason="the test gives up waiting")
    assert waited.cancelled_caught
    assert driving._holds == {}


async def test_a_stop_ends_the_holder_and_those_waiting_and_leaves_the_next_one_be(autojump_clock):
    driving = InProcessDriving()
    ended: dict[str, str] = {}

    async def drive(name: str) -> None:
        try:
            async with driving.hold("run"):
                await trio.sleep(100)
            ended[name] = "rested"
        except DriveStopped as exc:
            ended[name] = exc.message

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drive, "holder")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(drive, "waiting")
        await trio.testing.wait_all_tasks_blocked()
        assert driving.stop("run", "the run is being abandoned") == 2
        assert driving.stop("another", "nobody drives it") == 0
        # The stopper holds the run next: a drive that comes after it is not stopped.
        async with driving.hold("run"):
            nursery.start_soon(drive, "after")
            await trio.testing.wait_all_tasks_blocked()
    stopped = "the drive of run run was stopped: the run is being abandoned"
    assert ended == {"holder": stopped, "waiting": stopped, "after": "rested"}
    assert driving._holds == {}
