"""Every refusal of the append guard, from one table; a refusal changes nothing."""

from __future__ import annotations

import copy

import pytest
from salvor.protocol import (
    EMPTY_VIEW,
    LEGAL_NEXT,
    GuardRefusal,
    RunState,
    SchemaViolation,
    check_batch,
    check_labels,
    check_next,
    fold,
    step,
)

from .logs import REFUSALS, VIEW_CASES, Refusal, envelope, legal_next, started, wrap


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.name)
def test_refusal(case: Refusal) -> None:
    view = check_batch(EMPTY_VIEW, case.log)
    snapshot = copy.deepcopy(view)
    illegal = case.illegal

    with pytest.raises(GuardRefusal) as caught:
        check_next(view, illegal)

    refusal = caught.value
    assert refusal.code == "divergence"
    assert refusal.status == 409
    assert case.reason in refusal.message
    # The message names the state the run is in and the event it refused.
    assert f"in state {view.state.value}" in refusal.message
    assert f"{illegal.kind} at seq {illegal.seq}" in refusal.message
    assert refusal.to_json() == {"error": {"code": "divergence", "message": refusal.message}}
    # Nothing about the run changed, and it still takes its legal next event.
    assert view == snapshot
    assert view == fold(case.log)
    follow_up = legal_next(view)
    if view.terminal:
        assert follow_up is None
    else:
        check_next(view, follow_up)
        step(view, follow_up)


@pytest.mark.parametrize("case", REFUSALS, ids=lambda case: case.name)
def test_a_batch_holding_the_refusal_is_refused_whole(case: Refusal) -> None:
    with pytest.raises(GuardRefusal):
        check_batch(EMPTY_VIEW, [*case.log, case.illegal])


def test_every_state_is_refused_something() -> None:
    refused_states = {fold(case.log).state for case in REFUSALS}
    assert refused_states == set(RunState)


def test_legal_next_table_has_every_state() -> None:
    assert set(LEGAL_NEXT) == set(RunState)
    for state in (RunState.COMPLETED, RunState.FAILED, RunState.ABANDONED):
        assert LEGAL_NEXT[state] == frozenset()


def test_label_bounds_are_inclusive() -> None:
    at_the_bounds = {f"k{index}": "v" for index in range(15)} | {"k" * 64: "v" * 256}
    check_labels(at_the_bounds)
    check_labels(None)
    check_labels({})
    check_next(EMPTY_VIEW, envelope(0, started(labels=at_the_bounds)))
    # 32 two-byte characters are 64 bytes.
    check_next(EMPTY_VIEW, envelope(0, started(labels={"é" * 32: "ü" * 128})))


def test_check_labels_is_a_bad_request() -> None:
    with pytest.raises(SchemaViolation) as caught:
        check_labels({"k": "v" * 257})
    assert (caught.value.code, caught.value.status) == ("bad_request", 400)


def test_any_run_id_may_open_a_log() -> None:
    view = check_batch(EMPTY_VIEW, wrap([started()], run_id="another-run"))
    assert view.run_id == "another-run"


def test_check_batch_returns_the_view_and_leaves_its_input_alone() -> None:
    log = VIEW_CASES[-1].log
    head = check_batch(EMPTY_VIEW, log[:2])
    snapshot = copy.deepcopy(head)
    assert check_batch(head, log[2:]) == fold(log)
    assert head == snapshot
    assert check_batch(head, []) is head
