"""How much one run may make the store keep: its events, their bytes, and any one payload.

Rules of this module:

* A quota is judged on the rows an append would write (the payload texts ``prepare`` built),
  before any transaction: nothing over a limit is offered to the database.
* A run's bytes are the sum of its stored payloads' sizes in UTF-8. The log is append-only, so
  the bytes of a run's first ``n`` events never change: ``(n, bytes)`` is a fact the store may
  remember and trust whenever an append comes after exactly ``n`` events.
* The margin: one ending event (``RunFailed``, ``RunCompleted``, ``RunAbandoned``) of at most
  ``ENDING_MARGIN_BYTES`` is taken past a run's event and byte limits, so the failure a quota
  causes, a client's own ending and a person's abandon can always be written. Nothing follows
  an ending, so a run holds at most one event and ``ENDING_MARGIN_BYTES`` more than its limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from salvor.protocol import DEFAULT_MAX_PAYLOAD_BYTES, Event, EventKind

from ._errors import PayloadTooLarge, QuotaExceeded

MIB = 1024 * 1024
# The defaults of ``salvor serve``'s flags (the README gives the reasons).
DEFAULT_MAX_RUN_EVENTS = 100_000
DEFAULT_MAX_RUN_BYTES = 64 * MIB
ENDING_MARGIN_BYTES = 64 * 1024

_ENDINGS = frozenset({EventKind.RUN_FAILED, EventKind.RUN_COMPLETED, EventKind.RUN_ABANDONED})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunQuota:
    """The limits on what one run may make the store keep (each at least 1)."""

    max_run_events: int = DEFAULT_MAX_RUN_EVENTS
    max_run_bytes: int = DEFAULT_MAX_RUN_BYTES
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def __post_init__(self) -> None:
        for name in ("max_run_events", "max_run_bytes", "max_payload_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a whole number, 1 or more, not {value!r}")


def payload_bytes(text: str) -> int:
    """The UTF-8 size of a stored payload (an ASCII text, the common case, is not encoded)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _flag(name: str) -> str:
    return f"salvor serve --{name.replace('_', '-')}"


def bytes_after(
    quota: RunQuota,
    run_id: str,
    held: tuple[int, int],
    events: Sequence[Event],
    payloads: Sequence[str],
) -> int:
    """The run's bytes once ``events`` (stored as ``payloads``) follow ``held``, its
    ``(events, bytes)`` before them, if the quota takes them.

    Raises:
        PayloadTooLarge: one payload is over ``max_payload_bytes``.
        QuotaExceeded: the run would pass ``max_run_events`` or ``max_run_bytes`` (and the batch
            is not one ending within the margin).
        Either way the message names the limit and the flag that sets it; nothing is written.
    """
    count, stored = held
    sizes = [payload_bytes(text) for text in payloads]
    for event, size in zip(events, sizes):
        if size > quota.max_payload_bytes:
            raise PayloadTooLarge(
                f"a {event.KIND.value} of {size} bytes for run {run_id} is over the limit of "
                f"{quota.max_payload_bytes} bytes per payload ({_flag('max_payload_bytes')}); "
                "nothing of this append was written",
                details={"limit": "max_payload_bytes", "value": quota.max_payload_bytes},
            )
    added = sum(sizes)
    total = stored + added
    over_events = count + len(events) > quota.max_run_events
    over_bytes = total > quota.max_run_bytes
    if not (over_events or over_bytes):
        return total
    # Whatever the run holds (limits lowered since it was written, say): a run ends once.
    if len(events) == 1 and events[0].KIND in _ENDINGS and added <= ENDING_MARGIN_BYTES:
        return total
    if over_events:
        limit, value = "max_run_events", quota.max_run_events
        held_text = f"holds {count} events, and {len(events)} more would pass its limit of {value}"
    else:
        limit, value = "max_run_bytes", quota.max_run_bytes
        held_text = (
            f"holds {stored} bytes of events, and {added} more would pass its limit of {value} "
            "bytes"
        )
    raise QuotaExceeded(
        f"run {run_id} {held_text} per run ({_flag(limit)}); nothing of this append was "
        "written, and only the run's ending (RunFailed, RunCompleted or an abandon) may still be "
        "recorded",
        details={"limit": limit, "value": value, "events": count, "bytes": stored},
    )
