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

A lane is three parts: ``McpLane`` here takes each message and decides by the
log what becomes of it; ``LaneRecord`` (``_mcp_record``) writes the lane's
intents and completions, claims a keyed call's identity and parks the run
when a result asks; ``LiveServer`` (``_mcp_live``) holds the real server's
session, performs the calls sent it and keeps what the server sends besides
its answers. An open write of a parked run is settled by its probe
(``_mcp_probe``).

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

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from salvor.protocol import Envelope, ReplayLane, Step

from ..mcp import McpServerSpec
from ..recording import DriveInterrupted, claim_to_settle
from ._flow_server import FlowServer
from ._mcp_agent_channel import AgentChannel
from ._mcp_endpoint import serve_fixed_port
from ._mcp_live import RUN_ENDED, LiveServer
from ._mcp_probe import probe_open_write
from ._mcp_record import LaneRecord, after_finish
from ._mcp_replay import (
    LaneCall,
    answer_of,
    call_failed,  # noqa: F401 -- still importable from the lane, where its users look
    call_input,
    error_answer,
    lane_calls,
    lane_names,
    mismatch,
)
from ._model_proxy import ProxySession

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
        # The agent's server-push stream, and its answers to the server's requests.
        self.agent = AgentChannel(spec.name)
        self.live = LiveServer(
            spec, proxy, self.replay, self.agent, nursery, environ, mark, in_process
        )
        self.record = LaneRecord(spec, proxy, self.replay, self.live, in_process)

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
        notes, self.record.outbox = self.record.outbox, []
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

    async def _call(
        self, request_id: Any, method: str, params: dict, headers: Mapping[str, str]
    ) -> dict:
        """The answer to one request, by what the lane's log holds at its position."""
        record = self.record
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
            return await record.diverged(request_id, decision.divergence.message)
        if step is Step.ANSWER:
            return await record.replayed(request_id, call)
        if step is Step.PARK:
            probed = await probe_open_write(record, request_id, call)
            if probed is not None:
                return probed
            # It did not land: performed again under its recorded key, below.
        if step is Step.REPRODUCE:
            return await record.reproduce(request_id, method, asked, call)
        if step is Step.LIVE:
            opened = await record.open_intent(request_id, method, params, asked)
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
        return await record.complete(request_id, call, output, settle)

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
