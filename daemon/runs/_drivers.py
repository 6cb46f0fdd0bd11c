"""The driving set: which runs a driver task in this process is driving now.

It is the single truth behind ``driver: attached``. One driver per run: a
second start of a run already being driven is a no-op. A driver removes
itself in ``finally``, whatever ends it (the run rested, failed, or the
daemon is stopping), so the set is exact, not a heuristic.

Drives are paced: at most ``concurrency`` drive at once, and of those at
most ``launches`` are starting local processes (a process agent, a built-in
agent's stdio MCP servers) at any moment. A launch holds its slot until the
run records something, its drive ends, or ``launch_settle_seconds`` pass:
an interpreter that starts costs a core for a while, and after a restart
dozens of them starting at once starve the server's own thread. A drive
that stops on a store fault is handed to ``healing``, which drives it again
once the store accepts writes; one that stops on ``CallInFlight`` (another
run's unfinished call holds its call's identity) to ``claim_waits``, which
drives it again once that holder settles.

A stop cancels every driver with a reason and waits for them within a
deadline (``DRAIN_SECONDS`` unless the server says otherwise). A driver
still there past it is one a shielded wait holds, an append the writer
never confirms: the log names the run, and the store's door abandons
those appends, so the stop ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from salvor.protocol import CodedError
from salvor.store import Fenced, store_fault

from ..agents import AgentDefinition, AgentKind
from ..metrics import concerning_run
from ..recording import CallInFlight, DriveStopped
from ._claim_waits import FALLBACK_POLL_SECONDS, ClaimWaits
from ._healing import StoreHealing
from ._run_reads import driver_of
from ._runtime import Runtime

log = logging.getLogger("salvor.drivers")

# How long a stop waits for cancelled drivers to end before it gives up on them.
DRAIN_SECONDS = 10.0


def in_flight(exc: BaseException) -> CallInFlight | None:
    """The ``CallInFlight`` that stopped a drive, found in an exception group too (a graph walk's
    nursery wraps what its nodes raise); None when it is not one."""
    return _found(exc, CallInFlight)


def _found(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _found(inner, kind)
            if found is not None:
                return found
    return None


def launches_processes(agent: AgentDefinition) -> bool:
    """Whether a drive of ``agent`` starts local processes.

    It does for a process agent, or for stdio MCP servers.
    """
    return agent.kind is AgentKind.PROCESS or any(
        server.command is not None for server in agent.mcp_servers
    )


class _LaunchSlot:
    """One of the launch slots, released once (by whichever of its ends comes first)."""

    __slots__ = ("_held", "_slots")

    def __init__(self, slots: trio.Semaphore) -> None:
        self._slots = slots
        self._held = True

    def release(self, *_: object) -> None:
        if self._held:
            self._held = False
            self._slots.release()


class DriverSet:
    """Driver tasks, one per run, in a nursery owned by the server."""

    def __init__(
        self,
        runtime: Runtime,
        nursery: trio.Nursery,
        *,
        concurrency: int = 64,
        launches: int = 2,
        launch_settle_seconds: float = 1.0,
        healing: StoreHealing | None = None,
        claim_poll_seconds: float = FALLBACK_POLL_SECONDS,
    ) -> None:
        self.runtime = runtime
        self._nursery = nursery
        self._scopes: dict[str, trio.CancelScope] = {}
        # Runs asked to be driven while a driver was still finishing: driven
        # once more when it ends, so a resume racing a park is never lost.
        self._again: set[str] = set()
        # Bounds how many drives touch providers and tools at once (recovery
        # after a restart may find thousands of interrupted runs).
        self._limiter = trio.CapacityLimiter(concurrency)
        self._launches = trio.Semaphore(launches)
        self._launch_settle = launch_settle_seconds
        self._tasks: set[trio.CancelScope] = set()
        # Runs recovery handed over whose drive has not begun yet (waiting for a slot).
        self._recovering: set[str] = set()
        # Each driver's "the run shows as driven" (``shown``), set by its hold or its end.
        self._shown: dict[str, trio.Event] = {}
        self.healing = healing if healing is not None else StoreHealing()
        self.claim_waits = ClaimWaits(
            runtime.access, drive=self.start, spawn=self.spawn, poll_seconds=claim_poll_seconds
        )
        self._closed = False
        # Set once the set is stopping and the last driver or task has ended.
        self._drained = trio.Event()

    def driving(self, run_id: str) -> bool:
        return run_id in self._scopes

    def __len__(self) -> int:
        return len(self._scopes)

    @property
    def recovering(self) -> int:
        """How many runs recovery started that are still waiting for their drive to begin."""
        return len(self._recovering)

    def start(
        self, run_id: str, agent: AgentDefinition | None = None, *, recovery: bool = False
    ) -> bool:
        """Start driving ``run_id``; if a driver already is, it drives once more when it ends.

        Returns True when a new driver task was started (never once the set is stopping).
        """
        if self._closed:
            return False
        if run_id in self._scopes:
            self._again.add(run_id)
            return False
        # Whoever starts it now (a resume, a wake, the healer itself), it
        # is not waiting for the healer, nor for another run's claim.
        self.healing.forget(run_id)
        self.claim_waits.forget(run_id)
        scope = trio.CancelScope()
        self._scopes[run_id] = scope
        self._shown[run_id] = trio.Event()
        if recovery:
            self._recovering.add(run_id)
        self._nursery.start_soon(
            self._drive, run_id, agent, scope, recovery, name=f"drive {run_id}"
        )
        return True

    async def shown(self, run_id: str) -> None:
        """Wait until the driver of ``run_id`` started here shows in the store: its hold claimed
        the run, or found another drive holding it, or the drive ended. From then on every node
        reads the run as driven (or where its drive left it), never as resting where it was
        before. Returns at once when no driver here drives it."""
        shown = self._shown.get(run_id)
        if shown is not None:
            await shown.wait()

    async def _drive(
        self,
        run_id: str,
        agent: AgentDefinition | None,
        scope: trio.CancelScope,
        recovery: bool = False,
    ) -> None:
        how = None  # stays None when the drive was cancelled: it proved nothing about the store
        held: CallInFlight | None = None  # the claim wait that stopped the drive, if one did
        # This task is the drive's own: what it (and every task it starts) logs concerns the run.
        concerning_run(run_id)
        try:
            # The run is held before a pacing slot is taken: a drive waiting for another drive
            # of the same run (its parent's walk driving it inline) waits without a slot.
            # Recovery lets a run go that another node drives (it took the orphan first).
            with scope:
                shown = self._shown[run_id].set
                async with (
                    self.runtime.access.driving.hold(run_id, wait=not recovery, shown=shown),
                    self._limiter,
                ):
                    if agent is None:
                        view = await self.runtime.reads.view(run_id)
                        if view.graph_hash is None:
                            agent = await self.runtime.definitions.load_agent(view.agent_def_hash)
                    if agent is None:
                        # A graph run: its agent nodes are built-in (no process to pace).
                        self._recovering.discard(run_id)
                        view = await self.runtime.drive(run_id)
                    else:
                        view = await self._drive_paced(run_id, agent)
                how = f"rested {view.state.value}"
                log.info("run %s %s", run_id, how)
                waiting = driver_of(view)
                if waiting is not None and view.terminal:
                    # A child the drive of its parent left parked (a map item, a subagent's
                    # child) has ended here (resumed by a person, woken): the parent's drive
                    # records it and goes on.
                    self.start(waiting)
        except DriveStopped as exc:
            # Stopped on purpose (an abandon): whoever stopped it says what happens next.
            how = exc.message
            log.info("run %s: %s", run_id, how)
        except Exception as exc:  # noqa: BLE001 -- a drive's failure is its run's, told in the log
            how, held = self._stopped(run_id, exc)
        finally:
            self._recovering.discard(run_id)
            if how is not None and not self.healing.waiting(run_id):
                self.healing.settled(run_id, how)
            if self._scopes.get(run_id) is scope:
                del self._scopes[run_id]
                self._shown.pop(run_id).set()
                if held is not None and not self._closed:
                    # Nobody need resume it: driven again once the holder settles.
                    self.claim_waits.wait(run_id, held.claim)
                if run_id in self._again and not scope.cancel_called:
                    self._again.discard(run_id)
                    self.start(run_id, agent)
            self._maybe_drained()

    def _stopped(self, run_id: str, exc: Exception) -> tuple[str, CallInFlight | None]:
        """What a drive that raised ``exc`` says of itself, and the claim wait that stopped it."""
        if _found(exc, Fenced) is not None:
            # Another node took the run over and drives it now: no healing, no retry here.
            how = "drive ended: another node took the run over"
            log.info("run %s: %s", run_id, how)
            return how, None
        held = in_flight(exc)
        if isinstance(exc, CodedError):
            if store_fault(exc):
                self.healing.stopped(run_id, exc)
            # The run keeps its log; the failure is this drive's, not the daemon's.
            how = f"drive stopped: {exc.message}"
            log.warning("run %s: %s", run_id, how)
        elif held is not None:
            how = f"drive stopped: {held.message}"
            log.warning("run %s: %s", run_id, how)
        else:
            how = "drive crashed"
            log.exception(
                "run %s: drive crashed; its log is intact and a resume retries it", run_id
            )
        return how, held

    async def _drive_paced(self, run_id: str, agent: AgentDefinition):
        if not launches_processes(agent):
            self._recovering.discard(run_id)
            return await self.runtime.drive(run_id, agent=agent)
        await self._launches.acquire()
        slot = _LaunchSlot(self._launches)
        self._recovering.discard(run_id)

        async def settle() -> None:
            await trio.sleep(self._launch_settle)
            slot.release()

        timer = self.spawn(settle, name=f"launch slot {run_id}")
        try:
            return await self.runtime.drive(run_id, agent=agent, on_record=slot.release)
        finally:
            slot.release()
            timer.cancel(reason="the launch slot was released")

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
                self._maybe_drained()

        self._nursery.start_soon(run, name=name)
        return scope

    def cancel_all(self, reason: str) -> None:
        """Cancel every driver and task, and start no more; each run is
        left at its last durable event."""
        self._closed = True
        self._again.clear()
        for scope in [*self._scopes.values(), *self._tasks]:
            scope.cancel(reason=reason)
        self._maybe_drained()

    def _maybe_drained(self) -> None:
        if self._closed and not self._scopes and not self._tasks:
            self._drained.set()

    async def stop(self, reason: str, *, drain_seconds: float = DRAIN_SECONDS) -> list[str]:
        """Cancel everything (``cancel_all``) and wait up to ``drain_seconds`` for it to end.

        Returns the runs whose drivers had not ended by then, sorted; each
        is logged by id. Their appends still waiting on the writer are
        abandoned (``StoreAccess.abandon``): such a driver hears that the
        outcome is not known, and its run's log says it on the next start.
        A driver held by some other shielded wait ends when that wait does.
        """
        self.cancel_all(reason)
        with trio.move_on_after(drain_seconds):
            await self._drained.wait()
        left = sorted(self._scopes)
        if left:
            log.warning(
                "%d run(s) did not drain within %gs of the stop (held by a shielded wait, "
                "such as an append the store has not confirmed): %s; their unconfirmed "
                "appends are abandoned and the next start recovers them",
                len(left),
                drain_seconds,
                ", ".join(left),
            )
            self.runtime.access.abandon("the daemon stopped")
        return left
