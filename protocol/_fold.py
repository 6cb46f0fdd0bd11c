"""The fold: everything reported about a run is a pure function of its log.

``fold(envelopes)`` derives a ``RunView``; ``step(view, envelope)`` advances
one in O(1), so a driver keeps its view current without re-reading its log.
The fold is total: it never raises, whatever it is given (the append guard,
not the fold, decides what may be recorded). Status, usage, pending, counts
and labels all come from here; nothing about a run is stored beside its log
that this fold could not recompute.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from ._clock import parse_instant
from ._envelope import Envelope
from ._event_codec import Event
from ._event_kinds import Actor
from ._events import (
    BudgetExceeded,
    GraphRunStarted,
    MapItemCompleted,
    ModelCallCompleted,
    ModelCallRequested,
    NodeEntered,
    NodeExited,
    NowObserved,
    RandomObserved,
    Resumed,
    RunAbandoned,
    RunCompleted,
    RunFailed,
    RunStarted,
    SleepCompleted,
    SleepStarted,
    Suspended,
    ToolCallCompleted,
    ToolCallRequested,
)


class RunState(enum.StrEnum):
    NOT_STARTED = "not_started"
    RUNNING = "running"
    AWAITING_MODEL = "awaiting_model"
    AWAITING_TOOL = "awaiting_tool"
    NEEDS_RECONCILIATION = "needs_reconciliation"
    SUSPENDED = "suspended"
    SLEEPING = "sleeping"
    BUDGET_EXCEEDED = "budget_exceeded"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


TERMINAL_STATES = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.ABANDONED})
# States a driver stops at: nothing more happens until a person, a client or
# the clock acts.
RESTING_STATES = TERMINAL_STATES | {
    RunState.SUSPENDED,
    RunState.SLEEPING,
    RunState.BUDGET_EXCEEDED,
    RunState.NEEDS_RECONCILIATION,
}
# Resting states a drive has nothing to do in however late it is: the run is
# over, or waits for a person, a client or the operator. SLEEPING is not one:
# its driver wakes it when the timer is due.
IDLE_STATES = RESTING_STATES - {RunState.SLEEPING}

# The states whose status object says more than ``state``, each with the event that enters it: the
# status is ``{"state": ..., **that event's payload}``. The fold enters these states from this table
# and the OpenAPI document's ``Status`` variants are built from it (``_wire_schemas``), so a field
# an event gains shows in both or in neither. The other states have no fields of their own.
STATUS_DETAIL: Mapping[RunState, type[Event]] = MappingProxyType(
    {
        RunState.SUSPENDED: Suspended,
        RunState.SLEEPING: SleepStarted,
        RunState.BUDGET_EXCEEDED: BudgetExceeded,
        RunState.COMPLETED: RunCompleted,
        RunState.FAILED: RunFailed,
        RunState.ABANDONED: RunAbandoned,
    }
)
_ENTERS = {event_type: state for state, event_type in STATUS_DETAIL.items()}


class PendingKind(enum.StrEnum):
    """What a run's open intent asks for: a model call or a tool call."""

    MODEL = "model"
    TOOL = "tool"


# The pending object of each kind: ``kind``, then these fields of ``Pending`` in this order. Its
# builder reads this table and so does the OpenAPI document (``_wire_schemas``).
PENDING_FIELDS: Mapping[PendingKind, tuple[str, ...]] = MappingProxyType(
    {
        PendingKind.MODEL: ("seq", "request_hash"),
        PendingKind.TOOL: ("seq", "tool", "input", "effect", "idempotency_key"),
    }
)
# What an intent (``details.intent`` of a needs_reconciliation refusal) adds to the pending object.
INTENT_FIELDS = ("recorded_at",)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pending:
    """The one open intent of a run: a call recorded as asked for, not yet completed."""

    kind: PendingKind
    seq: int
    recorded_at: str
    request_hash: str | None = None
    tool: str | None = None
    input: Any = None
    effect: str | None = None
    idempotency_key: str | None = None
    performed_by: Actor | None = None

    def to_json(self) -> dict:
        """The spec's pending object (``PENDING_FIELDS``)."""
        body: dict[str, Any] = {"kind": self.kind.value}
        for name in PENDING_FIELDS[self.kind]:
            body[name] = getattr(self, name)
        return body

    def intent_json(self) -> dict:
        """The pending object plus when it was recorded (``details.intent``)."""
        body = self.to_json()
        for name in INTENT_FIELDS:
            body[name] = getattr(self, name)
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class RunView:
    """The derived state of a run after some prefix of its log."""

    run_id: str | None = None
    next_seq: int = 0
    state: RunState = RunState.NOT_STARTED
    # The state's own fields (reason, wake_at, output, ...), per the status table.
    detail: dict = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    step_count: int = 0
    pending: Pending | None = None
    agent_def_hash: str | None = None
    input: Any = None
    labels: dict | None = None
    driven_by: Actor | None = None
    # The origin run a re-run reproduces (absent for an ordinary run).
    replay_of: str | None = None
    first_recorded_at: str | None = None
    last_recorded_at: str | None = None
    # Extra allowance granted per budget kind by resumes after BudgetExceeded.
    budget_extensions: dict = field(default_factory=dict)
    first_now: str | None = None
    last_now: str | None = None
    tool_calls_completed: int = 0
    # A graph run: the graph it walks (its head is GraphRunStarted, and it has no
    # agent_def_hash), the fork origin its head names, and the node entered and not yet exited.
    graph_hash: str | None = None
    forked_from: dict | None = None
    open_node: str | None = None

    @property
    def event_count(self) -> int:
        return self.next_seq

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def idle(self) -> bool:
        """Whether a drive has nothing to do here (``IDLE_STATES``)."""
        return self.state in IDLE_STATES

    @property
    def resting(self) -> bool:
        return self.state in RESTING_STATES

    def usage(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    def status(self) -> dict:
        """The status object, ``{"state": ..., <that state's fields>}``."""
        body = {"state": self.state.value}
        body.update(self.detail)
        return body

    def status_at(self, now: datetime) -> dict:
        """The status object as seen at ``now``: a sleeping run past its instant is overdue."""
        return status_seen_at(self.status(), now)

    def replay_json(self) -> dict:
        """The dry-run replay projection: status, usage, next_seq, pending."""
        return {
            "status": self.status(),
            "usage": self.usage(),
            "next_seq": self.next_seq,
            "pending": self.pending.to_json() if self.pending else None,
        }

    def wake_at(self) -> str | None:
        return self.detail.get("wake_at") if self.state is RunState.SLEEPING else None


def status_seen_at(status: dict, now: datetime) -> dict:
    """A status object as seen at ``now``: a sleeping one past its
    ``wake_at`` also says how overdue it is.

    The fold itself reads no clock (a log means the same thing on every
    machine); this is the one step that does, for whoever reports a status.
    """
    if status.get("state") != RunState.SLEEPING.value:
        return status
    try:
        late = (now - parse_instant(status.get("wake_at"))).total_seconds()
    except (TypeError, ValueError):
        return status  # not a status the fold made: reported as it is
    if late <= 0:
        return status
    return {**status, "overdue": True, "overdue_seconds": int(late)}


_FIELDS = tuple(RunView.__dataclass_fields__)


class _Folder:
    """A mutable twin of RunView, so folding a long log allocates one view, not one per event."""

    __slots__ = _FIELDS

    def __init__(self, view: RunView) -> None:
        for name in _FIELDS:
            setattr(self, name, getattr(view, name))

    def freeze(self) -> RunView:
        return RunView(**{name: getattr(self, name) for name in _FIELDS})

    def apply(self, envelope: Envelope) -> None:
        if self.run_id is None:
            self.run_id = envelope.run_id
        if self.first_recorded_at is None:
            self.first_recorded_at = envelope.recorded_at
        self.last_recorded_at = envelope.recorded_at
        self.next_seq = envelope.seq + 1
        # The status of a STATUS_DETAIL state is its entering event's payload, whatever fields
        # that event has: written nowhere else, so the document's Status cannot drift from it.
        entered = _ENTERS.get(type(envelope.event))
        if entered is not None:
            self.state = entered
            self.detail = envelope.event.to_payload()
        handler = _HANDLERS.get(type(envelope.event))
        if handler is not None:
            handler(self, envelope.seq, envelope.recorded_at, envelope.event)

    # One method per kind. Each assumes nothing about legality.

    def _run_started(self, seq: int, at: str, event: RunStarted) -> None:
        self.state = RunState.RUNNING
        self.detail = {}
        self.agent_def_hash = event.agent_def_hash
        self.input = event.input
        self.labels = event.labels
        self.driven_by = event.driven_by
        self.replay_of = event.replay_of

    def _graph_run_started(self, seq: int, at: str, event: GraphRunStarted) -> None:
        self.state = RunState.RUNNING
        self.detail = {}
        self.graph_hash = event.graph_hash
        self.input = event.input
        self.labels = event.labels
        self.forked_from = event.forked_from

    def _node_entered(self, seq: int, at: str, event: NodeEntered) -> None:
        self.open_node = event.node

    def _node_exited(self, seq: int, at: str, event: NodeExited) -> None:
        self.open_node = None

    def _model_requested(self, seq: int, at: str, event: ModelCallRequested) -> None:
        self.state = RunState.AWAITING_MODEL
        self.detail = {}
        self.step_count += 1
        self.pending = Pending(
            kind=PendingKind.MODEL,
            seq=seq,
            recorded_at=at,
            request_hash=event.request_hash,
            performed_by=event.performed_by,
        )

    def _model_completed(self, seq: int, at: str, event: ModelCallCompleted) -> None:
        self.state = RunState.RUNNING
        self.pending = None
        usage = event.usage
        self.input_tokens += usage["input_tokens"]
        self.output_tokens += usage["output_tokens"]

    def _map_item_completed(self, seq: int, at: str, event: MapItemCompleted) -> None:
        # A map's agent items run in child logs: their calls are this graph run's cost too.
        if event.usage is not None:
            self.input_tokens += event.usage["input_tokens"]
            self.output_tokens += event.usage["output_tokens"]

    def _tool_requested(self, seq: int, at: str, event: ToolCallRequested) -> None:
        # A write with no completion as the log's last word is exactly what
        # needs_reconciliation means: it may or may not have landed.
        self.state = (
            RunState.NEEDS_RECONCILIATION if event.effect == "write" else RunState.AWAITING_TOOL
        )
        self.detail = {}
        self.pending = Pending(
            kind=PendingKind.TOOL,
            seq=seq,
            recorded_at=at,
            tool=event.tool,
            input=event.input,
            effect=event.effect,
            idempotency_key=event.idempotency_key,
            performed_by=event.performed_by,
        )

    def _tool_completed(self, seq: int, at: str, event: ToolCallCompleted) -> None:
        self.state = RunState.RUNNING
        self.pending = None
        self.tool_calls_completed += 1

    def _now_observed(self, seq: int, at: str, event: NowObserved) -> None:
        if self.first_now is None:
            self.first_now = event.now
        self.last_now = event.now

    def _random_observed(self, seq: int, at: str, event: RandomObserved) -> None:
        pass

    def _resumed(self, seq: int, at: str, event: Resumed) -> None:
        if self.state is RunState.BUDGET_EXCEEDED:
            amount = event.input.get("extend_by") if isinstance(event.input, dict) else None
            if type(amount) in (int, float):
                kind = self.detail["budget"]["kind"]
                extensions = dict(self.budget_extensions)
                extensions[kind] = extensions.get(kind, 0) + amount
                self.budget_extensions = extensions
        self.state = RunState.RUNNING
        self.detail = {}

    def _sleep_completed(self, seq: int, at: str, event: SleepCompleted) -> None:
        self.state = RunState.RUNNING
        self.detail = {}

    def _ended(self, seq: int, at: str, event: RunCompleted | RunFailed | RunAbandoned) -> None:
        # The state and its status fields were entered from STATUS_DETAIL (``apply``).
        self.pending = None


# What each kind does beyond entering a STATUS_DETAIL state (``apply``); Suspended, SleepStarted,
# BudgetExceeded and NodeSkipped do nothing more (the graph projection reads them from the log),
# and ToolsAttached changes no state (its tools are read from the log: ``attached_tools``).
_HANDLERS = {
    RunStarted: _Folder._run_started,
    GraphRunStarted: _Folder._graph_run_started,
    NodeEntered: _Folder._node_entered,
    NodeExited: _Folder._node_exited,
    ModelCallRequested: _Folder._model_requested,
    ModelCallCompleted: _Folder._model_completed,
    MapItemCompleted: _Folder._map_item_completed,
    ToolCallRequested: _Folder._tool_requested,
    ToolCallCompleted: _Folder._tool_completed,
    NowObserved: _Folder._now_observed,
    RandomObserved: _Folder._random_observed,
    Resumed: _Folder._resumed,
    SleepCompleted: _Folder._sleep_completed,
    RunCompleted: _Folder._ended,
    RunFailed: _Folder._ended,
    RunAbandoned: _Folder._ended,
}

EMPTY_VIEW = RunView()


def fold(envelopes: Iterable[Envelope], view: RunView = EMPTY_VIEW) -> RunView:
    """Derive the view after ``envelopes``, starting from ``view`` (default: no events)."""
    folder = _Folder(view)
    apply = folder.apply
    for envelope in envelopes:
        apply(envelope)
    return folder.freeze()


def step(view: RunView, envelope: Envelope) -> RunView:
    """The view after one more event. O(1): the log is not re-read."""
    folder = _Folder(view)
    folder.apply(envelope)
    return folder.freeze()
