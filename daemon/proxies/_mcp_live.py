"""A lane's real server: the session salvor holds with it, the calls it performs there, and what
the server sends besides its answers.

Live, salvor runs the real server itself (``_mcp_client``), started when the
first live request needs it: with the agent's own ``initialize`` when that is
live, else (after a replayed prefix) initialised silently with the
``initialize`` parameters the lane recorded. The ``salvor`` server
(``_flow_server``) is never started: it answers in this process (``in_process``).

The agent's declared client capabilities are passed on: a request the server
sends the agent (sampling, elicitation, roots) is relayed to the agent on its
server-push stream and the agent's answer back to the server, and both are
recorded with the call they crossed; a replay asks the agent again (its answer
is not matched) before it answers that call. An agent with no push stream open
is not asked: the server hears "method not found". The notifications a server
sends are recorded with the next answer of its lane and handed to the agent
just before that answer, live and on replay; the stdio relay writes them out,
and an HTTP agent gets them on its server-push stream (``GET``) when it has
one open. The notifications the agent sends go to the live server and are not
recorded (``LiveServer.tell``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import trio
from salvor.protocol import Effect, ReplayLane

from ..mcp import (
    McpError,
    McpNoAnswer,
    McpRemoteError,
    McpServerSpec,
    McpSession,
    McpUnavailable,
    open_session,
    salvor_outcome,
)
from ..recording import DriveInterrupted, outcome_output, tool_error
from ..tools import (
    DispatchFailed,
    NotPerformed,
    OutcomeUnknown,
    Tool,
    ToolCall,
    ToolFailed,
    dispatch,
)
from ._flow_server import FlowServer
from ._mcp_agent_channel import MAX_PUSHED, AgentChannel
from ._mcp_replay import INTERNAL_ERROR, LaneCall, call_input, error_answer, lane_tool, stub_result
from ._model_proxy import ProxySession

logger = logging.getLogger("salvor.mcp")
# The run stopped answering (its drive ended, or the run failed or parked).
RUN_ENDED = -32000
# Notifications kept between two answers; more are dropped (a server flooding its log).
MAX_CROSSED = MAX_PUSHED


class LiveServer:
    """One lane's real server for one drive: no session until a live request needs one."""

    def __init__(
        self,
        spec: McpServerSpec,
        proxy: ProxySession,
        replay: ReplayLane,
        agent: AgentChannel,
        nursery: trio.Nursery,
        environ: Mapping[str, str],
        mark: Mapping[str, str],
        in_process: FlowServer | None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.proxy = proxy
        # The lane's calls: where a crossing message is anchored, and a recorded ``initialize``.
        self.replay = replay
        self.agent = agent
        self.in_process = in_process
        self._session: McpSession | FlowServer | None = None
        # Server notifications since the last answer.
        self._crossed: list[dict] = []
        # The server's requests to the agent during the live call, with the agent's answers.
        self._asked: list[dict] = []
        self._nursery = nursery
        self._environ = environ
        self._mark = mark

    @property
    def session_id(self) -> str | None:
        """The real server's ``Mcp-Session-Id``, handed to the agent as it
        is (None when there is none)."""
        return self._session.remote_session_id if self._session is not None else None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.aclose()
            self._session = None

    async def session(self) -> McpSession | FlowServer:
        """The live session, or a new one (initialised silently) when there is none or it broke."""
        if self._session is not None and self._session.broken is None:
            return self._session
        return await self._open(None)

    async def tell(self, method: str, params: Any) -> None:
        """Hand one of the agent's notifications to the live server; with none live, it is dropped.

        Never recorded: a notification gets no answer, so nothing of the run
        depends on it, and it never takes a place in the lane. Over a
        replayed prefix or a re-run there is no server to tell, and a session
        opened later learns what it must from its own ``initialize``.
        ``notifications/initialized`` is salvor's own session's (sent as it
        opened), so the agent's is not sent twice; a ``notifications/cancelled``
        names the agent's request id, which is translated to the id salvor's
        session sent that request under (one not in flight is dropped). The
        cancelled call still waits for the server's answer, which is
        recorded: a server that finishes it anyway has done it. A failure to
        deliver is only logged: the agent's own requests report the session's
        health.
        """
        live = self._session
        if method == "notifications/initialized" or live is None or live.broken is not None:
            return
        sent = params if isinstance(params, dict) else None
        try:
            if method == "notifications/cancelled":
                reason = sent.get("reason") if sent is not None else None
                await live.cancel(
                    _request_key(sent.get("requestId") if sent else None),
                    reason if isinstance(reason, str) else None,
                )
            else:
                await live.notify(method, sent)
        except McpError as exc:
            logger.info(
                "MCP stand-in %r: the agent's %s did not reach the server: %s",
                self.name,
                method,
                exc.message,
            )

    async def perform(
        self,
        request_id: Any,
        method: str,
        params: dict,
        headers: Mapping[str, str],
        call: LaneCall,
    ) -> tuple[dict | None, Any]:
        """Execute the call whose intent is open: ``(None, output)``, the server's notifications
        and requests that crossed it riding along, or the answer that stops the agent (its
        intent left open, the run resting) and no output."""
        self._asked = []
        try:
            self.proxy.ctx.access.driving.gate(self.proxy.run_id)
            output = await self._execute(request_id, method, params, headers, call)
        except DriveInterrupted as exc:
            # This node may no longer act on the run: nothing was sent, the intent stays open for
            # the node that drives the run next, and this process is stopped.
            self.proxy.interrupt(exc)
            return error_answer(
                request_id, RUN_ENDED, f"{exc.message}; this agent process is stopped"
            ), None
        except OutcomeUnknown as exc:
            # The write's intent stays open: the run is parked in needs_reconciliation.
            self.proxy.rested.set()
            return error_answer(
                request_id,
                RUN_ENDED,
                f"{exc.message}; run {self.proxy.run_id} waits for a person to "
                f"record what happened",
            ), None
        except NotPerformed as exc:
            # Nothing of it happened and its intent stays open (a subagent's child waits on a
            # person or a timer): the process is stopped, and the run is driven again, from the
            # top of its log, when what it waits on ends; this call is then asked again.
            self.proxy.rested.set()
            return error_answer(
                request_id,
                RUN_ENDED,
                f"{exc.message}; this agent process is stopped and started again when it can "
                "go on, and this call is then made again",
            ), None
        if self._crossed and isinstance(output, dict):
            output = {**output, "notifications": self._crossed}
            self._crossed = []
        if self._asked and isinstance(output, dict):
            output = {**output, "server_requests": self._asked}
            self._asked = []
        return None, output

    async def _execute(
        self, request_id: Any, method: str, params: dict, headers: Mapping[str, str], call: LaneCall
    ) -> Any:
        """What the request is answered with (recorded as the call's
        output), retried as its effect allows.

        Raises:
            OutcomeUnknown: a write went out and no answer came back.
        """
        if method == "tools/call" and params.get("name") in self.spec.results:
            return {"result": stub_result(self.spec.results[params["name"]])}
        effect = Effect(call.effect)

        async def forward(_input: Any, attempt: ToolCall) -> Any:
            try:
                if method == "initialize":
                    return {"result": (await self._open(params)).initialized}
                result = await self._send(request_id, method, params, headers, call, attempt)
            except McpRemoteError as exc:
                # Settled by the server: the agent gets its error as it was sent.
                return {
                    "error": exc.error
                    or {"code": exc.code or INTERNAL_ERROR, "message": exc.message}
                }
            except McpNoAnswer as exc:
                if effect is Effect.WRITE:
                    raise OutcomeUnknown(
                        f"{exc.message}; the write "
                        f"{params.get('name')!r} may or may not have happened"
                    ) from None
                raise ToolFailed(exc.message) from None
            except McpUnavailable as exc:
                raise ToolFailed(f"{exc.message}; the call was not performed") from None
            if method != "tools/call":
                return {"result": result}
            # A request to park the run (the same check a built-in agent's call makes); a bad one
            # fails the call, never retried (ToolFailed, not retryable).
            outcome = salvor_outcome(self.name, str(params.get("name")), result)
            if outcome is result:
                return {"result": result}
            return {"result": result, **outcome_output(tool, outcome, attempt.attempt)}

        tool = Tool(
            name=lane_tool(self.name, method),
            description="",
            effect=effect,
            input_schema={},
            handler=forward,
        )
        try:
            outcome, _attempt = await dispatch(
                tool, params, run_id=self.proxy.run_id, seq=call.seq, key=call.idempotency_key
            )
        except DispatchFailed as failed:
            return tool_error("handler", failed.message, failed.attempts)
        return outcome

    async def _send(
        self,
        request_id: Any,
        method: str,
        params: dict,
        headers: Mapping[str, str],
        call: LaneCall,
        attempt: ToolCall,
    ) -> Any:
        """One attempt at a request: its result from the live session, sent under the agent's id.

        Raises:
            McpError: as ``McpSession.request`` does.
            NotPerformed: the ``salvor`` server could not perform the call now.
        """
        live = await self.session()
        live.pass_through(headers)
        # The in-process server is sent the recorded input: a file write's plan with it.
        sent = call_input(params if self.in_process is None else call.input)
        # The agent's own ``_meta`` (a progress token) goes to the server, unrecorded.
        meta = dict(params["_meta"]) if isinstance(params.get("_meta"), dict) else {}
        if attempt.idempotency_key is not None:
            # A server may use the key to collapse a repeated execution.
            meta["salvor"] = {"idempotency_key": attempt.idempotency_key, "run_id": attempt.run_id}
        if meta:
            sent["_meta"] = meta
        if isinstance(live, FlowServer):
            return await live.request(method, sent, call=attempt)
        return await live.request(method, sent, key=_request_key(request_id))

    async def _open(self, params: dict | None) -> McpSession | FlowServer:
        """A new real session: with the agent's ``initialize`` params, else the
        lane's recorded ones (silently)."""
        if params is None:
            recorded = next(
                (
                    c.input
                    for c in self.replay.calls
                    if c.method == "initialize" and isinstance(c.input, dict)
                ),
                None,
            )
            params = recorded
        if self._session is not None:
            await self._session.aclose()
            self._session = None
        initialize = None if params is None else call_input(params)
        self._session = await self._connect(initialize)
        self._session.on_notification = self._cross
        self._session.on_request = self._server_request
        return self._session

    async def _connect(self, initialize: dict | None) -> McpSession | FlowServer:
        """An initialised session with the server itself (started here, or dialled; the
        ``salvor`` server is in this process)."""
        if self.in_process is not None:
            return self.in_process.opened(initialize)
        return await open_session(
            self.spec, self._nursery, self._environ, self._mark, initialize=initialize
        )

    def _cross(self, message: dict) -> None:
        if len(self._crossed) < MAX_CROSSED:
            self._crossed.append({"after": self.replay.position, "message": message})

    # -- the server's requests to the agent --------------------------------------

    async def _server_request(self, message: dict) -> dict:
        """A request the real server sent during a live call: the agent's
        answer, recorded with the call."""
        answer = await self.agent.ask(message, self.spec.timeout)
        if len(self._asked) < MAX_CROSSED:
            self._asked.append(
                {"after": self.replay.position, "request": message, "answer": answer}
            )
        return answer

    async def ask_again(self, output: Any) -> None:
        """Replay: ask the agent each request the server sent during this call
        (the answers are not matched)."""
        asked = output.get("server_requests") if isinstance(output, dict) else None
        for entry in asked if isinstance(asked, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("request"), dict):
                await self.agent.ask(entry["request"], self.spec.timeout)


def _request_key(request_id: Any) -> str | int | float | None:
    """The key a live request is sent under: the agent's JSON-RPC id, when it is
    one (a string or a number)."""
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | float):
        return None
    return request_id
