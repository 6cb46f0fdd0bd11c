"""Record-or-replay, decided once: a live call against the recorded call at its position.

A driver re-runs its deterministic code from the top of the log on every
drive, and every call it makes is matched strictly by position: call k of
this drive against call k of the log. What happens to the call is decided
here and nowhere else:

* the log completed the recorded call and it matches: answer it from the log,
  execute nothing (``Step.ANSWER``);
* the log holds only its intent (a crash cut the call off, the recorded
  prefix ends there): execute it again when its effect allows (a model call,
  a ``read`` or ``idempotent`` tool under its recorded key: ``Step.REISSUE``),
  otherwise the run parks in needs_reconciliation (a ``write``: ``Step.PARK``);
* past the end of the log: a re-run answers from its origin's call at the
  same position (``Step.REPRODUCE``); any other run goes live and records the
  intent before any effect starts (``Step.LIVE``);
* anything else diverges (``Step.DIVERGED``): another kind of call or another
  request than the recorded one, a call a re-run's origin never made or never
  completed, or a new call while another boundary's intent is open. The
  ``Divergence`` says what was recorded and what came live, in a message and
  in details of one stable shape.

When a drive ends, ``ReplayLane.shortfall`` names the recorded calls it never
made again (a recovered run and a re-run must make every one, in order).

Two shapes of log go through these rules. ``ReplayCursor`` walks a whole log
(the built-in agent loop, whose calls sit between clock readings and control
events, so a position is a seq). ``ReplayLane`` holds the calls of one
boundary (a process agent's model calls; each of its MCP servers), whose
position is the call's number within the lane. How two requests compare is
the caller's (a request hash, a tool and its input, an MCP method and its
arguments): it hands the lane a function that names the difference.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ._canonical import canonical_json
from ._envelope import Envelope
from ._errors import ReplayDivergence
from ._event_kinds import Effect, EventKind
from ._events import ModelCallRequested, ToolCallRequested


class Step(enum.StrEnum):
    """What a driver does with the call it is about to make."""

    ANSWER = "answer"
    REISSUE = "reissue"
    PARK = "park"
    REPRODUCE = "reproduce"
    LIVE = "live"
    DIVERGED = "diverged"


class DivergenceReason(enum.StrEnum):
    """Why a live call is not the recorded one (``details["reason"]`` of a divergence)."""

    # Another kind of call at this position (a tool call where a model call is; another MCP method).
    KIND = "kind"
    # The same kind with another request (a request hash, a tool, an input, the streaming mode).
    REQUEST = "request"
    # A re-run made more calls than its origin recorded.
    BEYOND_END = "beyond_end"
    # A re-run reached a call its origin left open, so there is no answer to copy.
    NEVER_COMPLETED = "never_completed"
    # A re-run reached a call whose origin parked the run and never continued.
    NEVER_CONTINUED = "never_continued"
    # A new call past the end of the log while another boundary's intent is still open.
    OPEN_ELSEWHERE = "open_elsewhere"


class Recorded(Protocol):
    """What the rules read of a recorded call; each user keeps its own fields beside these."""

    @property
    def seq(self) -> int: ...

    @property
    def completed(self) -> bool: ...

    @property
    def effect(self) -> str | None:
        """The tool's declared effect; None for a model call (issuing it again has no effect)."""
        ...


C = TypeVar("C", bound=Recorded)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """How a live request differs from a recorded one, as a matching function reports it."""

    reason: DivergenceReason
    text: str


@dataclass(frozen=True, slots=True)
class CallNames:
    """How a lane's reports name its calls.

    ``one`` is followed by the call's number ("model call" -> "model call 3");
    ``many`` counts them ("model calls", "calls of MCP server 'fs'").
    """

    one: str
    many: str


@dataclass(frozen=True, slots=True)
class Divergence:
    """A live call that is not the recorded one: what the log holds, what came live, one message.

    ``position`` counts from 0 within the lane (the event index for the
    cursor); ``seq`` is the recorded intent's (the open one's, for
    ``OPEN_ELSEWHERE``), None when nothing was recorded there; ``origin`` is
    set when the recorded call is a re-run's origin's; ``recorded`` is how
    many calls the log (or the origin) holds in the lane (None for the cursor,
    which does not count them).
    """

    reason: DivergenceReason
    position: int
    seq: int | None
    origin: str | None
    recorded: int | None
    problem: str
    message: str

    @property
    def details(self) -> dict[str, Any]:
        """The stable shape a divergence is reported in beside its message."""
        details: dict[str, Any] = {"reason": self.reason.value, "position": self.position}
        if self.recorded is not None:
            details["recorded"] = self.recorded
        if self.seq is not None:
            details["seq"] = self.seq
        if self.origin is not None:
            details["origin"] = self.origin
        return details

    def error(self) -> ReplayDivergence:
        return ReplayDivergence(self.message, details=self.details)


@dataclass(frozen=True, slots=True)
class Decision(Generic[C]):
    """The step for one call, and the recorded call it concerns (the origin's for ``REPRODUCE``)."""

    step: Step
    call: C | None = None
    divergence: Divergence | None = None


@dataclass(frozen=True, slots=True)
class Shortfall:
    """A drive that ended before making every call it had to make again."""

    made: int
    expected: int
    origin: str | None
    message: str


def resume_step(call: Recorded | None) -> Step:
    """The step for a matching recorded call (None: there is none, the call goes live).

    An open intent is the recorded prefix's end after a crash: executed again
    unless it is a write, whose outcome only a person can tell.
    """
    if call is None:
        return Step.LIVE
    if call.completed:
        return Step.ANSWER
    return Step.PARK if call.effect == Effect.WRITE else Step.REISSUE


def _report(
    names: CallNames | None,
    reason: DivergenceReason,
    position: int,
    seq: int | None,
    origin: str | None,
    recorded: int | None,
    problem: str,
) -> str:
    if names is None:
        # A whole-log walk has no call numbers: the seq says where.
        return f"replay diverged at seq {seq}: {problem}"
    number = f"{names.one} {position + 1}"
    at = f"{number} (recorded{f' by origin run {origin}' if origin else ''} at seq {seq})"
    if reason is DivergenceReason.BEYOND_END:
        return (
            f"{number} has no counterpart: origin run {origin} recorded only {recorded} "
            f"{names.many}; {problem}"
        )
    if reason is DivergenceReason.OPEN_ELSEWHERE:
        return f"{number}: {problem} recorded open at seq {seq} was not made again"
    if reason is DivergenceReason.NEVER_COMPLETED:
        return f"{at} never completed, so a re-run cannot answer it"
    if reason is DivergenceReason.NEVER_CONTINUED:
        return f"{at} parked the run, which never continued, so a re-run cannot answer it"
    return f"{at} differs from the recording: {problem}"


def diverge(
    names: CallNames | None,
    reason: DivergenceReason,
    position: int,
    seq: int | None,
    problem: str,
    *,
    origin: str | None = None,
    recorded: int | None = None,
) -> Divergence:
    """A divergence with its message (for the rules here, and a user's own check of a call)."""
    message = _report(names, reason, position, seq, origin, recorded, problem)
    return Divergence(reason, position, seq, origin, recorded, problem, message)


# --------------------------------------------------------------------------
# One boundary's calls
# --------------------------------------------------------------------------


class ReplayLane(Generic[C]):
    """The recorded calls of one boundary, matched in order against the calls a drive makes.

    ``calls`` starts as the calls the run's own log holds; the caller adds
    each call it records (``record``) and moves on once a call is answered
    (``advance``): a call that failed before its answer keeps its position,
    so the next call is matched against it again. ``reference`` is a
    re-run's origin's calls of the same lane, which every call past the
    run's own log must reproduce.
    """

    def __init__(
        self,
        calls: Sequence[C],
        names: CallNames,
        *,
        reference: Sequence[C] | None = None,
        origin: str | None = None,
    ) -> None:
        self.calls: list[C] = list(calls)
        self.recorded = len(self.calls)
        self.names = names
        self.reference: list[C] | None = list(reference) if reference is not None else None
        self.origin = origin if reference is not None else None
        self.position = 0

    @property
    def expected(self) -> int:
        """How many calls a complete drive makes: the origin's for a re-run, else the log's."""
        return len(self.reference) if self.reference is not None else self.recorded

    def step(
        self,
        match: Callable[[C], Mismatch | None],
        *,
        live: str,
        noun: str,
        open_intent: tuple[int, str] | None = None,
    ) -> Decision[C]:
        """The step for the call at the lane's position.

        ``match`` names how the recorded call differs from the live one (None
        when it is the same call); ``live`` says what came live ("asks for
        model 'm'") and ``noun`` what it is ("model call", "tools/call"), for
        a report of a call with no recorded counterpart; ``open_intent`` is
        the run's open intent when there is one (its seq, and whose it is:
        "model", "mcp:fs/tools/call"), which only a call of its own lane may
        pass.
        """
        k = self.position
        if k < len(self.calls):
            call = self.calls[k]
            mismatch = match(call)
            if mismatch is not None:
                return self._diverged(mismatch.reason, call.seq, mismatch.text, origin=None)
            return Decision(resume_step(call), call)
        if self.reference is not None:
            if k >= len(self.reference):
                return self._diverged(
                    DivergenceReason.BEYOND_END, None, f"the agent now {live}", origin=self.origin
                )
            call = self.reference[k]
            mismatch = match(call)
            if mismatch is not None:
                return self._diverged(mismatch.reason, call.seq, mismatch.text, origin=self.origin)
            if not call.completed:
                return self._diverged(
                    DivergenceReason.NEVER_COMPLETED, call.seq, "", origin=self.origin, call=call
                )
            return Decision(Step.REPRODUCE, call)
        if open_intent is not None:
            seq, what = open_intent
            return self._diverged(
                DivergenceReason.OPEN_ELSEWHERE,
                seq,
                f"the agent made a new {noun} while the {what} call",
                origin=None,
            )
        return Decision(Step.LIVE)

    def refuse(self, reason: DivergenceReason, call: C, problem: str = "") -> Divergence:
        """A divergence at the lane's position over ``call``, from a check beyond matching."""
        origin = (
            self.origin if self.reference is not None and self.position >= self.recorded else None
        )
        return self._divergence(reason, call.seq, problem, origin)

    def _divergence(
        self, reason: DivergenceReason, seq: int | None, problem: str, origin: str | None
    ) -> Divergence:
        recorded = (
            len(self.reference)
            if origin is not None and self.reference is not None
            else self.recorded
        )
        return diverge(
            self.names, reason, self.position, seq, problem, origin=origin, recorded=recorded
        )

    def _diverged(
        self,
        reason: DivergenceReason,
        seq: int | None,
        problem: str,
        *,
        origin: str | None,
        call: C | None = None,
    ) -> Decision[C]:
        return Decision(Step.DIVERGED, call, self._divergence(reason, seq, problem, origin))

    def record(self, call: C) -> None:
        """Add a call this drive recorded past the lane's log (a live intent, a reproduced copy)."""
        self.calls.append(call)

    def advance(self) -> None:
        """The call at the position was answered: the next call is matched against the next one."""
        self.position += 1

    def shortfall(self, ended: str) -> Shortfall | None:
        """Why a drive that ``ended`` ("the agent process exited 0") before every call fails.

        None when it made every call the log (or a re-run's origin) holds.
        """
        made, expected = self.position, self.expected
        if made >= expected:
            return None
        if self.reference is not None:
            message = (
                f"{ended} after {made} of the {expected} {self.names.many} origin run "
                f"{self.origin} recorded; "
                f"a re-run must make every one of them, in order"
            )
        else:
            message = (
                f"{ended} after {made} of the {expected} recorded {self.names.many}; "
                f"a recovered run must make every recorded call again, in order"
            )
        return Shortfall(made, expected, self.origin, message)


# --------------------------------------------------------------------------
# A whole log
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """A call found in the log: its intent, and its completion when it has one."""

    intent: Envelope
    completion: Envelope | None

    @property
    def seq(self) -> int:
        return self.intent.seq

    @property
    def completed(self) -> bool:
        return self.completion is not None

    @property
    def effect(self) -> str | None:
        event = self.intent.event
        return event.effect if isinstance(event, ToolCallRequested) else None


_COMPLETION = {
    EventKind.MODEL_CALL_REQUESTED: EventKind.MODEL_CALL_COMPLETED,
    EventKind.TOOL_CALL_REQUESTED: EventKind.TOOL_CALL_COMPLETED,
}


def model_mismatch(recorded: ModelCallRequested, request_hash: str) -> Mismatch | None:
    """How a model call's request differs from the recorded one, by hash; None when equal."""
    if recorded.request_hash == request_hash:
        return None
    return Mismatch(
        DivergenceReason.REQUEST,
        f"model call request_hash {request_hash} differs from the recorded {recorded.request_hash}",
    )


def tool_mismatch(recorded: ToolCallRequested, tool: str, tool_input: Any) -> Mismatch | None:
    """How a tool call differs from the recorded one (tool, canonical input); None when equal."""
    if recorded.tool == tool and canonical_json(recorded.input) == canonical_json(tool_input):
        return None
    return Mismatch(
        DivergenceReason.REQUEST,
        (
            f"the run asked for tool call {tool!r} with input "
            f"{canonical_json(tool_input).decode()} but the log "
            f"records {recorded.tool!r} with input {canonical_json(recorded.input).decode()}"
        ),
    )


class ReplayCursor:
    """Walks a recorded log in the order a deterministic driver asks for it.

    While the log still has events the cursor hands back what was recorded
    (and refuses a call the log does not hold at that position); once the log
    is exhausted the driver is live and records. A refused call leaves the
    cursor where it was.
    """

    def __init__(self, log: Sequence[Envelope]) -> None:
        self._log = log
        self.position = 0
        # The tools attached at run time the cursor has passed (``ToolsAttached``), in order.
        self.attached: list[str] = []

    @property
    def at_end(self) -> bool:
        """True once every recorded event has been consumed: the driver is live."""
        self._pass_attachments()
        return self.position >= len(self._log)

    def _pass_attachments(self) -> None:
        # An attachment is recorded wherever the run rested when it came; no call asks for it,
        # so the cursor takes it in passing and keeps what it attached.
        log = self._log
        while self.position < len(log) and log[self.position].event.KIND is (
            EventKind.TOOLS_ATTACHED
        ):
            attached = self.attached
            attached.extend(n for n in log[self.position].event.tools if n not in attached)
            self.position += 1

    def _peek(self) -> Envelope | None:
        return None if self.at_end else self._log[self.position]

    def _refuse(self, reason: DivergenceReason, found: Envelope, problem: str) -> ReplayDivergence:
        return diverge(None, reason, found.seq, found.seq, problem).error()

    def _kind(self, asked: str, found: Envelope) -> ReplayDivergence:
        return self._refuse(
            DivergenceReason.KIND,
            found,
            f"the run asked for {asked} but the log records {found.kind}",
        )

    def _call(
        self, kind: EventKind, asked: str, match: Callable[[Any], Mismatch | None]
    ) -> RecordedCall | None:
        intent = self._peek()
        if intent is None:
            return None
        if intent.event.KIND is not kind:
            raise self._kind(asked, intent)
        mismatch = match(intent.event)
        if mismatch is not None:
            raise self._refuse(mismatch.reason, intent, mismatch.text)
        self.position += 1
        completion = self._peek()
        # An intent may also be followed by RunFailed or RunAbandoned: that
        # call never completed, and the terminal event is left for the driver.
        if completion is None or completion.event.KIND is not _COMPLETION[kind]:
            return RecordedCall(intent, None)
        self.position += 1
        return RecordedCall(intent, completion)

    def model_call(self, request_hash: str) -> RecordedCall | None:
        """The recorded model call at this position, or None when live (see ``resume_step``).

        Raises:
            ReplayDivergence: the log holds another kind here, or a model call
                whose request hash differs (the request was not rebuilt
                identically: a changed definition or a non-deterministic loop).
        """
        return self._call(
            EventKind.MODEL_CALL_REQUESTED,
            "a model call",
            lambda recorded: model_mismatch(recorded, request_hash),
        )

    def tool_call(self, tool: str, tool_input: Any) -> RecordedCall | None:
        """The recorded tool call at this position, or None when live (see ``resume_step``).

        Raises:
            ReplayDivergence: the log holds another kind here, or a call of
                another tool or with other input.
        """
        return self._call(
            EventKind.TOOL_CALL_REQUESTED,
            f"tool call {tool!r}",
            lambda recorded: tool_mismatch(recorded, tool, tool_input),
        )

    def take(self, kind: EventKind) -> Envelope | None:
        """Consume the next event if it is ``kind``; None when live.

        Raises:
            ReplayDivergence: the log holds another kind at this position.
        """
        found = self._peek()
        if found is None:
            return None
        if found.event.KIND is not kind:
            raise self._kind(kind.value, found)
        self.position += 1
        return found
