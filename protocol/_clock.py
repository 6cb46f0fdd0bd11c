"""RFC 3339 instants as the log records them.

The log stores instants as text in UTC with a ``Z`` suffix and microsecond
precision, so two recordings of the same instant are the same bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ._errors import excerpt


def format_instant(moment: datetime) -> str:
    """Render an aware datetime as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC."""
    if moment.tzinfo is None:
        raise ValueError("an instant must carry a timezone")
    # isoformat, not strftime: half the cost (it runs for every append), and a year below 1000
    # keeps its four digits. In UTC it always ends in "+00:00".
    return moment.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


def parse_instant(text: str) -> datetime:
    """Parse an RFC 3339 instant (``Z`` or a numeric offset) into an aware UTC datetime.

    Raises:
        ValueError: the text is not an RFC 3339 date-time with an offset.
    """
    if not isinstance(text, str):
        # ValueError, not TypeError: callers turn any unreadable instant, whatever
        # its type, into one refusal ("not an RFC 3339 instant").
        raise ValueError(f"an instant must be a string, not {type(text).__name__}")  # noqa: TRY004
    normalised = text.strip()
    if normalised.endswith(("Z", "z")):
        normalised = normalised[:-1] + "+00:00"
    if "T" not in normalised and "t" not in normalised:
        raise ValueError(f"{excerpt(text)!r} is not an RFC 3339 date-time")
    moment = datetime.fromisoformat(normalised)
    if moment.tzinfo is None:
        raise ValueError(f"{excerpt(text)!r} has no UTC offset; write it with Z or +HH:MM")
    return moment.astimezone(UTC)
