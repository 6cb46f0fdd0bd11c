"""One table of (legal log, expected view) drives the fold, the step-by-step
fold and the guard's acceptance of whole logs."""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime, timedelta

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    RunState,
    RunView,
    SleepStarted,
    check_batch,
    check_next,
    fold,
    parse_instant,
    step,
)

from .logs import AT_WRITE, COVERED_STATES, VIEW_CASES, WAKE_AT, S, ViewCase, wrap

cases = pytest.mark.parametrize("case", VIEW_CASES, ids=lambda case: case.name)


def assert_view(view: RunView, case: ViewCase) -> None:
    assert view.status() == case.status
    assert view.usage() == {"input_tokens": case.usage[0], "output_tokens": case.usage[1]}
    assert (view.pending.to_json() if view.pending else None) == case.pending
    assert view.next_seq == case.next_seq
    assert view.event_count == case.next_seq
    assert view.step_count == case.step_count
    for name, expected in case.extra.items():
        assert getattr(view, name) == expected, name
    assert view.replay_json() == {
        "status": case.status,
        "usage": view.usage(),
        "next_seq": case.next_seq,
        "pending": case.pending,
    }


def test_the_table_covers_every_state() -> None:
    assert COVERED_STATES == {state.value for state in RunState}
    # Both kinds of suspension and both kinds of abandonment are in it.
    statuses = [case.status for case in VIEW_CASES]
    assert any(s["state"] == "suspended" and "kind" not in s for s in statuses)
    assert any(s["state"] == "suspended" and s.get("kind") == "signal" for s in statuses)
    assert any(s["state"] == "abandoned" and "reason" in s for s in statuses)
    assert any(s["state"] == "abandoned" and "unresolved_write" in s for s in statuses)


@cases
def test_fold(case: ViewCase) -> None:
    assert_view(fold(case.log), case)


@cases
def test_step_by_step_equals_fold(case: ViewCase) -> None:
    stepped = functools.reduce(step, case.log, EMPTY_VIEW)
    assert stepped == fold(case.log)
    assert_view(stepped, case)


@cases
def test_fold_resumes_from_any_prefix_view(case: ViewCase) -> None:
    log = case.log
    for cut in range(len(log) + 1):
        assert fold(log[cut:], fold(log[:cut])) == fold(log)


@cases
def test_guard_accepts_the_whole_log(case: ViewCase) -> None:
    view = check_batch(EMPTY_VIEW, case.log)
    assert view == fold(case.log)
    assert_view(view, case)


@cases
def test_guard_accepts_each_event_in_turn(case: ViewCase) -> None:
    view = EMPTY_VIEW
    for envelope in case.log:
        before = dataclasses.replace(view)
        check_next(view, envelope)
        assert view == before
        view = step(view, envelope)
    assert view == fold(case.log)


@cases
def test_recorded_times_are_first_and_last_envelope(case: ViewCase) -> None:
    view = fold(case.log)
    if case.events:
        assert view.first_recorded_at == case.log[0].recorded_at
        assert view.last_recorded_at == case.log[-1].recorded_at
        assert view.run_id == case.log[0].run_id
    else:
        assert view == EMPTY_VIEW


def test_fold_of_an_empty_log_is_the_empty_view() -> None:
    assert fold([]) == EMPTY_VIEW == RunView()
    assert EMPTY_VIEW.status() == {"state": "not_started"}
    assert EMPTY_VIEW.replay_json() == {
        "status": {"state": "not_started"},
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "next_seq": 0,
        "pending": None,
    }


def test_view_is_frozen() -> None:
    view = fold(VIEW_CASES[1].log)
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.state = RunState.COMPLETED  # type: ignore[misc]


def test_terminal_and_resting_flags() -> None:
    for case in VIEW_CASES:
        view = fold(case.log)
        state = case.status["state"]
        assert view.terminal == (state in {"completed", "failed", "abandoned"}), case.name
        assert view.resting == (
            state
            in {
                "completed",
                "failed",
                "abandoned",
                "suspended",
                "sleeping",
                "budget_exceeded",
                "needs_reconciliation",
            }
        ), case.name


def test_sleeping_status_is_overdue_only_past_wake_at() -> None:
    view = fold(wrap([S, SleepStarted(wake_at=WAKE_AT)]))
    wake = parse_instant(WAKE_AT)
    assert view.wake_at() == WAKE_AT
    assert view.status_at(wake) == {"state": "sleeping", "wake_at": WAKE_AT}
    assert view.status_at(wake - timedelta(hours=1)) == {"state": "sleeping", "wake_at": WAKE_AT}
    assert view.status_at(wake + timedelta(seconds=90.7)) == {
        "state": "sleeping",
        "wake_at": WAKE_AT,
        "overdue": True,
        "overdue_seconds": 90,
    }
    # Only a sleeping run has a wake_at.
    assert fold(wrap([S])).wake_at() is None
    assert fold(wrap([S])).status_at(datetime.now(wake.tzinfo)) == {"state": "running"}


def test_pending_intent_json_carries_recorded_at() -> None:
    view = fold(wrap(AT_WRITE))
    assert view.pending.intent_json() == {
        "kind": "tool",
        "seq": 1,
        "tool": "charge",
        "input": {"amount": 10},
        "effect": "write",
        "idempotency_key": None,
        "recorded_at": wrap(AT_WRITE)[1].recorded_at,
    }
