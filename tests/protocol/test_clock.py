"""Instants: one form on the way in and out, and one error type for anything unreadable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from salvor.protocol import format_instant, parse_instant


def test_an_instant_reads_back_in_utc() -> None:
    moment = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert format_instant(moment) == "2026-11-29T08:00:00.123456Z"
    assert parse_instant("2026-11-29T10:00:00+02:00") == datetime(2026, 11, 29, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "moment",
    [datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2026, 11, 29, 0, 0, 0, 0, tzinfo=UTC)],
)
def test_every_instant_has_the_one_form_and_reads_back(moment) -> None:
    # Four digits of year and six of microseconds, whatever the value.
    text = format_instant(moment)
    assert len(text) == len("2026-11-29T08:00:00.123456Z")
    assert parse_instant(text) == moment


@pytest.mark.parametrize(
    "text", ["2026-11-29T10:00:00", "tomorrow", 7, None, ["2026-11-29T10:00:00Z"]]
)
def test_anything_unreadable_is_a_value_error(text) -> None:
    # Callers (sleep_until, wait_until) turn exactly this into their refusal, whatever the type.
    with pytest.raises(ValueError, match="instant|UTC offset|isoformat|Invalid"):
        parse_instant(text)
