"""The runs a serving daemon takes up of itself: the sleeping runs whose instant has passed, and
(for a caller that recovers without the takeover) the runs the log says were interrupted."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from salvor.protocol import CodedError

from ..api import ServerState, refuse_if_driven_elsewhere
from ..runs import ResumeOutcome

log = logging.getLogger("salvor.serve")


async def interrupted_runs(
    state: ServerState, driven_elsewhere: Callable[[list[str]], set[str]] | None = None
) -> list[str]:
    """The server-driven runs the log says were interrupted (one index read, nothing per run).

    ``driven_elsewhere`` names, in one call, the runs another live salvor (a
    ``salvor run``) drives right now: they are not interrupted, so they are
    left out.

    Raises:
        StoreUnavailable: the store cannot be read.
    """
    runtime = state.runtime
    interrupted = await runtime.reads.interrupted_runs()
    if driven_elsewhere is None:
        return interrupted
    skip = await trio.to_thread.run_sync(driven_elsewhere, interrupted)
    return [run_id for run_id in interrupted if run_id not in skip]


def recover(state: ServerState, run_ids: list[str]) -> int:
    """Hand every interrupted run to the driving set; returns how many drivers were started.

    Nothing is read here, and nothing waits: each driver loads its run's
    view and agent itself, inside the driving set's bounds (how many drive
    at once, how many start processes at once), so the server answers while
    recovery goes on. A run whose agent this store does not hold (or that no
    longer builds) is logged by its driver and left as it is.
    """
    return sum(state.drivers.start(run_id, recovery=True) for run_id in run_ids)


async def sweep_once(state: ServerState) -> int:
    """Re-drive every sleeping run whose instant has passed, through the resume path."""
    woken = 0
    for run_id in await state.runtime.reads.due_runs():
        if state.drivers.driving(run_id):
            continue
        try:
            await refuse_if_driven_elsewhere(state, run_id)
            decision = await state.runtime.control.resume(run_id)
        except CodedError as exc:
            # One bad run does not stop the sweep; it stays due.
            log.warning("sleeping run %s not woken: %s", run_id, exc.message, extra={"run": run_id})
            continue
        if decision.outcome is ResumeOutcome.DRIVING:
            woken += state.drivers.start(run_id)
    return woken


async def sweep_forever(state: ServerState, interval: float) -> None:
    while True:
        await sweep_once(state)
        # Uploads no call named in time go too: one conditional delete on the store's clock, so
        # whichever node sweeps first removes them and the others find nothing left.
        await state.runtime.uploads.sweep()
        await trio.sleep(interval)
