"""The typed words of a run: who acted (``Actor``), what an open intent asks for (``PendingKind``),
which resting states a drive has nothing to do in (``IDLE_STATES``), and the one check of a resume
input. Typed in memory, the same text on the wire and in the store."""

from __future__ import annotations

import json

import pytest
from salvor.protocol import (
    IDLE_STATES,
    RESTING_STATES,
    Actor,
    MalformedEvent,
    ModelCallRequested,
    PendingKind,
    RunState,
    RunView,
    SchemaViolation,
    ToolCallCompleted,
    ToolCallRequested,
    check_resume_input,
    decode_envelope,
    encode_payload,
    fold,
)
from salvor.store import view_from_json, view_to_json
from salvor.store._view_codec import dumps

from .logs import envelope, started


def test_a_decoded_actor_is_the_member_and_is_written_as_the_same_text() -> None:
    wire = {
        "run_id": "r",
        "seq": 1,
        "schema_version": 1,
        "recorded_at": "2026-11-29T10:00:00.000000Z",
        "event": {
            "kind": "ModelCallRequested",
            "payload": {"seq": 1, "request_hash": "sha256:" + "0" * 64, "performed_by": "client"},
        },
    }
    event = decode_envelope(wire).event
    assert event.performed_by is Actor.CLIENT
    assert encode_payload(event, seq=1) == encode_payload(
        ModelCallRequested(request_hash="sha256:" + "0" * 64, performed_by=Actor.CLIENT), seq=1
    )
    assert '"performed_by":"client"' in encode_payload(event, seq=1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: ModelCallRequested(request_hash="h", performed_by="operator"),
            '`performed_by` is "client" or absent',
        ),
        (
            lambda: ToolCallRequested(
                tool="t", input={}, effect="read", idempotency_key=None, performed_by="daemon"
            ),
            '`performed_by` is "client" or absent',
        ),
        (
            lambda: ToolCallCompleted(seq=1, output=1, settled_by="client"),
            '`settled_by` is "operator", "probe" or absent',
        ),
        (lambda: started(driven_by="operator"), '`driven_by` is "client" or absent'),
    ],
)
def test_an_actor_a_field_does_not_take_is_refused_in_its_words(build, message) -> None:
    with pytest.raises(MalformedEvent, match=message):
        build()


def test_a_pending_intent_has_a_typed_kind_that_survives_the_store() -> None:
    log = [
        envelope(0, started()),
        envelope(
            1,
            ToolCallRequested(
                tool="t", input={}, effect="read", idempotency_key=None, performed_by="client"
            ),
        ),
    ]
    view = fold(log)
    assert view.pending.kind is PendingKind.TOOL and view.pending.performed_by is Actor.CLIENT
    assert view.pending.to_json()["kind"] == "tool" and type(view.pending.to_json()["kind"]) is str
    again = view_from_json(json.loads(dumps(view_to_json(view))))
    assert (
        again == view
        and again.pending.kind is PendingKind.TOOL
        and again.pending.performed_by is Actor.CLIENT
    )
    client_run = fold([envelope(0, started(driven_by="client"))])
    assert view_from_json(json.loads(dumps(view_to_json(client_run)))).driven_by is Actor.CLIENT


def test_idle_states_are_the_resting_ones_but_sleeping() -> None:
    assert IDLE_STATES == RESTING_STATES - {RunState.SLEEPING}
    for state in RunState:
        assert RunView(state=state).idle is (
            state in RESTING_STATES and state is not RunState.SLEEPING
        )


def test_a_resume_input_is_checked_against_the_state_it_resumes() -> None:
    suspended = RunView(
        state=RunState.SUSPENDED, detail={"input_schema": {"type": "object", "required": ["ok"]}}
    )
    check_resume_input(suspended, {"ok": True})
    with pytest.raises(SchemaViolation, match="the resume input"):
        check_resume_input(suspended, {})
    over_budget = RunView(state=RunState.BUDGET_EXCEEDED)
    check_resume_input(over_budget, {"extend_by": 10})
    with pytest.raises(SchemaViolation):
        check_resume_input(over_budget, {"ok": True})
