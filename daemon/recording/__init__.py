"""A run's write-ahead record: the store access (one writer thread, batched appends) and the run
context that records every call before it happens.

Rule: imports only the packages below it (``web``, ``processes``, ``models``, ``tools``).
"""

from __future__ import annotations

from ._claim_wait import claim_wait_seconds
from ._drive_stops import CallInFlight, DriveInterrupted, Parked
from ._driving import DriveStopped, InProcessDriving, RunDriving
from ._free_space import DEFAULT_MIN_FREE_BYTES, FreeSpaceFloor
from ._refusals import (
    checked_labels,
    chosen_run_id,
    needs_reconciliation,
    parse_run_id,
)
from ._run_context import RunContext, utc_now
from ._store_access import (
    StoreAccess,
    claim_to_settle,
    open_store_access,
)
from ._tool_outcomes import outcome_output, slept, tool_error, wait_event

__all__ = [
    "DEFAULT_MIN_FREE_BYTES",
    "CallInFlight",
    "DriveInterrupted",
    "DriveStopped",
    "FreeSpaceFloor",
    "InProcessDriving",
    "Parked",
    "RunContext",
    "RunDriving",
    "StoreAccess",
    "checked_labels",
    "chosen_run_id",
    "claim_to_settle",
    "claim_wait_seconds",
    "needs_reconciliation",
    "open_store_access",
    "outcome_output",
    "parse_run_id",
    "slept",
    "tool_error",
    "utc_now",
    "wait_event",
]
