"""A process run's MCP lanes: each request the agent sends a declared server,
recorded or answered from the log.

One lane per declared server per drive. A request is matched by position
within its lane (a ``ReplayLane``; ``_mcp_replay`` says how two requests
differ): one the log completed is answered from it and the server never sees
it; an open ``read`` or ``idempotent`` intent is
executed again under its recorded key; past the end of the log the request
is recorded write-ahead (``ToolCallRequested`` with the operator's declared
effect for a ``tools/call``, ``read`` for the other methods) and only then
forwarded. A tool with a fixed answer in ``results`` is answered here and
never forwarded. A re-run answers every request past its own log from the
origin's lane and starts no server at all.

Live, the request goes to the server's real session (``LiveServer``, ``_mcp_live``),
which also carries the server's notifications and requests to the agent.

A ``tools/call`` result carrying ``_meta.salvor`` parks the run as it does a
built-in agent's (the same check, ``salvor_outcome``): the agent process is
stopped, and the drive that resumes or wakes the run starts it again and
answers that call with what the wait returned (``McpLane._answer``).

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

A run parked on an open ``write`` whose server declares a probe (``probes``)
is driven like any other: the agent's replay reaches that call, and while
the agent waits on it the lane asks the probe (a read of the same server,
over the lane's own session) and settles the write by its answer
(``McpLane._probe``); a write with no probe is never performed again here.
The ``salvor`` lane's file writes carry their own plan and probe (``_salvor_writes``).

The ``salvor`` server's lane (``_flow_server``) is a lane like these, recorded
and replayed alike; only its live half differs: its server answers in this
process and is never started (``in_process``), and an agent that never reaches
it has done nothing wrong. A call it cannot perform now (``NotPerformed``: a
subagent's child rests short of a result) leaves its intent open and stops the
process, as a park does; the next drive asks it again. Once the run's good
``finish`` was answered (live or from the log), every later ``tools/call`` on
any lane is answered with an MCP tool error and neither performed nor recorded.

Requests of one run are serialised with its model calls through the run's
one open-intent slot (``ProxySession.exclusive``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from salvor.protocol import (
    Actor,
    DivergenceReason,
    Effect,
    Envelope,
    ReplayLane,
    RunState,
    SleepStarted,
    Step,
    ToolCallCompleted,
    ToolCallRequested,
)

from ..mcp import (
    McpNoAnswer,
    McpRemoteError,
    McpServerSpec,
    McpUnavailable,
    probe_answer,
)
from ..recording import (
    CallInFlight,
    DriveInterrupted,
    claim_to_settle,
    slept,
    tool_error,
    wait_event,
)
from ..tools import (
    MissingKeyField,
    Probe,
    ProbeVerdict,
    Tool,
    ToolCall,
    ToolFailed,
    call_identity,
    derived_key,
)
from ._flow_server import FlowServer, finish_of, key_fields, probe_request, tool_error_result
from ._mcp_agent_channel import AgentChannel
from ._mcp_endpoint import serve_fixed_port
from ._mcp_live import RUN_ENDED, LiveServer
from ._mcp_replay import (
    LaneCall,
    answer_of,
    call_failed,
    call_input,
    copied_output,
    error_answer,
    lane_calls,
    lane_names,
    lane_probe,
    lane_tool,
    mismatch,
    notifications_of,
    stub_result,
)
from ._model_proxy import ProxySession
from ._salvor_writes import lane_write_probe, plan_lane_write

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602


def variable_suffix(server: str) -> str:
    """``<NAME>`` of a server's variables: upper-cased, anything but letters and digits as ``_``."""
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in server.upper())


class McpLane:
    """The exchanges of one drive with one declared server."""

    def __init__(
        self,
        spec: McpServerSpec,
        proxy: ProxySession,
        log: Sequence[Envelope],
        origin_log: Sequence[Envelope] | None,
        nursery: trio.Nursery,
        environ: Mapping[str, str],
        mark: Mapping[str, str],
        in_process: FlowServer | None = None,
    ) -> None:
        self.spec = spec
        # The ``salvor`` server's lane: its server answers in this process, never started.
        self.in_process = in_process
        self.name = spec.name
        self.proxy = proxy
        self.ctx = proxy.ctx
        self.origin = proxy.origin
        self.replay = ReplayLane(
            lane_calls(log, spec.name),
            lane_names(spec.name),
            reference=lane_calls(origin_log, spec.name) if origin_log is not None else None,
            origin=proxy.origin,
        )
        self.contacted = False
        # Server notifications due to the agent with the next answer.
        self._outbox: list[dict] = []
        # The agent's server-push stream, and its answers to the server's requests.
        self.agent = AgentChannel(spec.name)
        self.live = LiveServer(
            spec, proxy, self.replay, self.agent, nursery, environ, mark, in_process
        )

    @property
    def session_id(self) -> str | None:
        """The real server's ``Mcp-Session-Id``, handed to the agent as it
        is (None when there is none)."""
        return self.live.session_id

    @property
    def calls(self) -> list[LaneCall]:
        """The lane's exchanges so far: the log's, then those this drive recorded."""
        return self.replay.calls

    @property
    def position(self) -> int:
        """How many of the lane's calls this drive has answered."""
        return self.replay.position

    async def aclose(self) -> None:
        self.agent.close_push()
        await self.live.aclose()

    # -- one message ------------------------------------------------------------

    async def receive(
        self, message: Any, headers: Mapping[str, str]
    ) -> tuple[dict | None, list[dict]]:
        """One JSON-RPC message from the agent: the answer (None for a notification), and the
        server notifications to hand the agent before it."""
        answer = await self._receive(message, headers)
        if answer is None:
            return None, []  # the notifications due belong to the answer of a call
        notes, self._outbox = self._outbox, []
        return answer, notes

    async def _receive(self, message: Any, headers: Mapping[str, str]) -> dict | None:
        self.contacted = True
        request_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return error_answer(request_id, INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        method = message.get("method")
        if not isinstance(method, str):
            # The agent's answer to a request of the server's (relayed by ``AgentChannel.ask``).
            self.agent.answered(message)
            return None
        if "id" not in message:
            await self.live.tell(method, message.get("params"))
            return None
        params = message.get("params", {})
        if not isinstance(params, dict):
            return error_answer(
                request_id, INVALID_PARAMS, f"the params of {method} must be an object"
            )
        answer = await self.proxy.exclusive(lambda: self._call(request_id, method, params, headers))
        if answer is None:
            return error_answer(
                request_id, RUN_ENDED, f"run {self.proxy.run_id} is no longer accepting MCP calls"
            )
        return answer

    def _effect(self, method: str, params: dict) -> Effect:
        tool = params.get("name")
        if method == "tools/call" and self.in_process is not None:
            return self.in_process.effect_of(tool)
        if method != "tools/call" or tool in self.spec.results:
            # Listing, pinging, reading: no effect. A stubbed tool is salvor's own constant answer.
            return Effect.READ
        return self.spec.effect_of(tool) if isinstance(tool, str) else Effect.WRITE

    async def _diverged(self, request_id: Any, message: str) -> dict:
        await self.proxy.record_failure(message)
        return error_answer(request_id, RUN_ENDED, message)

    async def _call(
        self, request_id: Any, method: str, params: dict, headers: Mapping[str, str]
    ) -> dict:
        asked = call_input(params)
        if method == "tools/call" and self.proxy.finished is not None:
            # After a good finish the run's work is done: nothing more is performed or recorded
            # (so a replay or a re-run refuses it the same way), and the model reads why.
            return answer_of(request_id, {"result": after_finish(asked.get("name"))})
        pending = self.ctx.view.pending
        decision = self.replay.step(
            lambda call: mismatch(call, method, asked),
            live=f"sends {method}",
            noun=method,
            open_intent=None if pending is None else (pending.seq, pending.tool or "model"),
        )
        step, call = decision.step, decision.call
        if step is Step.DIVERGED:
            return await self._diverged(request_id, decision.divergence.message)
        if step is Step.ANSWER:
            self.replay.advance()
            self._outbox = notifications_of(call.output)
            await self.live.ask_again(call.output)
            return await self._answer(request_id, call)
        if step is Step.PARK:
            probed = await self._probe(request_id, call)
            if probed is not None:
                return probed
            # It did not land: performed again under its recorded key, below.
        if step is Step.REPRODUCE:
            return await self._reproduce(request_id, method, asked, call)
        if step is Step.LIVE:
            opened = await self._open_intent(request_id, method, params, asked)
            if isinstance(opened, dict):
                return opened
            call, settle = opened
        else:
            # An open read or idempotent intent, or a write its probe found did not land,
            # executed again: a claim its intent took is its own to settle.
            settle = await claim_to_settle(
                self.ctx.access, self.proxy.run_id, call.seq, call.idempotency_key
            )
        stopped, output = await self.live.perform(request_id, method, params, headers, call)
        if stopped is not None:
            return stopped
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
        self._outbox = notifications_of(output)
        return await self._answer(request_id, call)

    async def _probe(self, request_id: Any, call: LaneCall) -> dict | None:
        """Probe the open write ``call`` (the drive starts at a run parked on it only when it has
        a probe, ``probed_write``) while the agent waits on it: a file write of the ``salvor``
        lane by the agent's ``file_holds`` (``_salvor_writes``), another by its server's.

        The probe is a read the daemon sends the same server over this lane's own live session
        (started, or dialled, from the operator's declaration exactly as a forwarded call is,
        initialised with the lane's recorded ``initialize``): no origin the operator did not
        declare is contacted, no secret goes anywhere a forwarded call's does not, and the
        probe's exchange is not one of the lane's calls (it is kept as the probe's answer,
        ``RunContext.probe_write``). Landed: the write's completion is recorded with the
        answer's ``output`` as an MCP tool result (``settled_by: "probe"``, settling its
        claim) and the agent is answered with it. Did not land: None, and the caller performs
        the write again under its recorded key, once. Cannot tell: the run stays parked and
        the agent is stopped.
        """
        found = lane_write_probe(self.in_process, call.input) or self._declared_probe(call)
        if found is None:
            return error_answer(
                request_id,
                RUN_ENDED,
                f"{self.replay.names.one} {self.position + 1} (recorded at seq {call.seq}) is an "
                "open write its server declares no probe for; a person records what it did",
            )
        probe, reader, write_input = found
        try:
            verdict, output, evidence = await self.ctx.probe_write(
                probe, reader, write_input, call.seq
            )
        except DriveInterrupted as exc:
            # The probe was not sent: this node may no longer act on the run
            # (``LiveServer.perform``).
            self.proxy.interrupt(exc)
            return error_answer(
                request_id, RUN_ENDED, f"{exc.message}; this agent process is stopped"
            )
        if verdict is ProbeVerdict.NOT_LANDED:
            return None
        if verdict is not ProbeVerdict.LANDED:
            self.proxy.rested.set()
            return error_answer(
                request_id,
                RUN_ENDED,
                f"the probe {probe.tool} could not tell whether the write at seq {call.seq} "
                f"landed; run {self.proxy.run_id} waits for a person to record what happened",
            )
        answer = {"result": probed_result(output)}
        settle = await claim_to_settle(
            self.ctx.access, self.proxy.run_id, call.seq, call.idempotency_key
        )
        with trio.CancelScope(shield=True):
            await self.ctx.record(
                ToolCallCompleted(
                    seq=call.seq, output=answer, settled_by=Actor.PROBE, probe=evidence
                ),
                settle=settle,
            )
        call.output, call.completed = answer, True
        self.replay.advance()
        self._outbox = []
        return await self._answer(request_id, call)

    def _declared_probe(self, call: LaneCall) -> tuple[Probe, Tool, Any] | None:
        """The probe this lane's server declares for the open write ``call``, the read that
        asks it over this lane's live session, and the input it reads from; or None."""
        probe = lane_probe([self.spec], lane_tool(self.name, call.method), call.input)
        if probe is None:
            return None

        async def ask(arguments: Any, attempt: ToolCall) -> Any:
            try:
                result = await probe_request(await self.live.session(), probe.tool, arguments)
            except McpRemoteError as exc:
                raise ToolFailed(exc.message, retryable=False) from None
            except (McpNoAnswer, McpUnavailable) as exc:
                raise ToolFailed(exc.message) from None
            return probe_answer(self.name, probe.tool, result)

        reader = Tool(
            name=probe.tool,
            description=f"The probe {probe.tool} of MCP server {self.name}.",
            effect=Effect.READ,
            input_schema={},
            handler=ask,
            mcp_server=self.name,
        )
        return probe, reader, call.input.get("arguments")

    async def _open_intent(
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
        effect = self._effect(method, params)
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
        output = copied_output(holder.output)
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

    async def _answer(self, request_id: Any, call: LaneCall) -> dict:
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

    async def _reproduce(self, request_id: Any, method: str, asked: dict, call: LaneCall) -> dict:
        """A re-run's request past its own log, answered with the
        origin's ``call`` at this position."""
        if wait_event(call.output) is not None and not call.woken()[0]:
            return await self._diverged(
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
        self._outbox = notifications_of(call.output)
        await self.live.ask_again(call.output)
        return await self._answer(request_id, copy)

    # -- how the drive ended ------------------------------------------------------

    def never_contacted(self) -> str | None:
        """Why the run fails when the agent never reached this stand-in; None when it did."""
        if self.contacted or self.in_process is not None:
            return None  # the agent may never need the ``salvor`` server
        suffix = variable_suffix(self.name)
        if self.spec.command is not None:
            first, second = (
                f"SALVOR_MCP_SERVER_{suffix} (the command to spawn in place of the server)",
                f"SALVOR_MCP_URL_{suffix}",
            )
        else:
            first, second = (
                f"SALVOR_MCP_URL_{suffix} (the URL to dial in place of the server)",
                f"SALVOR_MCP_SERVER_{suffix}",
            )
        return (
            f"the agent never contacted salvor's MCP stand-in for {self.name!r}: its MCP "
            f"configuration must point that server at ${first}, or at ${second}"
        )

    def shortfall(self, what_ended: str) -> str | None:
        """Why a drive that ended before making every call of this lane
        it had to make again fails."""
        short = self.replay.shortfall(what_ended)
        return None if short is None else short.message


def after_finish(tool: Any) -> dict:
    """The MCP error result of a ``tools/call`` made after the run's good finish."""
    return tool_error_result(
        f"the run has finished (its finish was recorded), so {tool!r} is not called: no tool "
        "can be called after finish"
    )


def probed_result(output: Any) -> dict:
    """The MCP tool result an agent is answered with for a write its probe found landed: the
    probe's ``output`` when it is one (it has ``content``), else that value as JSON text."""
    if isinstance(output, dict) and isinstance(output.get("content"), list):
        return output
    return {"content": [{"type": "text", "text": json.dumps(output)}]}


@asynccontextmanager
async def open_lanes(
    proxy: ProxySession,
    servers: Sequence[McpServerSpec],
    log: Sequence[Envelope],
    origin_log: Sequence[Envelope] | None,
    *,
    environ: Mapping[str, str],
    mark: Mapping[str, str],
    salvor: FlowServer | None = None,
) -> AsyncIterator[dict[str, McpLane]]:
    """The lanes of one drive, mounted on ``proxy`` for the body; every real
    session is closed at its end. ``salvor``: the in-process server of the ``salvor`` lane,
    when the run is offered one."""
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        lanes = {
            spec.name: McpLane(spec, proxy, log, origin_log, nursery, environ, mark)
            for spec in servers
        }
        if salvor is not None:
            lanes[salvor.spec.name] = McpLane(
                salvor.spec, proxy, log, origin_log, nursery, environ, mark, in_process=salvor
            )
        proxy.mcp_lanes = lanes
        try:
            for spec in servers:
                if spec.port is not None:
                    await _listen(nursery, lanes[spec.name], spec.port, proxy.run_id)
            yield lanes
        except trio.Cancelled:
            raise
        except BaseException as exc:  # noqa: BLE001 -- re-raised below, unwrapped by the nursery
            failure = exc
        finally:
            with trio.CancelScope(shield=True):
                for lane in lanes.values():
                    await lane.aclose()
            nursery.cancel_scope.cancel(reason="the drive ended; its MCP lanes close")
    if failure is not None:
        raise failure


async def _listen(nursery: trio.Nursery, lane: McpLane, port: int, run_id: str) -> None:
    """Start the fixed-port stand-in of ``lane``.

    Raises:
        DriveInterrupted: the port is taken; the run keeps its log and a later drive tries again.
    """
    try:
        await nursery.start(serve_fixed_port, lane, port)
    except* OSError as group:
        reason = group.exceptions[0]
        raise DriveInterrupted(
            f"the stand-in for MCP server {lane.name!r} could not listen on its fixed port {port} "
            f"({getattr(reason, 'strerror', None) or reason}); `salvor resume {run_id}` tries again"
        ) from None
