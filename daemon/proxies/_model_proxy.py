"""The loopback model proxy: a local agent process's model calls, recorded or replayed.

One listener on 127.0.0.1 serves every process run of the daemon (``_model_listener``). Each
run is mounted under an unguessable capability path (``/r/<capability>/...``),
so one local process cannot write into another run's log. Three wire formats
are spoken, each non-streaming and streaming: OpenAI Chat Completions
(``POST .../v1/chat/completions``), OpenAI Responses (``POST .../v1/responses``)
and Anthropic Messages (``POST .../v1/messages``); ``GET .../v1/models`` is
answered locally. What each wire means (envelope, usage, final text, when a
stream is complete, error shape) lives in ``_wire``; how a call sits in the log, in
``_model_replay``; how one goes upstream, in ``_model_upstream``.

Every call goes through the run's record-or-replay, strictly by position
(a ``ReplayLane`` of model calls): call k of the process must hash-equal
call k of the log. A call the log
completed is answered from it with no upstream call; an open intent is
re-issued; past the end of the log the call is recorded write-ahead
(``ModelCallRequested`` before any byte goes upstream), then forwarded, and
its answer (the JSON body, or the stream's SSE frames in order) recorded as
``ModelCallCompleted``. A request that differs from the recorded one at its
position fails the run, naming the envelope difference.

The upstream credential goes into the outbound request header and nowhere
else: not into the log, not into an error, not into a log line. The agent's
own (placeholder) credential never goes upstream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
import trio
from salvor.protocol import (
    Envelope,
    ModelCallCompleted,
    ModelCallRequested,
    ReplayLane,
    RunFailed,
    Step,
    sha256_hash,
)
from salvor.store import Fenced, SeqConflict, StoreUnavailable

from ..recording import DriveInterrupted, Parked, RunContext
from ._model_replay import MODEL_CALLS, ModelCall, model_match, recorded_calls
from ._model_upstream import Reply, forward
from ._upstream import Upstream
from ._wire import carries_text, encode_frames, envelope, error_body, hashed_request, usage_of

T = TypeVar("T")

# A re-run commits its reproduced calls in batches: at most this many calls,
# or this long after the last commit (so a watcher sees it advance).
REPRODUCED_PER_COMMIT = 64
REPRODUCED_FLUSH_SECONDS = 0.25

# Why a live call, or an open one issued again, cannot go anywhere.
NO_UPSTREAM = (
    "salvor has no upstream for live model calls: set SALVOR_AGENT_UPSTREAM "
    "(or SALVOR_MODEL_BASE_URL, or OPENAI_BASE_URL) and SALVOR_AGENT_KEY "
    "(or SALVOR_AGENT_KEY_FILE) where the daemon runs"
)
NO_UPSTREAM_FOR_OPEN = (
    "salvor has no upstream to re-issue an open model call: set SALVOR_AGENT_UPSTREAM"
)


class ProxySession:
    """The model calls of one drive of one process run, in order, through its log.

    Calls are serialised (the run has one open-intent slot). ``rested`` is
    set once the session has brought the run to rest, as its log says (a
    divergence failed it, a write cut off mid-call or an MCP tool's
    ``_meta.salvor`` parked it), or once it stopped the drive with the run
    recoverable (``store_fault``, ``interrupted``); the driver then stops the
    process.
    """

    def __init__(
        self,
        ctx: RunContext,
        log_: Sequence[Envelope],
        *,
        record_prompts: bool,
        upstream: Upstream | None,
        client: httpx.AsyncClient,
        origin: str | None = None,
        origin_calls: Sequence[ModelCall] = (),
    ) -> None:
        self.ctx = ctx
        self.record_prompts = record_prompts
        self.upstream = upstream
        self.client = client
        # A re-run: the origin's calls, which every call past this run's own
        # log must reproduce, answered from the origin and never sent upstream.
        self.origin = origin
        self.replay = ReplayLane(
            recorded_calls(log_),
            MODEL_CALLS,
            reference=origin_calls if origin is not None else None,
            origin=origin,
        )
        self._flushed_at = trio.current_time()
        self.upstream_calls = 0
        self.lock = trio.Lock()
        self.closed = False
        self.rested = trio.Event()
        # The store fault that stopped this drive, if one did (``_stop_on_store_fault``).
        self.store_fault: StoreUnavailable | None = None
        # The recoverable stop that ended this drive, if one did (``interrupt``).
        self.interrupted: DriveInterrupted | None = None
        # Why another writer's append stopped this drive, if one did (``supersede``).
        self.superseded: str | None = None
        self._scopes: set[trio.CancelScope] = set()
        # The run's MCP stand-in lanes by server name (``_mcp_lane``),
        # served under ``.../mcp/<name>``.
        self.mcp_lanes: Mapping[str, Any] = {}
        # The result of the run's good ``finish`` on the ``salvor`` lane, once it was answered
        # (live or from the log): every later ``tools/call`` of the run is refused.
        self.finished: dict | None = None
        # The run's task as text, when the drive checks that it reached the model
        # (``agents._process``), and whether a request of this drive carried it yet.
        self.task: str | None = None
        self.task_reached = False

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    @property
    def calls(self) -> list[ModelCall]:
        """The drive's model calls so far: the log's, then those this drive recorded."""
        return self.replay.calls

    async def close(self) -> None:
        """Stop answering: in-flight calls are cut (their intents stay open), then wait for them."""
        self.closed = True
        for scope in list(self._scopes):
            scope.cancel(reason="the drive ended; its proxy session stops answering")
        async with self.lock:
            pass

    async def handle(self, wire: str, body: dict, headers: Mapping[str, str], reply: Reply) -> None:
        if self.task is not None and not self.task_reached:
            self.task_reached = carries_text(body, self.task)
        stream = bool(body.get("stream"))
        asked = hashed_request(wire, body)
        try:
            request_hash = sha256_hash(asked)
        except ValueError as exc:
            await reply.json(
                400,
                error_body(wire, 400, f"the request body holds a value JSON cannot carry: {exc}"),
            )
            return
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                async with self.lock:
                    if self.closed or self.rested.is_set():
                        await reply.json(
                            503,
                            error_body(
                                wire, 503, f"run {self.run_id} is no longer accepting model calls"
                            ),
                        )
                        return
                    try:
                        await self._call(wire, asked, request_hash, body, stream, headers, reply)
                    except StoreUnavailable as exc:
                        if not self._stop_on_store_fault(exc):
                            raise
                        await reply.json(
                            503, error_body(wire, 503, f"run {self.run_id} stopped: {exc.message}")
                        )
                        return
                    except DriveInterrupted as exc:
                        # This node's lease is lapsing: the call's intent stays open for the node
                        # that drives the run next, and this process is stopped.
                        self.interrupt(exc)
                        await reply.json(503, error_body(wire, 503, exc.message))
                        return
                    except (SeqConflict, Fenced) as exc:
                        # Another writer appended, or another node took the run over.
                        self._stop_superseded(exc)
                        # 410: the SDKs retry a 409 or a 503, and this run takes no more calls.
                        await reply.json(410, error_body(wire, 410, self.superseded_message))
                        return
                    except Parked:
                        # Over the store's quota: the run's failure, naming the limit, is
                        # recorded; the process is stopped with it.
                        self.rested.set()
                        await reply.json(
                            413, error_body(wire, 413, self.ctx.view.detail.get("error", ""))
                        )
                        return
            if scope.cancelled_caught:
                await reply.json(
                    503,
                    error_body(wire, 503, "the run's drive stopped while this call was in flight"),
                )
        finally:
            self._scopes.discard(scope)

    def _stop_on_store_fault(self, exc: StoreUnavailable) -> bool:
        """A store fault stops the drive (its process too) and leaves the run to be driven again.

        Nothing of the failed call was recorded, so the run sits at its last
        durable event; the driver raises ``store_fault`` instead of settling
        the run by the process's exit (which the fault caused). Returns
        False for a failure that will not pass, which the caller re-raises.
        """
        if not exc.transient:
            return False
        self.store_fault = exc
        self.rested.set()
        return True

    def _stop_superseded(self, exc: SeqConflict | Fenced) -> None:
        """A call met another writer's append to the run (``supersede``); nothing of it was
        recorded."""
        self.supersede(exc.message)

    def supersede(self, why: str) -> None:
        """Stop the drive, its process too: another writer appended to the run under it (a
        ``salvor abandon`` beside this daemon ended it). The driver reads the log again
        (``superseded`` says why) rather than settle the run by the process's exit."""
        if self.superseded is None:
            self.superseded = why
        self.rested.set()

    @property
    def superseded_message(self) -> str:
        return (
            f"run {self.run_id} was ended or moved on by another writer while this process ran; "
            "it takes no more calls from it"
        )

    def interrupt(self, reason: DriveInterrupted) -> None:
        """Stop the drive (its process too) with the run recoverable, as ``reason`` says.

        Whatever the run's log holds stays as it is; the driver raises
        ``interrupted`` instead of settling the run by the process's exit,
        which this stop caused.
        """
        self.interrupted = reason
        self.rested.set()

    async def _fail(self, wire: str, reply: Reply, message: str) -> None:
        await self.record_failure(message)
        await reply.json(409, error_body(wire, 409, message))

    async def record_failure(self, message: str) -> None:
        """Fail the run (the caller holds ``lock``); the driver then stops the process."""
        await self.ctx.record(RunFailed(error=message))
        self.rested.set()

    async def exclusive(self, call: Callable[[], Awaitable[T]]) -> T | None:
        """Run ``call`` holding the run's one open-intent slot, as a model call does.

        Returns None, without running it, once the session is closed or has
        brought the run to rest. Cancellation: ``close`` cuts ``call`` like an
        in-flight model call (an intent it recorded stays open).
        """
        scope = trio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                async with self.lock:
                    if self.closed or self.rested.is_set():
                        return None
                    try:
                        return await call()
                    except StoreUnavailable as exc:
                        if not self._stop_on_store_fault(exc):
                            raise
                        return None
                    except (SeqConflict, Fenced) as exc:
                        self._stop_superseded(exc)
                        return None
                    except Parked:
                        self.rested.set()  # over the store's quota: the run's failure is recorded
                        return None
            return None
        finally:
            self._scopes.discard(scope)

    @staticmethod
    async def _answer_recorded(response: dict, reply: Reply) -> None:
        if "frames" in response:
            await reply.start_stream(200)
            await reply.chunk(encode_frames(response["frames"]))
            await reply.end()
        else:
            await reply.json(200, response["body"])

    async def _reproduce(self, wire, asked, request_hash, call: ModelCall, reply: Reply) -> None:
        """A re-run's call past its own log, answered with the
        origin's ``call`` at this position."""
        # Nothing is paid for and nothing goes upstream, so a reproduced call
        # need not be durable before the agent has its answer, nor on its
        # own: the copies are held and committed a batch at a time (and with
        # the run's last event). A crash loses only copies the next drive
        # answers from the origin again. The copy is taken before answering,
        # so an agent that exits the instant it has its answer is still
        # counted as having made the call.
        intent = ModelCallRequested(
            request_hash=request_hash, request_body=asked if self.record_prompts else None
        )
        seq = self.ctx.view.next_seq + self.ctx.held
        self.ctx.hold(
            intent,
            ModelCallCompleted(
                seq=seq, response=call.response, usage=usage_of(wire, call.response)
            ),
        )
        self.replay.record(ModelCall(seq, request_hash, intent.request_body, call.response))
        self.replay.advance()
        await self._answer_recorded(call.response, reply)
        if (
            self.ctx.held >= 2 * REPRODUCED_PER_COMMIT
            or trio.current_time() - self._flushed_at >= REPRODUCED_FLUSH_SECONDS
        ):
            await self.ctx.flush()
            self._flushed_at = trio.current_time()

    async def _call(self, wire, asked, request_hash, body, stream, headers, reply: Reply) -> None:
        pending = self.ctx.view.pending
        decision = self.replay.step(
            model_match(asked, request_hash, stream),
            live=f"asks for model {envelope(asked)['model']!r}",
            noun="model call",
            # Another boundary's call (an MCP request) left open, which the agent went past.
            open_intent=None if pending is None else (pending.seq, pending.tool or "model"),
        )
        step, call = decision.step, decision.call
        if step is Step.DIVERGED:
            await self._fail(wire, reply, decision.divergence.message)
            return
        if step is Step.ANSWER:
            self.replay.advance()
            await self._answer_recorded(call.response, reply)
            return
        if step is Step.REPRODUCE:
            await self._reproduce(wire, asked, request_hash, call, reply)
            return
        if self.upstream is None:
            why = NO_UPSTREAM if step is Step.LIVE else NO_UPSTREAM_FOR_OPEN
            await reply.json(502, error_body(wire, 502, why))
            return
        if step is Step.LIVE:
            intent = ModelCallRequested(
                request_hash=request_hash, request_body=asked if self.record_prompts else None
            )
            seq = (await self.ctx.record(intent))[-1].seq
            call = ModelCall(seq, request_hash, intent.request_body, None)
            self.replay.record(call)
        # Nothing goes upstream from a node that may no longer act on the run (``handle``).
        self.ctx.access.driving.gate(self.run_id)
        self.upstream_calls += 1
        response = await forward(
            self.client, self.upstream, wire, body, stream, headers, reply, run_id=self.run_id
        )
        if response is not None:
            await self._complete(wire, call, response, reply)

    async def _complete(self, wire: str, call: ModelCall, response: dict, reply: Reply) -> None:
        """Answer the agent with a call's body (a stream got its frames as they came) and record
        its completion.

        The agent has its answer before the completion is durable: a crash in between only
        means the call is issued again, as for any open intent. The next call waits on the
        lock, so it is never recorded before this completion.
        """
        try:
            if "body" in response:
                await reply.json(200, response["body"])
        finally:
            # The call was paid for: its completion is recorded even when the
            # drive is stopping (the agent may have exited the moment it had
            # its answer), so a later drive never pays for it again.
            with trio.CancelScope(shield=True):
                await self.ctx.record(
                    ModelCallCompleted(
                        seq=call.seq, response=response, usage=usage_of(wire, response)
                    )
                )
            call.response = response
            self.replay.advance()
