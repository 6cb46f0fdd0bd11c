"""A call's wait on another call's open claim of its identity, and how long it may last.

The holder may be another process over the same store, so there is no event to wait on, only
the row: the wait polls it with a backoff, and stops the drive past its bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Protocol

import trio
from salvor.protocol import Envelope, Event, ToolCallRequested
from salvor.store import Claim, ClaimHeld

from ._drive_stops import CallInFlight
from ._store_access import StoreAccess

# The bound (``SALVOR_CLAIM_WAIT_SECONDS`` overrides it) and the polling backoff within it.
CLAIM_WAIT_VAR = "SALVOR_CLAIM_WAIT_SECONDS"
CLAIM_WAIT_SECONDS = 30.0
CLAIM_POLL_FIRST = 0.01
CLAIM_POLL_MAX = 0.5


class ClaimingRun(Protocol):
    """What a claim wait uses of the run whose call waits: a ``RunContext`` (which calls the
    wait, so the wait names only what it uses, and the two modules import one way)."""

    run_id: str
    access: StoreAccess
    claim_wait_seconds: float

    async def record(self, *events: Event, claim: str | None = None) -> list[Envelope]: ...

    async def flush(self) -> None: ...


def claim_wait_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How long a call waits on another call's open claim (``CLAIM_WAIT_VAR``, else the default).

    Raises:
        ValueError: the variable is set but is not a finite number of seconds, zero or more.
    """
    raw = environ.get(CLAIM_WAIT_VAR)
    if raw is None:
        return CLAIM_WAIT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"{CLAIM_WAIT_VAR} must be a number of seconds, 0 or more, not {raw!r}")
    return seconds


async def claim_or_wait(ctx: ClaimingRun, intent: ToolCallRequested, identity: str) -> Claim | None:
    """``RunContext.claim``'s wait: record ``intent`` claiming ``identity`` in ``ctx``'s run, or
    poll the claim's holder until it settles (None, or the settled claim to copy).

    Raises:
        CallInFlight: still open past ``ctx.claim_wait_seconds``; held-back events are
            committed, the intent is not.
    """
    delay = CLAIM_POLL_FIRST
    deadline = trio.current_time() + ctx.claim_wait_seconds
    while True:
        claim = await ctx.access.read(ctx.access.store.claims.get_claim, identity)
        if claim is None:
            try:
                await ctx.record(intent, claim=identity)
            except ClaimHeld:
                continue  # another call claimed it first: see what it became
            return None
        if claim.state == "settled":
            return claim
        if trio.current_time() + delay > deadline:
            await ctx.flush()
            raise CallInFlight(
                f"the {intent.tool} call's idempotency key is held by the unfinished call at "
                f"seq {claim.seq} of run {claim.run_id}; nothing of this call was written, "
                "and it is asked again (copying that call's outcome) once that call is "
                "recorded or resolved: a daemon serving this store drives the run on by "
                f"itself, else `salvor resume {ctx.run_id}` does",
                claim,
            )
        await trio.sleep(delay)
        delay = min(delay * 2, CLAIM_POLL_MAX)
