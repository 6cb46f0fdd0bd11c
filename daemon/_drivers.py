"""The driving set: which runs a driver task in this process is driving now.

It is the single truth behind ``driver: attached``. One driver per run: a
second start of a run already being driven is a no-op. A driver removes
itself in ``finally``, whatever ends it (the run rested, failed, or the
daemon is stopping), so the set is exact, not a heuristic.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from salvor.protocol import CodedError

from ._agent_def import AgentDefinition
from ._operations import Runtime

log = logging.getLogger("salvor.drivers")


class DriverSet:
    """Driver tasks, one per run, in a nursery owned by the server."""

    def __init__(self, runtime: Runtime, nursery: trio.Nursery, *, concurrency: int = 64) -> None:
        self.runtime = runtime
        self._nursery = nursery
        self._scopes: dict[str, trio.CancelScope] = {}
        # Runs asked to be driven while a driver was still finishing: driven
        # once more when it ends, so a resume racing a park is never lost.
        self._again: set[str] = set()
        # Bounds how many drives touch providers and tools at once (recovery
        # after a restart may find thousands of interrupted runs).
        self._limiter = trio.CapacityLimiter(concurrency)
        self._tasks: set[trio.CancelScope] = set()

    def driving(self, run_id: str) -> bool:
        return run_id in self._scopes

    def __len__(self) -> int:
        return len(self._scopes)

    def start(self, run_id: str, agent: AgentDefinition | None = None) -> bool:
        """Start driving ``run_id``; if a driver already is, it drives once more when it ends.

        Returns True when a new driver task was started.
        """
        if run_id in self._scopes:
            self._again.add(run_id)
            return False
        scope = trio.CancelScope()
        self._scopes[run_id] = scope
        self._nursery.start_soon(self._drive, run_id, agent, scope, name=f"drive {run_id}")
        return True

    async def _drive(self, run_id: str, agent: AgentDefinition | None, scope: trio.CancelScope) -> None:
        try:
            with scope:
                async with self._limiter:
                    view = await self.runtime.drive(run_id, agent=agent)
                log.info("run %s rested %s", run_id, view.state.value)
        except CodedError as exc:
            # The run keeps its log; the failure is this drive's, not the daemon's.
            log.warning("run %s: drive stopped: %s", run_id, exc.message)
        except Exception:
            log.exception("run %s: drive crashed; its log is intact and a resume retries it", run_id)
        finally:
            if self._scopes.get(run_id) is scope:
                del self._scopes[run_id]
                if run_id in self._again and not scope.cancel_called:
                    self._again.discard(run_id)
                    self.start(run_id, agent)

    def spawn(self, fn: Callable[[], Awaitable[None]], *, name: str) -> trio.CancelScope:
        """Run a short task that belongs to no driver (a streamed client step) until it ends or the
        server stops; cancelling the returned scope ends it early."""
        scope = trio.CancelScope()
        self._tasks.add(scope)

        async def run() -> None:
            try:
                with scope:
                    await fn()
            finally:
                self._tasks.discard(scope)

        self._nursery.start_soon(run, name=name)
        return scope

    def cancel_all(self, reason: str) -> None:
        """Cancel every driver and task; each run is left at its last durable event."""
        self._again.clear()
        for scope in [*self._scopes.values(), *self._tasks]:
            scope.cancel(reason=reason)
