"""Refusals every surface that drives a run shares: a run id that is not
one, a write left unsettled."""

from __future__ import annotations

import uuid

from salvor.protocol import RunView, excerpt

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


def needs_reconciliation(run_id: str, view: RunView) -> OperationRefused:
    intent = view.pending.intent_json()
    return OperationRefused(
        "needs_reconciliation",
        409,
        f"run {run_id} needs reconciliation: a write ({intent['tool']} at seq {intent['seq']}) was "
        f"recorded but never completed, so it may or may not have happened; check it, then record "
        f"what it returned with `salvor resolve {run_id} --output JSON`",
        details={"intent": intent},
    )
