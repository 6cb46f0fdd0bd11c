"""Who drives a run: one answer, asked by every drive before it reads the run's log.

Exactly-once rests on one driver per run. A run is driven from many places: the driving set's
task (a start, a resume, recovery, the wake sweeper, the healer), its parent's walk (a subagent
call, a map item), and the command line. Two drives of one run at once both read the same open
write, both probe it "not landed", and both perform it. Every drive therefore holds the run
here for as long as it reads and appends the run's log; a second drive of a held run waits for
the first to end, then reads the log the first left and goes on from there (usually to find the
run already at rest). Nobody drives a run without holding it: ``agents.drive`` and
``graphs.drive_graph`` take the hold themselves.

This is the in-process answer. The question is the interface (``RunDriving``): several processes
over one store answer it with a row in the store (an owner and an epoch) behind the same calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

import trio


class RunDriving(Protocol):
    """Which runs are being driven, and the hold a drive takes on its run."""

    def driven(self, run_id: str) -> bool:
        """Whether some drive holds ``run_id`` now."""
        ...

    def hold(self, run_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold ``run_id`` for a drive, waiting while another drive holds it.

        Held again by the task that holds it, it is held once (a drive whose caller took the
        hold first, such as the driving set's task waiting before it takes a pacing slot).
        A cancelled wait takes nothing.
        """
        ...


class _Hold:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()  # FIFO: drives waiting on one run go in the order they came
        self.users = 0  # the holder and those waiting: the entry goes when the last one leaves


class InProcessDriving:
    """``RunDriving`` for the drives of one process (its trio thread)."""

    def __init__(self) -> None:
        self._holds: dict[str, _Hold] = {}

    def driven(self, run_id: str) -> bool:
        hold = self._holds.get(run_id)
        return hold is not None and hold.lock.locked()

    @contextlib.asynccontextmanager
    async def hold(self, run_id: str) -> AsyncIterator[None]:
        hold = self._holds.get(run_id)
        if hold is not None and hold.lock.statistics().owner is trio.lowlevel.current_task():
            yield  # this task holds it already
            return
        if hold is None:
            hold = self._holds[run_id] = _Hold()
        hold.users += 1
        try:
            async with hold.lock:
                yield
        finally:
            hold.users -= 1
            if hold.users == 0:
                del self._holds[run_id]
