"""Runs whose drive stopped on ``CallInFlight``, each driven again once the claim's holder settles.

A call whose identity another run's unfinished call holds waits for it a
while inside the drive (``RunContext.claim``); past that bound the drive
stops and the run rests ``running`` with no driver. Nobody needs to resume
it: the holder's completion (or a person's resolve) settles the claim in the
same transaction as the holder's append, and every committed batch is seen
here (``StoreAccess.on_commit``), so a commit of the holder's run wakes the
runs waiting on it, which read the claim and, once it is no longer the open
claim they stopped on (settled, released, or claimed by another call), are
handed back to the driving set. The next drive copies the outcome, or
performs the call, or stops on the new holder and waits again.

A holder in another process (a `salvor run` or `salvor resume` in a shell
over the same store) commits nothing this process sees, so each wait also
reads the claim every ``FALLBACK_POLL_SECONDS``: such a run goes on within
seconds of the settle too.

Each wait is a short task of the driving set: the set's stop cancels it
(the run stays as its last drive left it, and the next start recovers it as
an interrupted run), and so does any other start of the run (a resume, a
wake), which takes the run on itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from salvor.protocol import Envelope, RunView
from salvor.store import Claim

from ..recording import StoreAccess

log = logging.getLogger("salvor.drivers")

# How often a wait reads the claim when no commit of its holder woke it (a holder in another
# process): a read per waiting run, a few seconds at most between the settle and the drive.
FALLBACK_POLL_SECONDS = 2.0


class ClaimWaits:
    """The runs waiting on another run's open claim, by run."""

    def __init__(
        self,
        access: StoreAccess,
        *,
        drive: Callable[[str], object],
        spawn: Callable[..., trio.CancelScope],
        poll_seconds: float = FALLBACK_POLL_SECONDS,
    ) -> None:
        """``drive``: starts a run's drive (the driving set's ``start``); ``spawn``: runs a
        short task the set's stop cancels (the set's ``spawn``)."""
        self._access = access
        self._drive = drive
        self._spawn = spawn
        self._poll = poll_seconds
        self._scopes: dict[str, trio.CancelScope] = {}
        # Holder run -> the wake-ups of the runs waiting on one of its claims.
        self._wakes: dict[str, set[trio.Event]] = {}
        access.on_commit.append(self._committed)

    def __len__(self) -> int:
        return len(self._scopes)

    def waiting(self, run_id: str) -> bool:
        return run_id in self._scopes

    def wait(self, run_id: str, claim: Claim) -> None:
        """Drive ``run_id`` again once ``claim`` (its holder's, open when its drive stopped) is
        no longer that open claim; a wait already there for the run is replaced."""
        self.forget(run_id)
        log.info(
            "run %s waits for run %s's call at seq %d to settle; it is driven on then",
            run_id,
            claim.run_id,
            claim.seq,
        )
        scope: trio.CancelScope | None = None

        async def until_settled() -> None:
            await self._until_settled(claim)
            if self._scopes.get(run_id) is scope:
                del self._scopes[run_id]
                self._drive(run_id)

        scope = self._spawn(until_settled, name=f"claim wait {run_id}")
        self._scopes[run_id] = scope

    def forget(self, run_id: str) -> None:
        """End ``run_id``'s wait, if any: something else drives it now."""
        scope = self._scopes.pop(run_id, None)
        if scope is not None:
            scope.cancel(reason=f"run {run_id} is driven by another start")

    async def _until_settled(self, claim: Claim) -> None:
        while True:
            # Registered before the read: a settle committed after it wakes this wait.
            woken = trio.Event()
            self._wakes.setdefault(claim.run_id, set()).add(woken)
            try:
                now = await self._access.read(self._access.store.claims.get_claim, claim.identity)
                if not _still_held(now, claim):
                    return
                with trio.move_on_after(self._poll):
                    await woken.wait()
            finally:
                wakes = self._wakes.get(claim.run_id)
                if wakes is not None:
                    wakes.discard(woken)
                    if not wakes:
                        del self._wakes[claim.run_id]

    def _committed(self, envelopes: list[Envelope], _view: RunView) -> None:
        # On the trio thread, after each of this process's commits: cheap unless a run waits.
        if self._wakes and envelopes:
            for woken in self._wakes.get(envelopes[0].run_id, ()):
                woken.set()


def _still_held(now: Claim | None, stopped_on: Claim) -> bool:
    """Whether the claim read ``now`` is still the open claim a drive stopped on."""
    return (
        now is not None
        and now.state == "open"
        and (now.run_id, now.seq) == (stopped_on.run_id, stopped_on.seq)
    )
