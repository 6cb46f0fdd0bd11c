"""Record-or-replay primitives a driver runs its deterministic loop through.

A driver re-runs its loop from the top of the log on every drive. Each
primitive first asks the replay cursor: a call the log already completed is
answered from the log and never executed again; an open intent is finished
according to its effect; past the end of the log the primitive goes live and
records, intent first, before any effect starts.

Completions and clock/random observations are held back and committed
together with the next intent (or the next resting event), so a step costs
one commit. Nothing with an outside effect ever runs between holding one back
and committing it, so an effect never starts before its intent is durable.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from salvor.protocol import (
    TOOL_ERROR_KEY,
    TOOL_SLEEP_KEY,
    TOOL_SUSPEND_KEY,
    CodedError,
    Effect,
    Envelope,
    ErrorCode,
    Event,
    EventKind,
    MalformedEvent,
    ModelCallCompleted,
    ModelCallRequested,
    NowObserved,
    RandomObserved,
    ReplayCursor,
    RunFailed,
    RunState,
    RunView,
    SchemaViolation,
    SleepCompleted,
    SleepStarted,
    Step,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    check_schema,
    fold,
    format_instant,
    parse_instant,
    resume_step,
    sha256_hash,
    validate,
)

from ..models import ModelCallError, ModelGateway
from ..tools import (
    DispatchFailed,
    NotPerformed,
    OutcomeUnknown,
    SleepUntil,
    Suspend,
    Tool,
    dispatch,
)
from ._store_access import StoreAccess


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


def utc_now() -> datetime:
    return datetime.now(UTC)


def tool_error(kind: str, message: str, attempts: int) -> dict:
    """The ``__salvor_error`` sentinel a failed tool call records as its output."""
    return {
        TOOL_ERROR_KEY: {"is_error": True, "kind": kind, "message": message, "attempts": attempts}
    }


def outcome_output(tool: Tool, outcome: Any, attempt: int) -> Any:
    """What a tool's outcome records as its output: a parking outcome becomes its sentinel."""
    if isinstance(outcome, Suspend):
        try:
            check_schema(outcome.input_schema)
        except MalformedEvent as exc:
            return tool_error("output_serialization", f"suspension schema: {exc.message}", attempt)
        body = {"reason": outcome.reason, "input_schema": outcome.input_schema}
        if outcome.kind is not None:
            body["kind"] = outcome.kind
        return {TOOL_SUSPEND_KEY: body}
    if isinstance(outcome, SleepUntil):
        return {TOOL_SLEEP_KEY: {"wake_at": format_instant(outcome.wake_at)}}
    return outcome


def wait_event(output: Any) -> Suspended | SleepStarted | None:
    """The event that starts the wait a tool's recorded output asks for;
    None when it asks for none."""
    if not isinstance(output, dict):
        return None
    if TOOL_SUSPEND_KEY in output:
        spec = output[TOOL_SUSPEND_KEY]
        return Suspended(
            reason=spec["reason"], input_schema=spec["input_schema"], kind=spec.get("kind")
        )
    if TOOL_SLEEP_KEY in output:
        return SleepStarted(wake_at=output[TOOL_SLEEP_KEY]["wake_at"])
    return None


def slept(wake_at: str) -> dict:
    """What a tool call that slept returns once the run wakes."""
    return {"slept_until": wake_at}


class RunContext:
    """One drive of one run: its replay cursor, its current view, held-back events."""

    def __init__(
        self,
        access: StoreAccess,
        run_id: str,
        log: Sequence[Envelope],
        *,
        on_record: Callable[[list[Envelope]], None] | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self.access = access
        self._clock = clock
        self.run_id = run_id
        self.cursor = ReplayCursor(log)
        self.view: RunView = fold(log)
        self._held: list[Event] = []
        self._on_record = on_record

    @property
    def live(self) -> bool:
        return self.cursor.at_end

    # -- recording -------------------------------------------------------

    async def record(self, *events: Event) -> list[Envelope]:
        """Commit held-back events plus ``events`` in one append."""
        batch = self._held + list(events)
        self._held = []
        envelopes, self.view = await self.access.append(self.run_id, batch, self.view)
        if self._on_record is not None:
            self._on_record(envelopes)
        return envelopes

    def hold(self, *events: Event) -> None:
        """Keep ``events`` for the next commit (they are lost if the drive ends before one)."""
        self._held.extend(events)

    @property
    def held(self) -> int:
        return len(self._held)

    async def flush(self) -> None:
        if self._held:
            await self.record()

    async def control(self, event: Event) -> None:
        """A control event: taken from the log in replay, recorded when live."""
        if self.live:
            await self.record(event)
        else:
            self.cursor.take(event.KIND)

    async def park(self, state: RunState) -> None:
        await self.flush()
        raise Parked(state)

    async def await_resume(self, state: RunState) -> Any:
        """The input a parked run was resumed with, or park here when it has none yet."""
        resumed = self.cursor.take(EventKind.RESUMED)
        if resumed is None:
            await self.park(state)
        return resumed.event.input

    # -- observations -----------------------------------------------------

    async def now(self) -> datetime:
        """The clock, recorded as NowObserved so a replay sees the same instant."""
        if not self.live:
            return parse_instant(self.cursor.take(EventKind.NOW_OBSERVED).event.now)
        recorded = format_instant(self._clock())
        self._held.append(NowObserved(now=recorded))
        return parse_instant(recorded)

    async def random(self) -> str:
        """128 random bits as hex, recorded as RandomObserved."""
        if not self.live:
            return self.cursor.take(EventKind.RANDOM_OBSERVED).event.value
        value = secrets.token_hex(16)
        self._held.append(RandomObserved(value=value))
        return value

    # -- model calls --------------------------------------------------------

    async def model_call(
        self, gateway: ModelGateway, request: dict, *, record_prompts: bool
    ) -> tuple[dict, dict]:
        """One model call: answered from the log when completed there, else (re-)issued.

        Error handling: a provider failure that may pass leaves the intent open
        (``DriveInterrupted``; ``salvor resume`` re-issues it); one that will
        not pass records ``RunFailed``.
        """
        request_hash = sha256_hash(request)
        recorded = self.cursor.model_call(request_hash)
        step = resume_step(recorded)
        if step is Step.ANSWER:
            event: ModelCallCompleted = recorded.completion.event
            return event.response, event.usage
        if step is Step.LIVE:
            intent = ModelCallRequested(
                request_hash=request_hash, request_body=request if record_prompts else None
            )
            seq = (await self.record(intent))[-1].seq
        else:
            seq = (
                recorded.seq
            )  # an open intent: a model call has no effect to fear, it is issued again
        try:
            result = await gateway.complete(request)
        except ModelCallError as exc:
            if exc.retryable:
                raise DriveInterrupted(
                    f"the model call at seq {seq} failed ({exc}); its intent stays open and "
                    f"`salvor resume {self.run_id}` issues it again"
                ) from None
            await self.record(RunFailed(error=f"the model call at seq {seq} failed: {exc}"))
            raise Parked(RunState.FAILED) from None
        self._held.append(ModelCallCompleted(seq=seq, response=result.response, usage=result.usage))
        return result.response, result.usage

    # -- tool calls ---------------------------------------------------------

    async def tool_call(self, tool: Tool, tool_input: Any) -> Any:
        """One tool call; returns the value the model is told (after any park and resume).

        A completed call is answered from the log. An open ``read`` or
        ``idempotent`` intent is executed again under its recorded key; an
        open ``write`` parks the run in needs_reconciliation, and so does a
        write whose handler could not learn its outcome (``OutcomeUnknown``).

        Raises:
            DriveInterrupted: the handler could not perform the call now
                (``NotPerformed``); its intent stays open for the next drive.
        """
        key = None
        if tool.effect is Effect.IDEMPOTENT:
            key = "idem_" + await self.random()
        recorded = self.cursor.tool_call(tool.name, tool_input)
        step = resume_step(recorded)
        if step is Step.ANSWER:
            output = recorded.completion.event.output
        else:
            if step is Step.PARK:
                await self.park(RunState.NEEDS_RECONCILIATION)
            if step is Step.LIVE:
                intent = ToolCallRequested(
                    tool=tool.name, input=tool_input, effect=tool.effect.value, idempotency_key=key
                )
                seq = (await self.record(intent))[-1].seq
            else:
                seq, key = recorded.seq, recorded.intent.event.idempotency_key
            try:
                output = await self._execute(tool, tool_input, seq, key)
            except OutcomeUnknown:
                # Sent and never answered: the open intent is the honest record.
                await self.park(RunState.NEEDS_RECONCILIATION)
            except NotPerformed as exc:
                raise DriveInterrupted(exc.message) from None
            self._held.append(ToolCallCompleted(seq=seq, output=output))
        return await self._after_tool(output)

    async def _execute(self, tool: Tool, tool_input: Any, seq: int, key: str | None) -> Any:
        try:
            validate(tool.input_schema, tool_input, what=f"the input of tool {tool.name}")
        except SchemaViolation as exc:
            return tool_error("invalid_input", exc.message, 1)
        try:
            outcome, attempt = await dispatch(
                tool, tool_input, run_id=self.run_id, seq=seq, key=key
            )
        except DispatchFailed as failed:
            return tool_error("handler", failed.message, failed.attempts)
        return outcome_output(tool, outcome, attempt)

    async def _after_tool(self, output: Any) -> Any:
        wait = wait_event(output)
        if isinstance(wait, Suspended):
            await self.control(wait)
            return await self.await_resume(RunState.SUSPENDED)
        if isinstance(wait, SleepStarted):
            await self.control(wait)
            await self.sleep_until_woken()
            return slept(wait.wake_at)
        return output

    async def wake_when_due(self) -> bool:
        """Wake a run this drive's view has sleeping, once its timer is due; True when it woke.

        A timer not yet due records nothing (the run is exactly as asleep as
        it was); a due one records the clock reading that proved it, then
        SleepCompleted.
        """
        moment = self._clock()
        if moment < parse_instant(self.view.detail["wake_at"]):
            return False
        await self.record(NowObserved(now=format_instant(moment)), SleepCompleted())
        return True

    async def sleep_until_woken(self) -> None:
        """Continue once the timer the run sleeps on is due; park sleeping
        before (``wake_when_due``)."""
        if not self.live:
            await self.now()
            await self.control(SleepCompleted())
            return
        if not await self.wake_when_due():
            await self.park(RunState.SLEEPING)
