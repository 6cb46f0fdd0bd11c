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
