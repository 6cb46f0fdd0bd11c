"""Port claims: which run of this daemon holds each service agent's loopback port.

A service agent's model calls arrive at one fixed port, and the proxy there
can serve one run's trajectory only: a second run on the same port would
interleave into the first one's positional call count. So a run claims its
agent's port before its head is recorded (a new run whose port is held is
refused, nothing recorded) and a drive holds it while it is bound. Claims
live in memory: they describe what this process is doing now, and a
restarted daemon starts with none.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

log = logging.getLogger("salvor.ports")


class PortClaims:
    """Port -> the run holding it, with a wake-up for drives waiting their turn."""

    def __init__(self) -> None:
        self._holders: dict[int, str] = {}
        self._freed: dict[int, trio.Event] = {}

    def holder(self, port: int) -> str | None:
        return self._holders.get(port)

    def claim(self, port: int, run_id: str) -> str | None:
        """Claim ``port`` for ``run_id``; returns the other run holding it, or None once claimed."""
        holder = self._holders.setdefault(port, run_id)
        return None if holder == run_id else holder

    def release(self, port: int, run_id: str) -> None:
        """Give the port back (a no-op unless ``run_id`` holds it); drives waiting for it wake."""
        if self._holders.get(port) != run_id:
            return
        del self._holders[port]
        freed = self._freed.pop(port, None)
        if freed is not None:
            freed.set()

    @asynccontextmanager
    async def hold(self, port: int, run_id: str) -> AsyncIterator[None]:
        """Hold ``port`` for the body, first waiting for the run that
        holds it (if any) to end its drive.

        A recovered or resumed run can find its port held by another live
        run; it waits its turn rather than failing, so both keep their logs.
        The wait ends when the holder's drive ends (bounded by its timeout).
        """
        while (other := self.claim(port, run_id)) is not None:
            log.info("run %s waits for port %d, held by run %s", run_id, port, other)
            await self._freed.setdefault(port, trio.Event()).wait()
        try:
            yield
        finally:
            self.release(port, run_id)
