"""Which appends call for a notification to the operator, and the outbox row each one writes.

Rules of this module:

* Pure: it reads the view before a batch, the batch's envelopes and the view after it, and
  decides from those alone (the append path reads nothing, and neither does this).
* A notification marks a moment: a run starts waiting on a person (a gate, an ``ask_user``
  question, a write of unknown outcome, a budget crossing) or fails. The view AFTER the batch
  decides, and the event that put the run there must be in the batch: a batch that leaves a run
  where it already was notifies nothing, and a state entered and left within one batch (a client
  recording a write and its completion together) is no wait at all.
* At most one notification per batch, keyed by the seq of the event that caused it, so the
  table's unique ``(run_id, seq, kind)`` holds by construction.
* The body carries the run's status, never its input (a secret may be in it) nor a write's
  input; what the person needs beyond the status they read from the API.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from salvor.protocol import (
    BudgetExceeded,
    Envelope,
    RunFailed,
    RunState,
    RunView,
    Suspended,
)

from ._view_codec import dumps


class NotificationKind(enum.StrEnum):
    GATE = "gate"
    QUESTION = "question"
    UNKNOWN_WRITE = "unknown_write"
    BUDGET = "budget"
    FAILED = "failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice:
    """A notification an append calls for: its kind and the seq of the event that caused it."""

    kind: NotificationKind
    seq: int


def _last(envelopes: Sequence[Envelope], kind: type) -> Envelope | None:
    for envelope in reversed(envelopes):
        if isinstance(envelope.event, kind):
            return envelope
    return None


def is_question(event: Suspended) -> bool:
    """Whether a suspension is an ``ask_user`` question rather than a gate.

    A question's suspension is the one ``protocol.question_schema`` builds: an object holding
    exactly ``answer``, described by the question itself, which is also the suspension's reason.
    The schema is the sign every path leaves alike (a built-in agent, a process agent over the
    MCP server, a client replaying either), where the tool's name is recorded differently by each.
    """
    schema = event.input_schema
    properties = schema.get("properties")
    if schema.get("required") != ["answer"] or not isinstance(properties, dict):
        return False
    answer = properties.get("answer")
    return (
        set(properties) == {"answer"}
        and schema.get("additionalProperties") is False
        and isinstance(answer, dict)
        and answer.get("description") == event.reason
    )


def notice_of(before: RunView, envelopes: Sequence[Envelope], after: RunView) -> Notice | None:
    """The notification the batch ``envelopes`` (taking ``before`` to ``after``) calls for, or None.

    A suspension of ``kind: "signal"`` notifies nothing: an outside system owes that run its
    payload, not a person.
    """
    state = after.state
    first = envelopes[0].seq
    if state is RunState.SUSPENDED:
        entered = _last(envelopes, Suspended)
        if entered is None or entered.event.kind == "signal":
            return None
        kind = NotificationKind.QUESTION if is_question(entered.event) else NotificationKind.GATE
        return Notice(kind=kind, seq=entered.seq)
    if state is RunState.NEEDS_RECONCILIATION:
        # The write's intent: recorded in this batch, or the run was already waiting on it.
        pending = after.pending
        if pending is None or pending.seq < first:
            return None
        return Notice(kind=NotificationKind.UNKNOWN_WRITE, seq=pending.seq)
    if state is RunState.BUDGET_EXCEEDED:
        entered = _last(envelopes, BudgetExceeded)
        return None if entered is None else Notice(kind=NotificationKind.BUDGET, seq=entered.seq)
    if state is RunState.FAILED:
        entered = _last(envelopes, RunFailed)
        return None if entered is None else Notice(kind=NotificationKind.FAILED, seq=entered.seq)
    return None


def notification_body(notice: Notice, after: RunView, recorded_at: str) -> dict[str, Any]:
    """What the operator is sent: kind, run, seq, when, the run's status, its labels if any."""
    body: dict[str, Any] = {
        "kind": notice.kind.value,
        "run": after.run_id,
        "seq": notice.seq,
        "recorded_at": recorded_at,
        "status": after.status(),
    }
    if after.labels:
        body["labels"] = after.labels
    return body


def notification_row(notice: Notice, after: RunView, recorded_at: str) -> dict[str, Any]:
    """The outbox row of ``notice``: due at once, never attempted."""
    return {
        "run_id": after.run_id,
        "seq": notice.seq,
        "kind": notice.kind.value,
        "body": dumps(notification_body(notice, after, recorded_at)),
        "created_at": recorded_at,
        "attempts": 0,
        "next_attempt_at": recorded_at,
        "delivered_at": None,
    }
