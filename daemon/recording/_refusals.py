"""Refusals every surface that drives a run shares.

A run id that is not one, labels out of bounds, a write left unsettled.
"""

from __future__ import annotations

import uuid
from typing import Any

from salvor.protocol import (
    ErrorCode,
    NextStep,
    RunView,
    SchemaViolation,
    StepKind,
    check_labels,
    excerpt,
)

from ..web import OperationRefused, bad_request


def parse_run_id(text: str) -> str:
    """A run id is a UUID; return it in canonical form.

    Raises:
        OperationRefused: bad_request when it is not one.
    """
    try:
        return str(uuid.UUID(text))
    except (ValueError, AttributeError, TypeError):
        raise bad_request(f"{excerpt(text)!r} is not a run id (a run id is a UUID)") from None


# The UUID versions salvor derives the ids of the runs it starts itself from (map items and
# subagents: uuid5 over the parent's id and position). A caller never chooses one: an id it
# could compute in advance would let it plant a run where a map or a parent will look for its
# child, and have its own "result" taken as the child's.
_DERIVED_VERSIONS = frozenset({3, 5})


def chosen_run_id(text: str) -> str:
    """A run id a caller chose for a new run, in canonical form: any UUID but a name-based one
    (version 3 or 5), the kind salvor derives for the children it starts (issue 29, item 6).

    Raises:
        OperationRefused: bad_request when it is no UUID, or a name-based one; nothing recorded.
    """
    run_id = parse_run_id(text)
    version = uuid.UUID(run_id).version
    if version in _DERIVED_VERSIONS:
        raise bad_request(
            f"run id {run_id} is a name-based UUID (version {version}), the kind salvor derives "
            "for the runs it starts itself (map items, subagents); choose a random UUID "
            "(version 4) or a time-ordered one (version 7), or leave the id to salvor"
        )
    return run_id


def checked_labels(labels: Any, where: str = "") -> dict[str, str] | None:
    """``labels`` when they pass the one label check (``salvor.protocol.check_labels``).

    Raises:
        OperationRefused: bad_request with the check's sentence, after ``where``
            (say ``"events[0]: "``).
    """
    try:
        check_labels(labels)
    except SchemaViolation as exc:
        raise bad_request(where + exc.message) from None
    return labels


def needs_reconciliation(run_id: str, view: RunView) -> OperationRefused:
    intent = view.pending.intent_json()
    return OperationRefused(
        ErrorCode.NEEDS_RECONCILIATION,
        f"run {run_id} needs reconciliation: a write ({intent['tool']} at seq {intent['seq']}) was "
        f"recorded but never completed, so it may or may not have happened",
        details={"intent": intent},
        next_step=NextStep(kind=StepKind.RESOLVE_WRITE, run=run_id),
    )
