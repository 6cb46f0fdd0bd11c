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

A tool call with an identity (``Tool.claims``) claims it in the store in the
intent's own append, and its completion settles it in the completion's own
append; a second call of that identity, from any run, performs nothing (see
``RunContext.tool_call``).

A write whose outcome is unknown (its intent found open, or its handler
raised ``OutcomeUnknown``) is probed first when it declares a probe: the
probe is a read, so it writes nothing to the log before its verdict, and a
drive killed mid-probe leaves the same open intent for the next one.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from salvor.protocol import (
    LEGAL_NEXT,
    Actor,
    Effect,
    Envelope,
    Event,
    EventKind,
    ModelCallCompleted,
    ModelCallRequested,
    NowObserved,
    RandomObserved,
    ReplayCursor,
    ReplayDivergence,
    RunFailed,
    RunState,
    RunView,
    SleepCompleted,
    SleepStarted,
    Step,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
    fold,
    format_instant,
    parse_instant,
    resume_step,
    sha256_hash,
)
from salvor.store import Claim, ClaimHeld, PayloadTooLarge, QuotaExceeded

from ..models import ModelCallError, ModelGateway
from ..tools import (
    MissingKeyField,
    NotPerformed,
    OutcomeUnknown,
    Probe,
    ProbeVerdict,
    Tool,
    derived_key,
)
from ._claim_wait import claim_or_wait, claim_wait_seconds
from ._copied import copied_outcome
from ._drive_stops import DriveInterrupted, Parked
from ._store_access import StoreAccess, claim_to_settle
from ._tool_execution import executed_output, probe_write
from ._tool_outcomes import leaves_no_outcome, slept, tool_error, wait_event


def utc_now() -> datetime:
    return datetime.now(UTC)


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
        # The identity the held-back completion settles (or, for a failed call,
        # releases) in its append, if any.
        self._settle: str | None = None
        self._release: str | None = None
        self._on_record = on_record
        self.claim_wait_seconds = claim_wait_seconds()

    @property
    def live(self) -> bool:
        return self.cursor.at_end

    # -- recording -------------------------------------------------------

    async def record(
        self,
        *events: Event,
        claim: str | None = None,
        settle: str | None = None,
        release: str | None = None,
    ) -> list[Envelope]:
        """Commit held-back events plus ``events`` in one append.

        ``claim``: an identity to claim for the batch's intent. A held-back
        completion with an identity settles it in this same append, or
        releases it when the call failed. ``settle`` / ``release``: the
        identity a completion among ``events`` settles, or (a failed call)
        releases; a batch settles or releases one identity at most.

        Raises:
            ClaimHeld: ``claim`` belongs to another call; nothing was written
                and the held-back events are still held.
            Parked: (failed) the batch was over the store's quota; instead of it the run's
                failure naming the limit was recorded (``_fail_over_quota``).
        """
        if (settle or release) and (self._settle or self._release):
            raise AssertionError("a batch settles or releases one identity at most")
        batch = self._held + list(events)
        held_settle, held_release = self._settle, self._release
        self._held, self._settle, self._release = [], None, None
        try:
            envelopes, self.view = await self.access.append(
                self.run_id,
                batch,
                self.view,
                claim=claim,
                settle=settle or held_settle,
                release=release or held_release,
            )
        except ClaimHeld:
            self._held = batch[: len(batch) - len(events)]
            self._settle, self._release = held_settle, held_release
            raise
        except (QuotaExceeded, PayloadTooLarge) as over:
            await self._fail_over_quota(over)
        if self._on_record is not None:
            self._on_record(envelopes)
        return envelopes

    async def _fail_over_quota(self, over: QuotaExceeded | PayloadTooLarge) -> None:
        """Record the run's failure, naming the limit its batch was over, and stop the drive.

        The batch is dropped whole (an open intent stays open, as after any failure); the
        failure is one ending event, which the quota's margin always takes.

        Raises:
            Parked: (failed) once the failure is recorded.
            QuotaExceeded / PayloadTooLarge: the run is in a state no failure may follow (it
                sleeps, waits on a person or on a reconciliation); nothing was written.
        """
        if RunFailed.KIND not in LEGAL_NEXT[self.view.state]:
            raise over
        envelopes, self.view = await self.access.append(
            self.run_id, [RunFailed(error=over.message)], self.view
        )
        if self._on_record is not None:
            self._on_record(envelopes)
        raise Parked(RunState.FAILED) from None

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
        not pass records ``RunFailed``. A drive whose node may no longer act on the
        run (``RunDriving.gate``) stops before the call goes out, the intent open.
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
        self.access.driving.gate(self.run_id)
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

    async def tool_call(
        self,
        tool: Tool,
        tool_input: Any,
        *,
        probe: Tool | None = None,
        key: str | None = None,
        write_key: str | None = None,
    ) -> Any:
        """One tool call; returns the value the model is told (after any park and resume).

        A completed call is answered from the log. An open ``read`` or
        ``idempotent`` intent is executed again under its recorded key (and
        settles the claim it holds). An open ``write``, and a write whose
        handler could not learn its outcome (``OutcomeUnknown``), is probed
        when ``tool`` declares a probe and ``probe`` is its read
        (``_reconcile``); otherwise, or when the probe cannot tell, the run
        parks in needs_reconciliation (its claim stays open until ``resolve``
        settles it).

        Keys: a call of a tool with key fields (``Tool.claims``) presents its
        identity (``Tool.call_identity``) as its key and claims it with its
        intent; an ``idempotent`` call without key fields presents ``key``
        when given (a graph's tool node passes ``graph_call_key``), else its
        position's derived key (``derived_key``); a ``write`` without key fields presents
        ``write_key`` when given (a file write's path and bytes), else none; a ``read``, none.

        Raises:
            DriveInterrupted: the handler could not perform the call now
                (``NotPerformed``), or this node may no longer act on the run
                (``RunDriving.gate``); its intent stays open for the next drive.
            CallInFlight: another call holds the identity and did not settle
                within ``claim_wait_seconds``; no intent was written.
        """
        if tool.effect is Effect.IDEMPOTENT and not self.live:
            self._skip_legacy_key()
        recorded = self.cursor.tool_call(tool.name, tool_input)
        step = resume_step(recorded)
        if step is Step.ANSWER:
            return await self._after_tool(recorded.completion.event.output)
        if step is Step.LIVE:
            return await self._live_tool_call(tool, tool_input, probe, key, write_key)
        if step is Step.PARK and (tool.probe is None or probe is None):
            await self.park(RunState.NEEDS_RECONCILIATION)
        seq, key = recorded.seq, recorded.intent.event.idempotency_key
        # Our own open claim (it names this run and seq) is ours to settle.
        settle = await claim_to_settle(self.access, self.run_id, seq, key) if tool.claims else None
        if step is Step.PARK:
            return await self._reconcile(tool, probe, tool_input, seq, key, settle)
        return await self._perform(tool, tool_input, seq, key, settle)

    def _skip_legacy_key(self) -> None:
        # Logs from before derived keys recorded a RandomObserved (the key's
        # random part) ahead of each idempotent intent: consume it, so those
        # logs replay; the intent's recorded key is what a re-execution uses.
        try:
            self.cursor.take(EventKind.RANDOM_OBSERVED)
        except ReplayDivergence:
            pass

    async def _live_tool_call(
        self,
        tool: Tool,
        tool_input: Any,
        probe: Tool | None,
        given_key: str | None = None,
        write_key: str | None = None,
    ) -> Any:
        seq = self.view.next_seq + len(self._held)

        def intent(key: str | None) -> ToolCallRequested:
            return ToolCallRequested(
                tool=tool.name, input=tool_input, effect=tool.effect.value, idempotency_key=key
            )

        if not tool.claims:
            key = None
            if tool.effect is Effect.IDEMPOTENT:
                key = given_key or derived_key(self.run_id, seq, tool.name)
            elif tool.effect is Effect.WRITE:
                key = write_key
            await self.record(intent(key))
            return await self._perform(tool, tool_input, seq, key, None, probe)
        try:
            identity = tool.call_identity(tool_input)
        except MissingKeyField as exc:
            # Recorded, not raised: the model is told and may call again with the field.
            output = tool_error("invalid_input", exc.message, 1)
            await self.record(intent(None), ToolCallCompleted(seq=seq, output=output))
            return output
        holder = await self.claim(intent(identity), identity)
        if holder is None:
            return await self._perform(tool, tool_input, seq, identity, identity, probe)
        # The identity already completed (in this run or another): its outcome is this call's.
        copied = ToolCallCompleted(
            seq=seq,
            output=copied_outcome(tool, holder.output),
            deduplicated_from={"run_id": holder.run_id, "seq": holder.seq},
        )
        await self.record(intent(identity), copied)
        return await self._after_tool(copied.output)

    async def claim(self, intent: ToolCallRequested, identity: str) -> Claim | None:
        """Record ``intent`` claiming ``identity``: None once claimed, or the settled claim to copy.

        The one claim wait of every performed call: a built-in agent's
        (``tool_call``) and a process agent's through an MCP stand-in.
        With a settled claim returned, nothing was written: the caller
        records ``intent`` with the copied outcome.

        A claim held open by another call is waited on, polling the store
        with a backoff, for ``claim_wait_seconds`` at most: a call in flight
        usually settles in moments, and waiting lets the second run copy its
        outcome instead of stopping. A claim still open past the bound stops
        the drive: its holder died mid-call or is parked on the unknown write
        (the log cannot tell those from a call in flight; only the holder's
        completion or ``resolve`` settles it).

        Cancellation: the wait is cancellable; a cancelled wait wrote nothing.

        Raises:
            CallInFlight: still open past the bound; held-back events are
                committed, the intent is not.
        """
        return await claim_or_wait(self, intent, identity)

    async def _perform(
        self,
        tool: Tool,
        tool_input: Any,
        seq: int,
        key: str | None,
        settle: str | None,
        probe: Tool | None = None,
    ) -> Any:
        """Execute the call whose intent is recorded at ``seq``, and hold its completion back.

        ``probe``: the read that tells whether the write landed, asked when the
        handler raises ``OutcomeUnknown``; without one that parks the run.
        """
        try:
            output = await executed_output(self.access, self.run_id, tool, tool_input, seq, key)
        except OutcomeUnknown:
            if tool.probe is not None and probe is not None:
                return await self._reconcile(tool, probe, tool_input, seq, key, settle)
            # Sent and never answered: the open intent is the honest record.
            await self.park(RunState.NEEDS_RECONCILIATION)
        except NotPerformed as exc:
            raise DriveInterrupted(exc.message) from None
        self._held.append(ToolCallCompleted(seq=seq, output=output))
        if leaves_no_outcome(tool, output):
            # A failed call leaves no outcome to copy: the next caller of the
            # identity performs it afresh rather than inherit this failure.
            self._release = settle
        else:
            self._settle = settle
        return await self._after_tool(output)

    async def _reconcile(
        self,
        tool: Tool,
        reader: Tool,
        tool_input: Any,
        seq: int,
        key: str | None,
        settle: str | None,
    ) -> Any:
        """Finish the write at ``seq`` whose outcome is unknown, as its probe's answer says.

        Landed: the completion (``settled_by: "probe"``, the probe's call as
        evidence) is held back with the answer as output, and settles the
        write's claim. Did not land: the write is performed again under its
        recorded key, once; should that too end unknown, the run parks, so a
        flaky provider never loops. Cannot tell: the run parks in
        needs_reconciliation, as without a probe.

        Every probe's answer is recorded first (``store.claims.put_probe_answer``)
        for the reconciliation queue; the log gets nothing before the verdict.
        """
        verdict, output, evidence = await self.probe_write(tool.probe, reader, tool_input, seq)
        if verdict is ProbeVerdict.LANDED:
            self._held.append(
                ToolCallCompleted(seq=seq, output=output, settled_by=Actor.PROBE, probe=evidence)
            )
            self._settle = settle
            return await self._after_tool(output)
        if verdict is ProbeVerdict.NOT_LANDED:
            return await self._perform(tool, tool_input, seq, key, settle)
        await self.park(RunState.NEEDS_RECONCILIATION)

    async def probe_write(
        self, probe: Probe, reader: Tool, write_input: Any, seq: int
    ) -> tuple[ProbeVerdict, Any, dict]:
        """This run's ``probe_write``: ``_reconcile``'s, and a process agent's MCP lane's."""
        return await probe_write(self.access, self.run_id, probe, reader, write_input, seq)

    async def after_tool(self, output: Any) -> Any:
        """What a tool call whose output is ``output`` gives the model: the output, or (an output
        asking the run to wait) the resume's input once it parks and is resumed."""
        return await self._after_tool(output)

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
