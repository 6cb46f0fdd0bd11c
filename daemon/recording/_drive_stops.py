"""How a drive stops short of its run's end: the run rests, or the drive is interrupted.

Each is raised out of the record-or-replay loop (``RunContext``) once the log says what the next
drive needs to know; none of them leaves anything held back uncommitted that matters to the run.
"""

from __future__ import annotations

from salvor.protocol import CodedError, ErrorCode, RunState
from salvor.store import Claim


class Parked(Exception):
    """The run reached a resting point; the driver stops. The log already says why."""

    def __init__(self, state: RunState) -> None:
        super().__init__(state.value)
        self.state = state


class DriveInterrupted(CodedError):
    """The drive stopped early with the run recoverable; ``message`` says how to continue.

    The model call's intent is left open (the legal crash state): resuming
    re-issues it.
    """

    code = ErrorCode.MODEL_EXECUTION


class CallInFlight(DriveInterrupted):
    """A call's identity is claimed by another call that has not settled; nothing of it was written.

    The drive stopped before this call's intent (what it already held back is
    committed), so the run is recoverable: the next drive asks again, and
    performs the call or copies the holder's outcome once the holder settled.
    """

    code = ErrorCode.CLAIM_HELD

    def __init__(self, message: str, claim: Claim) -> None:
        super().__init__(message)
        self.claim = claim
