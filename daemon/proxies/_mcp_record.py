"""A lane's calls in the run's log: the intent a live request opens, the completion that settles
it, and the answer the agent gets from either, parking the run when a result asks.

A ``tools/call`` of a write or idempotent tool the server's
``idempotency_keys`` names key fields for claims its identity across runs
with its intent, exactly as a built-in agent's call of that tool does
(``RunContext.claim``), and carries it to the server as
``_meta.salvor.idempotency_key``: an identity that already completed is
answered with that call's result (``deduplicated_from``) and never forwarded;
one still held past the wait stops the drive with nothing of the call written
(``ProxySession.interrupt``). The completion settles the claim, or releases it
when the call failed (``call_failed``). An idempotent call without key fields
presents its position's derived key.

A ``tools/call`` result carrying ``_meta.salvor`` parks the run as it does a
built-in agent's (the same check, ``salvor_outcome``): the agent process is
stopped, and the drive that resumes or wakes the run starts it again and
answers that call with what the wait returned (``LaneRecord.answer``).
"""

from __future__ import annotations

from typing import Any

import trio
from salvor.protocol import (
    DivergenceReason,
    Effect,
    ReplayLane,
    RunState,
    SleepStarted,
    ToolCallCompleted,
    ToolCallRequested,
)

from ..mcp import McpServerSpec
from ..recording import CallInFlight, slept, tool_error, wait_event
from ..tools import MissingKeyField, call_identity, derived_key
from ._flow_server import (
    FlowServer,
    finish_of,
    key_fields,
    relays_registry_tool,
    tool_error_result,
)
from ._mcp_live import RUN_ENDED, LiveServer
from ._mcp_replay import (
    LaneCall,
    answer_of,
    call_failed,
    copied_output,
    error_answer,
    lane_tool,
    notifications_of,
    stub_result,
)
from ._model_proxy import ProxySession
from ._salvor_writes import plan_lane_write


class LaneRecord:
    """What one lane writes to the run's log in one drive, and what the agent is answered."""

    def __init__(
        self,
        spec: McpServerSpec,
        proxy: ProxySession,
        replay: ReplayLane,
        live: LiveServer,
        in_process: FlowServer | None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.proxy = proxy
        self.ctx = proxy.ctx
        self.replay = replay
        self.live = live
        self.in_process = in_process
        # Server notifications due to the agent with the next answer.
        self.outbox: list[dict] = []

    def effect(self, method: str, params: dict) -> Effect:
        tool = params.get("name")
        if method == "tools/call" and self.in_process is not None:
            return self.in_process.effect_of(tool)
        if method != "tools/call" or tool in self.spec.results:
            # Listing, pinging, reading: no effect. A stubbed tool is salvor's own constant answer.
            return Effect.READ
        return self.spec.effect_of(tool) if isinstance(tool, str) else Effect.WRITE

    async def diverged(self, request_id: Any, message: str) -> dict:
        await self.proxy.record_failure(message)
        return error_answer(request_id, RUN_ENDED, message)

    async def open_intent(
        self, request_id: Any, method: str, params: dict, asked: dict
    ) -> tuple[LaneCall, str | None] | dict:
        """Record a live request's intent: the call and the identity it claimed, or the answer.

        A ``tools/call`` of a write or idempotent tool with key fields claims its identity
        (``call_identity``, as a built-in agent's call of that server's tool does) in the
        intent's append, waiting on another call holding it (``RunContext.claim``). An answer
        comes back instead of a call to perform when the request is settled here: the identity
        had completed (its outcome is copied, ``deduplicated_from``; the server never sees the
        call), the input lacks a key field or a file write's plan refused (recorded as the
        call's failure), or the identity stayed held past the wait (nothing written; the drive
        stops, recoverable, and the process with it).
        """
        effect = self.effect(method, params)
        seq = self.ctx.view.next_seq + self.ctx.held
        tool = lane_tool(self.name, method)
        # A file write of the salvor lane carries its plan, keyed by it (``_salvor_writes``).
        asked, write_key, refused = await plan_lane_write(
            self.in_process, method, asked, self.proxy.run_id, seq
        )

        def intent(key: str | None) -> ToolCallRequested:
            return ToolCallRequested(
                tool=tool, input=asked, effect=effect.value, idempotency_key=key
            )

        name, arguments = params.get("name"), params.get("arguments")
        paths, server = key_fields(self.spec, self.in_process, method, name)
        if refused is None and (effect is Effect.READ or not paths):
            # Without key fields an idempotent call presents its position's key.
            idem = effect is Effect.IDEMPOTENT
            key = derived_key(self.proxy.run_id, seq, tool) if idem else write_key
            await self.ctx.record(intent(key))
            return self._track(LaneCall(seq, method, asked, effect.value, key)), None
        if refused is None:
            try:
                identity = call_identity(name, paths, arguments, mcp_server=server)
            except MissingKeyField as exc:
                refused = tool_error("invalid_input", exc.message, 1)
        if refused is not None:
            # Recorded, not raised: the agent is told, and may call again as it says.
            await self.ctx.record(intent(None), ToolCallCompleted(seq=seq, output=refused))
            call = LaneCall(seq, method, asked, effect.value, None)
            return self._settled(request_id, call, refused)
        try:
            holder = await self.ctx.claim(intent(identity), identity)
        except CallInFlight as exc:
            self.proxy.interrupt(exc)
            return error_answer(
                request_id, RUN_ENDED, f"{exc.message}; this agent process is stopped"
            )
        call = LaneCall(seq, method, asked, effect.value, identity)
        if holder is None:
            return self._track(call), identity
        output = copied_output(
            holder.output, registry=relays_registry_tool(self.in_process, method, name)
        )
        copied = ToolCallCompleted(
            seq=seq,
            output=output,
            deduplicated_from={"run_id": holder.run_id, "seq": holder.seq},
        )
        await self.ctx.record(intent(identity), copied)
        return self._settled(request_id, call, output)

    def _track(self, call: LaneCall) -> LaneCall:
        self.replay.record(call)
        return call

    def _settled(self, request_id: Any, call: LaneCall, output: Any) -> dict:
        """The answer of a call whose completion was recorded with its intent."""
        call.output, call.completed = output, True
        self.replay.record(call)
        self.replay.advance()
        return answer_of(request_id, output)

    async def complete(
        self, request_id: Any, call: LaneCall, output: Any, settle: str | None
    ) -> dict:
        """Record the completion of a performed call, settling (or, when it failed, releasing)
        the claim ``settle`` its intent took; the agent's answer."""
        wait = wait_event(output)
        # A failed call leaves no outcome to copy: its identity is released,
        # and the next caller performs the call afresh.
        failed = call_failed(output)
        with trio.CancelScope(shield=True):
            # A wait its result asks for is recorded with the
            # completion: no log ends between the two.
            await self.ctx.record(
                ToolCallCompleted(seq=call.seq, output=output),
                *([wait] if wait else []),
                settle=None if failed else settle,
                release=settle if failed else None,
            )
        call.output, call.completed = output, True
        if wait is not None:
            call.wait.append(wait)
        self.replay.advance()
        self.outbox = notifications_of(output)
        return await self.answer(request_id, call)

    async def replayed(self, request_id: Any, call: LaneCall) -> dict:
        """The answer of a call the log completed; the server never sees it."""
        self.replay.advance()
        self.outbox = notifications_of(call.output)
        await self.live.ask_again(call.output)
        return await self.answer(request_id, call)

    async def reproduce(self, request_id: Any, method: str, asked: dict, call: LaneCall) -> dict:
        """A re-run's request past its own log, answered with the
        origin's ``call`` at this position."""
        if wait_event(call.output) is not None and not call.woken()[0]:
            return await self.diverged(
                request_id, self.replay.refuse(DivergenceReason.NEVER_CONTINUED, call).message
            )
        # Nothing runs, so the copy is held and committed with the run's next event
        # (as reproduced model calls are).
        seq = self.ctx.view.next_seq + self.ctx.held
        intent = ToolCallRequested(
            tool=lane_tool(self.name, method),
            input=asked,
            effect=call.effect,
            idempotency_key=call.idempotency_key,
        )
        copy = LaneCall(
            seq,
            method,
            asked,
            call.effect,
            call.idempotency_key,
            call.output,
            True,
            list(call.wait),
        )
        # The origin's wait is reproduced with the call: a re-run never waits.
        self.ctx.hold(intent, ToolCallCompleted(seq=seq, output=call.output), *call.wait)
        self.replay.record(copy)
        self.replay.advance()
        self.outbox = notifications_of(call.output)
        await self.live.ask_again(call.output)
        return await self.answer(request_id, copy)

    async def answer(self, request_id: Any, call: LaneCall) -> dict:
        """The agent's answer to a completed call; for one whose result
        parked the run, the run parks here.

        A call whose wait has ended (the run was resumed, or woke) is
        answered with what the wait returned, as a tool result. One whose
        wait has not: the run rests (suspended, or sleeping until its
        ``wake_at``), the agent is answered with an error naming it and then
        stopped with its whole process group. The next drive (a resume, the
        wake sweeper) starts it again from the top of the log, like
        recovery does: its recorded calls, this one included, are answered
        from the log, so the tool that parked the run is never executed
        again.
        """
        wait = wait_event(call.output)
        if self.in_process is not None and (finished := finish_of(call)) is not None:
            self.proxy.finished = finished
        if wait is None:
            return answer_of(request_id, call.output)
        if not call.wait:
            # A log whose completion came without its wait (this lane appends the two at once).
            with trio.CancelScope(shield=True):
                await self.ctx.record(wait)
            call.wait.append(wait)
        ended, value = call.woken()
        if (
            not ended
            and self.ctx.view.state is RunState.SLEEPING
            and await self.ctx.wake_when_due()
        ):
            ended, value = True, slept(wait.wake_at)
        if ended:
            return answer_of(request_id, {"result": stub_result(value)})
        self.proxy.rested.set()
        state = self.ctx.view.state.value
        until = f" until {self.ctx.view.wake_at()}" if isinstance(wait, SleepStarted) else ""
        return error_answer(
            request_id,
            RUN_ENDED,
            (
                f"run {self.proxy.run_id} is {state}{until}: the result of "
                f"{call.input.get('name')!r} asked salvor to park it (`_meta.salvor`); this agent "
                "process is stopped and started again when the run "
                f"{'wakes' if until else 'is resumed'}, and this call is then answered from the log"
            ),
        )


def after_finish(tool: Any) -> dict:
    """The MCP error result of a ``tools/call`` made after the run's good finish."""
    return tool_error_result(
        f"the run has finished (its finish was recorded), so {tool!r} is not called: no tool "
        "can be called after finish"
    )
