"""Drive-token leases: the single-writer hold on a client-driven run.

A client that opens (or adopts) a client-driven run gets a drive token; every
driving call presents it and so refreshes the hold. A hold that goes quiet
for the TTL lapses, and the next open takes the run with a fresh token.

``DriveLeases`` is what the client-run service asks of the holds. Two kinds
keep them: ``LeaseRegistry`` here, in this process only, on the trio clock (a
restart drops them all: the run's log says it is client-driven, and the first
open after a restart adopts it; tests move time with ``autojump_clock``), and
``StoredLeases`` (``_stored_leases``), in the store on the database's clock,
so a client may drive through any node over it. The daemon uses the stored one.
"""

from __future__ import annotations

import hmac
import math
import os
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

import trio
from salvor.protocol import ErrorCode

from ..web import OperationRefused

DEFAULT_TTL_SECONDS = 60.0
TTL_VARIABLE = "SALVOR_CLIENT_LEASE_TTL_SECS"


def lease_ttl(environ: Mapping[str, str] = os.environ) -> float:
    """The TTL from ``SALVOR_CLIENT_LEASE_TTL_SECS`` (default 60 s).

    Raises:
        ValueError: the variable is set to something that is not a positive number of seconds.
    """
    text = environ.get(TTL_VARIABLE)
    if text is None or not text.strip():
        return DEFAULT_TTL_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{TTL_VARIABLE}={text!r} must be a positive number of seconds")
    return value


def missing_token() -> OperationRefused:
    return OperationRefused(
        ErrorCode.MISSING_DRIVE_TOKEN,
        "this call drives a client-driven run and needs its drive token in the X-Drive-Token "
        "header (POST /v1/client-runs answers it)",
    )


def invalid_token(run_id: str) -> OperationRefused:
    return OperationRefused(
        ErrorCode.INVALID_DRIVE_TOKEN,
        f"the drive token is not the current lease on run {run_id}: the lease lapsed or "
        "another driver holds it; re-open the run with POST /v1/client-runs to drive it again",
    )


def lease_held(run_id: str, seconds_left: float) -> OperationRefused:
    lapses = whole_seconds(seconds_left)
    return OperationRefused(
        ErrorCode.LEASE_HELD,
        f"another driver holds run {run_id}; its lease lapses in {lapses}s if that "
        "driver goes quiet, and re-opening works then (or as soon as the run finishes)",
        details={"lapses_in_seconds": lapses},
    )


def whole_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))


def new_token() -> str:
    return "dt_" + secrets.token_urlsafe(24)


class DriveLeases(Protocol):
    """The holds on client-driven runs, one per run (at most one driver per run)."""

    ttl: float

    async def opened(self, run_id: str) -> bool:
        """Whether the run was opened under a lease still standing (its head may not be
        appended yet, so its log may not say it is client-driven)."""
        ...

    async def holds(self, run_id: str) -> bool:
        """Whether a current lease stands on the run (the ``driver: attached`` fact)."""
        ...

    async def holding(self, run_ids: Collection[str]) -> set[str]:
        """Which of ``run_ids`` a current lease stands on (``holds`` for a page of runs)."""
        ...

    def seen_holding(self, run_id: str) -> bool:
        """``holds`` from this process's memory alone, for a caller that cannot wait: exact for
        leases kept in memory; for leases kept elsewhere, whether this process saw one stand on
        the run within the last tenth of the TTL."""
        ...

    async def record_prompts(self, run_id: str) -> bool:
        """What the current lease's open said of keeping model request bodies (False
        without one)."""
        ...

    async def open(
        self,
        run_id: str,
        presented: str | None,
        *,
        terminal: bool = False,
        record_prompts: bool = False,
    ) -> str:
        """The drive token for an open: the presented one back while it holds, else a fresh
        lease. A terminal run is never held: it opens at once.

        Raises:
            OperationRefused: lease_held (409) when another driver's lease is current.
        """
        ...

    async def check(self, run_id: str, presented: str | None) -> None:
        """Admit a driving call (and refresh the hold it proves alive).

        Raises:
            OperationRefused: missing_drive_token (401), invalid_drive_token (403).
        """
        ...

    async def heartbeat(self, run_id: str, presented: str | None) -> int:
        """Refresh the hold; the whole seconds it now lasts (``check``'s refusals)."""
        ...

    async def release(self, run_id: str, presented: str | None) -> bool:
        """Hand the hold back; False when there was none to give back.

        Raises:
            OperationRefused: invalid_drive_token (403) when a hold stands and the caller did
                not present it (a missing token included).
        """
        ...

    async def drop(self, run_id: str) -> None:
        """Clear any hold (an operator resolved the run: its driver is gone)."""
        ...


@dataclass(slots=True)
class _Lease:
    token: str
    expires_at: float
    # Whether the daemon's model steps keep their request bodies (said at the open).
    record_prompts: bool = False


# Lapsed leases nobody touches again are swept when the registry has grown
# past this many (then past twice what survived): a long-lived daemon's
# memory stays proportional to the runs driven now, not to every run ever.
_SWEEP_FLOOR = 1024


class LeaseRegistry:
    """The current holds, one per run, and the runs this process opened, in its memory (a
    ``DriveLeases``)."""

    def __init__(self, ttl: float = DEFAULT_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._leases: dict[str, _Lease] = {}
        # Runs opened here under a lease still standing, including ones whose
        # head the client has not appended yet (so the log cannot say so).
        # A run leaves with its lease: from then on its log answers.
        self._opened: set[str] = set()
        self._sweep_at = _SWEEP_FLOOR

    def _current(self, run_id: str) -> _Lease | None:
        lease = self._leases.get(run_id)
        if lease is not None and trio.current_time() >= lease.expires_at:
            self._forget(run_id)
            lease = None
        return lease

    def _forget(self, run_id: str) -> None:
        self._leases.pop(run_id, None)
        self._opened.discard(run_id)

    def _sweep(self) -> None:
        now = trio.current_time()
        for run_id in [r for r, lease in self._leases.items() if now >= lease.expires_at]:
            self._forget(run_id)
        self._sweep_at = max(_SWEEP_FLOOR, 2 * len(self._leases))

    @staticmethod
    def _matches(lease: _Lease, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode(), lease.token.encode()
        )

    def _refresh(self, lease: _Lease) -> None:
        lease.expires_at = trio.current_time() + self.ttl

    async def opened(self, run_id: str) -> bool:
        """Whether the run was opened here under a lease still standing (a
        lapsed one is forgotten first)."""
        self._current(run_id)
        return run_id in self._opened

    async def holds(self, run_id: str) -> bool:
        """Whether a current lease stands on the run (the ``driver: attached`` fact)."""
        return self._current(run_id) is not None

    async def holding(self, run_ids: Collection[str]) -> set[str]:
        return {run_id for run_id in run_ids if self._current(run_id) is not None}

    def seen_holding(self, run_id: str) -> bool:
        return self._current(run_id) is not None

    async def record_prompts(self, run_id: str) -> bool:
        """What the current lease's open said of keeping model request
        bodies (False without one)."""
        lease = self._current(run_id)
        return lease is not None and lease.record_prompts

    async def open(
        self,
        run_id: str,
        presented: str | None,
        *,
        terminal: bool = False,
        record_prompts: bool = False,
    ) -> str:
        """The drive token for an open: the presented one back while it holds, else a fresh lease.

        A terminal run is never held: it takes no more appends, so it opens at once.
        ``record_prompts`` is taken by a fresh lease; the holder's re-open keeps what its
        lease was opened with.

        Raises:
            OperationRefused: lease_held (409) when another driver's lease is current.
        """
        lease = self._current(run_id)
        if lease is not None and not terminal:
            if self._matches(lease, presented):
                self._refresh(lease)
                return lease.token
            raise lease_held(run_id, lease.expires_at - trio.current_time())
        if len(self._leases) >= self._sweep_at:
            self._sweep()
        token = new_token()
        self._leases[run_id] = _Lease(token, trio.current_time() + self.ttl, record_prompts)
        self._opened.add(run_id)
        return token

    async def check(self, run_id: str, presented: str | None) -> None:
        """Admit a driving call (and refresh the hold it proves alive).

        Raises:
            OperationRefused: missing_drive_token (401), invalid_drive_token (403).
        """
        if presented is None:
            raise missing_token()
        lease = self._current(run_id)
        if lease is None or not self._matches(lease, presented):
            raise invalid_token(run_id)
        self._refresh(lease)

    async def heartbeat(self, run_id: str, presented: str | None) -> int:
        """Refresh the hold; the whole seconds it now lasts."""
        await self.check(run_id, presented)
        return whole_seconds(self.ttl)

    async def release(self, run_id: str, presented: str | None) -> bool:
        """Hand the hold back; False when there was none to give back.

        Raises:
            OperationRefused: invalid_drive_token (403) when a hold stands and
                the caller did not present it (a missing token included).
        """
        lease = self._current(run_id)
        if lease is None:
            return False
        if not self._matches(lease, presented):
            raise invalid_token(run_id)
        self._forget(run_id)
        return True

    async def drop(self, run_id: str) -> None:
        """Clear any hold (an operator resolved the run: its driver is gone)."""
        self._forget(run_id)
