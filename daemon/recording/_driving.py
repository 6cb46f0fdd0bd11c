"""Who drives a run: one answer, asked by every drive before it reads the run's log.

Exactly-once rests on one driver per run. A run is driven from many places: the driving set's
task (a start, a resume, recovery, the wake sweeper, the healer), its parent's walk (a subagent
call, a map item), and the command line. Two drives of one run at once both read the same open
write, both probe it "not landed", and both perform it. Every drive therefore holds the run
here for as long as it reads and appends the run's log; a second drive of a held run waits for
the first to end, then reads the log the first left and goes on from there (usually to find the
run already at rest). Nobody drives a run without holding it: ``agents.drive`` and
``graphs.drive_graph`` take the hold themselves.

A drive can also be stopped from outside (``stop``): abandoning a run ends whatever drive holds
it, and the drives waiting for it, before ``RunAbandoned`` is appended, so the drive's process is
gone and nothing it would still record lands after the run's end. A stopped drive raises
``DriveStopped`` out of its hold.

This is the in-process answer. The question is the interface (``RunDriving``): several processes
over one store answer it with a row in the store (an owner and an epoch) behind the same calls
(``cluster.StoreDriving``), adding what this one never needs: the fence a held run's appends
carry, and the gate every effect passes before it starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import trio
from salvor.protocol import CodedError, ErrorCode


class DriveStopped(CodedError):
    """A drive was stopped from outside its task (``RunDriving.stop``), with the reason given.

    Everything the drive recorded before it stopped stays recorded; its effects in flight were
    cancelled (a process it started was killed with its group), leaving their intents open.
    """

    code = ErrorCode.WRONG_STATE


class RunDriving(Protocol):
    """Which runs are being driven, and the hold a drive takes on its run."""

    def driven(self, run_id: str) -> bool:
        """Whether some drive holds ``run_id`` now."""
        ...

    def hold(
        self,
        run_id: str,
        *,
        here: bool = False,
        wait: bool = True,
        shown: Callable[[], None] | None = None,
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold ``run_id`` for a drive, waiting while another drive holds it.

        Held again by the task that holds it, it is held once (a drive whose caller took the
        hold first, such as the driving set's task waiting before it takes a pacing slot).
        A cancelled wait takes nothing.

        ``here``: hold it in this process only, never taking it from another process (an
        abandon, which records the run's end over whoever drives it). ``wait`` False: when
        another process drives the run, give up at once instead of waiting for it (recovery,
        which has no business with a run someone else drives).

        ``shown``: called once every process over the store would see the run driven: this hold
        is taken (in the store too), or another drive (here, or another node's) is found holding
        it. A resume answers only then, so a stream on another node never reads the run as
        resting at the write it is about to probe.

        Raises:
            DriveStopped: ``stop`` stopped this drive (while it held the run, or waited for it),
                or (``wait`` False) another process drives the run.
        """
        ...

    def fence(self, run_id: str, *, creating: bool = False) -> object | None:
        """What this process's appends to ``run_id`` carry to prove their drive still owns it
        (the store refuses a stale one); None when no drive here holds it in the store.

        ``creating``: for the append that writes the run's first event. With no drive here
        holding it, a node answers the mark that makes it the new run's owner (not yet driving
        it) in that same transaction: a run exists only with an owner, so no peer's takeover
        takes it between its creation and its first drive's claim.
        """
        ...

    def gate(self, run_id: str) -> None:
        """Called before an effect of ``run_id``'s drive starts (its intent already durable).

        Raises:
            DriveInterrupted: this process may no longer start effects for the run; nothing
                was started, the intent stays open for whoever drives the run next.
        """
        ...

    def stop(self, run_id: str, reason: str) -> int:
        """Stop the drive that holds ``run_id`` and those waiting for it; returns how many.

        Each of them is cancelled and leaves its hold with ``DriveStopped`` saying ``reason``.
        A drive that holds the run afterwards is not affected: a caller that must be sure no
        drive goes on takes the hold itself next.
        """
        ...


class _Hold:
    __slots__ = ("lock", "stops", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()  # FIFO: drives waiting on one run go in the order they came
        self.users = 0  # the holder and those waiting: the entry goes when the last one leaves
        # Each user's cancel scope, by which ``stop`` ends it, and the reason it was stopped.
        self.stops: dict[trio.CancelScope, str | None] = {}


class InProcessDriving:
    """``RunDriving`` for the drives of one process (its trio thread)."""

    def __init__(self) -> None:
        self._holds: dict[str, _Hold] = {}

    def driven(self, run_id: str) -> bool:
        hold = self._holds.get(run_id)
        return hold is not None and hold.lock.locked()

    def held_by_this_task(self, run_id: str) -> bool:
        """Whether the current task holds ``run_id`` (a hold taken again is no new hold)."""
        hold = self._holds.get(run_id)
        return hold is not None and hold.lock.statistics().owner is trio.lowlevel.current_task()

    def fence(self, run_id: str, *, creating: bool = False) -> None:
        return None  # one process: the hold alone keeps a second drive out

    def gate(self, run_id: str) -> None:
        pass  # nobody else may take the run while this process lives

    @contextlib.asynccontextmanager
    async def hold(
        self,
        run_id: str,
        *,
        here: bool = False,
        wait: bool = True,
        shown: Callable[[], None] | None = None,
    ) -> AsyncIterator[None]:
        if self.held_by_this_task(run_id):
            yield  # this task holds it already
            return
        hold = self._holds.get(run_id)
        if hold is None:
            hold = self._holds[run_id] = _Hold()
        elif hold.lock.locked() and shown is not None:
            shown()  # another drive here holds it: it shows as driven already
        hold.users += 1
        scope = trio.CancelScope()
        hold.stops[scope] = None
        try:
            with scope:
                async with hold.lock:
                    if shown is not None:
                        shown()
                    yield
        finally:
            reason = hold.stops.pop(scope)
            hold.users -= 1
            if hold.users == 0:
                del self._holds[run_id]
        if scope.cancelled_caught:
            raise DriveStopped(f"the drive of run {run_id} was stopped: {reason}")

    def stop(self, run_id: str, reason: str) -> int:
        hold = self._holds.get(run_id)
        if hold is None:
            return 0
        for scope in hold.stops:
            hold.stops[scope] = reason
            scope.cancel(reason=reason)
        return len(hold.stops)
