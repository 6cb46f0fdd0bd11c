"""The append guard: is this envelope the one legal next event of its run?

Everything that decides legality lives here, as a table from the run's state
to the kinds it may record next, plus the per-kind checks a table cannot say
(contiguous seq, a completion correlating with its intent, the head, a
resume input its schema accepts). The store appends only what this accepted;
a refusal names the state and the event, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._envelope import SCHEMA_VERSION, Envelope
from ._errors import GuardRefusal, MalformedEvent, SchemaViolation
from ._event_kinds import EventKind
from ._events import (
    GraphRunStarted,
    MapItemCompleted,
    ModelCallCompleted,
    NodeEntered,
    NodeExited,
    NodeSkipped,
    Resumed,
    RunAbandoned,
    RunStarted,
    Suspended,
    ToolCallCompleted,
)
from ._fold import PendingKind, RunState, RunView, step
from ._labels import check_labels
from ._schema import check_schema, validate, validate_budget_extension

K = EventKind
S = RunState
_ABANDON = {K.RUN_ABANDONED}
_AFTER_INTENT = {K.RUN_FAILED, K.RUN_ABANDONED}

# What narrates a graph run's walk: recorded between the node-level steps, never inside a call.
_GRAPH_WALK = (K.NODE_ENTERED, K.NODE_EXITED, K.NODE_SKIPPED, K.MAP_ITEM_COMPLETED)

_LEGAL_NEXT: dict[RunState, frozenset[EventKind]] = {
    S.NOT_STARTED: frozenset({K.RUN_STARTED, K.GRAPH_RUN_STARTED}),
    S.RUNNING: frozenset(
        {
            K.MODEL_CALL_REQUESTED,
            K.TOOL_CALL_REQUESTED,
            K.NOW_OBSERVED,
            K.RANDOM_OBSERVED,
            K.SUSPENDED,
            K.SLEEP_STARTED,
            K.BUDGET_EXCEEDED,
            K.RUN_COMPLETED,
            K.RUN_FAILED,
            K.RUN_ABANDONED,
            *_GRAPH_WALK,
        }
    ),
    S.AWAITING_MODEL: frozenset({K.MODEL_CALL_COMPLETED} | _AFTER_INTENT),
    S.AWAITING_TOOL: frozenset({K.TOOL_CALL_COMPLETED} | _AFTER_INTENT),
    # A write that may have landed cannot be papered over with a failure:
    # only its completion (a person's resolve) or an abandonment that names it.
    S.NEEDS_RECONCILIATION: frozenset({K.TOOL_CALL_COMPLETED} | _ABANDON),
    S.SUSPENDED: frozenset({K.RESUMED} | _ABANDON),
    S.SLEEPING: frozenset({K.NOW_OBSERVED, K.SLEEP_COMPLETED} | _ABANDON),
    S.BUDGET_EXCEEDED: frozenset({K.RESUMED} | _ABANDON),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.ABANDONED: frozenset(),
}
# Tools attached at run time narrate and change no state: any run that has started and not
# ended may record them, wherever it rests (a replay passes them wherever they stand).
LEGAL_NEXT: dict[RunState, frozenset[EventKind]] = {
    state: kinds | {K.TOOLS_ATTACHED} if state is not S.NOT_STARTED and kinds else kinds
    for state, kinds in _LEGAL_NEXT.items()
}


def check_resume_input(view: RunView, value: Any) -> None:
    """Check that ``value`` resumes ``view``.

    A suspended run's input is checked against the ``input_schema`` it recorded, an over-budget
    run's budget extension as one. (Which states take a resume is ``LEGAL_NEXT``'s.)

    Raises:
        SchemaViolation: naming every violation (maps to ``400 bad_request``).
    """
    if view.state is S.SUSPENDED:
        validate(view.detail["input_schema"], value, what="the resume input")
    else:
        validate_budget_extension(value)


def _refuse(view: RunView, envelope: Envelope, why: str) -> GuardRefusal:
    return GuardRefusal(
        f"{envelope.kind} at seq {envelope.seq} refused in state {view.state.value}: {why}"
    )


def _check_walk(
    view: RunView,
    envelope: Envelope,
    event: NodeEntered | NodeExited | NodeSkipped | MapItemCompleted,
) -> None:
    """A walk event belongs to a graph run and to the node the walk is at.

    One node is open at a time (a map's items are child runs, not steps of this log): a node is
    entered only when none is open, exited or given a map item only while it is the open one,
    and skipped only between nodes.
    """
    if view.graph_hash is None:
        raise _refuse(view, envelope, "only a graph run (GraphRunStarted) narrates nodes")
    if isinstance(event, NodeEntered | NodeSkipped):
        if view.open_node is not None:
            raise _refuse(view, envelope, f"node {view.open_node!r} is entered and not exited")
    elif event.node != view.open_node:
        where = "no node is open" if view.open_node is None else f"{view.open_node!r} is open"
        raise _refuse(view, envelope, f"it names node {event.node!r}, but {where}")


def check_next(view: RunView, envelope: Envelope) -> None:
    """Accept ``envelope`` as the next event after ``view``, or refuse it.

    Raises:
        GuardRefusal: with the precise reason; nothing about the run changed.
    """
    if envelope.seq != view.next_seq:
        raise _refuse(view, envelope, f"the next seq is {view.next_seq}")
    if envelope.schema_version != SCHEMA_VERSION:
        raise _refuse(view, envelope, f"schema_version must be {SCHEMA_VERSION}")
    if view.run_id is not None and envelope.run_id != view.run_id:
        raise _refuse(view, envelope, f"the log belongs to run {view.run_id}")
    kind = envelope.event.KIND
    if kind not in LEGAL_NEXT[view.state]:
        if view.state is S.NOT_STARTED:
            why = "a log must open with RunStarted or GraphRunStarted at seq 0"
        elif view.terminal:
            why = "nothing may follow a terminal event"
        elif view.pending is not None and kind in (K.MODEL_CALL_REQUESTED, K.TOOL_CALL_REQUESTED):
            why = f"the intent at seq {view.pending.seq} is still open (at most one open intent)"
        elif view.pending is not None:
            why = f"the {view.pending.kind} intent at seq {view.pending.seq} must complete first"
        else:
            allowed = ", ".join(sorted(k.value for k in LEGAL_NEXT[view.state]))
            why = f"the legal next kinds are {allowed}"
        raise _refuse(view, envelope, why)
    event = envelope.event
    if isinstance(event, RunStarted | GraphRunStarted):
        try:
            check_labels(event.labels)
        except SchemaViolation as exc:
            raise _refuse(view, envelope, exc.message) from None
    elif isinstance(event, NodeEntered | NodeExited | NodeSkipped | MapItemCompleted):
        _check_walk(view, envelope, event)
    elif isinstance(event, ModelCallCompleted):
        if view.pending.kind != PendingKind.MODEL or event.seq != view.pending.seq:
            raise _refuse(
                view, envelope, f"it must name the open model intent at seq {view.pending.seq}"
            )
    elif isinstance(event, ToolCallCompleted):
        if event.seq != view.pending.seq:
            raise _refuse(
                view, envelope, f"it must name the open tool intent at seq {view.pending.seq}"
            )
    elif isinstance(event, Suspended):
        try:
            check_schema(event.input_schema)
        except MalformedEvent as exc:
            raise _refuse(view, envelope, f"input_schema is unusable: {exc}") from None
    elif isinstance(event, Resumed):
        try:
            check_resume_input(view, event.input)
        except SchemaViolation as exc:
            raise _refuse(view, envelope, exc.message) from None
    elif isinstance(event, RunAbandoned):
        expected = (
            {"seq": view.pending.seq, "tool": view.pending.tool}
            if view.state is S.NEEDS_RECONCILIATION
            else None
        )
        if event.unresolved_write != expected:
            if expected is None:
                raise _refuse(
                    view, envelope, "unresolved_write is only for a run parked at a write"
                )
            raise _refuse(view, envelope, f"it must carry unresolved_write {expected}")


def check_batch(view: RunView, envelopes: Iterable[Envelope]) -> RunView:
    """Check a batch in order against ``view``; return the view after all of it.

    Raises:
        GuardRefusal: at the first illegal envelope; the caller appends none of the batch.
    """
    for envelope in envelopes:
        check_next(view, envelope)
        view = step(view, envelope)
    return view
